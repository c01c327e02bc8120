"""The sender's bookkeeping of the receivers connected to its ROUTER socket.

A receiver counts once its ``ready`` packet has arrived (the handshake of
docs/format.md): in the ``ranks`` pattern as the receiver of the rank it names, replacing
an earlier one for good (a receiver that restarted, or a second trainer of the rank: see
``_ranks``), in the ``shared`` pattern as one more consumer. A receiver that expects the
other pattern is refused (a ``refuse`` packet tells it why) and gets nothing. Each
message to a receiver carries that receiver's next sequence number; the receiver
acknowledges what it has read, so a closing sender knows whom it must still wait for. A
receiver that says ``bye`` (it closed its socket) is forgotten for good; one that a send
finds unreachable, until it announces itself again.

A receiver is known by its routing id, which it keeps across reconnections (after a
network blip, ZeroMQ reconnects it with the same id). Its sequence numbers go on until
its ``bye``, whatever happens to the connection: a receiver that comes back after
a blip gets the sequence number after the last one sent to it, so it reports what it
lost meanwhile as one StepGapError, and never takes a fresh message for an old one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection
from dataclasses import KW_ONLY, dataclass, field

import anyio.lowlevel
import zmq

from rlwire._core.errors import TransportError, transport_error
from rlwire.transport.zmq._admission import NO_PARTS, Pattern, misfit
from rlwire.transport.zmq._complaints import gone, timed_out, untold
from rlwire.transport.zmq._control import (
    ABSENT_SINCE,
    ACK,
    BYE,
    PING,
    READY,
    REANNOUNCE_SECONDS,
    abort_packet,
    absent_packet,
    end_packet,
    parse_ack,
    parse_ready,
    refuse_packet,
)
from rlwire.transport.zmq._peer_packets import PEER_PARTS, PeerPackets
from rlwire.transport.zmq._ranks import RankOwners, taken_over
from rlwire.transport.zmq._sockets import RETRY_SECONDS, Socket, has_packet, wait_descriptor

__all__ = ["Peers"]

#: How long a receiver connected to a sender may take to announce itself (it does on
#: connecting, and again after ``REANNOUNCE_SECONDS`` without news).
_ANNOUNCE_SECONDS = REANNOUNCE_SECONDS + RETRY_SECONDS * 10


@dataclass(eq=False)
class Peers:
    """The receivers a sender's socket knows, which rank each serves, and how many of the
    messages sent to each it has read.

    Only the task that holds the sender uses it (ZeroMQ sockets are not thread-safe); the
    sink's ``close`` uses it last, from a worker thread, once no send is running. Errors
    it raises do not say where (the sink adds its endpoint as they pass), but
    :meth:`finish`'s, which is told.

    Attributes:
        socket: the sender's bound ROUTER socket, with ``ROUTER_MANDATORY`` set so that a
            send to a full or vanished receiver fails instead of dropping.
        session: the sender's 8-byte session, which acknowledgements must name.
        pattern: ``"ranks"`` or ``"shared"``.
        consumers: with ``"shared"``, how many consumers the first send waits for.
        ready_timeout: seconds a send waits for a missing receiver (``None``: no limit).
        delivered: True once a message went out: later sends stop waiting for
            ``consumers``.
    """

    socket: Socket
    _: KW_ONLY
    session: bytes
    pattern: Pattern
    consumers: int
    ready_timeout: float | None
    delivered: bool = field(default=False, init=False)
    #: The end step once the sender finished: receivers that announce themselves later
    #: are told at once.
    end: int | None = field(default=None, init=False)
    #: When :meth:`linger` may stop waiting for receivers not yet known (of
    #: :func:`time.monotonic`): set when a stream ends before anything was sent, so that
    #: every receiver connected to this sender has announced itself (at the latest when
    #: it has heard nothing for ``REANNOUNCE_SECONDS``) and heard of the end.
    announced_by: float = field(default=0.0, init=False)
    #: The socket's monitor of handshakes, read before every drain: :meth:`linger` waits
    #: for a receiver that connected as the stream ended (``None``: none).
    monitor: Socket | None = None
    # for each connection up whose receiver has not announced itself yet, until when
    # linger waits for it (monotonic): one each, as a ``ready`` answers one only
    _unheard: list[float] = field(default_factory=list, init=False, repr=False)
    # each rank's receiver, and those a newer one replaced
    _owners: RankOwners = field(default_factory=RankOwners, init=False, repr=False)
    # the routing ids of the receivers there now, in the order they announced themselves
    _live: dict[bytes, None] = field(default_factory=dict, init=False, repr=False)
    # routing id -> next sequence number, until its bye (it may come back before)
    _seq: dict[bytes, int] = field(default_factory=dict, init=False, repr=False)
    # routing id -> messages it has read (kept as long)
    _acked: dict[bytes, int] = field(default_factory=dict, init=False, repr=False)
    #: routing id -> why the sender refused that receiver (its last ``ready``)
    refused: dict[bytes, str] = field(default_factory=dict, init=False, repr=False)
    #: True once a part was sent: receivers of protocol 2.0 are refused from then on
    parts: bool = field(default=False, init=False)
    _minor: dict[bytes, int] = field(default_factory=dict, init=False, repr=False)
    # round robin over consumers, for the shared pattern
    _turn: int = field(default=0, init=False, repr=False)
    # receivers not yet told the end (their queue was full)
    _end_pending: set[bytes] = field(default_factory=set, init=False, repr=False)
    _opened: float = field(default_factory=time.monotonic, init=False, repr=False)
    _packets: PeerPackets = field(default_factory=PeerPackets, init=False, repr=False)

    async def await_ranks(self, ranks: Collection[int]) -> None:
        """Wait, sending nothing, until a receiver of each of ``ranks`` (those to be sent
        something now) has announced itself: a step is not handed to some ranks and then
        given up for want of another (a timeout or a cancellation leaves it unsent).

        Raises:
            TransportError: a rank's receiver is still missing after ``ready_timeout``.
        """
        deadline = self._deadline()
        while True:
            self.drain()
            missing = sorted(set(ranks) - set(self._owners.ranks()))
            if not missing:
                return
            if _expired(deadline):
                raise self._timed_out(missing)
            await self._wait()

    async def claim(self, rank: int, *, peer: bytes | None = None) -> bytes:
        """The routing id of the receiver that gets ``rank``'s message (``peer``, for
        the next data packet of a message already going to it), once its queue has room.
        The routing id part is sent here: the rest of the packet must follow at once, in
        the same task, with no checkpoint that could cancel it in between.

        Raises:
            TransportError: the receiver of ``rank`` (or ``peer``) disconnected, or no
                receiver is there after ``ready_timeout``.
        """
        deadline = self._deadline()
        while True:
            self.drain()
            if peer is not None and peer not in self._live:
                raise gone(self.pattern, rank, replaced=self._owners.replaced(peer) is not None)
            for candidate in self._candidates(rank) if peer is None else [peer]:
                try:
                    self.socket.send(candidate, zmq.SNDMORE | zmq.NOBLOCK)
                except zmq.Again:
                    continue  # this receiver's queue is full: backpressure
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise transport_error(exc, "send", where=None) from exc
                    self.forget(candidate)
                    if self.pattern == "ranks" or peer is not None:
                        raise gone(self.pattern, rank, replaced=False) from exc
                    continue
                return candidate
            if peer is None and _expired(deadline) and not self._candidates(rank):
                raise self._timed_out([rank])
            await self._wait()

    def abort(self, peer: bytes, seq: int) -> None:
        """Tell ``peer`` to drop what it got of message ``seq``, the last one taken for it,
        which is given up before its seal, if its queue has room (if not, the first data
        packet of the next message tells it). ``seq`` goes to the next message."""
        if self._seq.get(peer) == seq + 1:
            self._seq[peer] = seq
        with contextlib.suppress(zmq.ZMQError):
            self.socket.send_multipart([peer, *abort_packet(self.session, seq)], zmq.NOBLOCK)

    def tell_absent(self, step: int, ranks: int) -> None:
        """Tell the receivers of ranks ``ranks`` and above that ``step``, sent to ranks
        ``0 .. ranks - 1``, has no message for them, if their queue has room (else, or
        not of 2.2, or not there yet, they learn it from their next message). Not
        sequenced: the step after it, which the next message holds, tells it too."""
        for rank, peer in self._owners.served():
            if rank >= ranks and self._minor.get(peer, 0) >= ABSENT_SINCE:
                with contextlib.suppress(zmq.ZMQError):
                    self.socket.send_multipart([peer, *absent_packet(step, ranks)], zmq.NOBLOCK)

    def take_seq(self, peer: bytes) -> int:
        """The sequence number of the message now going to ``peer``, counted as sent."""
        self.delivered = True
        seq = self._seq[peer]
        self._seq[peer] = seq + 1
        return seq

    def drain(self) -> None:
        """Take every ``ready``, ``ack`` and ``bye`` packet waiting (see ``_peer_packets``)."""
        self._watch_connections()
        while (parts := self._packets.take(self.socket)) is not None:
            if len(parts) != PEER_PARTS:
                continue  # not from an rlwire receiver
            peer, kind, body = parts
            if kind == BYE:
                self._drop(peer)
            elif kind == ACK:
                self._acknowledged(peer, body)
            elif kind == READY:
                self._ready(peer, body)

    def forget(self, peer: bytes) -> None:
        """Drop ``peer`` (gone, refused, or replaced by a receiver of the same rank) until
        it announces itself again; its sequence number is kept."""
        self._live.pop(peer, None)
        self._end_pending.discard(peer)
        self._owners.release(peer)

    def _drop(self, peer: bytes) -> None:
        """Forget ``peer`` for good: it said bye, closing its socket, and no receiver
        reuses its routing id (one opened per step would leave an entry in each table)."""
        self.forget(peer)
        self._owners.drop(peer)
        for table in (self._seq, self._acked, self._minor):
            table.pop(peer, None)

    def linger(self, deadline: float) -> None:
        """Wait, until ``deadline`` (of :func:`time.monotonic`), for every receiver still
        connected to read every message sent to it and, once the stream ended, to be told
        the end (including receivers that announce themselves meanwhile; see
        :attr:`announced_by`).

        ZeroMQ's own linger is not enough: a receiver whose queue is full stops reading
        its connection, and drops what is left in it once the sender closes it. A ZeroMQ
        error ends the wait: the socket is being closed anyway.
        """
        with contextlib.suppress(zmq.ZMQError):
            while time.monotonic() < deadline:
                waiting = self._waiting()
                if self._end_pending:
                    self.send_end(list(self._end_pending))
                told = not self._end_pending and (
                    self.end is None or time.monotonic() >= max([self.announced_by, *self._unheard])
                )
                if not waiting and told:
                    return
                for peer in waiting:  # one that went away without a word is unreachable
                    try:
                        self.socket.send_multipart([peer, PING], zmq.NOBLOCK)
                    except zmq.Again:
                        pass  # its queue is full: it is there
                    except zmq.ZMQError:
                        self.forget(peer)
                self.socket.poll(int(RETRY_SECONDS * 1000), zmq.POLLIN)

    async def finish(self, end: int, seconds: float, *, where: str) -> None:
        """Record that the stream ended at ``end`` and tell every receiver known, waiting
        at most ``seconds`` for room in the queues that are full, taking what the
        receivers send meanwhile (one that says ``bye`` or vanishes is dropped, one that
        announces itself is told). After this the sender's task uses the socket only to
        close it, and a sender may stay open long after: a receiver whose queue was full
        (if only until ZeroMQ's I/O thread moved the last message on) would wait for the
        end until then.

        Raises:
            TransportError: a receiver's queue stayed full for ``seconds`` (it reads
                nothing): said to be at ``where``; :meth:`linger` tries again.
        """
        deadline = time.monotonic() + seconds
        self.drain()
        self.end = end
        if not self.delivered:
            # A sender that sent nothing (a restart with nothing left to send) may not
            # know the receivers still connected from before: they announce themselves
            # again after hearing nothing for REANNOUNCE_SECONDS. Wait that long for them.
            # (A sender that sent has heard from every receiver its sends waited for.)
            self.announced_by = self._opened + _ANNOUNCE_SECONDS
        self.send_end()
        while self._end_pending:
            if time.monotonic() >= deadline:
                pending = self._end_pending
                ranks = self._owners.ranks_of(pending)
                raise untold(
                    self.pattern, ranks, len(pending), end=self.end, seconds=seconds
                ).add_context(where=where)
            await self._wait()
            self.drain()
            self.send_end(list(self._end_pending))

    def send_end(self, peers: list[bytes] | None = None) -> None:
        """Tell ``peers`` (default: every receiver known) that the stream ended at
        :attr:`end`. A receiver whose queue is full is told again by :meth:`linger`
        (or when it announces itself again); one that vanished is forgotten."""
        assert self.end is not None
        for peer in list(self._live) if peers is None else peers:
            try:
                self.socket.send_multipart([peer, *end_packet(self.end)], zmq.NOBLOCK)
            except zmq.Again:
                self._end_pending.add(peer)
            except zmq.ZMQError:
                self.forget(peer)
            else:
                self._end_pending.discard(peer)

    def _watch_connections(self) -> None:
        """Note a connection that came up: its ``ready`` follows (and is read after this,
        as the monitor reports the handshake first)."""
        while self.monitor is not None and has_packet(self.monitor):
            self.monitor.recv_multipart()
            now = time.monotonic()  # (the expired are waited for no more)
            self._unheard = [*(t for t in self._unheard if t > now), now + _ANNOUNCE_SECONDS]

    def _ready(self, peer: bytes, body: bytes) -> None:
        if peer not in self._live and self._unheard:
            # A receiver announcing itself anew answers one connection, not all of them.
            self._unheard.pop(0)
        ready = parse_ready(body)
        if ready is None:
            return
        rank, refused = ready.rank, misfit(ready, self.pattern, parts=self.parts)
        lost = self._owners.replaced(peer)  # (only ever set in the ranks pattern)
        if lost is not None:
            refused = taken_over(lost)  # it never takes its rank back
        if refused:
            self._refuse(peer, refused, record=lost is None)
            return
        self._minor[peer] = ready.minor  # its protocol's
        self.refused.pop(peer, None)
        if self.end is not None:
            self.send_end([peer])
        self._live[peer] = None
        self._seq.setdefault(peer, 0)  # a receiver known before goes on where it was
        if self.pattern == "ranks":
            old = self._owners.take(rank, peer)
            if old is not None:  # the newest receiver wins; the old one is told
                self._refuse(old, taken_over(rank), record=False)

    def carry_parts(self) -> None:
        """Note that a step filled part by part is being sent: refuse the receivers that
        cannot read one (protocol 2.0, which would take a part for a whole step), those
        known now and any that announce themselves later."""
        if not self.parts:
            self.parts = True
            for peer in [p for p in self._live if self._minor.get(p, 0) < 1]:
                self._refuse(peer, NO_PARTS)

    def _refuse(self, peer: bytes, why: str, *, record: bool = True) -> None:
        """Tell ``peer`` why it gets nothing (if its queue has room: else when it
        announces itself again), and forget it; ``record``: for :meth:`_timed_out`."""
        if record:
            self.refused[peer] = why
        self.forget(peer)
        with contextlib.suppress(zmq.ZMQError):
            self.socket.send_multipart([peer, *refuse_packet(why)], zmq.NOBLOCK)

    def _acknowledged(self, peer: bytes, body: bytes) -> None:
        ack = parse_ack(body)
        if ack is not None and peer in self._seq and ack[0] == self.session:
            self._acked[peer] = max(self._acked.get(peer, 0), ack[1] + 1)

    def _candidates(self, rank: int) -> list[bytes]:
        """The receivers that may get ``rank``'s message, in the order to try them."""
        if self.pattern == "ranks":
            peer = self._owners.owner(rank)
            return [] if peer is None else [peer]
        peers = list(self._live)
        if len(peers) < self.consumers and not self.delivered:
            return []  # the first send waits for the consumers the user asked for
        self._turn += 1
        start = self._turn % len(peers) if peers else 0
        return peers[start:] + peers[:start]

    def _waiting(self) -> list[bytes]:
        """The receivers that have not yet read everything sent to them."""
        self.drain()
        return [peer for peer in self._live if self._acked.get(peer, 0) < self._seq[peer]]

    async def _wait(self) -> None:
        """Wait for any change on the socket (a packet in, room in a queue), at most
        :data:`RETRY_SECONDS`; with a packet in (one being discarded), let the loop tick."""
        if has_packet(self.socket):
            return await anyio.lowlevel.checkpoint()
        await wait_descriptor(self.socket, RETRY_SECONDS)

    def _deadline(self) -> float | None:
        return None if self.ready_timeout is None else time.monotonic() + self.ready_timeout

    def _timed_out(self, ranks: list[int]) -> TransportError:
        refused = next(iter(self.refused.values()), None)
        return timed_out(
            self.pattern,
            ranks,
            live=len(self._live),
            consumers=self.consumers,
            ready_timeout=self.ready_timeout,
            refused=refused,
        )


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline
