"""A hostile sender: a raw ROUTER socket that sends what no rlwire sender would, to a real
receiver. What it sends costs the receiver no more than what it honestly carries, and
is a typed error; the receiver then goes on with the next good message."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash
import zmq
from helpers import loop_gaps

import rlwire
from rlwire.codecs import MsgpackCodec
from rlwire.transport.zmq import _control as control
from rlwire.transport.zmq import _protocol as protocol

#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 60.0
#: Empty parts in one data packet: about 200 KB on the wire.
MANY = 100_000

Packets = list[list[bytes]]


def message(step: int, seq: int, *, rank: int = 0) -> Packets:
    """The packets an rlwire sender sends for ``{"step": step}`` to ``rank``."""
    frame = MsgpackCodec().encode({"step": step})
    segments = [bytes(frame.header), *map(bytes, frame.buffers)]
    head = protocol.make_head(
        frame, session=b"S" * 8, step=step, rank=rank, shared=False, checksum=True
    )
    checksums = b"".join(struct.pack("<Q", xxhash.xxh3_64_intdigest(s)) for s in segments)
    first = protocol.first_part(head, seq=seq, index=0, count=1)
    return [[first, *segments], control.seal_packet(b"S" * 8, seq, checksums)]


def many_parts(declared: int) -> Packets:
    """A data packet of :data:`MANY` empty segments after a header, whose head says the
    message has ``declared`` segments, and its seal (no checksums)."""
    frame = MsgpackCodec().encode({"step": 0})
    head = protocol.make_head(frame, session=b"S" * 8, step=0, rank=0, shared=False, checksum=False)
    head = protocol.Head(
        **{**{f: getattr(head, f) for f in head.__struct_fields__}, "segments": declared}
    )
    first = protocol.first_part(head, seq=0, index=0, count=1)
    return [[first, bytes(frame.header), *[b""] * MANY], control.seal_packet(b"S" * 8, 0, b"")]


class Hostile:
    """A raw ROUTER socket playing the sender to one receiver in this process."""

    def __init__(self, url: str) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVTIMEO, int(LONG * 1000))
        self.router.bind(url.removeprefix("zmq+"))
        self.peer: bytes | None = None

    def handshake(self) -> None:
        peer, kind, _body = self.router.recv_multipart()
        assert kind == b"ready"
        self.peer = peer

    def send(self, packets: Packets) -> None:
        assert self.peer is not None
        for parts in packets:
            self.router.send_multipart([self.peer, *parts])

    def close(self) -> None:
        self.router.close()
        self.context.term()


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[str, Hostile]]:
    url = f"zmq+ipc://{tmp_path}/sock"
    peer = Hostile(url)
    yield url, peer
    peer.close()


#: A packet of MANY empty parts: the head says so (a message of more segments than can
#: be real), or says what the message has (the packet carries more than that).
MANY_PARTS = [
    (MANY + 1, "takes the message to 65537 segments in 7 bytes"),
    (2, "data packet 0 of 1 carries 3 of 2 segments"),
]


@pytest.mark.parametrize(("declared", "words"), MANY_PARTS)
def test_a_packet_of_many_empty_parts_is_refused_and_discarded(
    hostile: tuple[str, Hostile], declared: int, words: str
) -> None:
    """A data packet of 100,000 empty parts is refused with CorruptFrameError naming
    where and the step; the parts left are discarded and the next good message is
    returned."""
    url, peer = hostile
    with rlwire.open_receiver(url, type=Any) as receiver:
        peer.handshake()
        peer.send(many_parts(declared))
        peer.send(message(0, 0))  # the packet refused left its sequence number unused
        with pytest.raises(rlwire.CorruptFrameError, match=words) as info:
            receiver.receive(timeout=LONG)
        assert "step 0" in str(info.value) and url.removeprefix("zmq+") in str(info.value)
        assert receiver.receive(timeout=LONG) == {"step": 0}


#: A receiver in a process of its own: its peak memory (Linux's VmHWM, reset to the
#: memory in use just before the receive) is its own.
RECEIVER = """
import json, sys
from typing import Any
import rlwire

