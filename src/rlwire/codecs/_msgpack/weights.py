"""Weights the msgpack encoder cuts chunks by: an estimate, told from a sample, of what
msgspec must write for a value (its items, and 64-byte runs of its strings).

:func:`weight` decides where a chunked container is cut
(:mod:`rlwire.codecs._msgpack.encode`); :func:`run_weights` tells it for a run of items
at once, with the common case (dicts whose first value is a number) in C.

Example:
    >>> weight({"id": 1, "tokens": [1, 2, 3]})
    5
    >>> run_weights([{"id": 1, "tokens": [1, 2, 3]}, "x" * 130])
    [5, 3]
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import add, mul
from typing import Any

import msgspec

__all__ = ["ONE", "SCALARS", "SCAN", "run_weights", "weight"]

#: Plain scalars, left to msgspec as they are.
SCALARS = frozenset((str, int, float, bool, type(None)))
#: The scalars that weigh one each (a string weighs by its length).
ONE = frozenset((int, float, bool, type(None)))
#: Items of a list of scalars whose types are scanned in one C call.
SCAN = 65536


def weight(obj: Any) -> int:
    """An estimate of what msgspec must write for ``obj``: its items, and 64-byte runs
    of its strings. Long containers are sampled (first, middle, last item), not read."""
    kind = type(obj)
    if kind is str or kind is bytes:
        return 1 + len(obj) // 64
    if kind is list or kind is tuple:
        n = len(obj)
        if n < 3:
            return 1 + sum(weight(item) for item in obj)
        return 1 + n * max(weight(obj[0]), weight(obj[n // 2]), weight(obj[-1]))
    if kind is dict:
        n = len(obj)
        return 1 + (n * (1 + weight(next(iter(obj.values())))) if n else 0)
    if isinstance(obj, msgspec.Struct):
        return 1 + sum(weight(getattr(obj, name)) for name in obj.__struct_fields__)
    return 1


def run_weights(values: Sequence[Any]) -> list[int]:
    """``[weight(value) for value in values]``; for dicts that are not empty and whose
    first values weigh one each, told in C (a dict weighs ``1 + 2 n`` then)."""
    if values and set(map(type, values)) == {dict} and all(values):
        firsts = map(next, map(iter, map(dict.values, values)))  # none is empty
        if set(map(type, firsts)) <= ONE:
            return list(map(add, map(mul, map(len, values), repeat(2)), repeat(1)))
    return list(map(weight, values))
