"""How a sender takes its receivers' packets off its ROUTER socket: part by part, a
packet of more parts than a receiver's ever has ignored as soon as it shows.

A receiver sends its sender control packets only (``ready``, ``ack``, ``bye``: a kind
and a body), which the ROUTER socket hands over after the routing id of the connection
they came by: :data:`PEER_PARTS` parts. ZeroMQ hands a packet over only whole, but its
parts can be taken one at a time. A packet of more parts is no rlwire receiver's (a
hostile or broken peer's: millions of empty parts cost a few bytes each on the wire, and
a Python object each if kept), and is ignored as soon as its next part shows, as the
sender ignores any other packet it cannot read: its parts left are discarded, unkept,
a slice of :data:`DISCARD_SECONDS` per read, so that the producer's event loop, on which
the sender reads, ticks on meanwhile.
"""

from __future__ import annotations

import time

import zmq

from rlwire.transport.zmq._sockets import Socket

__all__ = ["DISCARD_SECONDS", "PEER_PARTS", "PeerPackets"]

#: The parts of a receiver's packet: its routing id, the kind and the body.
PEER_PARTS = 3
#: How long one read goes on discarding the parts of a packet ignored.
DISCARD_SECONDS = 0.002
_BATCH = 64  # parts discarded between two looks at the clock


class PeerPackets:
    """The packets arriving on a sender's socket from its receivers."""

    def __init__(self) -> None:
        self._discarding = False  # the parts left of a packet ignored

    @property
    def discarding(self) -> bool:
        """True while the parts of a packet ignored are still being discarded (the
        socket then says a packet waits)."""
        return self._discarding

    def take(self, sock: Socket) -> list[bytes] | None:
        """The parts of the next packet on ``sock``, empty for a packet of more than
        :data:`PEER_PARTS` parts (ignored, and discarded whole); ``None`` if no packet
        waits, or the parts of one ignored are still being discarded (:attr:`discarding`)
        when this read's slice is up.

        Raises:
            zmq.ZMQError: the socket cannot receive.
        """
        try:
            if self._discarding and not self._discard(sock):
                return None
            parts = [sock.recv(zmq.NOBLOCK)]
            while sock.get(zmq.RCVMORE):
                if len(parts) == PEER_PARTS:
                    self._discarding = True
                    return [] if self._discard(sock) else None
                parts.append(sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            return None
        return parts

    def _discard(self, sock: Socket) -> bool:
        """Discard the parts left of a packet ignored, for :data:`DISCARD_SECONDS` at
        most: True once none is left."""
        deadline = time.monotonic() + DISCARD_SECONDS
        while time.monotonic() < deadline:
            for _ in range(_BATCH):
                sock.recv(zmq.NOBLOCK)
                if not sock.get(zmq.RCVMORE):
                    self._discarding = False
                    return True
        return False
