"""A rank's message as the objects it is stored as in Ray's object store, and back.

A message is one *main* object, and a *sidecar* object when some of its buffers go in
the sidecar. Each object is a list of :class:`pickle.PickleBuffer`, which Ray stores out
of band (a pickle of a few bytes, no globals) and hands back as read-only views of its
shared memory: no user data is ever pickled. The main object holds the envelope (a small
msgspec message rlwire writes: codec, segment sizes, compression, checksums, which
buffers are in the sidecar), the codec's header, then the buffers that are not in the
sidecar; the sidecar object holds the others, in buffer order.
"""

from __future__ import annotations

from pickle import PickleBuffer
from typing import Any

import msgspec

from rlwire._core.errors import CorruptFrameError, UnsupportedVersionError
from rlwire._frame.checksums import CHECKSUM, verify_segments
from rlwire._frame.frame import Frame
from rlwire._frame.pieces import Pieces

__all__ = [
    "ENVELOPE_VERSION",
    "Envelope",
    "Payload",
    "make_payload",
    "out_of_band",
    "parse_payload",
]

#: The version of the envelope this module writes and reads.
ENVELOPE_VERSION = 1
#: More than any envelope takes: one larger is refused unread.
_MAX_ENVELOPE_BYTES = 1 << 20


class Envelope(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """What a main object says about its message, before the header.

    Attributes:
        version: :data:`ENVELOPE_VERSION`.
        codec: the name of the codec that made the header.
        sizes: each segment's size in bytes (0 is the header, ``i + 1`` buffer ``i``).
        sidecar: the indices of the buffers stored in the sidecar object, ascending.
        compression: each segment's compression id, or empty when none is compressed.
        raw_sizes: each segment's size after decompression, or empty.
        checksum: the checksum algorithm, or ``""`` when none was recorded.
        checksums: each segment's checksum, packed little-endian u64.
    """

    version: int
    codec: str
    sizes: tuple[int, ...]
    sidecar: tuple[int, ...]
    compression: tuple[int, ...]
    raw_sizes: tuple[int, ...]
    checksum: str
    checksums: bytes


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Envelope)

#: What goes into the object store for one rank: the main object's buffers, and the
#: sidecar object's (``None`` when the message has no sidecar).
Payload = tuple[list[memoryview], list[memoryview] | None]


def out_of_band(views: list[memoryview]) -> list[PickleBuffer]:
    """The values of one object, as Ray stores them: each buffer out of band.

    Make them just before Ray takes them, and drop them right after (clear the list
    in a ``finally``): a PickleBuffer over a memoryview must never be left to the cyclic
    garbage collector (a traceback kept in a cycle): clearing a memoryview that still
    exports a buffer fails there, and CPython 3.11 was seen to crash in that collection.
    """
    return [PickleBuffer(view) for view in views]


def make_payload(frame: Frame, checksums: bytes | None) -> Payload:
    """The objects of ``frame``, whose buffers are memoryviews (the sender joined any
    :class:`~rlwire._frame.pieces.Pieces`), with ``checksums`` of its segments (packed
    u64, from :func:`~rlwire._frame.checksums.checksum_segments`) or ``None``. Nothing is
    copied: the buffers are the frame's own memory (wrap them with :func:`out_of_band`)."""
    views = [_view(b) for b in frame.buffers]
    sidecar = tuple(sorted(frame.sidecar))
    envelope = Envelope(
        version=ENVELOPE_VERSION,
        codec=frame.codec,
        sizes=(len(frame.header), *(v.nbytes for v in views)),
        sidecar=sidecar,
        compression=tuple(frame.compression),
        raw_sizes=tuple(frame.raw_sizes),
        checksum="" if checksums is None else CHECKSUM,
        checksums=checksums or b"",
    )
    main = [memoryview(_ENCODER.encode(envelope)), memoryview(frame.header)]
    main += [v for i, v in enumerate(views) if i not in frame.sidecar]
    side = [views[i] for i in sidecar] if sidecar else None
    return main, side


def _view(buffer: memoryview | Pieces) -> memoryview:
    if isinstance(buffer, Pieces):  # the sender joins them for a sink that does not gather
        raise TypeError("a ray:// frame buffer must be a memoryview, not Pieces")
    return buffer


