"""The control packets, exactly as docs/format.md ("ZeroMQ messages") specifies them.

A control packet is a kind and a body (``ping`` is a kind alone): ``ready``, ``ack`` and
``bye`` go from a receiver to the sender; ``ping``, ``seal`` (which closes a message's
data packets: see :mod:`rlwire.transport.zmq._protocol`), ``abort``, ``end``, ``refuse``
and (2.2) ``absent`` from a sender to a receiver.

This module builds and checks them and touches no socket. What it writes is the wire
format: a change here is a change of docs/format.md, and of
:data:`~rlwire.transport.zmq._protocol.VERSION`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgspec

from rlwire._core.errors import CorruptFrameError
from rlwire.transport.zmq._protocol import VERSION

__all__ = [
    "ABORT",
    "ABSENT",
    "ABSENT_SINCE",
    "ACK",
    "BYE",
    "END",
    "PING",
    "READY",
    "REANNOUNCE_SECONDS",
    "REFUSE",
    "SEAL",
    "Ready",
    "Seal",
    "abort_packet",
    "absent_packet",
    "ack_packet",
    "bye_packet",
    "end_packet",
    "is_ping",
    "parse_abort",
    "parse_absent",
    "parse_ack",
    "parse_end",
    "parse_ready",
    "parse_refuse",
    "parse_seal",
    "ready_packet",
    "refuse_packet",
    "seal_packet",
]

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
#: Sender -> receiver (2.2), body: a step and how many ranks it was sent to (u64 LE
#: each): the step has no message for this receiver, whose rank is not among them.
ABSENT = b"absent"
#: The minor version from which a receiver reads ``absent``: one of 2.1 would refuse the
#: packet as corrupt, so it is sent only to receivers whose ``ready`` says this or more.
ABSENT_SINCE = 2
REANNOUNCE_SECONDS = 1.0

_ACK_BODY = struct.Struct("<8sQ")
_END_BODY = struct.Struct("<Q")
_ABSENT_BODY = struct.Struct("<QQ")
# session, seq: the body of an abort, and what opens the body of a seal
_MESSAGE_ID = struct.Struct("<8sQ")


class Seal(msgspec.Struct, frozen=True):
    """A ``seal`` packet: message ``seq`` of ``session`` is whole, and these are its
    ``checksums`` (packed little-endian u64, one per segment, or empty)."""

    session: bytes
    seq: int
    checksums: bytes


class Ready(msgspec.Struct, array_like=True, frozen=True):
    """The body of a ``ready`` packet: the receiver's major version, its rank, the
    pattern it expects (or nil), and since 2.1 its minor version (a 2.0 sender ignores
    it; a receiver that sends none is taken for 2.0, which carries no parts; one of 2.1
    is sent no ``absent``)."""

    major: int
    rank: int
    pattern: str | None = None
    minor: int = 0


_ready_decoder = msgspec.msgpack.Decoder(Ready)


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


def absent_packet(step: int, ranks: int) -> list[bytes]:
    """The ``absent`` packet: ``step`` went to ranks ``0 .. ranks - 1`` only, so it has
    no message for the receiver told."""
    return [ABSENT, _ABSENT_BODY.pack(step, ranks)]


def parse_absent(parts: Sequence[bytes | memoryview]) -> tuple[int, int] | None:
    """``(step, ranks)`` if ``parts`` is a sender's ``absent`` packet, else ``None``.

    Example:
        >>> parse_absent(absent_packet(7, 2)), parse_absent([b"absent", b"short"])
        ((7, 2), None)
    """
    if len(parts) != 2 or bytes(parts[0]) != ABSENT or len(parts[1]) != _ABSENT_BODY.size:
        return None
    step, ranks = _ABSENT_BODY.unpack(parts[1])
    return step, ranks


def is_ping(parts: Sequence[bytes | memoryview]) -> bool:
    """True if ``parts`` is a sender's ``ping``, which a receiver ignores."""
    return len(parts) == 1 and bytes(parts[0]) == PING


def ready_packet(rank: int, pattern: str | None = None) -> list[bytes]:
    """The ``ready`` packet of a receiver of ``rank`` that expects ``pattern`` (``None``:
    it named none): ``[major, rank, pattern or nil, minor]``.

    Example:
        >>> ready_packet(2), ready_packet(0, "shared")
        ([b'ready', b'\\x94\\x02\\x02\\xc0\\x02'], [b'ready', b'\\x94\\x02\\x00\\xa6shared\\x02'])
    """
    return [READY, msgspec.msgpack.encode([VERSION[0], rank, pattern, VERSION[1]])]


def parse_ready(body: bytes) -> Ready | None:
    """What a ``ready`` body announces (an unknown pattern reads as none), or ``None``
    if it is malformed or of another major version (a sender ignores such a receiver).

    Example:
        >>> parse_ready(ready_packet(2)[1]), parse_ready(b"\\x92\\x09\\x02")  # version 9
        (Ready(major=2, rank=2, pattern=None, minor=2), None)
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
