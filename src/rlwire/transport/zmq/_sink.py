"""ZmqSink: binds a ROUTER socket and sends each step's messages to the receivers there."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

import anyio
import zmq
from anyio import CapacityLimiter

from rlwire._core.args import check_int, check_positive
from rlwire._core.errors import ConfigError, RlwireError, TransportError, transport_error
from rlwire._core.slicing import Sliced
from rlwire._frame.checksums import CHECKSUM
from rlwire._frame.frame import Frame
from rlwire._frame.pieces import Pieces
from rlwire.transport._base import OnExisting, PendingFrame, Sink, Staged, take_frame
from rlwire.transport._options import SinkOptions, SourceOptions, reject_unknown
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._url import URL
from rlwire.transport.zmq._admission import Pattern
from rlwire.transport.zmq._delivery import send_step
from rlwire.transport.zmq._parts import (
    SentParts,
    encode_seal,
    part_head,
    refuse_shared,
    seal_head,
)
from rlwire.transport.zmq._peers import Peers
from rlwire.transport.zmq._protocol import WHOLE, Head, make_head
from rlwire.transport.zmq._sending import Message, cut, send_message
from rlwire.transport.zmq._sockets import (
    Context,
    curve_server_keys,
    endpoint,
    ensure_ipc_free,
    release,
    start_authenticator,
)
from rlwire.transport.zmq._source import ZmqSource, open_source

__all__ = ["ZmqSink"]


#: The default of storage option ``message_bytes``: the size of a data packet, at least.
PACKET_BYTES = 32 << 20


class _ZmqStaged(Staged):
    def __init__(
        self, sink: ZmqSink, messages: list[Message], part: tuple[int, PartInfo] | None = None
    ) -> None:
        self.sink = sink
        self.messages = messages
        self.part = part  # (step, part) of a part's message, recorded once it may be visible

    async def acommit(self, limiter: CapacityLimiter) -> None:
        try:
            await self.sink._deliver(self, limiter)
        except RlwireError as exc:
            exc.add_context(where=self.sink.endpoint)
            raise
        finally:
            if self.part is not None and self.visible:
                self.sink._sent_parts.sent(*self.part)

    def discard(self) -> None:
        self.messages = []  # nothing reached the socket

    def seen(self) -> None:
        self.visible = True  # a message's data packets are all sent: a receiver may have it


class ZmqSink(Sink):
    """Sends each step's frames over a ZeroMQ ROUTER socket it binds.

    Every buffer is a ZeroMQ part, sent without a copy, but for a
    :class:`~rlwire._frame.pieces.Pieces` buffer, which is joined into one part as its
    data packet is sent.

    Storage options (``open_sender(..., storage_options={...})``):

    ``pattern``
        ``"ranks"`` (default: each rank's receiver gets only its own payload; of two
        receivers of one rank, the one that announced itself last gets it, and the
        other is refused) or ``"shared"`` (each step goes to one of the consumers,
        sharing the work).
        Receivers may name it too (their storage option ``pattern``) to refuse
        messages of the other one; else a receiver keeps the pattern of its first.
    ``consumers``
        with ``"shared"``, how many consumers must announce themselves before the first
        send (default 1).
    ``hwm``
        packets queued per receiver before a send waits (default 2).
    ``message_bytes``
        the size of the data packets a message (a step's payload for one receiver) is
        cut into, at buffer boundaries (default 32 MiB): each side hashes one while
        ZeroMQ moves the next (docs/format.md, "ZeroMQ messages").
    ``ready_timeout``
        seconds a send waits for a receiver that has not announced itself (default:
        no limit) before raising TransportError.
    ``linger``
        seconds ``finish`` waits for room for the end, and closing a sender for what
        receivers still connected have not read (default 30).
    ``curve_secret_key`` / ``curve_public_key``
        the sender's CURVE key pair (Z85, from :func:`zmq.curve_keypair`): encrypt
        everything, and accept only receivers that know the public key.
    ``curve_clients``
        with CURVE, the public keys of the only receivers allowed to connect.

    Raises:
        ConfigError: a malformed URL or storage option.
        TransportError: the address cannot be bound; a receiver disconnected, or a
            newer receiver of its rank took the rank over, while it was being sent to;
            no receiver announced itself within ``ready_timeout``, or made room for the
            end within ``linger``.

    Example:
        >>> from rlwire.abc import SinkOptions
        >>> from rlwire.transport import parse_url
        >>> sink = ZmqSink.from_url(parse_url("zmq+tcp://127.0.0.1:5599"), SinkOptions())
        >>> sink.endpoint
        'tcp://127.0.0.1:5599'
    """

    _OPTIONS = (
        "pattern",
        "consumers",
        "hwm",
        "message_bytes",
        "ready_timeout",
        "linger",
        "curve_secret_key",
        "curve_public_key",
        "curve_clients",
    )

    gathers = True  # a Pieces buffer is joined per data packet (see joined)
    stores_parts = True  # the "ranks" pattern carries them (docs/format.md, 2.1)

    def __init__(  # noqa: PLR0913 (its storage options, one each; from_url parses them)
        self,
        endpoint: str,
        *,
        checksum: bool = True,
        pattern: Pattern = "ranks",
        consumers: int = 1,
        hwm: int = 2,
        message_bytes: int = PACKET_BYTES,
        ready_timeout: float | None = None,
        linger: float = 30.0,
        curve_secret_key: bytes | None = None,
        curve_clients: Iterable[bytes] | None = None,
    ) -> None:
        if pattern not in ("ranks", "shared"):
            raise ConfigError(f"pattern must be 'ranks' or 'shared', got {pattern!r}")
        self.endpoint = endpoint
        self.checksum = checksum
        self.pattern = pattern
        self.consumers = consumers
        self.hwm = hwm
        self.message_bytes = message_bytes
        self.ready_timeout = ready_timeout
        self.linger = linger
        self.curve_secret_key = curve_secret_key
        self.curve_clients = None if curve_clients is None else frozenset(curve_clients)
        self._context: Context | None = None
        self._auth: Any = None
        self._peers: Peers | None = None  # holds the socket while the sink is open
        self._session = os.urandom(8)
        self._sent_parts = SentParts()

    def __repr__(self) -> str:
        return f"ZmqSink({self.endpoint!r}, pattern={self.pattern!r})"

    @property
    def url(self) -> str:
        """The URL receivers connect to: once open, with the port actually bound."""
        return f"zmq+{self.endpoint}"

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> ZmqSink:
        opts = options.storage_options
        reject_unknown(url, opts, cls._OPTIONS)
        secret, clients = curve_server_keys(url, opts)
        ready_timeout = opts.get("ready_timeout")
        return cls(
            endpoint(url),
            checksum=options.checksum,
            pattern=opts.get("pattern", "ranks"),
            consumers=check_int(opts.get("consumers", 1), "storage option 'consumers'", low=1),
            hwm=check_int(opts.get("hwm", 2), "storage option 'hwm'", low=1),
            message_bytes=check_int(
                opts.get("message_bytes", PACKET_BYTES), "storage option 'message_bytes'", low=1
            ),
            ready_timeout=None
            if ready_timeout is None
            else check_positive(ready_timeout, "storage option 'ready_timeout'"),
            linger=check_positive(opts.get("linger", 30.0), "storage option 'linger'"),
            curve_secret_key=secret,
            curve_clients=clients,
        )

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> ZmqSource:
        return open_source(url, options)

    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        # A socket keeps nothing from earlier runs: every on_existing starts at
        # start_step, which receivers opened with the same start_step expect.
        ensure_ipc_free(self.endpoint)
        context: Context = zmq.Context()
        sock = context.socket(zmq.ROUTER)
        auth, monitor = None, None
        try:
            # Handshakes: a receiver that connects as the stream ends is waited for.
            monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or unknown peer is an error
            # A receiver reconnecting after a blip keeps its routing id: let it take over
            # a connection this side has not yet seen die, instead of being ignored.
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            sock.setsockopt(zmq.SNDHWM, self.hwm)
            if self.curve_secret_key is not None:
                auth = start_authenticator(context, self.curve_clients)
                sock.setsockopt(zmq.CURVE_SERVER, 1)
                sock.setsockopt(zmq.CURVE_SECRETKEY, self.curve_secret_key)
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            release(sock, context, auth, linger=0, monitor=monitor)  # nothing was sent
            raise transport_error(exc, "bind", where=self.endpoint) from exc
        # The address actually bound: zmq+tcp://host:0 picks a free port.
        self.endpoint = cast(bytes, sock.getsockopt(zmq.LAST_ENDPOINT)).decode()
        self._context, self._auth = context, auth
        self._peers = Peers(
            sock,
            session=self._session,
            pattern=self.pattern,
            consumers=self.consumers,
            ready_timeout=self.ready_timeout,
            monitor=monitor,
        )
        return start_step or 0

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        if self.pattern == "shared" and len(frames) > 1:
            raise ConfigError(
                f"the 'shared' pattern sends one object per step; got {len(frames)} "
                "(use pattern='ranks' for per-rank payloads)",
                where=self.endpoint,
            )
        messages = []
        for rank, pending in enumerate(frames):
            frame = yield from take_frame(pending)
            head = make_head(
                frame,
                session=self._session,
                step=step,
                rank=rank,
                shared=self.pattern == "shared",
                checksum=self.checksum,
            )
            messages.append(self._message(head, [frame.header, *frame.buffers]))
        return _ZmqStaged(self, messages)

    def _message(self, head: Head, segments: list[bytes | memoryview | Pieces]) -> Message:
        return Message(head, segments, cut(segments, self.message_bytes))

    def committed_parts(self, step: int, ranks: int | None = None) -> list[PartInfo]:
        # Nothing is stored: a sender in a new process knows no part of an earlier one,
        # as open() starts every on_existing afresh; the same sender opening the step
        # again (after an error) learns the parts it sent itself.
        refuse_shared(self.pattern, where=self.endpoint)
        return self._sent_parts.open(step)

    def stage_part(self, step: int, part: PartInfo, frame: Frame | Sliced[Frame]) -> Sliced[Any]:
        refuse_shared(self.pattern, where=self.endpoint)
        got = yield from take_frame(frame)
        head = make_head(
            got,
            session=self._session,
            step=step,
            rank=part.rank,
            shared=False,
            checksum=self.checksum,
        )
        message = self._message(part_head(head, part), [got.header, *got.buffers])
        return _ZmqStaged(self, [message], (step, part))

    def seal(self, seal: Seal) -> None:
        raise ConfigError(
            "a ZeroMQ sink sends a seal from the sender's task (aseal), never from a thread",
            where=self.endpoint,
        )

    async def aseal(self, seal: Seal, limiter: CapacityLimiter) -> None:
        """Send ``seal`` to the receiver of every rank of its step (but those sent it by
        an earlier try), once each is there, as a message of its own."""
        refuse_shared(self.pattern, where=self.endpoint)
        if self._peers is None:
            raise TransportError("the sink is not open", where=self.endpoint)
        sent, body = self._sent_parts, encode_seal(seal)
        # A rank sent its seal (by an earlier try, or just now) may close and leave: it
        # is owed nothing more, so neither this wait nor a later rank's seal waits for it.
        unsealed = [rank for rank in range(seal.ranks) if rank not in sent.sealed_to]
        await self._peers.await_ranks(unsealed)
        checksum = CHECKSUM if self.checksum else None
        for rank in unsealed:
            head = seal_head(self._session, seal, rank, checksum=checksum)
            await _ZmqStaged(self, [self._message(head, [body])]).acommit(limiter)
            sent.sealed_to.add(rank)
        sent.close(seal.step)

    async def _deliver(self, staged: _ZmqStaged, limiter: CapacityLimiter) -> None:
        if self._peers is None:
            raise TransportError("the sink is not open", where=self.endpoint)
        peers = self._peers
        if any(message.head.kind != WHOLE for message in staged.messages):
            peers.carry_parts()  # from now on, refuse receivers that cannot read them
        if self.pattern == "ranks":
            # The ranks sent to, not every rank up to them: a part or a seal for rank 1
            # goes whether or not rank 0's receiver (done with the step, or not yet
            # there) is connected.
            await peers.await_ranks({message.head.rank for message in staged.messages})
        trackers: list[zmq.MessageTracker] = []

        async def send(message: Message) -> None:
            await send_message(
                peers,
                message,
                trackers,
                limiter,
                checksum=self.checksum,
                where=self.endpoint,
                on_visible=staged.seen,
            )

        # Once one rank's message is sealed, the others follow, whatever cancellation.
        await send_step(staged.messages, send, patience=self.linger)
        first = staged.messages[0].head if staged.messages else None
        if self.pattern == "ranks" and first is not None and first.kind == WHOLE:
            # Sent whole to ranks 0 .. w-1: the ranks after are told now, not by the next
            # step, which may come a whole rollout later. A send stopped before this
            # (cancelled, failed) tells them nothing: their next message does.
            peers.tell_absent(first.step, len(staged.messages))
        # The caller's arrays are referenced, not copied: return only once ZeroMQ has
        # let go of them, so they may be reused. A tracker has no descriptor to wait on.
        delay = 0.0005
        for tracker in trackers:
            while not tracker.done:
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.01)

    async def afinish(self, end: int, limiter: CapacityLimiter) -> None:
        # In the sender's task, like a send: only one thread may use the socket.
        if self._peers is None:
            raise TransportError("the sink is not open", where=self.endpoint)
        await self._peers.finish(end, self.linger, where=self.endpoint)

    def close(self) -> None:
        """Stop sending: wait, up to ``linger`` seconds, until every receiver still
        connected has read what was sent to it, then release the socket and the address.
        The sender runs this in a worker thread, shielded from cancellation."""
        peers, context, auth = self._peers, self._context, self._auth
        self._peers, self._context, self._auth = None, None, None
        if peers is None or context is None:
            return
        deadline = time.monotonic() + self.linger
        peers.linger(deadline)
        # ZeroMQ's own linger, for what is still queued, within the same deadline.
        remaining = max(0, int((deadline - time.monotonic()) * 1000))
        release(peers.socket, context, auth, linger=remaining, monitor=peers.monitor)
