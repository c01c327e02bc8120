"""The encoder's shortcut through plain values: their weight, told without the walk.

Most of a step's metadata is plain builtins: dicts, lists and tuples of strings, numbers,
``None`` and small bytes. The walk (:mod:`rlwire.codecs._msgpack.encode`) would leave
each of them as it is, and its only product for them is their *weight*, which decides
what is chunked. :class:`PlainWeights` computes that weight in one plain recursive call
per container, with no generator, no copy and no path, and refuses (:class:`NotPlain`)
any value the walk would do more with, so that the walk takes that one instead:

* anything but those builtins (arrays, Structs, dataclasses, numpy scalars, extension
  values, subclasses, ...), and bytes of the inline threshold or more;
* a dict with a key that is a sidecar name (the walk notes it, and sends what is under
  it to the sidecar);
* a container whose items weigh more than :data:`CHUNK_WEIGHT` together (the walk may
  chunk some of them), and a list of scalars longer than
  :data:`~rlwire.codecs._msgpack.weights.SCAN`;
* a value that would take more than :data:`_BUDGET` steps: one call stays well under a
  millisecond, and the walk cuts such a value into its items, each tried again here.

The weights are the walk's to the unit (:func:`~rlwire.codecs._msgpack.weights.weight`
for a list of scalars, sampled), so the frame is the same byte for byte.

Example:
    >>> plain = PlainWeights(frozenset(), inline_threshold=4096)
    >>> plain.weights([{"id": 1, "tokens": [1, 2, 3]}, "ok", [1, {"x": None}]], 0)
    ([8, 1, 5], False)
    >>> plain.weights([{"id": 1}, object()], 0)  # the walk takes the object
    ([3], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlwire.codecs._msgpack.weights import ONE, SCALARS, SCAN, weight

__all__ = ["CHUNK_WEIGHT", "NotPlain", "PlainWeights"]

#: The most weight (about one item of a list, or 64 bytes of a string) one msgspec call
#: gets: some 0.1-0.5 ms of GIL-holding C code on either side (decoding makes an object
#: per item, and takes several times longer where fresh memory is slow to fault in).
#: A container heavier is cut into chunks (:mod:`rlwire.codecs._msgpack.encode`).
CHUNK_WEIGHT = 8192
# Steps (items visited; a sixteenth of a step per scalar of a scanned list) one call of
# :meth:`PlainWeights.weights` may take: well under a millisecond.
_BUDGET = 1024


class NotPlain(Exception):
    """A value the walk must look at (see the module's docstring)."""


class PlainWeights:
    """Weights of plain values, for one encoding pass.

    Args:
        sidecar: the sidecar names; a dict keyed by one is not plain.
        inline_threshold: bytes this long or longer are not plain (they go out of band).
    """

    def __init__(self, sidecar: frozenset[str], inline_threshold: int) -> None:
        self.sidecar = sidecar
        self.threshold = inline_threshold
        self.left = _BUDGET

    def weights(self, items: Sequence[Any], start: int) -> tuple[list[int], bool]:
        """``(weights, stopped)``: the weights of ``items[start:]``, as many of them as
        are plain and fit the step budget together; ``stopped`` when the next one is
        not plain (or would take more than the budget alone)."""
        out: list[int] = []
        used = 0
        for i in range(start, len(items)):
            self.left = _BUDGET
            item = items[i]
            try:
                out.append(self._mapping(item) if type(item) is dict else self.weight(item))
            except NotPlain:
                return out, True
            used += 1 + _BUDGET - self.left  # a scalar takes a step too
            if used >= _BUDGET:
                break
        return out, False

    def weight(self, obj: Any) -> int:
        """The walk's weight of ``obj`` if it is plain, else :class:`NotPlain`."""
        kind = type(obj)
        if kind is str:
            return 1 + len(obj) // 64
        if kind in ONE:
            return 1
        if kind is dict:
            return self._mapping(obj)
        if kind is list or kind is tuple:
            return self._sequence(obj)
        if (kind is bytes or kind is bytearray) and len(obj) < self.threshold:
            return 1 + len(obj) // 64
        raise NotPlain

    def _mapping(self, obj: dict[Any, Any]) -> int:
        n = len(obj)
        self.left -= n + 1
        if self.left < 0 or (self.sidecar and not self.sidecar.isdisjoint(obj)):
            raise NotPlain
        total = n  # each entry weighs one more than its value
        for value in obj.values():
            kind = type(value)
            if kind is str:
                total += 1 + len(value) // 64
            elif kind in ONE:
                total += 1
            elif kind is list:
                total += self._sequence(value)
            else:
                total += self.weight(value)
        if total > CHUNK_WEIGHT:
            raise NotPlain
        return total + 1

    def _sequence(self, obj: list[Any] | tuple[Any, ...]) -> int:
        n = len(obj)
        if not n:
            return 1
        self.left -= 1
        if type(obj[0]) in SCALARS:
            if n > SCAN:
                raise NotPlain
            self.left -= n >> 4
            if self.left < 0:
                raise NotPlain
            kinds = set(map(type, obj))
            if kinds <= SCALARS:
                return 1 + n if str not in kinds else weight(obj)
        self.left -= n
        if self.left < 0:
            raise NotPlain
        total = 0
        for item in obj:
            kind = type(item)
            if kind is str:
                total += 1 + len(item) // 64
            elif kind in ONE:
                total += 1
            else:
                total += self.weight(item)
        if total > CHUNK_WEIGHT:
            raise NotPlain
        return total + 1
