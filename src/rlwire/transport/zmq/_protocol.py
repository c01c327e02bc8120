"""The packets, exactly as docs/format.md ("ZeroMQ messages") specifies them.

A *packet* is one multipart ZeroMQ message. A message (one rank's frame of one step, one
part of a step filled part by part, or such a step's seal) travels as one or more *data
packets* (part 0: the prelude then the :class:`Head`, built by :func:`first_part`; parts
1 …: the message's next segments, unpadded), then a *seal* packet carrying the checksums
of every segment (:func:`seal_packet`). Control packets are a kind and a body: ``ready``,
``ack`` and ``bye`` go from a receiver to the sender, ``ping`` (a single part), ``seal``,
``abort``, ``end`` and ``refuse`` from a sender to a receiver.

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
    "ABORT",
    "ACK",
    "BYE",
    "END",
    "MAGIC",
    "PART",
    "PING",
    "READY",
    "REANNOUNCE_SECONDS",
    "REFUSE",
    "SEAL",
    "STEP_SEAL",
    "VERSION",
    "WHOLE",
    "Head",
    "Ready",
    "Seal",
    "abort_packet",
    "ack_packet",
    "bye_packet",
    "end_packet",
    "first_part",
    "frame_of",
    "is_ping",
    "make_head",
    "parse_abort",
    "parse_ack",
    "parse_data",
    "parse_end",
    "parse_ready",
    "parse_refuse",
    "parse_seal",
    "ready_packet",
    "refuse_packet",
    "seal_packet",
]

MAGIC = b"RLWZ"
#: (major, minor): a reader refuses a major version it does not know.
VERSION = (2, 1)
_PRELUDE = struct.Struct("<4sHH")
_PRELUDE_BYTES = _PRELUDE.pack(MAGIC, *VERSION)

#: Receiver -> sender, body :class:`Ready`: sent on connecting, and again after
#: :data:`REANNOUNCE_SECONDS` without news, so that a restarted sender learns who is there.
READY = b"ready"
#: Receiver -> sender, body: the session and ``seq`` of the last message read.
ACK = b"ack"
#: Receiver -> sender, empty body: the receiver is closing.
BYE = b"bye"
#: Sender -> receiver, a single part, ignored: finds receivers that vanished.
PING = b"ping"
#: Sender -> receiver, body: the end step (u64 LE): the sender finished the stream, and
#: no step at or after it will come.
END = b"end"
#: Sender -> receiver, body: the message's session and ``seq``, then its checksums: the
#: message's data packets are all sent.
SEAL = b"seal"
#: Sender -> receiver, body: the message's session and ``seq``: the sender stopped midway
#: through the message (a cancelled send); what arrived of it is discarded.
ABORT = b"abort"
#: Sender -> receiver, body: why (UTF-8, 1000 bytes at most): the sender sends nothing
#: to a receiver whose ``ready`` does not fit it (it expects the other pattern).
REFUSE = b"refuse"
_REFUSE_BYTES = 1000
REANNOUNCE_SECONDS = 1.0

_ACK_BODY = struct.Struct("<8sQ")
_END_BODY = struct.Struct("<Q")
# session, seq: the body of an abort, and what opens the body of a seal
_MESSAGE_ID = struct.Struct("<8sQ")


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


class Seal(msgspec.Struct, frozen=True):
    """A ``seal`` packet: message ``seq`` of ``session`` is whole, and these are its
    ``checksums`` (packed little-endian u64, one per segment, or empty)."""

    session: bytes
    seq: int
    checksums: bytes


class Ready(msgspec.Struct, array_like=True, frozen=True):
    """The body of a ``ready`` packet: the receiver's major version, its rank, the
    pattern it expects (or nil), and since 2.1 its minor version (a 2.0 sender ignores
    it; a receiver that sends none is taken for 2.0, which carries no parts)."""

    major: int
    rank: int
    pattern: str | None = None
    minor: int = 0


_head_encoder = msgspec.msgpack.Encoder()
_head_decoder = msgspec.msgpack.Decoder(Head)
_ready_decoder = msgspec.msgpack.Decoder(Ready)


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


def seal_packet(session: bytes, seq: int, checksums: bytes) -> list[bytes]:
    """The ``seal`` of message ``seq`` of ``session``: its data packets are all sent, and
    ``checksums`` are its segments' (packed little-endian u64, or empty for none)."""
    return [SEAL, _MESSAGE_ID.pack(session, seq) + checksums]


def parse_seal(parts: Sequence[bytes | memoryview], *, where: str) -> Seal | None:
    """The seal if ``parts`` is a ``seal`` packet, else ``None``.

    Raises:
        CorruptFrameError: a seal whose body is malformed; ``where`` says where.

    Example:
        >>> parse_seal(seal_packet(b"S" * 8, 3, b""), where="ipc:///run")
        Seal(session=b'SSSSSSSS', seq=3, checksums=b'')
    """
    if len(parts) != 2 or bytes(parts[0]) != SEAL:
        return None
    body = bytes(parts[1])
    if len(body) < _MESSAGE_ID.size or (len(body) - _MESSAGE_ID.size) % 8:
        raise CorruptFrameError(f"malformed seal ({len(body)}-byte body)", where=where)
    session, seq = _MESSAGE_ID.unpack_from(body)
    return Seal(session, seq, body[_MESSAGE_ID.size :])


