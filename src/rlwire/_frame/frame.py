"""Frame: the unit every codec produces and every sink moves.

A Frame is a small structured header plus raw out-of-band buffers that are never
copied into it (the shape pickle protocol 5, Dask's protocol and safetensors share).
Codecs decide what goes out-of-band; sinks decide where each buffer travels. A buffer
a sender holds in many arrays is a :class:`~rlwire._frame.pieces.Pieces`: its runs are
written back to back, as one buffer (received as one contiguous view).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from rlwire._core.copying import copied_into
from rlwire._core.slicing import Sliced
from rlwire._frame.pieces import Pieces

__all__ = ["Frame", "JoinSpace", "as_byte_view", "joined_pieces"]


def as_byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    """Return a flat, C-contiguous unsigned-byte view of ``data`` without copying."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.ndim == 1 and view.format == "B":
        return view
    return view.cast("B")


@dataclass(frozen=True, slots=True)
class Frame:
    """A header plus out-of-band buffers.

    Attributes:
        header: the codec's small structured header.
        buffers: raw byte views; their memory belongs to the objects they came from
            (for example numpy arrays) or to what was received (an mmap, a socket frame).
            On the sending side a buffer may be a :class:`~rlwire._frame.pieces.Pieces`,
            runs of bytes stored back to back as that one buffer (same table entry, same
            bytes, same checksum as the joined runs); a frame a source returns holds
            memoryviews only.
        sidecar: indices into ``buffers`` that travel in the sidecar rather than beside
            the header (see ``open_sender(..., sidecar=...)``).
        codec: the name of the codec that made the header; receivers decode with the
            codec registered under this name.
        compression: how each *segment* (0 is the header, ``i + 1`` is buffer ``i``) is
            compressed: an id per segment (0 none, 1 lz4, 2 zstd), or ``()`` when none is.
        raw_sizes: each segment's size after decompression, or ``()`` when none is
            compressed.
        stored_size: the bytes the message took where it was stored or received (its
            files, its packets), when a source knows it; decompression keeps it. Every
            allocation bound of a receiver is computed from it (:attr:`stored_nbytes`),
            never from sizes the message declares.
        missing: indices of the buffers a source did not read (a partial read, see
            :mod:`rlwire._frame.selection`): each is an empty view, neither verified nor
            decompressed, and the codec must not need it.
        verified: True when the source that read it checked every segment against a
            checksum the message carried (False: a message without checksums, a
            source with ``verify=False``, or one that does not say).
        message_id: the id of the stored message the frame was read from, which
            tells it from any other message stored as the same step and rank (a
            file's or object's envelope ``id``; on ``ray://``, the step's commit, or
            the run of a step filled part by part's parts); ``b""``
            where the source has none (ZeroMQ, a frame made in memory).
            ``add_fields(..., of=)`` compares it.

    Example:
        >>> frame = Frame(b"hdr", (memoryview(b"payload"),))
        >>> frame.nbytes
        10
    """

    header: bytes | memoryview
    buffers: Sequence[memoryview | Pieces] = ()
    sidecar: frozenset[int] = field(default_factory=frozenset)
    codec: str = "msgpack"
    compression: tuple[int, ...] = ()
    raw_sizes: tuple[int, ...] = ()
    stored_size: int | None = None
    missing: frozenset[int] = field(default_factory=frozenset)
    verified: bool = False
    message_id: bytes = b""

    def __post_init__(self) -> None:
        bad = [i for i in self.sidecar if not 0 <= i < len(self.buffers)]
        if bad:
            raise ValueError(
                f"sidecar indices {sorted(bad)} out of range for {len(self.buffers)} buffers"
            )
        segments = len(self.buffers) + 1
        if self.compression and not (len(self.compression) == len(self.raw_sizes) == segments):
            raise ValueError(
                f"compression and raw_sizes need one entry per segment ({segments}), got "
                f"{len(self.compression)} and {len(self.raw_sizes)}"
            )

    @property
    def nbytes(self) -> int:
        """Total size of the header and all buffers, in bytes."""
        return len(self.header) + sum(b.nbytes for b in self.buffers)

    def views(self) -> list[memoryview]:
        """The buffers as memoryviews: as they are for a received frame, whose buffers
        are memoryviews only; a :class:`~rlwire._frame.pieces.Pieces` is joined (a copy).

        Example:
            >>> frame = Frame(b"h", (Pieces([memoryview(b"ab"), memoryview(b"c")]),))
            >>> [bytes(view) for view in frame.views()]
            [b'abc']
        """
        return [b.joined() if isinstance(b, Pieces) else b for b in self.buffers]

    @property
    def stored_nbytes(self) -> int:
        """The bytes the message took where it was stored: :attr:`stored_size` when a
        source recorded it, else :attr:`nbytes`."""
        return self.nbytes if self.stored_size is None else self.stored_size


def joined_pieces(frame: Frame) -> Sliced[Frame]:
    """``frame`` with every :class:`~rlwire._frame.pieces.Pieces` buffer joined into one
    memoryview (copies made in slices, the GIL released), for a sink that writes
    memoryviews only; ``frame`` itself when it holds none.

    Example:
        >>> from rlwire._core.slicing import run_sliced
        >>> frame = Frame(b"h", (Pieces([memoryview(b"ab"), memoryview(b"c")]),))
        >>> bytes(run_sliced(joined_pieces(frame)).buffers[0])
        b'abc'
    """
    if not any(isinstance(b, Pieces) for b in frame.buffers):
        return frame
    buffers: list[memoryview] = []
    for b in frame.buffers:
        buffers.append((yield from b.joined_sliced()) if isinstance(b, Pieces) else b)
    return replace(frame, buffers=tuple(buffers))


class JoinSpace:
    """Memory kept from one message to the next to join
    :class:`~rlwire._frame.pieces.Pieces` into, for a sink that has copied each message
    elsewhere before it joins the next (into Ray's object store, say). A new allocation
    of a few hundred megabytes costs more in page faults than the copy itself; these
    pages are faulted in by the first message and warm for every later one. It grows to
    the largest message's Pieces and keeps that much memory while the sink lives.

    Example:
        >>> from rlwire._core.slicing import run_sliced
        >>> space = JoinSpace()
        >>> frame = Frame(b"h", (Pieces([memoryview(b"ab"), memoryview(b"c")]),))
        >>> bytes(run_sliced(space.joined(frame)).buffers[0])
        b'abc'
        >>> run_sliced(space.joined(Frame(b"h", (Pieces([]),)))).buffers[0].nbytes
        0
    """

    def __init__(self) -> None:
        self._block = np.empty(0, np.uint8)

    def joined(self, frame: Frame) -> Sliced[Frame]:
        """``frame`` with every Pieces buffer joined into this space (read-only views of
        it, valid until the next call); ``frame`` itself when it holds none."""
        pieces = [b for b in frame.buffers if isinstance(b, Pieces)]
        if not pieces:
            return frame
        need = sum(b.nbytes for b in pieces)
        if self._block.nbytes < need:
            self._block = np.empty(0, np.uint8)  # let the old block go before the new
            self._block = np.empty(need, np.uint8)
        buffers: list[memoryview] = []
        offset = 0
        for b in frame.buffers:
            if isinstance(b, Pieces):
                target = self._block[offset : offset + b.nbytes]
                yield from copied_into(list(b.runs), target)
                buffers.append(target.data.toreadonly())
                offset += b.nbytes
            else:
                buffers.append(b)
        return replace(frame, buffers=tuple(buffers))
