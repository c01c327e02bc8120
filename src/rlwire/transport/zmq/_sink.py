"""ZmqSink: binds a ROUTER socket and sends each step's messages to the receivers there."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.lowlevel
import numpy as np
import zmq
from anyio import CapacityLimiter, to_thread

from rlwire._core.args import check_int, check_positive
from rlwire._core.errors import ConfigError, RlwireError, TransportError, transport_error
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._frame.checksums import segment_digests
from rlwire._frame.pieces import Pieces
from rlwire.transport._base import (
    OnExisting,
    PendingFrame,
    Sink,
    SinkOptions,
    SourceOptions,
    Staged,
    reject_unknown,
    take_frame,
)
from rlwire.transport._url import URL
from rlwire.transport.zmq._peers import Pattern, Peers
from rlwire.transport.zmq._protocol import Head, first_part, make_head, seal_packet
from rlwire.transport.zmq._sockets import (
    Context,
    Socket,
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


@dataclass
class _Message:
    """One rank's frame, as the data packets it is sent as."""

    head: Head
    segments: list[bytes | memoryview | Pieces]  # the header, then the buffers
    bounds: list[tuple[int, int]]  # the segments each data packet carries


class _ZmqStaged(Staged):
    def __init__(self, sink: ZmqSink, messages: list[_Message]) -> None:
        self.sink = sink
        self.messages = messages

    async def acommit(self, limiter: CapacityLimiter) -> None:
        try:
            await self.sink._deliver(self, limiter)
        except RlwireError as exc:
            exc.add_context(where=self.sink.endpoint)
            raise

    def discard(self) -> None:
        self.messages = []  # nothing reached the socket


