"""ZeroMQ sink and source: ``zmq+tcp://host:port`` and ``zmq+ipc:///path``.

The sender binds a ROUTER socket; each receiver connects a DEALER socket and announces
itself with a *ready* message naming its rank, so the sender knows who is there before
it sends step 0 and a receiver that starts late misses nothing. Two patterns:

``ranks`` (default)
    per-rank fan-out: ``send_ranks(objs)`` sends ``objs[r]`` only to the receiver of
    rank ``r``, and waits until every rank has announced itself.
``shared``
    one producer, consumers sharing work: each step goes to one consumer, the next one
    whose queue has room, so a slow consumer gets less.

A message is a multipart ZeroMQ message: a small *head* (magic, version, session, step,
sequence number, rank, codec, per-segment compression, checksums), the codec's header,
then one frame per out-of-band buffer, sent zero-copy. Every message to a receiver carries
the next sequence number of the sender's session, so a receiver detects a lost message
and raises :class:`~rlwire.errors.StepGapError` instead of training on a hole.
High-water marks bound the queue per receiver; a full queue makes the sender wait, never
drop. A send returns once ZeroMQ has released the message's buffers (handed them to the
kernel), so the caller may reuse its arrays. Receivers acknowledge what they read, and
closing a sender waits until every receiver that is still there has read everything sent
to it (up to ``linger`` seconds in all): ZeroMQ itself drops what a slow receiver had not
yet taken off its connection when the sender closes it.

Sockets are driven by the task that holds the sender, waiting on the socket's
edge-triggered file descriptor with :func:`anyio.wait_readable` and re-reading
``ZMQ_EVENTS`` after every wake-up: the same code runs under asyncio, uvloop and trio.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import anyio
import anyio.lowlevel
import msgspec
import zmq
import zmq.auth
from anyio import CapacityLimiter

from .._slicing import Sliced, SliceTimer
from ..errors import (
    ConfigError,
    CorruptFrameError,
    StepGapError,
    TransportError,
    UnsupportedVersionError,
    transport_error,
)
from ..frame import Frame
from ._base import OnExisting, Sink, SinkOptions, Source, SourceOptions, Staged, reject_unknown
from ._layout import CHECKSUM, checksum_segments, verify_segments
from ._url import URL

__all__ = ["ZmqSink", "ZmqSource"]

_MAGIC = b"RLWZ"
_VERSION = (1, 0)
_PRELUDE = struct.Struct("<4sHH")
_READY = b"ready"
_BYE = b"bye"
#: Receiver -> sender: the session and sequence number of the last message read.
_ACK = b"ack"
_ACK_BODY = struct.Struct("<8sQ")
#: Sender -> receiver, ignored: tells a closing sender whether the receiver is still there.
_PING = b"ping"
#: A receiver that has heard nothing for this long announces itself again, so a sender
#: that restarted (and so never saw the first announcement) learns it is there.
_REANNOUNCE_SECONDS = 1.0
#: Longest the sender sleeps between checks of a full queue or a missing receiver; the
#: socket's descriptor usually wakes it sooner.
_RETRY_SECONDS = 0.05

Pattern = Literal["ranks", "shared"]


class _Head(msgspec.Struct, array_like=True, frozen=True):
    session: bytes
    seq: int
    step: int
    rank: int
    shared: bool
    codec: str
    sidecar: list[int]
    compression: bytes  # one id per segment, or empty
    raw_sizes: list[int]  # one per segment, or empty
    checksum: str | None
    checksums: bytes  # packed little-endian u64 per segment, or empty


class _Ready(msgspec.Struct, array_like=True, frozen=True):
    version: int
    rank: int


_head_encoder = msgspec.msgpack.Encoder()
_head_decoder = msgspec.msgpack.Decoder(_Head)
_ready_decoder = msgspec.msgpack.Decoder(_Ready)


def _endpoint(parsed: URL) -> str:
    """``zmq+tcp://host:port`` -> ``tcp://host:port``; ``zmq+ipc:///p`` -> ``ipc:///p``."""
    url, parts = parsed.text, parsed.parts
    transport = parts.scheme.removeprefix("zmq+")
    if transport == "tcp":
        try:
            port = parts.port
        except ValueError as exc:  # a port that is not a number, or out of range
            raise ConfigError(f"{url!r}: a zmq+tcp URL needs a valid port: {exc}") from None
        if not parts.hostname or port is None:
            raise ConfigError(f"{url!r}: a zmq+tcp URL needs a host and a port")
        return f"tcp://{parts.netloc}"
    if transport == "ipc":
        path = parts.netloc + parts.path
        if not path:
            raise ConfigError(f"{url!r}: a zmq+ipc URL needs a path (zmq+ipc:///tmp/run.sock)")
        return f"ipc://{path}"
    raise ConfigError(f"{url!r}: ZeroMQ URLs are zmq+tcp://host:port or zmq+ipc:///path")


