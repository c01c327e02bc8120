"""A ZeroMQ data packet whose send asyncio cancels itself (``task.cancel()``, as
``asyncio.timeout`` does) midway, between its parts: anyio's shield around the packet
does not hold that off, and a packet cut short would run into the next message on the
socket. asyncio only: trio has no cancellation outside its scopes."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from rlwire._core.slicing import SliceTimer
from rlwire.transport.zmq import _sending


def test_a_packet_cancelled_by_asyncio_midway_is_sent_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A slice of no time: the send lets the loop in after every part.
    monkeypatch.setattr(_sending, "SliceTimer", lambda: SliceTimer(0.0))
    parts: list[bytes | memoryview] = [b"first", *(bytes([i]) * 64 for i in range(40))]
    context = zmq.Context()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        sender.bind("inproc://packet")
        receiver.connect("inproc://packet")

        async def main() -> None:
            task = asyncio.ensure_future(_sending.send_rest(sender, parts, []))
            await asyncio.sleep(0)  # the send starts and waits at its first checkpoint
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert receiver.poll(5000)
        assert receiver.recv_multipart(zmq.NOBLOCK) == parts
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()