def abort_packet(session: bytes, seq: int) -> list[bytes]:
    """The ``abort`` of message ``seq`` of ``session``: the sender stopped midway."""
    return [ABORT, _MESSAGE_ID.pack(session, seq)]


def parse_abort(parts: Sequence[bytes | memoryview]) -> tuple[bytes, int] | None:
    """``(session, seq)`` if ``parts`` is an ``abort`` packet, else ``None``.

    Example:
        >>> parse_abort(abort_packet(b"S" * 8, 3)), parse_abort([b"abort", b"short"])
        ((b'SSSSSSSS', 3), None)
    """
    if len(parts) != 2 or bytes(parts[0]) != ABORT or len(parts[1]) != _MESSAGE_ID.size:
        return None
    session, seq = _MESSAGE_ID.unpack(parts[1])
    return session, seq


def end_packet(end: int) -> list[bytes]:
    """The ``end`` packet: no step at or after ``end`` will come."""
    return [END, _END_BODY.pack(end)]


def parse_end(parts: Sequence[bytes | memoryview]) -> int | None:
    """The end step if ``parts`` is a sender's ``end`` packet, else ``None``."""
    if len(parts) != 2 or bytes(parts[0]) != END or len(parts[1]) != _END_BODY.size:
        return None
    return int(_END_BODY.unpack(parts[1])[0])


def is_ping(parts: Sequence[bytes | memoryview]) -> bool:
    """True if ``parts`` is a sender's ``ping``, which a receiver ignores."""
    return len(parts) == 1 and bytes(parts[0]) == PING


def parse_data(parts: Sequence[bytes | memoryview], *, where: str) -> tuple[Head, list[memoryview]]:
    """Check a received data packet as docs/format.md asks a reader to, before anything
    is decoded: the prelude and the version, the head, and that the head's counts agree
    with each other. Which receiver it is for, whether it follows on from the packets
    before it, and checksums are left to the caller.

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
    first = bytes(parts[0])
    if len(first) < _PRELUDE.size:
        raise CorruptFrameError(f"not an rlwire packet ({len(first)}-byte head)", where=where)
    magic, major, _minor = _PRELUDE.unpack_from(first)
    check_magic(magic, major, expected=MAGIC, known=VERSION[0], what="ZeroMQ packet", where=where)
    try:
        head = _head_decoder.decode(first[_PRELUDE.size :])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise CorruptFrameError(f"malformed packet head: {exc}", where=where) from exc
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


def ready_packet(rank: int, pattern: str | None = None) -> list[bytes]:
    """The ``ready`` packet of a receiver of ``rank`` that expects ``pattern`` (``None``:
    it named none): ``[major, rank, pattern or nil, minor]``.

    Example:
        >>> ready_packet(2), ready_packet(0, "shared")
        ([b'ready', b'\\x94\\x02\\x02\\xc0\\x01'], [b'ready', b'\\x94\\x02\\x00\\xa6shared\\x01'])
    """
    return [READY, msgspec.msgpack.encode([VERSION[0], rank, pattern, VERSION[1]])]


def parse_ready(body: bytes) -> Ready | None:
    """What a ``ready`` body announces (an unknown pattern reads as none), or ``None``
    if it is malformed or of another major version (a sender ignores such a receiver).

    Example:
        >>> parse_ready(ready_packet(2)[1]), parse_ready(b"\\x92\\x09\\x02")  # version 9
        (Ready(major=2, rank=2, pattern=None, minor=1), None)
    """
    try:
        ready = _ready_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    if ready.pattern not in (None, "ranks", "shared"):
        ready = msgspec.structs.replace(ready, pattern=None)
    return ready if ready.major == VERSION[0] and ready.rank >= 0 else None


def refuse_packet(reason: str) -> list[bytes]:
    """The ``refuse`` packet: the sender will send this receiver nothing, for ``reason``."""
    return [REFUSE, reason.encode()[:_REFUSE_BYTES]]


def parse_refuse(parts: Sequence[bytes | memoryview]) -> str | None:
    """Why the sender refused this receiver, if ``parts`` is a ``refuse`` packet."""
    if len(parts) != 2 or bytes(parts[0]) != REFUSE:
        return None
    return bytes(parts[1])[:_REFUSE_BYTES].decode(errors="replace")


def ack_packet(session: bytes, seq: int) -> list[bytes]:
    """The ``ack`` packet of a receiver that has read message ``seq`` of ``session``.

    Example:
        >>> ack_packet(b"S" * 8, 7)
        [b'ack', b'SSSSSSSS\\x07\\x00\\x00\\x00\\x00\\x00\\x00\\x00']
    """
    return [ACK, _ACK_BODY.pack(session, seq)]


def parse_ack(body: bytes) -> tuple[bytes, int] | None:
    """``(session, seq)`` of an ``ack`` body, or ``None`` if it is malformed.

    Example:
        >>> parse_ack(ack_packet(b"S" * 8, 7)[1]), parse_ack(b"short")
        ((b'SSSSSSSS', 7), None)
    """
    if len(body) != _ACK_BODY.size:
        return None
    session, seq = _ACK_BODY.unpack(body)
    return session, seq


def bye_packet() -> list[bytes]:
    """The ``bye`` packet of a receiver that is closing."""
    return [BYE, b""]