def _z85(value: object, name: str) -> bytes:
    key = value.encode() if isinstance(value, str) else value
    if not isinstance(key, bytes) or len(key) != 40:
        raise ConfigError(
            f"storage option {name!r} must hold 40-character Z85 CURVE keys "
            "(as zmq.curve_keypair() makes)"
        )
    return key


def _key(options: Mapping[str, Any], name: str) -> bytes | None:
    value = options.get(name)
    return None if value is None else _z85(value, name)


def _positive(
    options: Mapping[str, Any], name: str, default: float | None, kind: type = float
) -> Any:
    """``options[name]`` checked to be a positive number (an integer if ``kind`` is int)."""
    value = options.get(name, default)
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int if kind is int else int | float)
        or value <= 0
    ):
        what = "integer" if kind is int else "number"
        raise ConfigError(f"storage option {name!r} must be a positive {what}, got {value!r}")
    return value


def _events(sock: zmq.Socket[bytes]) -> int:
    """The socket's ZMQ_EVENTS; reading them also re-arms its edge-triggered descriptor."""
    return cast(int, sock.getsockopt(zmq.EVENTS))


async def _wait_descriptor(sock: zmq.Socket[bytes], timeout: float | None) -> None:
    """Wait for the socket's descriptor to signal a change, at most ``timeout`` seconds."""
    with anyio.move_on_after(timeout):
        await anyio.wait_readable(cast(int, sock.getsockopt(zmq.FD)))


@dataclass
class _Message:
    rank: int
    head: _Head
    parts: list[bytes | memoryview]


class _ZmqStaged(Staged):
    def __init__(self, sink: ZmqSink, messages: list[_Message]) -> None:
        self.sink = sink
        self.messages = messages

    async def acommit(self, limiter: CapacityLimiter) -> None:
        await self.sink._deliver(self)

    def discard(self) -> None:
        self.messages = []  # nothing reached the socket


