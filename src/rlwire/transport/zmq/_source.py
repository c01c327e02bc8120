"""ZmqSource: connects a DEALER socket to a ZmqSink and reads what it sends to one rank."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field

import msgspec
import zmq

from rlwire._core.args import check_int
from rlwire._core.errors import (
    ConfigError,
    CorruptFrameError,
    EndOfStream,
    StepGapError,
    StepOrderError,
    TransportError,
    transport_error,
)
from rlwire._frame.checksums import CHECKSUM, check_algorithm, compare_digests, segment_digests
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source, SourceOptions, reject_unknown
from rlwire.transport._url import URL
from rlwire.transport.zmq._peers import Pattern
from rlwire.transport.zmq._protocol import (
    REANNOUNCE_SECONDS,
    Head,
    Seal,
    ack_message,
    bye_message,
    check_recipient,
    frame_of,
    is_ping,
    parse_abort,
    parse_data,
    parse_end,
    parse_seal,
    ready_message,
)
from rlwire.transport.zmq._sockets import (
    RETRY_SECONDS,
    Context,
    Socket,
    connect_curve,
    endpoint,
    has_message,
    option_key,
    release,
    wait_descriptor,
)

__all__ = ["ZmqSource", "open_source"]


@dataclass
class _Partial:
    """The data messages of a batch received so far, hashed as they came."""

    head: Head  # of data message 0
    segments: list[memoryview] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)
    received: int = 0  # data messages

    def follows(self, head: Head) -> bool:
        """True if ``head`` is of the data message that comes next in this batch."""
        return head.index == self.received and msgspec.structs.replace(head, index=0) == self.head


class ZmqSource(Source):
    """Receives what a :class:`ZmqSink` sends to one rank, over a DEALER socket.

    Buffers are views of the received ZeroMQ frames (no copy); ``writable=True`` copies
    each buffer once. Storage options (``open_receiver(..., storage_options={...})``):

    ``hwm``
        messages queued before the sender waits (default 2).
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

    Every message is checked against the next one expected (docs/format.md, "ZeroMQ
    messages"), and no step is handed out twice:

    - a message after a gap (a sequence number skipped or, in the ``ranks`` pattern, a
      step after the expected one) raises StepGapError; the next read returns it;
    - a step below the expected one (in the ``shared`` pattern: not above the last one
      returned) is never returned. From the session of the messages before it (a
      repeated or reordered message, a sequence number that goes back) it raises
      StepOrderError and is discarded, each time. From a new sender session (a sender
      that restarted from an earlier step) it raises one StepOrderError, and that
      session's messages below the expected step are then discarded without a word;
      before any message was returned (a receiver opened with a later ``start_step``)
      they are discarded without an error;
    - ``end`` ends the stream whichever session sent it (it carries none): a sender that
      restarted and finished before sending this receiver anything ended it too. In
      the ``ranks`` pattern, an end beyond the expected step first raises StepGapError
      (the steps in between were lost), then EndOfStream.

    Raises:
        ConfigError: CURVE keys that do not go together; an unknown pattern.
        TransportError: the socket cannot connect or receive.
        StepGapError: a message was lost (the sequence or, for per-rank messages, the
            step does not follow on); the next read returns the message after the gap.
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

    def __init__(
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
        try:
            sock.setsockopt(zmq.RCVHWM, hwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, os.urandom(12))
            if curve_server_key is not None:
                connect_curve(sock, curve_server_key, curve_public_key, curve_secret_key)
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            release(sock, self._context, None, linger=None)
            raise transport_error(exc, "connect", where=endpoint) from exc
        self._socket: Socket | None = sock
        # The pattern expected (True: shared), fixed by the first message if not given.
        self._shared: bool | None = None if pattern is None else pattern == "shared"
        # The session of the last message taken in order, and the seq to follow it.
        self._session: bytes | None = None
        self._next_seq = 0
        self._received = False  # True once a message was returned (or a gap reported)
        # A new session that started behind: its steps below the expected one are
        # discarded without a word (it was reported once).
        self._behind: bytes | None = None
        self._pending: tuple[int, Frame] | None = None
        self._partial: _Partial | None = None  # a batch whose seal has not come
        self._end: int | None = None  # the end step, once the sender finished
        self._heard = 0.0  # when a message last arrived or this receiver last announced
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

    def read_next(self, step: int) -> tuple[int, Frame] | None:
        with self._lock:
            if self._pending is not None:
                got, self._pending = self._pending, None
                return got
            if self._end is not None:
                raise EndOfStream.at(self._end, where=self.endpoint)
            sock = self._require_socket()
            self._send_ack()
            while True:
                try:
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    if time.monotonic() - self._heard > REANNOUNCE_SECONDS:
                        self._announce()
                    return None
                except zmq.ZMQError as exc:
                    raise transport_error(exc, "receive", where=self.endpoint) from exc
                self._heard = time.monotonic()
                views = [part.buffer for part in parts]
                if is_ping(views):
                    continue
                end = parse_end(views)
                if end is not None:
                    # Sent after every message to this receiver, on the same connection.
                    self._partial = None
                    self._end = end
                    if self._shared is False and end > step:
                        raise StepGapError(
                            f"expected step {step}, but the sender finished the stream "
                            f"at step {end}: steps {_span(step, end)} were lost; the next "
                            "receive raises EndOfStream",
                            where=self.endpoint,
                            rank=self.rank,
                        )
                    raise EndOfStream.at(self._end, where=self.endpoint)
                taken = self._take(views, step)
                if taken is not None:
                    return taken

    def wait(self, timeout: float | None) -> None:
        # Bounded, so that the next read_next re-announces this receiver to a sender
        # that restarted (else a blocking receive waits forever); in short polls under
        # the lock, since close() may be called from another thread meanwhile.
        deadline = _deadline(timeout)
        while (remaining := deadline - time.monotonic()) > 0:
            with self._lock:
                if self._socket is None or self._socket.poll(
                    max(1, int(min(remaining, RETRY_SECONDS) * 1000)), zmq.POLLIN
                ):
                    return

    async def await_message(self, timeout: float | None) -> None:
        # Bounded, so a closed source or a re-announcement is noticed.
        deadline = _deadline(timeout)
        while (remaining := deadline - time.monotonic()) > 0:
            sock = self._socket
            try:
                if sock is None or has_message(sock):
                    return
                await wait_descriptor(sock, min(remaining, RETRY_SECONDS))
            except zmq.ZMQError:
                return  # closed meanwhile: the next read says so

    def close(self) -> None:
        with self._lock:
            sock, self._socket = self._socket, None
            if sock is None:
                return
            with contextlib.suppress(zmq.ZMQError):  # else the sender learns from ZeroMQ
                sock.send_multipart(bye_message(), zmq.NOBLOCK)
            release(sock, self._context, None, linger=100)

    def _require_socket(self) -> Socket:
        if self._socket is None:
            raise TransportError("the source is closed", where=self.endpoint)
        return self._socket

    def _announce(self) -> None:
        sock = self._require_socket()
        # Not connected yet and the queue full: a later announcement goes instead.
        with contextlib.suppress(zmq.Again):
            sock.send_multipart(ready_message(self.rank), zmq.NOBLOCK)
        self._heard = time.monotonic()

    def _send_ack(self) -> None:
        """Tell the sender which message was read last (a later one says it again)."""
        if self._ack is not None:
            with contextlib.suppress(zmq.Again):
                self._require_socket().send_multipart(self._ack, zmq.NOBLOCK)
                self._ack = None

    def _take(self, parts: list[memoryview], step: int) -> tuple[int, Frame] | None:
        """The step and frame of the batch ``parts`` completes if it is the next one for
        this receiver; ``None`` if it completes none, or one to discard without a word;
        an error otherwise."""
        where = self.describe(step)
        aborted = parse_abort(parts)
        if aborted is not None:
            if self._partial is not None and aborted == (
                self._partial.head.session,
                self._partial.head.seq,
            ):
                self._partial = None
            return None
        seal = parse_seal(parts, where=where)
        if seal is not None:
            return self._sealed(seal, step)
        try:
            head, segments = parse_data(parts, where=where)
        except CorruptFrameError:
            self._partial = None
            raise
        if head.index == 0:
            self._partial = _Partial(head)  # one stopped midway is dropped
        elif self._partial is None or not self._partial.follows(head):
            # Part of a batch whose start was lost: the whole batch is, and the next
            # batch reports the loss.
            self._partial = None
            return None
        partial = self._partial
        partial.segments += segments
        partial.received += 1
        if len(partial.segments) > head.segments:
            self._partial = None
            raise CorruptFrameError(
                f"data message {head.index} of step {head.step} takes the batch to "
                f"{len(partial.segments)} segments; its head says {head.segments}",
                where=where,
            )
        if self.verify and head.checksum == CHECKSUM:  # while the next message arrives
            partial.digests += segment_digests(segments)
        return None

    def _sealed(self, seal: Seal, step: int) -> tuple[int, Frame] | None:
        """The step and frame of the batch ``seal`` closes, as :meth:`_take` says."""
        where = self.describe(step)
        partial, self._partial = self._partial, None
        if (
            partial is None
            or (partial.head.session, partial.head.seq) != (seal.session, seal.seq)
            or partial.received != partial.head.count
        ):
            return None  # the seal of a batch not whole here: lost, as above
        head, segments = partial.head, partial.segments
        # Read, whatever follows: a closing sender need not wait for it.
        self._ack = ack_message(head.session, head.seq)
        self._send_ack()
        try:
            expected = 8 * head.segments if head.checksum else 0
            if len(segments) != head.segments or len(seal.checksums) != expected:
                raise CorruptFrameError(
                    f"the batch disagrees with its head: {head.segments} segments in the "
                    f"head, {len(segments)} received, {len(seal.checksums) // 8} checksums",
                    where=where,
                )
            check_recipient(head, rank=self.rank, shared=self._shared, where=where)
            self._shared = head.shared
            if self.verify and head.checksum is not None:
                check_algorithm(head.checksum, where)
                compare_digests(seal.checksums, partial.digests, segments, where)
            frame = frame_of(head, segments, where=where)
        except CorruptFrameError as exc:
            # Its sequence number stays unused: the next batch reports the loss.
            exc.add_context(step=head.step, rank=self.rank)
            raise
        order = self._order(head, step)
        if order is None:
            return None
        if self.writable:
            frame = frame_of(head, [memoryview(bytearray(s)) for s in segments], where=where)
        got = head.step, frame
        if order:
            self._pending = got
            raise StepGapError(
                f"{order}: messages were lost (a sender or receiver restarted, or a send "
                f"failed); the next receive returns step {head.step}",
                where=self.endpoint,
                rank=self.rank,
            )
        return got

    def _order(self, head: Head, step: int) -> str | None:
        """Where ``head``'s message stands: ``""`` if it is the next one, what was
        expected instead if it comes after a gap (it is returned after a StepGapError),
        or ``None`` to discard it without a word. The state moves on past it.

        Raises:
            StepOrderError: it repeats or goes back: discarded (it moves the state on only
                if it is the next in the sequence, with a step already past).
        """
        new = head.session != self._session
        expected_seq = 0 if new else self._next_seq
        sender = "a new sender session" if new else "this sender"
        ordinal = f"message {head.seq} of {sender}"
        if not new and head.seq < expected_seq:
            raise StepOrderError(
                f"{ordinal} (step {head.step}) repeats or goes back: expected message "
                f"{expected_seq}; discarded",
                where=self.endpoint,
                rank=self.rank,
            )
        if head.step < step:
            if new or head.session == self._behind:
                report = new and self._received
                self._session, self._next_seq = head.session, head.seq + 1
                self._behind = head.session
                if not report:
                    return None  # older than the step this receiver starts at
                raise StepOrderError(
                    f"a new sender session started at step {head.step}, behind step "
                    f"{step}: steps {_span(head.step, step)} would repeat; discarded "
                    f"until step {step}",
                    where=self.endpoint,
                    rank=self.rank,
                )
            if head.seq == expected_seq:
                self._next_seq += 1  # the next in the sequence, with a wrong step
            again = head.step == step - 1
            what = f"step {head.step} again" if again else f"step {head.step}, behind step {step}"
            raise StepOrderError(
                f"{ordinal} holds {what}: already past it; discarded",
                where=self.endpoint,
                rank=self.rank,
            )
        self._session, self._next_seq, self._behind = head.session, head.seq + 1, None
        self._received = True
        if not head.shared and head.step != step:
            return f"expected step {step}, got step {head.step}"
        if head.seq != expected_seq:
            return f"expected message {expected_seq} of {sender}, got {head.seq}"
        return ""


def open_source(url: URL, options: SourceOptions) -> ZmqSource:
    """The :class:`ZmqSource` for ``url`` (what :meth:`ZmqSink.open_source` returns).

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


def _deadline(timeout: float | None) -> float:
    """When a wait of ``timeout`` seconds ends: never later than a re-announcement is due."""
    limit = REANNOUNCE_SECONDS if timeout is None else min(timeout, REANNOUNCE_SECONDS)
    return time.monotonic() + limit


def _span(first: int, end: int) -> str:
    """Steps ``first`` up to ``end`` (excluded), in words: ``"3"`` or ``"3-7"``."""
    return str(first) if end - first == 1 else f"{first}-{end - 1}"
