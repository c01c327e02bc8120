"""How a step filled part by part spreads its parts over ranks: a part's default cost
(its tokens) and the rank the next part goes to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlwire._core.columns import Columns
from rlwire._core.ragged import Ragged

__all__ = ["choose_rank", "token_cost"]


def token_cost(samples: Sequence[Any] | Columns) -> int:
    """The default cost of a part: its number of tokens, the length of each sample's
    ``token_ids`` (an attribute, or a key of a dict), or the rows of a ``token_ids``
    column of an :class:`~rlwire.Columns`; a sample without ``token_ids`` counts 1.

    Example:
        >>> token_cost([{"token_ids": [1, 2, 3]}, {"token_ids": [4]}, {"reward": 1.0}])
        5
    """
    if isinstance(samples, Columns):
        column = samples["token_ids"] if "token_ids" in samples.names else None
        if isinstance(column, Ragged):
            return int(column.offsets[-1] - column.offsets[0])
        return len(samples)
    total = 0
    for sample in samples:
        ids = sample.get("token_ids") if isinstance(sample, Mapping) else None
        if ids is None:
            ids = getattr(sample, "token_ids", None)
        total += 1 if ids is None else len(ids)
    return total


def choose_rank(costs: Sequence[Sequence[float]], balance: str = "cost") -> int:
    """The rank the next part goes to, given each rank's parts' costs so far: the one
    with the lowest total (``balance="cost"``), or with the fewest parts and then the
    lowest total (``"count"``); ties go to the lowest rank.

    With ``"cost"``, the totals of any two ranks never differ by more than the largest
    single cost: the part goes to the lightest rank, which it can lift at most its own
    cost above the others.

    Example:
        >>> choose_rank([[5.0], [2.0, 2.0]]), choose_rank([[5.0], [2.0, 2.0]], "count")
        (1, 0)
    """
    totals = [sum(c) for c in costs]
    if balance == "count":
        return min(range(len(costs)), key=lambda r: (len(costs[r]), totals[r], r))
    return min(range(len(costs)), key=lambda r: (totals[r], r))