class ZmqSink(Sink):
    """Sends each step's frames over a ZeroMQ ROUTER socket it binds.

    Storage options (``open_sender(..., storage_options={...})``):

    ``pattern``
        ``"ranks"`` (default: each rank's receiver gets only its own payload) or
        ``"shared"`` (each step goes to one of the consumers, sharing the work).
    ``consumers``
        with ``"shared"``, how many consumers must announce themselves before the first
        send (default 1).
    ``hwm``
        messages queued per receiver before a send waits (default 2).
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
        >>> from rlwire.abc import SinkOptions, parse_url
        >>> sink = ZmqSink.from_url(parse_url("zmq+tcp://127.0.0.1:5599"), SinkOptions())
        >>> sink.endpoint
        'tcp://127.0.0.1:5599'
    """

    _OPTIONS = (
        "pattern",
        "consumers",
        "hwm",
        "ready_timeout",
        "linger",
        "curve_secret_key",
        "curve_public_key",
        "curve_clients",
    )

    def __init__(
        self,
        endpoint: str,
        *,
        checksum: bool = True,
        pattern: Pattern = "ranks",
        consumers: int = 1,
        hwm: int = 2,
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
        self.ready_timeout = ready_timeout
        self.linger = linger
        self.curve_secret_key = curve_secret_key
        self.curve_clients = None if curve_clients is None else frozenset(curve_clients)
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self._auth: Any = None
        self._session = os.urandom(8)
        self._rank_peer: dict[int, bytes] = {}  # rank -> routing id of its receiver
        self._seq: dict[bytes, int] = {}  # routing id -> next sequence number
        self._acked: dict[bytes, int] = {}  # routing id -> messages it has read
        self._turn = 0  # round robin over consumers, for the shared pattern
        self._delivered = False

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
        secret = _key(opts, "curve_secret_key")
        public = _key(opts, "curve_public_key")
        if public is not None and (secret is None or zmq.curve_public(secret) != public):
            raise ConfigError(
                f"{url}: curve_public_key must come with the curve_secret_key it belongs to"
            )
        clients = opts.get("curve_clients")
        if clients is not None and secret is None:
            raise ConfigError(f"{url}: curve_clients needs curve_secret_key")
        if clients is not None and (
            isinstance(clients, str | bytes) or not isinstance(clients, Iterable)
        ):
            raise ConfigError(
                f"{url}: storage option 'curve_clients' must be a list of Z85 public keys, "
                f"got {type(clients).__name__}"
            )
        return cls(
            _endpoint(url),
            checksum=options.checksum,
            pattern=opts.get("pattern", "ranks"),
            consumers=_positive(opts, "consumers", 1, int),
            hwm=_positive(opts, "hwm", 2, int),
            ready_timeout=_positive(opts, "ready_timeout", None),
            linger=_positive(opts, "linger", 30.0),
            curve_secret_key=secret,
            curve_clients=None
            if clients is None
            else [_z85(key, "curve_clients") for key in clients],
        )

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> ZmqSource:
        opts = options.storage_options
        reject_unknown(url, opts, ZmqSource._OPTIONS)
        return ZmqSource(
            _endpoint(url),
            rank=options.rank,
            verify=options.verify,
            writable=options.writable,
            hwm=_positive(opts, "hwm", 2, int),
            curve_server_key=_key(opts, "curve_server_key"),
            curve_public_key=_key(opts, "curve_public_key"),
            curve_secret_key=_key(opts, "curve_secret_key"),
        )

    def open(self, on_existing: OnExisting) -> int:
        # A socket keeps nothing from earlier runs, so every on_existing starts at 0.
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = context.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or unknown peer is an error
            sock.setsockopt(zmq.SNDHWM, self.hwm)
            if self.curve_secret_key is not None:
                self._auth = _start_authenticator(context, self.curve_clients)
                sock.setsockopt(zmq.CURVE_SERVER, 1)
                sock.setsockopt(zmq.CURVE_SECRETKEY, self.curve_secret_key)
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)  # nothing was sent
            if self._auth is not None:
                self._auth.stop()
                self._auth = None
            context.term()
            raise transport_error(exc, "bind", where=self.endpoint) from exc
        # The address actually bound: zmq+tcp://host:0 picks a free port.
        self.endpoint = cast(bytes, sock.getsockopt(zmq.LAST_ENDPOINT)).decode()
        self._context, self._socket = context, sock
        return 0

    def stage(self, step: int, frames: Sequence[Frame]) -> Sliced[Staged]:
        if self.pattern == "shared" and len(frames) > 1:
            raise ConfigError(
                f"{self.endpoint}: the 'shared' pattern sends one object per step; "
                f"got {len(frames)} (use pattern='ranks' for per-rank payloads)"
            )
        messages = []
        for rank, frame in enumerate(frames):
            sums = (yield from checksum_segments(frame)) if self.checksum else b""
            head = _Head(
                session=self._session,
                seq=0,  # set per receiver at delivery
                step=step,
                rank=rank,
                shared=self.pattern == "shared",
                codec=frame.codec,
                sidecar=sorted(frame.sidecar),
                compression=bytes(frame.compression),
                raw_sizes=list(frame.raw_sizes),
                checksum=CHECKSUM if self.checksum else None,
                checksums=sums,
            )
            messages.append(_Message(rank, head, [frame.header, *frame.buffers]))
        return _ZmqStaged(self, messages)

    async def _deliver(self, staged: _ZmqStaged) -> None:
        sock = self._require_socket()
        if self.pattern == "ranks":
            await self._await_ranks(len(staged.messages))
        trackers: list[zmq.MessageTracker] = []
        for message in staged.messages:
            peer = await self._claim_peer(message.rank)
            head = msgspec.structs.replace(message.head, seq=self._seq[peer])
            first = _PRELUDE.pack(_MAGIC, *_VERSION) + _head_encoder.encode(head)
            # Once the routing id is accepted ZeroMQ takes the rest (its queue limit
            # counts whole messages), so the message is delivered whole or not at all;
            # the parts are handed over in slices short enough to keep the loop going.
            with anyio.CancelScope(shield=True):
                staged.visible = self._delivered = True
                self._seq[peer] += 1
                slicer = SliceTimer()
                last = len(message.parts) - 1
                try:
                    sock.send(first, zmq.SNDMORE | zmq.NOBLOCK)
                    for i, part in enumerate(message.parts):
                        flags = zmq.NOBLOCK | (0 if i == last else zmq.SNDMORE)
                        tracker = sock.send(part, flags, copy=False, track=True)
                        if tracker is not None and not tracker.done:
                            trackers.append(tracker)
                        if slicer.due():
                            await anyio.lowlevel.checkpoint()
                            slicer.restart()
                except zmq.ZMQError as exc:
                    raise transport_error(
                        exc, f"send rank {message.rank}", where=self.endpoint
                    ) from exc
        # The caller's arrays are referenced, not copied: return only once ZeroMQ has
        # let go of them, so they may be reused.
        delay = 0.0005
        for tracker in trackers:
            while not tracker.done:
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.01)

    async def _await_ranks(self, ranks: int) -> None:
        """Wait, sending nothing, until a receiver of each of ``ranks`` ranks has announced
        itself: a step is not handed to some ranks and then given up for want of another
        (a timeout or a cancellation meanwhile leaves the step unsent)."""
        deadline = None if self.ready_timeout is None else time.monotonic() + self.ready_timeout
        while True:
            self._drain()
            missing = [rank for rank in range(ranks) if rank not in self._rank_peer]
            if not missing:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TransportError(
                    f"{self.endpoint}: no receiver of rank {', '.join(map(str, missing))} "
                    f"announced itself within ready_timeout={self.ready_timeout} s"
                )
            await self._wait_for_socket(_RETRY_SECONDS)

    async def _claim_peer(self, rank: int) -> bytes:
        """The routing id of the receiver that gets ``rank``'s message, once its queue has
        room for the first part; the routing id part is sent here."""
        sock = self._require_socket()
        deadline = None if self.ready_timeout is None else time.monotonic() + self.ready_timeout
        while True:
            self._drain()
            for peer in self._candidates(rank):
                try:
                    sock.send(peer, zmq.SNDMORE | zmq.NOBLOCK)
                except zmq.Again:
                    continue  # this receiver's queue is full: backpressure
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise transport_error(exc, "send", where=self.endpoint) from exc
                    self._forget(peer)
                    if self.pattern == "ranks":
                        raise TransportError(
                            f"the receiver of rank {rank} disconnected; it will get a "
                            "StepGapError for this step when it reconnects",
                            where=self.endpoint,
                        ) from exc
                    continue
                return peer
            if deadline is not None and time.monotonic() > deadline and not self._candidates(rank):
                raise TransportError(
                    f"{self.endpoint}: {self._missing(rank)} within "
                    f"ready_timeout={self.ready_timeout} s"
                )
            await self._wait_for_socket(_RETRY_SECONDS)

    def _candidates(self, rank: int) -> list[bytes]:
        if self.pattern == "ranks":
            peer = self._rank_peer.get(rank)
            return [] if peer is None else [peer]
        peers = list(self._seq)
        if len(peers) < self.consumers and not self._delivered:
            return []  # the first send waits for the consumers the user asked for
        self._turn += 1
        start = self._turn % len(peers) if peers else 0
        return peers[start:] + peers[:start]

    def _missing(self, rank: int) -> str:
        if self.pattern == "ranks":
            return f"no receiver of rank {rank} announced itself"
        return f"{len(self._seq)} of {self.consumers} consumers announced themselves"

    def _drain(self, sock: zmq.Socket[bytes] | None = None) -> None:
        """Take every announcement, acknowledgement and farewell waiting on the socket."""
        sock = self._require_socket() if sock is None else sock
        while True:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 3:
                continue  # not from an rlwire receiver
            peer, kind, payload = parts
            if kind == _BYE:
                self._forget(peer)
            elif kind == _ACK:
                if len(payload) == _ACK_BODY.size and peer in self._seq:
                    session, seq = _ACK_BODY.unpack(payload)
                    if session == self._session:
                        self._acked[peer] = max(self._acked.get(peer, 0), seq + 1)
            elif kind == _READY:
                try:
                    ready = _ready_decoder.decode(payload)
                except msgspec.DecodeError:
                    continue
                if ready.version != _VERSION[0] or ready.rank < 0:
                    continue
                self._seq.setdefault(peer, 0)
                if self.pattern == "ranks":
                    old = self._rank_peer.get(ready.rank)
                    if old is not None and old != peer:
                        self._forget(old)  # a restarted receiver replaces the old one
                    self._rank_peer[ready.rank] = peer

    def _forget(self, peer: bytes) -> None:
        self._seq.pop(peer, None)
        self._acked.pop(peer, None)
        for rank, known in list(self._rank_peer.items()):
            if known == peer:
                del self._rank_peer[rank]

    async def _wait_for_socket(self, timeout: float) -> None:
        """Wait for any change on the socket (a message in, room in a queue), at most
        ``timeout`` seconds."""
        sock = self._require_socket()
        if not _events(sock) & zmq.POLLIN:
            await _wait_descriptor(sock, timeout)

    def _require_socket(self) -> zmq.Socket[bytes]:
        if self._socket is None:
            raise TransportError(f"{self.endpoint}: the sink is not open")
        return self._socket

    def _waiting(self, sock: zmq.Socket[bytes]) -> list[bytes]:
        """The receivers that have not yet read everything sent to them."""
        self._drain(sock)
        return [peer for peer, sent in self._seq.items() if self._acked.get(peer, 0) < sent]

    def _linger(
        self, sock: zmq.Socket[bytes], context: zmq.Context[zmq.Socket[bytes]], auth: Any
    ) -> None:
        """Wait, up to ``linger`` seconds, until every receiver still connected has read
        every message sent to it, then release the socket.

        ZeroMQ's own linger is not enough: a receiver whose queue is full stops reading
        its connection, and drops what is left in it once the sender closes it.
        """
        deadline = time.monotonic() + self.linger
        with contextlib.suppress(zmq.ZMQError):
            while (waiting := self._waiting(sock)) and time.monotonic() < deadline:
                for peer in waiting:  # one that went away without a word is unreachable
                    try:
                        sock.send_multipart([peer, _PING], zmq.NOBLOCK)
                    except zmq.Again:
                        pass  # its queue is full: it is there
                    except zmq.ZMQError:
                        self._forget(peer)
                sock.poll(int(_RETRY_SECONDS * 1000), zmq.POLLIN)
        # ZeroMQ's own linger, for what is still queued, within the same deadline.
        sock.close(linger=max(0, int((deadline - time.monotonic()) * 1000)))
        if auth is not None:
            auth.stop()
        context.term()

    def close(self) -> None:
        """Stop sending: wait, up to ``linger`` seconds, until every receiver still
        connected has read what was sent to it, then release the socket and the address.
        The sender runs this in a worker thread, shielded from cancellation."""
        sock, context, auth = self._socket, self._context, self._auth
        self._socket = self._context = self._auth = None
        if sock is not None and context is not None:
            self._linger(sock, context, auth)


