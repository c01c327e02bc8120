"""ZmqSource: connects a DEALER socket to a ZmqSink and reads what it sends to one rank."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import zmq

from rlwire._core.args import check_int
from rlwire._core.errors import (
    ConfigError,
    CorruptFrameError,
    StepGapError,
    TransportError,
    transport_error,
)
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._options import SourceOptions, reject_unknown
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._url import URL
from rlwire.transport.zmq._admission import Pattern, refusal
from rlwire.transport.zmq._control import (
    REANNOUNCE_SECONDS,
    ack_packet,
    bye_packet,
    is_ping,
    parse_absent,
    parse_end,
    parse_refuse,
    ready_packet,
)
from rlwire.transport.zmq._incoming import Incoming
from rlwire.transport.zmq._ordering import Ordering
from rlwire.transport.zmq._parts import StepParts
from rlwire.transport.zmq._protocol import PART, STEP_SEAL, WHOLE, Head
from rlwire.transport.zmq._reassembly import Reassembly, Sealed
from rlwire.transport.zmq._sockets import (
    HANDSHAKE_EVENTS,
    Context,
    Socket,
    check_handshake,
    connect_curve,
    endpoint,
    option_key,
    release,
)
from rlwire.transport.zmq._waiting import await_packet, wait_for_packet

__all__ = ["ZmqSource", "open_source"]


class ZmqSource(Source):
    """Receives what a :class:`~rlwire.transport.zmq.ZmqSink` sends to one rank, over a
    DEALER socket.

    Buffers are views of the received ZeroMQ frames (no copy); ``writable=True`` copies
    each buffer once. Storage options (``open_receiver(..., storage_options={...})``):

    ``hwm``
        packets queued before the sender waits (default 2).
    ``pattern``
        the sender's pattern, ``"ranks"`` or ``"shared"``: a message of the other one is
        refused. Not given, the first message fixes it for the receiver's lifetime.
    ``curve_server_key``
        the sender's CURVE public key: encrypt, and refuse any other sender.
    ``curve_public_key`` / ``curve_secret_key``
        this receiver's key pair (made fresh when not given), for senders that allow
        only listed receivers.

    The receiver announces itself (``ready``) on connecting, and again whenever it has
    heard nothing for a second, so a sender that restarted learns it is there; it
    acknowledges every message it reads, so a closing sender knows when it is done.

    A message returned stays the next one until a read asks for a step after it: a
    receive cancelled after taking it off the socket (while decoding it) gets it again,
    as it would a stored step.

    Every message is checked against the next one expected, and no step is handed out
    twice (docs/format.md, "ZeroMQ messages": a gap raises StepGapError, then the next
    read goes on after it; a repeat, or a step that goes back, StepOrderError; ``end``
    ends the stream whichever session sent it).

    A step filled part by part comes as its rank's parts, then its seal, kept until a
    read asks for a later step; nothing past the seal is read until then.

    Raises:
        ConfigError: CURVE keys that do not go together; an unknown pattern. Raised by
            a read: the sender refused this receiver (it expects the other pattern, or
            a newer receiver of its rank took the rank over), by that read and every
            later one, which read nothing more.
        TransportError: the socket cannot connect or receive; CURVE authentication
            failed (the sender refused this receiver's key, ``curve_server_key`` is not
            the sender's, or is missing for a sender that uses CURVE): raised by a read.
        StepGapError: a message was lost (the sequence or, for per-rank messages, the
            step does not follow on); the next read returns the message after the gap.
            Or the sender said the step has no message for this rank (``absent``: it
            went to fewer ranks). Said once: then the next step follows on, a read of
            any step said goes on with it (:meth:`moved_to`: a step filled part by
            part is read under its own number).
        StepOrderError: a step that would be returned a second time, or go backwards:
            discarded, the next read goes on with the next message.
        CorruptFrameError: a message that is not well-formed, fails its checksums, holds
            another rank's payload, or is of the other pattern (discarded).

    Example:
        >>> source = ZmqSource("tcp://127.0.0.1:5599", rank=1)
        >>> source.read(0) is None  # no sender there
        True
        >>> source.close()
    """

    _OPTIONS = ("hwm", "pattern", "curve_server_key", "curve_public_key", "curve_secret_key")
    reads_once = True
    stores_parts = True  # reads them (docs/format.md, "ZeroMQ messages", 2.1)

    def __init__(  # noqa: PLR0913 (its storage options, one each; from_url parses them)
        self,
        endpoint: str,
        *,
        rank: int = 0,
        verify: bool = True,
        writable: bool = False,
        hwm: int = 2,
        pattern: Pattern | None = None,
        curve_server_key: bytes | None = None,
        curve_public_key: bytes | None = None,
        curve_secret_key: bytes | None = None,
    ) -> None:
        if pattern not in (None, "ranks", "shared"):
            raise ConfigError(
                f"storage option 'pattern' must be 'ranks' or 'shared', got {pattern!r}",
                where=endpoint,
            )
        if curve_server_key is None and (curve_public_key or curve_secret_key):
            raise ConfigError("a CURVE key pair needs curve_server_key", where=endpoint)
        if curve_server_key is not None and (curve_public_key is None) != (
            curve_secret_key is None
        ):
            raise ConfigError("give both curve_public_key and curve_secret_key", where=endpoint)
        self.endpoint = endpoint
        self.rank = rank
        self.verify = verify
        self.writable = writable
        # The socket is used by one thread at a time: a read, a wait, or close().
        self._lock = threading.Lock()
        self._context: Context = zmq.Context()
        sock = self._context.socket(zmq.DEALER)
        self._curve, monitor = curve_server_key is not None, None
        try:
            sock.setsockopt(zmq.RCVHWM, hwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, os.urandom(12))
            if curve_server_key is not None:
                connect_curve(sock, curve_server_key, curve_public_key, curve_secret_key)
            # A failed handshake says why (a CURVE sender, for a plain receiver too).
            events = HANDSHAKE_EVENTS if self._curve else zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            monitor = sock.get_monitor_socket(events)
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            release(sock, self._context, None, linger=None, monitor=monitor)
            raise transport_error(exc, "connect", where=endpoint) from exc
        self._socket: Socket | None = sock
        self._monitor: Socket = monitor
        self._pattern = pattern  # as given, announced to the sender
        # The pattern expected (True: shared), fixed by the first message if not given.
        self._shared: bool | None = None if pattern is None else pattern == "shared"
        self._ordering = Ordering(endpoint, rank=rank)
        self._reassembly = Reassembly(verify=verify)
        self._incoming = Incoming()
        self._pending: tuple[int, Frame] | None = None  # the message after a gap
        self._parts = StepParts()  # of the step filled part by part being read
        # The message read_next returned last, until the receiver asks for a later step.
        self._handed: tuple[int, Frame] | None = None
        self._end: int | None = None  # the end step, once the sender finished
        self._refused: str | None = None  # why, once the sender refused this receiver
        self._heard = 0.0  # when a packet last arrived or this receiver last announced
        self._ack: list[bytes] | None = None  # an acknowledgement still to send
        try:
            self._announce()
        except zmq.ZMQError as exc:
            self.close()
            raise transport_error(exc, "announce itself", where=endpoint) from exc

    def __repr__(self) -> str:
        return f"ZmqSource({self.endpoint!r}, rank={self.rank})"

    def describe(self, step: int) -> str:
        # The step and rank travel as the error's context; a message read from a socket
        # has no name of its own.
        return self.endpoint

    def read(self, step: int) -> Frame | None:
        got = self.read_next(step)
        return None if got is None else got[1]

    def moved_to(self, step: int) -> int:
        with self._lock:
            return self._ordering.moved_to(step)

    def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
        with self._lock:
            step = self._ordering.moved_to(step)
            self._pump(step)
            return self._parts.get(step, index)

    def read_seal(self, step: int) -> Seal | None:
        # Reads nothing: taken here, a seal could overtake parts a reader just missed.
        with self._lock:
            return self._parts.seal_of(self._ordering.moved_to(step))

    def _pump(self, step: int) -> None:
        """Take what arrived of ``step``'s parts, up to its seal (the lock held); a whole
        message met on the way is kept for :meth:`read_next`."""
        self._parts.forget_before(step)
        handed = self._handed is not None and step <= self._handed[0]
        if handed or self._pending is not None or self._parts.sealed(step):
            return
        self._pending = self._next(step)

    def read_next(self, step: int) -> tuple[int, Frame] | None:
        with self._lock:
            step = self._ordering.moved_to(step)  # past the steps said never to come
            self._parts.forget_before(step)
            handed, self._handed = self._handed, None
            if handed is not None and step <= handed[0]:
                # The receive that took it was cancelled (it did not move past it): it is
                # still the next one, as a stored step would be.
                self._handed = handed
                return handed
            got = self._next(step)
            self._handed = got
            return got

    def _next(self, step: int) -> tuple[int, Frame] | None:
        """:meth:`read_next`, with the lock held and nothing handed out to take again."""
        if self._pending is not None:
            got, self._pending = self._pending, None
            return got
        if self._refused is not None:  # for good: it reads and announces nothing more
            raise refusal(self.rank, self._refused, where=self.endpoint)
        if self._end is not None:
            raise self._ordering.end_of_stream(self._end, step)
        sock = self._require_socket()
        check_handshake(self._monitor, where=self.endpoint, curve=self._curve)
        self._send_ack()
        while not self._parts.sealed(step):  # what follows a seal is for a later step
            try:
                packet = self._incoming.take(sock, self._reassembly, where=self.describe(step))
            except zmq.Again:
                if time.monotonic() - self._heard > REANNOUNCE_SECONDS:
                    self._announce()
                return None
            except zmq.ZMQError as exc:
                raise transport_error(exc, "receive", where=self.endpoint) from exc
            self._heard = time.monotonic()
            if packet is None:  # the rest of a packet refused, still being discarded
                return None
            views, head = packet
            if head is None and self._controlled(views, step):
                continue
            taken = self._take(views, step, head)
            if taken is not None:
                return taken
        return None

    def _controlled(self, views: list[memoryview], step: int) -> bool:
        """True if ``views`` is a control packet, done with: a ping, or an ``absent`` of
        another step than ``step`` (a passed one, or one after a gap, which the next
        message reports); an error for the others."""
        if is_ping(views):
            return True
        self._refused = parse_refuse(views)
        if self._refused is not None:
            raise refusal(self.rank, self._refused, where=self.endpoint)
        end = parse_end(views)
        if end is not None:
            # Sent after every message to this receiver, on the same connection.
            self._reassembly.drop()
            self._end = end
            raise self._ordering.ended(end, step, per_rank=self._shared is False)
        absent = parse_absent(views)
        if absent is not None:
            self._ordering.absent(*absent, step)  # raises StepGapError if it is step
        return absent is not None

    def wait(self, timeout: float | None) -> None:
        wait_for_packet(lambda: self._socket, self._lock, timeout)

    async def await_message(self, timeout: float | None) -> None:
        await await_packet(lambda: self._socket, timeout)

    def close(self) -> None:
        with self._lock:
            sock, self._socket = self._socket, None
            self._pending = self._handed = None
            if sock is None:
                return
            with contextlib.suppress(zmq.ZMQError):  # else the sender learns from ZeroMQ
                sock.send_multipart(bye_packet(), zmq.NOBLOCK)
            release(sock, self._context, None, linger=100, monitor=self._monitor)

    def _require_socket(self) -> Socket:
        if self._socket is None:
            raise TransportError("the source is closed", where=self.endpoint)
        return self._socket

    def _announce(self) -> None:
        sock = self._require_socket()
        # Not connected yet and the queue full: a later announcement goes instead.
        with contextlib.suppress(zmq.Again):
            sock.send_multipart(ready_packet(self.rank, self._pattern), zmq.NOBLOCK)
        self._heard = time.monotonic()

    def _send_ack(self) -> None:
        """Tell the sender which message was read last (a later one says it again)."""
        if self._ack is not None:
            with contextlib.suppress(zmq.Again):
                self._require_socket().send_multipart(self._ack, zmq.NOBLOCK)
                self._ack = None

    def _take(
        self, parts: list[memoryview], step: int, head: Head | None
    ) -> tuple[int, Frame] | None:
        """The step and frame of the message that packet ``parts`` (of ``head``, if a
        data packet whose head was read) completes if it is the next one for this
        receiver; ``None`` if it completes none, or one to discard without a word; an
        error otherwise."""
        where = self.describe(step)
        sealed = self._reassembly.take(parts, where=where, select=self.select, head=head)
        return None if sealed is None else self._sealed(sealed, step)

    def _sealed(self, sealed: Sealed, step: int) -> tuple[int, Frame] | None:
        """The step and frame of ``sealed``, as :meth:`_take` says."""
        where = self.describe(step)
        head, segments = sealed.head, sealed.segments
        # Read, whatever follows: a closing sender need not wait for it.
        self._ack = ack_packet(head.session, head.seq)
        self._send_ack()
        try:
            sealed.check(rank=self.rank, shared=self._shared, verify=self.verify, where=where)
            if head.kind not in (WHOLE, PART, STEP_SEAL) or (head.shared and head.kind):
                raise CorruptFrameError(f"a message of unknown kind {head.kind}", where=where)
            self._shared = head.shared
            verified = self.verify and head.checksum is not None
            frame = None if head.kind == STEP_SEAL else sealed.frame(where, verified=verified)
        except CorruptFrameError as exc:
            # Its sequence number stays unused: the next message reports the loss.
            exc.add_context(step=head.step, rank=self.rank)
            raise
        order = self._ordering.place(head, step)
        if order is None:
            return None
        if self.writable and frame is not None:
            frame = sealed.frame(where, copy=True, verified=verified)
        got = None
        if frame is None:
            self._parts.add_seal(head, segments[0], where=where)
        elif head.kind == PART:
            self._parts.add_part(head, frame, where=where)
        else:
            got = head.step, frame
            self._pending = got if order else None
        if order:
            raise StepGapError(
                f"{order}: steps never came (sent to fewer ranks: a send after a "
                "send_ranks, or a send_ranks of fewer batches) or were lost (a sender or "
                f"receiver restarted, or a send failed); the next receive goes on with step "
                f"{head.step}",
                where=self.endpoint,
                rank=self.rank,
            )
        return got


def open_source(url: URL, options: SourceOptions) -> ZmqSource:
    """The :class:`ZmqSource` for ``url`` (what
    :meth:`~rlwire.transport.zmq.ZmqSink.open_source` returns).

    Raises:
        ConfigError: a malformed URL, or an unknown or malformed storage option.
        TransportError: the socket cannot connect.
    """
    opts = options.storage_options
    reject_unknown(url, opts, ZmqSource._OPTIONS)
    return ZmqSource(
        endpoint(url),
        rank=options.rank,
        verify=options.verify,
        writable=options.writable,
        hwm=check_int(opts.get("hwm", 2), "storage option 'hwm'", low=1),
        pattern=opts.get("pattern"),
        curve_server_key=option_key(opts, "curve_server_key"),
        curve_public_key=option_key(opts, "curve_public_key"),
        curve_secret_key=option_key(opts, "curve_secret_key"),
    )