def kib(name):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(name))

with rlwire.open_receiver(sys.argv[1], type=Any) as receiver:
    sys.stdin.readline()  # the packets were sent
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak is now the memory in use
    before = kib("VmRSS:")
    try:
        receiver.receive(timeout=60)
        error = None
    except rlwire.RlwireError as exc:
        error = [type(exc).__name__, str(exc)]
    rise = kib("VmHWM:") - before
    try:
        got = receiver.receive(timeout=60)
    except rlwire.RlwireError as exc:
        got = [type(exc).__name__, str(exc)]
    print(json.dumps({"error": error, "rise_kib": rise, "next": got}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's /proc")
def test_a_packet_of_many_empty_parts_costs_the_receiver_little_memory(
    hostile: tuple[str, Hostile],
) -> None:
    """The receiver refuses a packet of 100,000 empty parts (a few bytes each on the
    wire) before it keeps a Python object for each: its peak memory grows by a few MB
    (hundreds for millions of parts before)."""
    url, peer = hostile
    child = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        peer.handshake()
        peer.send(many_parts(MANY + 1))
        peer.send(message(0, 0))
        out, _ = child.communicate("go\n", timeout=LONG)
    finally:
        child.kill()
        child.wait()
    got = json.loads(out)
    assert got["rise_kib"] < 24 << 10, f"{got['rise_kib'] >> 10} MiB"  # 87 MiB before, 9 after
    assert got["error"][0] == "CorruptFrameError" and "65537 segments" in got["error"][1]
    assert got["next"] == {"step": 0}


@pytest.mark.anyio
async def test_discarding_a_packet_of_many_parts_keeps_the_loop_and_the_timeout(
    hostile: tuple[str, Hostile],
) -> None:
    """Async: the packet of many parts is refused, its parts discarded in slices in a
    worker thread (the event loop ticks on meanwhile), and the next receive returns the
    good message after it."""
    url, peer = hostile
    with rlwire.open_receiver(url, type=Any) as receiver:
        peer.handshake()
        peer.send(many_parts(MANY + 1))
        peer.send(message(0, 0))
        async with loop_gaps() as gaps:
            with pytest.raises(rlwire.CorruptFrameError, match="65537 segments"):
                await receiver.areceive(timeout=LONG)
            assert await receiver.areceive(timeout=LONG) == {"step": 0}
        assert gaps and max(gaps) < 0.5, max(gaps)


def test_a_control_packet_of_more_parts_than_two_is_refused(
    hostile: tuple[str, Hostile],
) -> None:
    """A ``ping`` of many parts is refused once its third part arrives."""
    url, peer = hostile
    with rlwire.open_receiver(url, type=Any) as receiver:
        peer.handshake()
        peer.send([[b"ping", *[b""] * MANY], *message(0, 0)])
        with pytest.raises(rlwire.CorruptFrameError, match="a 'ping' packet of more than 2 parts"):
            receiver.receive(timeout=LONG)
        assert receiver.receive(timeout=LONG) == {"step": 0}


def test_an_absent_packet_that_leaves_no_rank_out_is_refused(
    hostile: tuple[str, Hostile],
) -> None:
    """``absent`` of step 0 sent to ranks 0..4, told to rank 0 (which it does not leave
    out), is malformed: CorruptFrameError naming it, not a gap; the real step 0 that
    follows is returned."""
    url, peer = hostile
    with rlwire.open_receiver(url, type=Any, rank=0) as receiver:
        peer.handshake()
        peer.send([control.absent_packet(0, 5), *message(0, 0)])
        with pytest.raises(rlwire.CorruptFrameError, match=r"ranks 0\.\.4, rank 0 among them"):
            receiver.receive(timeout=LONG)
        assert receiver.receive(timeout=LONG) == {"step": 0}
