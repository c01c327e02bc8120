"""How a receiver takes a packet off its socket: part by part, each part checked against
what the packet may hold before the next one is taken.

ZeroMQ hands over a packet (a multipart message) only whole, but its parts can be taken
one at a time. A control packet has at most :data:`CONTROL_PARTS` parts. A data packet's
head comes first, and bounds the rest: no more segments than its message has left, and
no more than :data:`SPARE_SEGMENTS` beyond one per :data:`BYTES_PER_SEGMENT` bytes of the
message received so far (an honest message's buffers are far larger than that; a
hostile one of millions of empty parts, a few bytes each on the wire, would otherwise
cost the reader a Python object each). A packet found bad is refused at once
(``CorruptFrameError``); its parts left are then discarded, unkept, a slice of
:data:`DRAIN_SECONDS` per read, so that a receive keeps its timeout.
"""

from __future__ import annotations

import time

import zmq

from rlwire._core.errors import CorruptFrameError
from rlwire.transport.zmq._control import ABORT, ABSENT, END, PING, REFUSE, SEAL
from rlwire.transport.zmq._protocol import Head, parse_head
from rlwire.transport.zmq._reassembly import Reassembly
from rlwire.transport.zmq._sockets import Socket

__all__ = ["BYTES_PER_SEGMENT", "CONTROL_PARTS", "DRAIN_SECONDS", "SPARE_SEGMENTS", "Incoming"]

#: The most parts of a packet that is not a data packet: a kind and a body.
CONTROL_PARTS = 2
#: A message's segments may number one per this many bytes of it...
BYTES_PER_SEGMENT = 64
#: ...plus this many.
SPARE_SEGMENTS = 65_536
#: How long one read goes on discarding the parts of a packet refused.
DRAIN_SECONDS = 0.05

_CONTROL = frozenset({PING, SEAL, ABORT, END, REFUSE, ABSENT})
_EMPTY = memoryview(b"")
_SMALL = 64  # parts this short are copied: a ZeroMQ frame kept costs more than they hold


class Incoming:
    """The packets arriving on one receiver's socket."""

    def __init__(self) -> None:
        self._discarding = False  # the parts left of a packet refused

    def take(
        self, sock: Socket, reassembly: Reassembly, *, where: str
    ) -> tuple[list[memoryview], Head | None] | None:
        """The next packet on ``sock``, as read-only views of its parts, and its head if
        it is a data packet of more than one part; ``None`` while the parts of a packet
        refused are still being discarded.

        Raises:
            zmq.Again: no packet waits.
            zmq.ZMQError: the socket cannot receive.
            CorruptFrameError: a packet of more parts than it may hold (``reassembly``
                drops the message under way), or a data packet whose head is malformed.
            UnsupportedVersionError: a data packet of a major version this reader does
                not know.
        """
        if self._discarding and not self._discard(sock):
            return None
        first = sock.recv(zmq.NOBLOCK, copy=False)
        parts = [_view(first)]
        if not sock.getsockopt(zmq.RCVMORE):
            return parts, None
        head, segments, nbytes, check = None, 0, 0, CONTROL_PARTS
        kind = bytes(parts[0][:8])  # a control packet's whole part 0, if one
        try:
            if kind not in _CONTROL:
                head = parse_head(parts[0], where=where)
                segments, nbytes = reassembly.held(head)
                check = 1 + min(head.segments, SPARE_SEGMENTS) - segments  # parts unchecked
            while sock.getsockopt(zmq.RCVMORE):
                part = _view(sock.recv(zmq.NOBLOCK, copy=False))
                parts.append(part)
                nbytes += len(part)
                if len(parts) > check:  # past what any head allows: check each part
                    if head is None:
                        raise CorruptFrameError(
                            f"a {kind.decode()!r} packet of more than {CONTROL_PARTS} parts",
                            where=where,
                        )
                    _check_room(
                        head, len(parts) - 1, segments + len(parts) - 1, nbytes, where=where
                    )
        except CorruptFrameError as exc:  # UnsupportedVersionError too
            reassembly.drop()
            self._discarding = bool(sock.get(zmq.RCVMORE))
            if head is not None:
                exc.add_context(step=head.step)
            raise
        return parts, head

    def _discard(self, sock: Socket) -> bool:
        """Discard the parts left of a packet refused, for :data:`DRAIN_SECONDS` at
        most: True once none is left."""
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            for _ in range(1024):
                sock.recv(zmq.NOBLOCK)
                if not sock.get(zmq.RCVMORE):
                    self._discarding = False
                    return True
        return False


def _view(part: zmq.Frame) -> memoryview:
    """A read-only view of a received part (numpy makes read-only arrays of it)."""
    size = len(part)
    if size == 0:
        return _EMPTY
    if size < _SMALL:
        return memoryview(part.bytes)
    return part.buffer.toreadonly()


def _check_room(head: Head, carried: int, segments: int, nbytes: int, *, where: str) -> None:
    """Check that a data packet of ``head`` carrying ``carried`` parts so far, which
    take its message to ``segments`` segments of ``nbytes`` bytes, has room for them.

    Raises:
        CorruptFrameError: more segments than the head says, or than can be real.
    """
    if segments > head.segments:
        if segments == carried:  # the message's first packet, or one that is lost
            raise CorruptFrameError(
                f"the head disagrees with the packet: data packet {head.index} of "
                f"{head.count} carries {carried} of {head.segments} segments",
                where=where,
            )
        raise CorruptFrameError(
            f"data packet {head.index} of step {head.step} takes the message to "
            f"{segments} segments; its head says {head.segments}",
            where=where,
        )
    if segments > SPARE_SEGMENTS + nbytes // BYTES_PER_SEGMENT:
        raise CorruptFrameError(
            f"data packet {head.index} of step {head.step} takes the message to "
            f"{segments} segments in {nbytes} bytes: at most one per {BYTES_PER_SEGMENT} "
            f"bytes plus {SPARE_SEGMENTS} can be real",
            where=where,
        )