def _start_authenticator(
    context: zmq.Context[zmq.Socket[bytes]], clients: frozenset[bytes] | None
) -> Any:
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(context)
    auth.start()
    if clients is None:
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    else:
        allowed = clients

        class _Allowed:
            def callback(self, domain: str, key: bytes) -> bool:
                return key in allowed

        auth.configure_curve_callback(domain="*", credentials_provider=_Allowed())
    return auth


class ZmqSource(Source):
    """Receives what a :class:`ZmqSink` sends to one rank, over a DEALER socket.

    Buffers are views of the received ZeroMQ frames (no copy); ``writable=True`` copies
    each buffer once. Storage options (``open_receiver(..., storage_options={...})``):

    ``hwm``
        messages queued before the sender waits (default 2).
    ``curve_server_key``
        the sender's CURVE public key: encrypt, and refuse any other sender.
    ``curve_public_key`` / ``curve_secret_key``
        this receiver's key pair (made fresh when not given), for senders that allow
        only listed receivers.

    Raises:
        StepGapError: a message was lost (the sequence or, for per-rank messages, the
            step does not follow on); the next read returns the message after the gap.
        CorruptFrameError: a message that is not well-formed or fails its checksums.
    """

    _OPTIONS = ("hwm", "curve_server_key", "curve_public_key", "curve_secret_key")
    consumes = True

    def __init__(
        self,
        endpoint: str,
        *,
        rank: int = 0,
        verify: bool = True,
        writable: bool = False,
        hwm: int = 2,
        curve_server_key: bytes | None = None,
        curve_public_key: bytes | None = None,
        curve_secret_key: bytes | None = None,
    ) -> None:
        if curve_server_key is None and (curve_public_key or curve_secret_key):
            raise ConfigError(f"{endpoint}: a CURVE key pair needs curve_server_key")
        if curve_server_key is not None and (curve_public_key is None) != (
            curve_secret_key is None
        ):
            raise ConfigError(f"{endpoint}: give both curve_public_key and curve_secret_key")
        self.endpoint = endpoint
        self.rank = rank
        self.verify = verify
        self.writable = writable
        self._lock = threading.Lock()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = self._context.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.RCVHWM, hwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, os.urandom(12))
            if curve_server_key is not None:
                if curve_public_key is None or curve_secret_key is None:
                    curve_public_key, curve_secret_key = zmq.curve_keypair()
                sock.setsockopt(zmq.CURVE_SERVERKEY, curve_server_key)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, curve_public_key)
                sock.setsockopt(zmq.CURVE_SECRETKEY, curve_secret_key)
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            self._context.term()
            raise transport_error(exc, "connect", where=endpoint) from exc
        self._socket: zmq.Socket[bytes] | None = sock
        self._session: bytes | None = None
        self._next_seq = 0
        self._received = False
        self._pending: tuple[int, Frame] | None = None
        self._heard = 0.0  # when a message last arrived or this receiver last announced
        self._ack: bytes | None = None  # an acknowledgement still to send
        try:
            self._announce()
        except zmq.ZMQError as exc:
            self.close()
            raise transport_error(exc, "announce itself", where=endpoint) from exc

    def __repr__(self) -> str:
        return f"ZmqSource({self.endpoint!r}, rank={self.rank})"

    def describe(self, step: int) -> str:
        return f"{self.endpoint}: step {step} rank {self.rank}"

    def _announce(self) -> None:
        sock = self._require_socket()
        # Not connected yet and the queue full: a later announcement goes instead.
        with contextlib.suppress(zmq.Again):
            sock.send_multipart(
                [_READY, msgspec.msgpack.encode(_Ready(_VERSION[0], self.rank))], zmq.NOBLOCK
            )
        self._heard = time.monotonic()

    def _require_socket(self) -> zmq.Socket[bytes]:
        if self._socket is None:
            raise TransportError(f"{self.endpoint}: the source is closed")
        return self._socket

    def read(self, step: int) -> Frame | None:
        got = self.read_next(step)
        return None if got is None else got[1]

    def read_next(self, step: int) -> tuple[int, Frame] | None:
        with self._lock:
            if self._pending is not None:
                got, self._pending = self._pending, None
                return got
            sock = self._require_socket()
            self._send_ack()
            while True:
                try:
                    parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    if time.monotonic() - self._heard > _REANNOUNCE_SECONDS:
                        self._announce()
                    return None
                except zmq.ZMQError as exc:
                    raise transport_error(exc, "receive", where=self.endpoint) from exc
                self._heard = time.monotonic()
                if len(parts) == 1 and parts[0].bytes == _PING:
                    continue
                head, frame = self._parse(parts, step)
                self._ack = _ACK_BODY.pack(head.session, head.seq)
                self._send_ack()
                if not head.shared and not self._received and head.step < step:
                    continue  # older than the step this receiver starts at
                return self._check_order(head, step, frame)

    def _send_ack(self) -> None:
        """Tell the sender which message was read last (a later one says it again)."""
        if self._ack is not None:
            with contextlib.suppress(zmq.Again):
                self._require_socket().send_multipart([_ACK, self._ack], zmq.NOBLOCK)
                self._ack = None

    def _check_order(self, head: _Head, step: int, frame: Frame) -> tuple[int, Frame]:
        expected_seq = self._next_seq if head.session == self._session else head.seq
        lost_seq = head.seq != expected_seq
        lost_step = not head.shared and head.step != step
        self._session, self._next_seq, self._received = head.session, head.seq + 1, True
        if lost_seq or lost_step:
            self._pending = (head.step, frame)
            detail = (
                f"expected step {step}, got step {head.step}"
                if lost_step
                else f"expected message {expected_seq} of this sender, got {head.seq}"
            )
            raise StepGapError(
                f"{self.endpoint}: rank {self.rank}: {detail}: messages were lost (a sender "
                f"or receiver restarted, or a send failed); the next receive returns step "
                f"{head.step}"
            )
        return head.step, frame

    def _parse(self, parts: list[zmq.Frame], step: int) -> tuple[_Head, Frame]:
        where = self.describe(step)
        first = parts[0].bytes
        if len(first) < _PRELUDE.size:
            raise CorruptFrameError(f"{where}: not an rlwire message ({len(first)}-byte head)")
        magic, major, _minor = _PRELUDE.unpack_from(first)
        if magic != _MAGIC:
            raise CorruptFrameError(f"{where}: not an rlwire message (bad magic {magic!r})")
        if major != _VERSION[0]:
            raise UnsupportedVersionError(
                f"{where}: ZeroMQ message version {major} is not supported; this reader "
                f"knows version {_VERSION[0]} (upgrade rlwire to read it)"
            )
        try:
            head = _head_decoder.decode(first[_PRELUDE.size :])
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise CorruptFrameError(f"{where}: malformed message head: {exc}") from exc
        segments = len(parts) - 1
        checks = {
            "compression ids": (len(head.compression), segments if head.compression else 0),
            "raw sizes": (len(head.raw_sizes), segments if head.compression else 0),
            "checksums": (len(head.checksums), 8 * segments if head.checksum else 0),
        }
        for what, (found, expected) in checks.items():
            if segments < 1 or found != expected:
                raise CorruptFrameError(
                    f"{where}: the head disagrees with the message: {segments} segments, "
                    f"{found} {what} (expected {expected})"
                )
        if not head.shared and head.rank != self.rank:
            raise CorruptFrameError(f"{where}: holds rank {head.rank}'s payload")
        views = [memoryview(p.buffer) for p in parts[1:]]
        if self.verify and head.checksum is not None:
            try:
                verify_segments(head.checksum, head.checksums, views, f"{where} (step {head.step})")
            except CorruptFrameError:
                # Read all the same: the sender need not wait for it when closing. Its
                # sequence number stays unused, so the next message reports the loss.
                self._ack = _ACK_BODY.pack(head.session, head.seq)
                self._send_ack()
                raise
        if self.writable:
            views = [memoryview(bytearray(v)) for v in views]
        try:
            frame = Frame(
                views[0],
                tuple(views[1:]),
                frozenset(head.sidecar),
                head.codec,
                tuple(head.compression),
                tuple(head.raw_sizes),
            )
        except ValueError as exc:
            raise CorruptFrameError(f"{where}: {exc}") from exc
        return head, frame

    def wait(self, timeout: float | None) -> None:
        # Bounded, so that the next read_next re-announces this receiver to a sender
        # that restarted (else a blocking receive waits forever); in short polls under
        # the lock, since close() may be called from another thread meanwhile.
        limit = _REANNOUNCE_SECONDS if timeout is None else min(timeout, _REANNOUNCE_SECONDS)
        deadline = time.monotonic() + limit
        while (remaining := deadline - time.monotonic()) > 0:
            with self._lock:
                if self._socket is None or self._socket.poll(
                    max(1, int(min(remaining, _RETRY_SECONDS) * 1000)), zmq.POLLIN
                ):
                    return

    async def await_message(self, timeout: float | None) -> None:
        # Bounded, so a closed source or a re-announcement is noticed.
        limit = _REANNOUNCE_SECONDS if timeout is None else min(timeout, _REANNOUNCE_SECONDS)
        deadline = time.monotonic() + limit
        while (remaining := deadline - time.monotonic()) > 0:
            sock = self._socket
            try:
                if sock is None or _events(sock) & zmq.POLLIN:
                    return
                await _wait_descriptor(sock, min(remaining, _RETRY_SECONDS))
            except zmq.ZMQError:
                return  # closed meanwhile: the next read says so

    def close(self) -> None:
        with self._lock:
            sock, self._socket = self._socket, None
            if sock is None:
                return
            with contextlib.suppress(zmq.ZMQError):  # else the sender learns from ZeroMQ
                sock.send_multipart([_BYE, b""], zmq.NOBLOCK)
            sock.close(linger=100)
            self._context.term()
