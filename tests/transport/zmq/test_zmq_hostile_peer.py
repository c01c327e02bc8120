"""A hostile receiver: a raw DEALER socket that sends a real sender what no rlwire
receiver would, a packet of very many parts. The sender ignores it, as any packet it
cannot read, discarding its parts unkept a slice at a time: it costs the producer no
Python object per part, its event loop ticks on, and the peer's next packet is taken."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
from helpers import loop_gaps

import rlwire
from rlwire.transport.zmq._control import ACK, ready_packet

#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 60.0
#: Parts of the hostile packet: a few MB on the wire.
MANY = 200_000


class Hostile:
    """A raw DEALER socket playing a receiver of rank 1 to the sender at ``url``."""

    def __init__(self, url: str) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.RCVTIMEO, int(LONG * 1000))
        self.dealer.connect(url.removeprefix("zmq+"))

    def send_many_then_ready(self, part: bytes) -> None:
        """An ``ack`` of :data:`MANY` parts ``part`` after it, then an honest ``ready``."""
        self.dealer.send_multipart([ACK, *[part] * MANY])
        self.dealer.send_multipart(ready_packet(1))

    def first_packet(self) -> list[bytes]:
        return self.dealer.recv_multipart()

    def close(self) -> None:
        """Disconnect (else the sender's close waits its ``linger`` for an ``ack``)."""
        self.dealer.close()
        self.context.term()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"zmq+ipc://{tmp_path}/sock"


@pytest.fixture
def hostile(url: str) -> Iterator[Hostile]:
    peer = Hostile(url)
    yield peer
    if not peer.context.closed:
        peer.close()


@pytest.mark.anyio
async def test_a_packet_of_many_parts_from_a_peer_is_ignored_and_the_loop_ticks_on(
    url: str, hostile: Hostile
) -> None:
    """A peer's packet of 200,000 empty parts is ignored, its parts discarded a slice at
    a time while the producer's event loop ticks on (one read of them all stalled it
    2-3 s on a loaded 2-core VM); the ``ready`` the peer sends after it is taken, and
    the step sent to its rank and to an honest receiver's arrives."""
    with rlwire.open_receiver(url, type=Any) as receiver:
        async with rlwire.open_sender(url) as sender:
            await sender.send({"step": 0})
            assert await receiver.areceive(timeout=LONG) == {"step": 0}
            hostile.send_many_then_ready(b"")
            async with loop_gaps() as gaps:
                await anyio.sleep(0.05)  # ticking
                await sender.send_ranks([{"step": 1}, {"step": 1, "rank": 1}])
                await anyio.sleep(0.05)  # a tick after the last wait, to be measured
            assert gaps and max(gaps) < 0.5, max(gaps)
            assert await receiver.areceive(timeout=LONG) == {"step": 1}
            assert hostile.first_packet()[0].startswith(b"RLWZ")  # rank 1's data packet
            hostile.close()


#: A producer in a process of its own: its peak memory (Linux's VmHWM, reset to the
#: memory in use just before the hostile packet comes) is its own.
PRODUCER = """
import json, sys
import anyio, rlwire

def kib(name):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(name))

async def main():
    async with rlwire.open_sender(sys.argv[1]) as sender:
        await sender.send({"step": 0})
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # the peak is now the memory in use
        before = kib("VmRSS:")
        print("cleared", flush=True)
        await sender.send_ranks([{"step": 1}, {"step": 1, "rank": 1}])
        print(json.dumps({"rise_kib": kib("VmHWM:") - before}), flush=True)

anyio.run(main)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's /proc")
def test_a_packet_of_many_parts_from_a_peer_costs_the_producer_no_object_a_part(
    url: str, hostile: Hostile
) -> None:
    """A peer's packet of 200,000 parts of 33 bytes (7 MB on the wire) costs the
    producer what libzmq holds of it (27 MiB: libzmq keeps a multipart packet whole
    until it is read, docs/reliability.md), not a Python object a part on top (43 MiB
    before); the ``ready`` after it is taken."""
    child = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with rlwire.open_receiver(url, type=Any) as receiver:
            assert receiver.receive(timeout=LONG) == {"step": 0}
            assert child.stdout is not None and child.stdout.readline() == "cleared\n"
            hostile.send_many_then_ready(b"x" * 33)  # bytes of 33: a Python object each
            assert receiver.receive(timeout=LONG) == {"step": 1}
            assert hostile.first_packet()[0].startswith(b"RLWZ")
            # The producer's figure once its step went to both ranks: closing the peer
            # before the rest of its message left made the send fail (a loaded run).
            out = child.stdout.readline()
            hostile.close()
            _, err = child.communicate(timeout=LONG)
    finally:
        child.kill()
        child.wait()
    assert out, err
    rise = json.loads(out)["rise_kib"]
    assert rise < 35 << 10, f"{rise >> 10} MiB"
