"""What a sender opened with ``on_existing="resume"`` checks the first step it sends
against: the steps sent whole that it goes on after, which a commit cut short may have
left visible for their first ranks only (on S3 without sidecars nothing of the other
ranks is listed, so :func:`~rlwire.transport._stored.names.start_step` takes such a step
for a step of fewer ranks)."""

from __future__ import annotations

from collections.abc import Iterable

from rlwire._core.errors import StepExistsError
from rlwire.transport._stored.names import MAIN_RE

__all__ = ["Trail", "check_ranks_after", "whole_before"]

#: The steps sent whole that a step follows: ``(first, last, ranks)``, the steps
#: ``first..last`` each visible for ``ranks``.
Trail = tuple[int, int, frozenset[int]]


def whole_before(names: Iterable[str], step: int) -> Trail | None:
    """The steps sent whole right before ``step``, back to the first of them visible for
    the same ranks as the step before ``step`` (None: that step was not sent whole, or
    ``step`` is the first).

    Example:
        >>> whole_before(["step-00000001.rank-0000.rlw", "step-00000002.rank-0000.rlw"], 3)
        (1, 2, frozenset({0}))
    """
    mains: dict[int, set[int]] = {}
    for name in names:
        if m := MAIN_RE.fullmatch(name):
            mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    have = mains.get(step - 1)
    if have is None:
        return None
    first = step - 1
    while mains.get(first - 1) == have:
        first -= 1
    return first, step - 1, frozenset(have)


def check_ranks_after(where: str, before: Trail, ranks: int) -> None:
    """Refuse the first step a resumed sender sends to ``ranks`` ranks when the steps
    ``before`` it (:func:`whole_before`) lack one of them: a sender killed while
    committing the first of them made it visible for its first ranks only (and a
    resumed one may have sent on to those ranks only). Going on would leave the other
    ranks' receivers without those steps; the repair deletes them all, from the first."""
    first, last, have = before
    if set(range(ranks)) <= have:
        return
    if first == last:
        what = f"step {first} is incomplete (ranks {sorted(have)} of {ranks}: a sender was "
        what += "killed while committing it)"
    else:
        what = (
            f"steps {first}..{last} have ranks {sorted(have)} only, of {ranks}: a sender "
            f"killed while committing step {first}, then resumed and sending on to fewer "
            "ranks, leaves that"
        )
    raise StepExistsError(
        f"cannot resume: {what}; open the sender with start_step={first}, on_existing="
        f"'truncate' to delete step {first} and every later one, then send from step "
        f"{first} again",
        where=where,
    )
