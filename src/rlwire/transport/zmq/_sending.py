"""A message's data packets: where a message is cut into them, and how each is sent
zero-copy after the routing id (docs/format.md, "ZeroMQ messages")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import anyio
import anyio.lowlevel
import numpy as np
import zmq
from anyio import CapacityLimiter, to_thread

from rlwire._core.errors import transport_error
from rlwire._core.slicing import SliceTimer
from rlwire._frame.checksums import segment_digests
from rlwire._frame.pieces import Pieces
from rlwire.transport.zmq._control import seal_packet
from rlwire.transport.zmq._peers import Peers
from rlwire.transport.zmq._protocol import Head, first_part
from rlwire.transport.zmq._sockets import Socket

#: A data packet this small is hashed in the event loop (xxh3: some tens of microseconds)
#: rather than in a worker thread, whose hop would delay the seal more than the hash.
INLINE_HASH_BYTES = 256 << 10

__all__ = ["Message", "cut", "joined", "send_message", "send_rest"]


@dataclass
class Message:
    """One rank's frame, as the data packets it is sent as."""

    head: Head
    segments: list[bytes | memoryview | Pieces]  # the header, then the buffers
    bounds: list[tuple[int, int]]  # the segments each data packet carries


async def send_rest(
    sock: Socket, parts: list[bytes | memoryview], trackers: list[zmq.MessageTracker]
) -> None:
    """Send ``parts`` after the routing id :meth:`Peers.claim` sent: the first one
    copied, the others zero-copy with a tracker appended to ``trackers`` while ZeroMQ
    holds them, in slices short enough to keep the event loop going."""
    sock.send(parts[0], zmq.SNDMORE | zmq.NOBLOCK)
    slicer = SliceTimer()
    last = len(parts) - 1
    cancelled: BaseException | None = None
    for i, part in enumerate(parts[1:], start=1):
        flags = zmq.NOBLOCK | (0 if i == last else zmq.SNDMORE)
        tracker = sock.send(part, flags, copy=False, track=True)
        if tracker is not None and not tracker.done:
            trackers.append(tracker)
        if slicer.due():
            try:
                await anyio.lowlevel.checkpoint()
            except anyio.get_cancelled_exc_class() as exc:
                # asyncio's own cancellation, which the caller's shield does not hold
                # off: a packet cut short would run into the next one. Raised once whole.
                cancelled = exc
            slicer.restart()
    if cancelled is not None:
        raise cancelled


async def joined(
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


def cut(segments: list[bytes | memoryview | Pieces], limit: int) -> list[tuple[int, int]]:
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


async def send_message(
    peers: Peers,
    message: Message,
    trackers: list[zmq.MessageTracker],
    limiter: CapacityLimiter,
    *,
    checksum: bool,
    where: str,
    on_visible: Callable[[], None],
) -> None:
    """Send ``message``'s data packets, each hashed while ZeroMQ sends it, then its
    seal. Stopped before the seal (cancelled, or an error), it tells the receiver to
    drop what it got, and the message's sequence number goes to the next message: a
    receiver returns a message only once sealed, so the step was not delivered.
    ``on_visible`` is called once the data packets are all sent."""
    rank = message.head.rank
    # Pieces are joined before the routing id is sent: nothing may wait between it
    # and the rest of the packet.
    start, stop = message.bounds[0]
    segments = await joined(message.segments[start:stop], limiter)
    peer = await peers.claim(rank)
    seq = peers.take_seq(peer)
    digests: list[int] = []
    try:
        for index, (start, stop) in enumerate(message.bounds):
            if index:
                segments = await joined(message.segments[start:stop], limiter)
                await peers.claim(rank, peer=peer)
            # Once the routing id is accepted ZeroMQ takes the rest (its queue limit
            # counts whole packets), so the packet is delivered whole or not at all.
            with anyio.CancelScope(shield=True):
                first = first_part(message.head, seq=seq, index=index, count=len(message.bounds))
                try:
                    await send_rest(peers.socket, [first, *segments], trackers)
                except zmq.ZMQError as exc:
                    raise transport_error(exc, f"send rank {rank}", where=where) from exc
            if checksum:
                views = [memoryview(segment) for segment in segments]
                if sum(view.nbytes for view in views) <= INLINE_HASH_BYTES:
                    digests += segment_digests(views)  # sooner than a worker thread
                else:
                    digests += await to_thread.run_sync(segment_digests, views, limiter=limiter)
        await peers.claim(rank, peer=peer)
    except BaseException:
        peers.abort(peer, seq)
        raise
    on_visible()
    checksums = np.array(digests, "<u8").tobytes()
    try:
        peers.socket.send_multipart(seal_packet(peers.session, seq, checksums), zmq.NOBLOCK)
    except zmq.ZMQError as exc:
        raise transport_error(exc, f"send rank {rank}", where=where) from exc