def parse_payload(main: object, side: object, *, verify: bool, writable: bool, where: str) -> Frame:
    """The frame stored as ``main`` (and ``side``, ``None`` without a sidecar), the
    values ``ray.get`` returned for the objects :func:`make_payload` made, as views of
    them (copies, with ``writable``).

    Raises:
        CorruptFrameError: the objects are not such a message, or (with ``verify``) a
            segment does not match its checksum.
        UnsupportedVersionError: an envelope or checksum algorithm this reader does not
            know.
    """
    values = _views(main, "main object", where)
    if len(values) < 2:
        raise CorruptFrameError(
            f"the main object holds {len(values)} values, at least 2 expected", where=where
        )
    envelope = _envelope(values[0], where)
    segments = len(envelope.sizes)
    buffers = segments - 1
    sidecar = envelope.sidecar
    if (
        buffers < 0
        or list(sidecar) != sorted(set(sidecar))
        or any(not 0 <= i < buffers for i in sidecar)
    ):
        raise CorruptFrameError(
            f"the envelope's sidecar indices {list(sidecar)} do not fit {buffers} buffers",
            where=where,
        )
    side_values = [] if side is None else _views(side, "sidecar object", where)
    if (side is None) != (not sidecar):
        what = "has no sidecar object" if side is None else "has a sidecar object it lists none for"
        raise CorruptFrameError(f"the message {what}", where=where)
    if len(values) != 2 + buffers - len(sidecar) or len(side_values) != len(sidecar):
        raise CorruptFrameError(
            f"the envelope lists {buffers} buffers ({len(sidecar)} in the sidecar); the "
            f"objects hold {len(values) - 2} and {len(side_values)}",
            where=where,
        )
    main_buffers = iter(values[2:])
    side_buffers = iter(side_values)
    ordered = [values[1]]
    ordered += [next(side_buffers) if i in sidecar else next(main_buffers) for i in range(buffers)]
    for i, (view, size) in enumerate(zip(ordered, envelope.sizes, strict=True)):
        if view.nbytes != size:
            what = "the header" if i == 0 else f"buffer {i - 1}"
            raise CorruptFrameError(
                f"{what} is {view.nbytes} bytes, the envelope says {size}", where=where, segment=i
            )
    if verify and envelope.checksum:
        if len(envelope.checksums) != 8 * segments:
            raise CorruptFrameError(
                f"the envelope holds {len(envelope.checksums) // 8} checksums for "
                f"{segments} segments",
                where=where,
            )
        verify_segments(envelope.checksum, envelope.checksums, ordered, where)
    if writable:
        ordered = [memoryview(bytearray(view)) for view in ordered]
    try:
        return Frame(
            ordered[0],
            tuple(ordered[1:]),
            sidecar=frozenset(sidecar),
            codec=envelope.codec,
            compression=envelope.compression,
            raw_sizes=envelope.raw_sizes,
            stored_size=values[0].nbytes + sum(envelope.sizes),
        )
    except ValueError as exc:  # compression and raw_sizes that do not fit the segments
        raise CorruptFrameError(f"the envelope is inconsistent: {exc}", where=where) from exc


def _views(values: object, what: str, where: str) -> list[memoryview]:
    if not isinstance(values, list):
        raise CorruptFrameError(
            f"the {what} is a {type(values).__name__}, not a list of buffers", where=where
        )
    try:
        return [_flat(value) for value in values]
    except TypeError as exc:
        raise CorruptFrameError(
            f"the {what} holds a value that is not a buffer", where=where
        ) from exc


def _flat(value: Any) -> memoryview:
    view = memoryview(value)
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


def _envelope(view: memoryview, where: str) -> Envelope:
    if view.nbytes > _MAX_ENVELOPE_BYTES:
        raise CorruptFrameError(
            f"the envelope is {view.nbytes} bytes, more than {_MAX_ENVELOPE_BYTES}", where=where
        )
    try:
        envelope = _DECODER.decode(view)
    except msgspec.DecodeError as exc:
        raise CorruptFrameError(f"the envelope cannot be read: {exc}", where=where) from exc
    if envelope.version != ENVELOPE_VERSION:
        raise UnsupportedVersionError(
            f"envelope version {envelope.version} is not one this reader knows "
            f"({ENVELOPE_VERSION}); upgrade rlwire",
            where=where,
        )
    return envelope
