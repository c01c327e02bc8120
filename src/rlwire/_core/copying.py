"""Copies into new ``bytes`` or ``bytearray`` objects, with the GIL left free.

``bytes(view)`` copies in one call that holds the GIL: a 45 MB field stalls every other
thread, the event loop included, for the whole copy (tens of milliseconds, hundreds on
memory that must first be faulted in). Here the new object is made without being
filled, then filled by ``memmove`` calls that release the GIL, a bounded number of bytes
each, one per slice. The object is not handed out until it is full, so nothing sees it
half-copied.
"""

from __future__ import annotations

import ctypes
from typing import TypeVar

import numpy as np

from rlwire._core.slicing import Sliced, SliceTimer

__all__ = ["COPY_CHUNK_BYTES", "concatenated", "copied", "copied_into"]

#: Bytes copied per ``memmove`` call (and per slice).
COPY_CHUNK_BYTES = 8 << 20
# Below this a copy under the GIL is shorter than a slice: not worth the ctypes calls.
_SMALL = 1 << 20

B = TypeVar("B", bytes, bytearray)


def _c_api(name: str, restype: object, *argtypes: object) -> ctypes._CFunctionType:
    function: ctypes._CFunctionType = getattr(ctypes.pythonapi, name)
    function.restype = restype  # type: ignore[assignment]
    function.argtypes = argtypes  # type: ignore[assignment]
    return function


# ``FromStringAndSize(NULL, n)`` makes an object of n bytes left unset: documented C API.
_new = {
    bytes: _c_api("PyBytes_FromStringAndSize", ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t),
    bytearray: _c_api(
        "PyByteArray_FromStringAndSize", ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t
    ),
}
_address = {
    bytes: _c_api("PyBytes_AsString", ctypes.c_void_p, ctypes.py_object),
    bytearray: _c_api("PyByteArray_AsString", ctypes.c_void_p, ctypes.py_object),
}


def copied(view: memoryview, kind: type[B]) -> Sliced[B]:
    """A new ``kind`` (``bytes`` or ``bytearray``) holding a copy of ``view``'s bytes.

    Example:
        >>> from rlwire._core.slicing import run_sliced
        >>> run_sliced(copied(memoryview(b"abc"), bytes))
        b'abc'
    """
    n = view.nbytes
    if n < _SMALL or not view.c_contiguous:
        return kind(view)
    out: B = _new[kind](None, n)
    target = _address[kind](out)
    source = np.frombuffer(view.cast("B"), np.uint8)  # keeps the buffer alive while copying
    start_of = int(source.ctypes.data)
    for start in range(0, n, COPY_CHUNK_BYTES):
        ctypes.memmove(target + start, start_of + start, min(COPY_CHUNK_BYTES, n - start))
        yield
    return out


def concatenated(parts: list[bytes | memoryview], size: int) -> Sliced[bytes]:
    """``b"".join(parts)``, whose total length is ``size``; each part is released from
    ``parts`` once copied, so the parts and the result are not both held whole. A
    memoryview part must be a flat, contiguous byte view.

    Example:
        >>> from rlwire._core.slicing import run_sliced
        >>> run_sliced(concatenated([b"ab", b"c"], 3))
        b'abc'
    """
    if size < _SMALL:
        return b"".join(parts)
    out: bytes = _new[bytes](None, size)
    target = _address[bytes](out)
    offset = copied_since_yield = 0
    timer = SliceTimer()
    for i, part in enumerate(parts):
        n = len(part)
        if offset + n > size:
            raise ValueError(f"the parts hold more than {size} bytes")
        source = part if type(part) is bytes else np.frombuffer(part, np.uint8).ctypes.data
        ctypes.memmove(target + offset, source, n)
        parts[i] = b""
        offset += n
        copied_since_yield += n
        # Thousands of small parts cost microseconds of Python each: a slice ends by time
        # too, not only by bytes.
        if copied_since_yield >= COPY_CHUNK_BYTES or timer.due():
            copied_since_yield = 0
            yield
            timer.restart()
    if offset != size:
        raise ValueError(f"the parts hold {offset} bytes, not {size}")
    return out


def copied_into(parts: list[bytes | memoryview], target: np.ndarray) -> Sliced[None]:
    """Copy ``parts`` back to back into ``target``, a writable C-contiguous uint8 array
    exactly as long as they are, about COPY_CHUNK_BYTES per slice. Memory the caller
    keeps from one use to the next has its pages faulted in already. numpy copies each
    part with the GIL released (and in a fraction of the per-call cost of ``memmove``
    through ctypes, which counts when the parts are thousands of rows).

    Example:
        >>> from rlwire._core.slicing import run_sliced
        >>> out = np.zeros(3, np.uint8)
        >>> run_sliced(copied_into([b"ab", memoryview(b"c")], out)); out.tobytes()
        b'abc'
    """
    size = target.nbytes
    offset = copied_since_yield = 0
    timer = SliceTimer()
    for part in parts:
        n = part.nbytes if isinstance(part, memoryview) else len(part)
        if offset + n > size:
            raise ValueError(f"the parts hold more than {size} bytes")
        if type(part) is not memoryview or part.format != "B":  # numpy reads bytes as text
            part = np.frombuffer(part, np.uint8).data
        if n <= COPY_CHUNK_BYTES:  # the common case: a row
            target[offset : offset + n] = part
            copied_since_yield += n
        else:  # a huge part: a slice per chunk
            for start in range(0, n, COPY_CHUNK_BYTES):
                yield
                stop = min(n, start + COPY_CHUNK_BYTES)
                target[offset + start : offset + stop] = part[start:stop]
            copied_since_yield = COPY_CHUNK_BYTES
        offset += n
        # Thousands of rows cost a couple of microseconds each (8 MiB of rows of 8-16 KiB
        # held the GIL 2 ms): a slice ends by time too, not only by bytes.
        if copied_since_yield >= COPY_CHUNK_BYTES or timer.due():
            copied_since_yield = 0
            yield
            timer.restart()
    if offset != size:
        raise ValueError(f"the parts hold {offset} bytes, not {size}")
