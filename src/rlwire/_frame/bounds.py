"""The one bound on what decoding a received message may allocate, from its stored size.

A message's bytes are stored once; what a reader builds from them is bounded by that
size, never by the sizes the message declares for itself (decompressed sizes, chunk
tables, item counts), which a hostile writer chooses. Every decode path (msgpack into a
type or into plain builtins, JSON, ``rlwire inspect``) draws on the same allowance:
:func:`heap_allowance`, computed once per message from :attr:`Frame.stored_nbytes
<rlwire._frame.frame.Frame.stored_nbytes>`. Decompression (:mod:`rlwire._frame.compression`)
draws on the same budget: ``max_compression_ratio`` times the stored size, less the
:data:`HEAP_FLOOR` kept for decoding. The two add up, never multiply, and a stored message
under 1 MB stays under 1 GiB in all (at most 1024 x 1 MB - 256 MiB decompressed, plus
256 MiB + 16 x 1 MB of objects).

Example:
    >>> from rlwire._frame.frame import Frame
    >>> heap_allowance(Frame(b"x" * 1000)) == HEAP_FLOOR + HEAP_RATIO * 1000
    True
"""

from __future__ import annotations

from rlwire._frame.frame import Frame

__all__ = ["HEAP_FLOOR", "HEAP_RATIO", "heap_allowance", "heap_bytes"]

#: Python objects decoded from any message may take this much heap...
HEAP_FLOOR = 256 << 20
#: ...plus this many times the bytes the message took where it was stored: far more than
#: any header rlwire's encoders write needs, far less than a hostile one could build.
HEAP_RATIO = 16


def heap_bytes(stored: int) -> int:
    """The bytes of Python objects decoding what was stored in ``stored`` bytes may
    build: :data:`HEAP_FLOOR` plus :data:`HEAP_RATIO` times ``stored``."""
    return HEAP_FLOOR + HEAP_RATIO * stored


def heap_allowance(frame: Frame) -> int:
    """:func:`heap_bytes` of ``frame``'s stored size (not its decompressed size)."""
    return heap_bytes(frame.stored_nbytes)
