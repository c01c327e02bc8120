"""The msgpack extension values the codec writes in a header: their type codes and layouts.

These are in the wire format (docs/format.md): each extension value's payload is a msgpack
array with the fields below, in order.

* ``1`` out-of-band array (:class:`ArrayRef`)
* ``2`` inline array (:class:`InlineArray`), for arrays below the inline threshold
* ``3`` out-of-band bytes (:class:`BytesRef`)
* ``4`` / ``5`` chunked array / map (:class:`ChunksRef`), each chunk a msgpack array /
  map in that buffer
* ``6`` ragged array: ``[values, offsets]``, each an extension value 1 or 2
* ``7`` columns: a list of rows stored field by field, ``[count, layout, names,
  columns]`` (:data:`ROWS_AS_MAPS` or :data:`ROWS_AS_ARRAYS`; each column an extension
  value 6, or a msgpack array of ``count`` values, or an extension value 4 of them)

Example:
    >>> msgspec.msgpack.encode(BytesRef(index=2))
    b'\\x91\\x02'
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "EXT_ARRAY",
    "EXT_BYTES",
    "EXT_CHUNKED_ARRAY",
    "EXT_CHUNKED_MAP",
    "EXT_COLUMNS",
    "EXT_INLINE_ARRAY",
    "EXT_RAGGED",
    "ROWS_AS_ARRAYS",
    "ROWS_AS_MAPS",
    "ArrayRef",
    "BytesRef",
    "ChunksRef",
    "InlineArray",
    "weak_hook_decoder",
]

EXT_ARRAY = 1
EXT_INLINE_ARRAY = 2
EXT_BYTES = 3
EXT_CHUNKED_ARRAY = 4
EXT_CHUNKED_MAP = 5
EXT_RAGGED = 6
EXT_COLUMNS = 7
#: Layouts of a columns value's rows: maps of name to value (dicts, Structs), or arrays
#: in the order of the names (Structs with ``array_like=True``).
ROWS_AS_MAPS, ROWS_AS_ARRAYS = 0, 1


class ArrayRef(msgspec.Struct, array_like=True):
    """An array whose bytes are out-of-band buffer ``index``."""

    index: int
    dtype: str
    shape: list[int]
    order: str


class InlineArray(msgspec.Struct, array_like=True):
    """A small array whose bytes are in the header."""

    dtype: str
    shape: list[int]
    order: str
    data: bytes


class BytesRef(msgspec.Struct, array_like=True):
    """A bytes value that is out-of-band buffer ``index``."""

    index: int


class ChunksRef(msgspec.Struct, array_like=True):
    """Where a chunked container's chunks are: ``count`` items in all, chunk ``i`` at
    bytes ``ranges[2 i]`` to ``ranges[2 i + 1]`` of buffer ``index``."""

    index: int
    count: int
    ranges: list[int]


def weak_hook_decoder(hook: Callable[[int, memoryview], Any]) -> msgspec.msgpack.Decoder[Any]:
    """A decoder whose ``ext_hook`` is the bound method ``hook``, held weakly: an object
    that keeps the decoder as an attribute then makes no reference cycle with it (a
    cycle kept what the object holds, a received message's memory included, until
    Python's cyclic collector ran: on ``ray://`` the object store's memory of a step
    ``keep_last`` had dropped). The object must outlive every decode the decoder runs."""
    method = weakref.WeakMethod(hook)

    def ext_hook(code: int, data: memoryview) -> Any:
        bound = method()
        assert bound is not None, "the decoder's owner is gone"
        return bound(code, data)

    return msgspec.msgpack.Decoder(ext_hook=ext_hook)
