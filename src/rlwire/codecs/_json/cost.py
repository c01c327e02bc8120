"""What parsing a JSON document into Python objects could cost, told without parsing it.

orjson builds a Python object for nearly every few bytes of JSON: ``[],`` (three bytes)
is a 56-byte list and an 8-byte slot, so 64 MiB of them build some 1.5 GB of lists. A
JSON message gets the same allowance as every other message,
:func:`~rlwire._frame.bounds.heap_allowance` of its stored size, and :func:`json_cost`
bounds what the parse would build from above, counting the bytes that open containers,
entries, strings and numbers, in numpy, a window at a time, so that the codec refuses a
hostile document before orjson allocates anything (:func:`refuse_costly`; a line of a
JSON-lines file gets the allowance of its own length).

Example:
    >>> json_cost(b"[1, 2, 3]") <= 200
    True
    >>> json_cost(b"[" + b"[]," * 1000 + b"[]]") > 1000 * 64
    True
"""

from __future__ import annotations

import numpy as np

from rlwire._core.errors import FrameTooLargeError
from rlwire._frame.bounds import HEAP_FLOOR, HEAP_RATIO, heap_bytes

__all__ = ["MOST_PER_BYTE", "json_cost", "refuse_costly"]

# Bytes of heap, upper bounds on CPython 3.11-3.13 (as in rlwire.codecs._msgpack.cost).
_LIST, _DICT, _DICT_ITEM, _SLOT = 56, 160, 64, 8
_NUMBER = 32  # an int or a float; one-character numbers are cached small ints
_STRING = 40  # per quote: a string is two, 80 bytes of object at most, plus...
_PER_BYTE = 4  # ...at most four bytes per byte of UTF-8 text (and nothing else is more)
#: The most any byte of JSON can cost parsed (an empty object and its separator).
MOST_PER_BYTE = _DICT + 2 * _SLOT + _PER_BYTE
_WINDOW = 4 << 20

_CHARGE = np.zeros(256, np.int64)
_CHARGE[ord("[")] = _LIST + _SLOT
_CHARGE[ord("{")] = _DICT + _SLOT
_CHARGE[ord(":")] = _DICT_ITEM
_CHARGE[ord(",")] = _SLOT
_CHARGE[ord('"')] = _STRING
_NUMERIC = np.zeros(256, bool)
_NUMERIC[np.frombuffer(b"0123456789+-.eE", np.uint8)] = True


def json_cost(data: bytes | memoryview, limit: int | None = None) -> int:
    """An upper bound of the heap, in bytes, that parsing ``data`` (one JSON document,
    possibly malformed) into Python objects would take. Without counting, when
    :data:`MOST_PER_BYTE` times its size is within ``limit``; otherwise it stops
    counting as soon as the total exceeds ``limit``."""
    arr = np.frombuffer(data, np.uint8)
    total = _SLOT + _PER_BYTE * arr.size
    if limit is not None and MOST_PER_BYTE * arr.size <= limit:
        return MOST_PER_BYTE * arr.size
    for start in range(0, arr.size, _WINDOW):
        window = arr[max(0, start - 1) : start + _WINDOW + 1]  # a byte of context each side
        inner = window[1 if start else 0 : (start and 1) + min(_WINDOW, arr.size - start)]
        total += int(_CHARGE[inner].sum())
        # Numbers of two characters or more, each a new object: runs of numeric bytes.
        numeric = _NUMERIC[window]
        edges = np.flatnonzero(np.diff(numeric.view(np.int8)))  # run starts and ends
        begins = edges[numeric[edges + 1]] + 1  # positions in window where a run begins
        if start == 0 and numeric.size and numeric[0]:
            begins = np.concatenate(([0], begins))
        begins = begins[begins < (start and 1) + inner.size]  # begun in this window
        if start:
            begins = begins[begins >= 1]
        long = begins + 1 < window.size
        long[long] = numeric[begins[long] + 1]
        total += _NUMBER * int(np.count_nonzero(long))
        if limit is not None and total > limit:
            break
    return total


def refuse_costly(data: bytes | memoryview, stored: int, what: str, where: object = None) -> None:
    """Raise :class:`~rlwire.FrameTooLargeError` naming ``what`` (and ``where``) if
    parsing ``data`` could build more than :func:`~rlwire._frame.bounds.heap_bytes` of
    ``stored``, the bytes it took where it was stored."""
    allowance = heap_bytes(stored)
    if json_cost(data, allowance) > allowance:
        raise FrameTooLargeError(
            f"{what}: parsing it could build over {allowance >> 20} MiB of Python objects "
            f"from {stored} stored bytes (the limit is {HEAP_RATIO} times its stored size "
            f"+ {HEAP_FLOOR >> 20} MiB): it is made of tiny values, such as empty lists or "
            "objects",
            where=where,
        )
