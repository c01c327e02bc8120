"""The items of one container the encoder walks: their weights, and what is encoded in
place of those the walk changed (an extension value, a chunked container, a copy).

Plain items are left as they are, so a container none of whose items changed is
encoded as it is, with no copy. One object per item (``[key, value, weight]``) made
hundreds of thousands of small containers for a long list, each tracked by Python's
cyclic collector: their number alone set off full collections, each a pause of some
100 ms over the whole heap.

Example:
    >>> entries = Entries(["x", "y"], keys=["a", "b"])
    >>> entries.weights += [2, 2]
    >>> entries.put(1, "z")
    >>> entries.value(1), entries.key(1), entries.values()
    ('z', 'b', ['x', 'z'])
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import Any

from rlwire._core.slicing import Sliced

__all__ = ["Entries", "mapping_entries"]

# Items copied, or let go of, per slice (1-2 ms): a dict of a million items copied at
# once held the GIL for some 40 ms, and as long again to let go of.
_PIECE = 16384


class Entries:
    """The items of ``items`` (keyed by ``keys``, or by position if None)."""

    __slots__ = ("changed", "items", "keys", "weights")

    def __init__(self, items: Sequence[Any], keys: Sequence[Any] | None = None) -> None:
        self.items = items
        self.keys = keys
        self.weights: list[int] = []  # the weight of each item weighed so far
        self.changed: dict[int, Any] = {}  # what to encode in place of item i

    def key(self, i: int) -> Any:
        return i if self.keys is None else self.keys[i]

    def value(self, i: int) -> Any:
        """What to encode in place of item ``i``."""
        changed = self.changed
        return changed[i] if i in changed else self.items[i]

    def put(self, i: int, value: Any) -> None:
        """Encode ``value`` in place of item ``i``."""
        if value is not self.items[i] or i in self.changed:
            self.changed[i] = value

    def values(self) -> list[Any]:
        """What to encode in place of each item."""
        out = list(self.items)
        for i, value in self.changed.items():
            out[i] = value
        return out

    def release(self) -> Sliced[None]:
        """Let go of the copies of a long container's items a piece per slice."""
        for copied in (self.keys, self.items):
            while isinstance(copied, list) and len(copied) > _PIECE:
                del copied[-_PIECE:]
                yield


def mapping_entries(obj: dict[Any, Any]) -> Sliced[Entries]:
    """The entries of ``obj``'s items, its keys and values copied a piece per slice."""
    if len(obj) <= _PIECE:
        return Entries(list(obj.values()), list(obj))
    keys: list[Any] = []
    values: list[Any] = []
    names, items = iter(obj), iter(obj.values())
    while len(keys) < len(obj):
        keys += islice(names, _PIECE)
        values += islice(items, _PIECE)
        yield
    return Entries(values, keys)
