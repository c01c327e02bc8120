"""The one bound on what decoding a received message may allocate, from its stored size.

A message's bytes are stored once; what a reader builds from them is bounded by that
size, never by the sizes the message declares for itself (decompressed sizes, chunk
tables, item counts), which a hostile writer chooses. Every decode path (msgpack into a
type or into plain builtins, JSON, ``rlwire inspect``) draws on the same allowance:
:func:`heap_allowance`, computed once per message from :attr:`Frame.stored_nbytes
<rlwire._frame.frame.Frame.stored_nbytes>`. Decompression has its own bound
(:mod:`rlwire._frame.compression`), on the same stored size, so the two add up, never
multiply.

Example:
    >>> from rlwire._frame.frame import Frame
    >>> heap_allowance(Frame(b"x" * 1000)) == HEAP_FLOOR + HEAP_RATIO * 1000
    True
"""

from __future__ import annotations

from rlwire._frame.frame import Frame

__all__ = ["HEAP_FLOOR", "HEAP_RATIO", "heap_allowance"]

#: Python objects decoded from any message may take this much heap...
HEAP_FLOOR = 256 << 20
#: ...plus this many times the bytes the message took where it was stored: far more than
#: any header rlwire's encoders write needs, far less than a hostile one could build.
HEAP_RATIO = 16


def heap_allowance(frame: Frame) -> int:
    """The bytes of Python objects decoding ``frame`` may build: :data:`HEAP_FLOOR` plus
    :data:`HEAP_RATIO` times its stored size (not its decompressed size)."""
    return HEAP_FLOOR + HEAP_RATIO * frame.stored_nbytes
