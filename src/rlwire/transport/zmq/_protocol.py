"""The data packets, exactly as docs/format.md ("ZeroMQ messages") specifies them.

A *packet* is one multipart ZeroMQ message. A message (one rank's frame of one step, one
part of a step filled part by part, or such a step's seal) travels as one or more *data
packets* (part 0: the prelude then the :class:`Head`, built by :func:`first_part`; parts
1 …: the message's next segments, unpadded), then a *seal* packet carrying the checksums
of every segment. The seal and the other control packets, a kind and a body, live in
:mod:`rlwire.transport.zmq._control`.

This module builds and checks those parts and touches no socket. What it writes is the
wire format: a change here is a change of docs/format.md, and of :data:`VERSION`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgspec

from rlwire._core.errors import CorruptFrameError
from rlwire._frame.checksums import CHECKSUM
from rlwire._frame.frame import Frame
from rlwire.transport._stored.layout import check_magic

__all__ = [
    "MAGIC",
    "PART",
    "STEP_SEAL",
    "VERSION",
    "WHOLE",
    "Head",
    "first_part",
    "frame_of",
    "make_head",
    "parse_data",
    "parse_head",
]

MAGIC = b"RLWZ"
#: (major, minor): a reader refuses a major version it does not know.
VERSION = (2, 2)
_PRELUDE = struct.Struct("<4sHH")
_PRELUDE_BYTES = _PRELUDE.pack(MAGIC, *VERSION)


class Head(msgspec.Struct, array_like=True, frozen=True):
    """What part 0 of a data packet carries after the prelude, field by field as
    docs/format.md lists them. The data packets of one message differ only in ``index``.

    Attributes:
        session: 8 random bytes, new for every sender.
        seq: how many messages this session sent to this receiver before this one.
        step: the step.
        rank: the rank whose payload this is (meaningless when ``shared``).
        shared: true for the ``shared`` pattern.
        codec: the name of the codec that made the header.
        sidecar: indices of the buffers the sender named sidecar fields.
        compression: one compression id per segment, or empty.
        raw_sizes: each segment's size before compression, or empty.
        checksum: ``"xxh3-64"`` (the seal carries one per segment), or ``None``.
        segments: how many segments the message has (the header and the buffers).
        index: this data packet's place among the message's, from 0.
        count: how many data packets the message has.
        kind: since 2.1: :data:`WHOLE`, :data:`PART` or :data:`STEP_SEAL`.
        part: since 2.1, of a part: its index among its rank's parts of the step.
        key: since 2.1, of a part: its producer's key.
        cost: since 2.1, of a part: its cost.
    """

    session: bytes
    seq: int
    step: int
    rank: int
    shared: bool
    codec: str
    sidecar: list[int]
    compression: bytes
    raw_sizes: list[int]
    checksum: str | None
    segments: int
    index: int
    count: int
    kind: int = 0
    part: int = 0
    key: str | int | None = None
    cost: float = 0.0


#: A head's ``kind`` (2.1): a step's whole message for a rank, a part of a step filled part
#: by part, or the seal closing such a step (one segment: msgpack ``[keys, costs]``).
WHOLE, PART, STEP_SEAL = 0, 1, 2


_head_encoder = msgspec.msgpack.Encoder()
_head_decoder = msgspec.msgpack.Decoder(Head)


def make_head(
    frame: Frame, *, session: bytes, step: int, rank: int, shared: bool, checksum: bool
) -> Head:
    """The head of the data packets that carry ``frame``, with ``seq``, ``index`` and
    ``count`` left at 0 for :func:`first_part` to set. With ``checksum``, the seal will
    carry the xxh3-64 of every segment.
    """
    return Head(
        session=session,
        seq=0,
        step=step,
        rank=rank,
        shared=shared,
        codec=frame.codec,
        sidecar=sorted(frame.sidecar),
        compression=bytes(frame.compression),
        raw_sizes=list(frame.raw_sizes),
        checksum=CHECKSUM if checksum else None,
        segments=1 + len(frame.buffers),
        index=0,
        count=0,
    )


def first_part(head: Head, *, seq: int, index: int, count: int) -> bytes:
    """Part 0 of data packet ``index`` of ``count``, of message ``seq`` of its session to
    one receiver: the prelude, then ``head`` (a whole step's without the fields of 2.1)."""
    values = msgspec.structs.astuple(head)
    values = (*values[:1], seq, *values[2:11], index, count, *(values[13:] if head.kind else ()))
    return _PRELUDE_BYTES + _head_encoder.encode(values)


def parse_head(first: bytes | memoryview, *, where: str) -> Head:
    """The head of a data packet whose part 0 is ``first``: its prelude and version
    checked, its counts not (:func:`parse_data` checks them against the packet).

    Raises:
        UnsupportedVersionError: a major version this reader does not know.
        CorruptFrameError: not a data packet's part 0, or a malformed head.
    """
    first = bytes(first)
    if len(first) < _PRELUDE.size:
        raise CorruptFrameError(f"not an rlwire packet ({len(first)}-byte head)", where=where)
    magic, major, _minor = _PRELUDE.unpack_from(first)
    check_magic(magic, major, expected=MAGIC, known=VERSION[0], what="ZeroMQ packet", where=where)
    try:
        return _head_decoder.decode(first[_PRELUDE.size :])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise CorruptFrameError(f"malformed packet head: {exc}", where=where) from exc


def parse_data(
    parts: Sequence[bytes | memoryview], *, where: str, head: Head | None = None
) -> tuple[Head, list[memoryview]]:
    """Check a received data packet as docs/format.md asks a reader to, before anything
    is decoded: the prelude and the version, the head (``head``: :func:`parse_head`
    of its part 0, already), and that the head's counts agree with each other. Which
    receiver it is for, whether it follows on from the packets before it, and checksums
    are left to the caller.

    Returns:
        The head, and a view of each segment it carries (parts 1 …), not copied.

    Raises:
        UnsupportedVersionError: a major version this reader does not know.
        CorruptFrameError: anything else that is not as specified; ``where`` says where.

    Example:
        >>> parse_data([b"xy"], where="ipc:///run")
        Traceback (most recent call last):
        ...
        rlwire.errors.CorruptFrameError: ipc:///run: not an rlwire packet (2-byte head)
    """
    if head is None:
        head = parse_head(parts[0], where=where)
    carried = len(parts) - 1
    if not 0 <= head.index < head.count or not 1 <= carried <= head.segments:
        raise CorruptFrameError(
            f"the head disagrees with the packet: data packet {head.index} of "
            f"{head.count} carries {carried} of {head.segments} segments",
            where=where,
        )
    for what, found in (
        ("compression ids", len(head.compression)),
        ("raw sizes", len(head.raw_sizes)),
    ):
        expected = head.segments if head.compression else 0
        if found != expected:
            raise CorruptFrameError(
                f"the head disagrees with the packet: {head.segments} segments, "
                f"{found} {what} (expected {expected})",
                where=where,
            )
    return head, [memoryview(part) for part in parts[1:]]


def frame_of(head: Head, segments: Sequence[memoryview], *, where: str) -> Frame:
    """The Frame of a checked message: its segments, described by its head.

    Raises:
        CorruptFrameError: the head's description does not fit the segments.
    """
    try:
        return Frame(
            segments[0],
            tuple(segments[1:]),
            frozenset(head.sidecar),
            head.codec,
            tuple(head.compression),
            tuple(head.raw_sizes),
        )
    except ValueError as exc:
        raise CorruptFrameError(str(exc), where=where) from exc