class ZmqSink(Sink):
    """Sends each step's frames over a ZeroMQ ROUTER socket it binds.

    Every buffer is a ZeroMQ part, sent without a copy, but for a
    :class:`~rlwire._frame.pieces.Pieces` buffer, which is joined into one part as its
    data packet is sent.

    Storage options (``open_sender(..., storage_options={...})``):

    ``pattern``
        ``"ranks"`` (default: each rank's receiver gets only its own payload) or
        ``"shared"`` (each step goes to one of the consumers, sharing the work).
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
        seconds closing a sender waits for receivers still connected that have not read
        everything sent to them (default 30).
    ``curve_secret_key`` / ``curve_public_key``
        the sender's CURVE key pair (Z85, from :func:`zmq.curve_keypair`): encrypt
        everything, and accept only receivers that know the public key.
    ``curve_clients``
        with CURVE, the public keys of the only receivers allowed to connect.

    Raises:
        ConfigError: a malformed URL or storage option.
        TransportError: the address cannot be bound; a receiver disconnected while it
            was being sent to; no receiver announced itself within ``ready_timeout``.

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

    gathers = True  # a Pieces buffer is joined per data packet (see _joined)

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
        auth = None
        try:
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
            release(sock, context, auth, linger=0)  # nothing was sent
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
            segments = [frame.header, *frame.buffers]
            messages.append(_Message(head, segments, _cut(segments, self.message_bytes)))
        return _ZmqStaged(self, messages)

    async def _deliver(self, staged: _ZmqStaged, limiter: CapacityLimiter) -> None:
        if self._peers is None:
            raise TransportError("the sink is not open", where=self.endpoint)
        peers = self._peers
        if self.pattern == "ranks":
            await peers.await_ranks(len(staged.messages))
        trackers: list[zmq.MessageTracker] = []
        for message in staged.messages:
            await self._send_message(staged, message, trackers, limiter)
        # The caller's arrays are referenced, not copied: return only once ZeroMQ has
        # let go of them, so they may be reused. A tracker has no descriptor to wait on.
        delay = 0.0005
        for tracker in trackers:
            while not tracker.done:
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.01)

    async def _send_message(
        self,
        staged: _ZmqStaged,
        message: _Message,
        trackers: list[zmq.MessageTracker],
        limiter: CapacityLimiter,
    ) -> None:
        """Send ``message``'s data packets, each hashed while ZeroMQ sends it, then its
        seal. Stopped before the seal (cancelled, or an error), it tells the receiver to
        drop what it got, and the message's sequence number goes to the next message: a
        receiver returns a message only once sealed, so the step was not delivered."""
        assert self._peers is not None
        peers, rank = self._peers, message.head.rank
        # Pieces are joined before the routing id is sent: nothing may wait between it
        # and the rest of the packet.
        start, stop = message.bounds[0]
        segments = await _joined(message.segments[start:stop], limiter)
        peer = await peers.claim(rank)
        seq = peers.take_seq(peer)
        digests: list[int] = []
        try:
            for index, (start, stop) in enumerate(message.bounds):
                if index:
                    segments = await _joined(message.segments[start:stop], limiter)
                    await peers.claim(rank, peer=peer)
                # Once the routing id is accepted ZeroMQ takes the rest (its queue limit
                # counts whole packets), so the packet is delivered whole or not at all.
                with anyio.CancelScope(shield=True):
                    first = first_part(
                        message.head, seq=seq, index=index, count=len(message.bounds)
                    )
                    try:
                        await _send_rest(peers.socket, [first, *segments], trackers)
                    except zmq.ZMQError as exc:
                        raise transport_error(
                            exc, f"send rank {rank}", where=self.endpoint
                        ) from exc
                if self.checksum:
                    views = [memoryview(segment) for segment in segments]
                    digests += await to_thread.run_sync(segment_digests, views, limiter=limiter)
            await peers.claim(rank, peer=peer)
        except BaseException:
            peers.abort(peer, seq)
            raise
        staged.visible = True
        checksums = np.array(digests, "<u8").tobytes()
        try:
            peers.socket.send_multipart(seal_packet(self._session, seq, checksums), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            raise transport_error(exc, f"send rank {rank}", where=self.endpoint) from exc

    async def afinish(self, end: int, limiter: CapacityLimiter) -> None:
        # In the sender's task, like a send: only one thread may use the socket.
        if self._peers is None:
            raise TransportError("the sink is not open", where=self.endpoint)
        self._peers.drain()
        self._peers.finish(end)

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
        release(peers.socket, context, auth, linger=remaining)


async def _send_rest(
    sock: Socket, parts: list[bytes | memoryview], trackers: list[zmq.MessageTracker]
) -> None:
    """Send ``parts`` after the routing id :meth:`Peers.claim` sent: the first one
    copied, the others zero-copy with a tracker appended to ``trackers`` while ZeroMQ
    holds them, in slices short enough to keep the event loop going."""
    sock.send(parts[0], zmq.SNDMORE | zmq.NOBLOCK)
    slicer = SliceTimer()
    last = len(parts) - 1
    for i, part in enumerate(parts[1:], start=1):
        flags = zmq.NOBLOCK | (0 if i == last else zmq.SNDMORE)
        tracker = sock.send(part, flags, copy=False, track=True)
        if tracker is not None and not tracker.done:
            trackers.append(tracker)
        if slicer.due():
            await anyio.lowlevel.checkpoint()
            slicer.restart()


async def _joined(
    segments: list[bytes | memoryview | Pieces], limiter: CapacityLimiter
) -> list[bytes | memoryview]:
    """The segments of one data packet as ZeroMQ parts: each is one part, so a
    :class:`~rlwire._frame.pieces.Pieces` is joined into one buffer here. That is a copy
    (ZeroMQ sends a part from one contiguous block), made in a worker thread, packet by
    packet, so only the packets in flight hold one; the other segments go zero-copy."""
    if not any(isinstance(segment, Pieces) for segment in segments):
        return cast(list[bytes | memoryview], segments)

    def join() -> list[bytes | memoryview]:
        return [s.joined() if isinstance(s, Pieces) else s for s in segments]

    return await to_thread.run_sync(join, limiter=limiter)


def _cut(segments: list[bytes | memoryview | Pieces], limit: int) -> list[tuple[int, int]]:
    """Where to cut ``segments`` into data packets: runs of whole segments, each closed
    once it holds ``limit`` bytes or more."""
    bounds = []
    start = size = 0
    for i, segment in enumerate(segments):
        size += segment.nbytes if isinstance(segment, Pieces) else memoryview(segment).nbytes
        if size >= limit:
            bounds.append((start, i + 1))
            start, size = i + 1, 0
    if start < len(segments):
        bounds.append((start, len(segments)))
    return bounds
