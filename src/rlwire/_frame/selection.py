"""Partial reads: which buffers of a message a receiver needs, asked before they are read.

A receiver opened with ``fields=`` reads only the buffers of those fields. Transport
cannot tell which buffers those are (it never decodes a header), and codecs never see
where bytes are stored; a :data:`Selector` joins them. A source that can read part of a
message reads its codec header first, then calls the selector with a frame holding that
header and the buffers read so far (the others :attr:`~rlwire.Frame.missing`, as empty
views), reads what it answers, and calls it again until it asks for nothing new.
Checksums are verified, and segments decompressed, only for what was read.

Example:
    >>> from rlwire._frame.frame import Frame
    >>> def first_only(frame: Frame) -> Selection:
    ...     return Selection(frozenset({0}))
    >>> frame = Frame(b"h", (memoryview(b""),) * 3, missing=frozenset({0, 1, 2}))
    >>> sorted(first_only(frame).buffers)
    [0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlwire._frame.frame import Frame

__all__ = ["Selection", "Selector"]


@dataclass(frozen=True)
class Selection:
    """The buffers a receiver needs of one message.

    Attributes:
        buffers: indices of the buffers to read (the header is always read).
        complete: False when buffers in ``buffers`` must be read before the rest can be
            told (a container chunked into a buffer may refer to others): a source
            that reads by ranges asks again once they are read; one that cannot ask
            again (a stream, deciding as data arrives) keeps every buffer.
    """

    buffers: frozenset[int]
    complete: bool = True


#: Given a frame holding its codec header (as stored: possibly compressed) and the
#: buffers read so far, the buffers the receiver needs: a :class:`Selection`, or ``None``
#: for all of them. May raise an :class:`~rlwire.RlwireError` (a field the message does
#: not hold), which the source passes on.
Selector = Callable[[Frame], "Selection | None"]
