"""Steps filled part by part over ZeroMQ (protocol 2.1): a producer in another process,
receivers reading part by part and whole, a producer that dies mid-step and a new one
that fills the step again, the same sender reopening a step, and what is refused (the
``shared`` pattern, receivers of protocol 2.0). Every async test runs under asyncio and
trio."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import forked
import msgspec
import pytest
import zmq
from helpers import make_batch

import rlwire
from rlwire._api.synthetic import assert_batches_equal
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport.zmq import ZmqSource
from rlwire.transport.zmq import _protocol as protocol
from rlwire.transport.zmq._parts import decode_seal, encode_seal, part_head, seal_head

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).resolve().parents[2]
LONG = 60.0

# A producer process: fills ``steps`` steps of ``ranks`` ranks with ``groups`` parts each
# (the samples of group g of step s: make_batch seeded 100 * s + g), prints each step's
# assignment, then finishes the stream; or (``hang_after``) prints the assignment after
# that many parts of step 0 and hangs, for the test to kill it (-9) midway through.
PRODUCER = textwrap.dedent("""
    import json, sys
    spec = json.loads(sys.argv[1])
    sys.path.insert(0, spec["tests"])
    import anyio, rlwire
    from helpers import make_batch

    async def main():
        async with rlwire.open_sender(spec["url"]) as sender:
            for step in range(spec["steps"]):
                async with sender.open_step(ranks=spec["ranks"]) as writer:
                    for g in range(spec["groups"]):
                        samples = make_batch(1 + g % 3, 8, seed=100 * step + g).samples
                        await writer.put(samples, key=f"s{step}-g{g}")
                        if spec["hang_after"] == g + 1:
                            print(json.dumps(writer.assignment), flush=True)
                            await anyio.sleep_forever()
                print(json.dumps(writer.assignment), flush=True)
            await sender.finish()

    anyio.run(main, backend=spec["backend"])
""")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def samples_of(step: int, g: int) -> list[rlwire.TrainingSample]:
    return make_batch(1 + g % 3, 8, seed=100 * step + g).samples


def producer(url: str, backend: str, **spec: Any) -> subprocess.Popen[str]:
    spec = {"tests": str(TESTS), "url": url, "backend": backend, "hang_after": None, **spec}
    return forked.Popen(
        [sys.executable, "-c", PRODUCER, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill(child: subprocess.Popen[str]) -> None:
    """Kill ``child`` (-9), as a crash would, and release its pipes."""
    child.kill()
    child.communicate(timeout=LONG)


def url_of(kind: str, tmp_path: Path) -> str:
    if kind == "ipc":
        return f"zmq+ipc://{tmp_path}/sock"
    with zmq.Context() as context, context.socket(zmq.ROUTER) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    return f"zmq+tcp://127.0.0.1:{port}"


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
async def test_parts_from_a_producer_process(tmp_path: Path, kind: str, anyio_backend: str) -> None:
    """A producer process fills three steps of two ranks part by part: rank 0 reads each
    step part by part, rank 1 each step whole; every part is its rank's, in commit
    order, bit-exact, and the stream then ends."""
    url, steps, groups = url_of(kind, tmp_path), 3, 5
    got: dict[int, list[Any]] = {0: [], 1: []}
    with (
        rlwire.open_receiver(url, rank=0) as r0,
        rlwire.open_receiver(url, rank=1) as r1,
    ):
        child = producer(url, anyio_backend, steps=steps, ranks=2, groups=groups)
        try:

            async def by_parts() -> None:
                for _ in range(steps):
                    got[0].append([p async for p in r0.aparts(timeout=LONG)])
                with pytest.raises(rlwire.EndOfStream):
                    await r0.areceive(timeout=LONG)

            async def whole() -> None:
                for _ in range(steps):
                    got[1].append(await r1.areceive(timeout=LONG))
                with pytest.raises(rlwire.EndOfStream):
                    await r1.areceive(timeout=LONG)

            async with anyio.create_task_group() as tg:
                tg.start_soon(by_parts)
                tg.start_soon(whole)
            out, err = await anyio.to_thread.run_sync(child.communicate, None, LONG)
        finally:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assignments = [json.loads(line) for line in out.splitlines()]
    for step, assignment in enumerate(assignments):
        keys0, keys1 = assignment
        assert sorted(keys0 + keys1) == sorted(f"s{step}-g{g}" for g in range(groups))
        parts = got[0][step]
        assert [(p.step, p.key, p.rank, p.index) for p in parts] == [
            (step, k, 0, i) for i, k in enumerate(keys0)
        ]
        for part in parts:
            g = int(str(part.key).split("-g")[1])
            assert_batches_equal(part.value, rlwire.TrainingBatch(samples=samples_of(step, g)))
        joined = [s for k in keys1 for s in samples_of(step, int(k.split("-g")[1]))]
        assert_batches_equal(got[1][step], rlwire.TrainingBatch(samples=joined))


async def test_a_new_producer_fills_a_step_the_dead_one_left_open(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A socket stores nothing: a producer that dies midway through a step leaves no
    parts a new one could learn of (``committed_parts`` is empty, as a ZeroMQ sender
    starts afresh whatever ``on_existing``), so the new one puts every key again. A
    receiver reading the step whole gets the new session's parts, each key once: the
    dead session's unsealed parts are dropped when the new session's first part comes."""
    url = url_of("ipc", tmp_path)
    with rlwire.open_receiver(url, rank=0) as receiver:
        child = producer(url, anyio_backend, steps=1, ranks=1, groups=4, hang_after=2)
        assert child.stdout is not None
        line = await anyio.to_thread.run_sync(child.stdout.readline)
        assert json.loads(line) == [["s0-g0", "s0-g1"]], child.stderr
        kill(child)

        async def produce_again() -> None:
            async with rlwire.open_sender(url, on_existing="resume") as sender:
                async with sender.open_step(ranks=1) as writer:
                    assert writer.resumed == frozenset()
                    for g in range(4):
                        assert await writer.put(samples_of(0, g), key=f"s0-g{g}") is False

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce_again)
            whole = await receiver.areceive(timeout=LONG)
    expected = [s for g in range(4) for s in samples_of(0, g)]
    assert_batches_equal(whole, rlwire.TrainingBatch(samples=expected))
    assert receiver.next_step == 1


async def test_parts_read_from_a_dead_producer_are_void_once_a_new_one_starts(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A receiver reading part by part has handed out the dead producer's parts: when a
    new producer starts the step again, parts() raises StepOrderError saying so, and
    receive() returns the new producer's step whole once sealed."""
    url = url_of("ipc", tmp_path)
    with rlwire.open_receiver(url, rank=0) as receiver:
        child = producer(url, anyio_backend, steps=1, ranks=1, groups=4, hang_after=2)
        read = []
        async with aclosing(receiver.aparts(timeout=LONG)) as parts:
            async for part in parts:
                read.append(part.key)
                if len(read) == 2:
                    break
        assert read == ["s0-g0", "s0-g1"]
        kill(child)

        async def produce_again() -> None:
            async with rlwire.open_sender(url, on_existing="resume") as sender:
                async with sender.open_step(ranks=1) as writer:
                    await writer.put(samples_of(0, 3), key="s0-g3")

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce_again)
            with pytest.raises(rlwire.StepOrderError, match="those are void"):
                async for _ in receiver.aparts(timeout=LONG):
                    pass
            whole = await receiver.areceive(timeout=LONG)
    assert_batches_equal(whole, rlwire.TrainingBatch(samples=samples_of(0, 3)))


async def test_the_same_sender_reopens_a_step_and_skips_what_it_sent(tmp_path: Path) -> None:
    """An error inside the block leaves the step open; the same sender reopening it
    learns the parts it sent (put() skips them), and the receiver gets each key once."""
    url = url_of("ipc", tmp_path)
    with rlwire.open_receiver(url) as receiver:

        async def produce() -> None:
            async with rlwire.open_sender(url) as sender:
                with pytest.raises(RuntimeError):
                    async with sender.open_step() as writer:
                        await writer.put(samples_of(0, 0), key="a")
                        await writer.put(samples_of(0, 1), key="b")
                        raise RuntimeError("the producer's own error")
                async with sender.open_step(0) as writer:
                    assert writer.resumed == {"a", "b"}
                    assert await writer.put(samples_of(0, 0), key="a") is True
                    assert await writer.put(samples_of(0, 2), key="c") is False
                with pytest.raises(rlwire.StepOrderError, match="repeats step 0"):
                    async with sender.open_step(0):
                        pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            parts = [p async for p in receiver.aparts(timeout=LONG)]
    assert [p.key for p in parts] == ["a", "b", "c"]
    assert_batches_equal(parts[2].value, rlwire.TrainingBatch(samples=samples_of(0, 2)))


async def test_the_shared_pattern_refuses_open_step(tmp_path: Path) -> None:
    url = url_of("ipc", tmp_path)
    async with rlwire.open_sender(url, storage_options={"pattern": "shared"}) as sender:
        with pytest.raises(rlwire.ConfigError, match="needs pattern='ranks'"):
            async with sender.open_step():
                pass


async def test_a_receiver_of_protocol_2_0_is_refused_with_a_reason(tmp_path: Path) -> None:
    """A 2.0 receiver would take a part for a whole step: once a step is filled part by
    part, the sender refuses it (a ``refuse`` packet, which a 2.0 receiver raises as
    ConfigError), and waits for a receiver that can read parts."""
    url = url_of("ipc", tmp_path)
    options = {"ready_timeout": 1.0}
    with zmq.Context() as context, context.socket(zmq.DEALER) as old:
        old.setsockopt(zmq.RCVTIMEO, int(LONG * 1000))
        old.setsockopt(zmq.LINGER, 0)
        old.connect(url.removeprefix("zmq+"))
        old.send_multipart([b"ready", msgspec.msgpack.encode([2, 0])])  # as 2.0 sends it
        async with rlwire.open_sender(url, storage_options=options) as sender:
            with pytest.raises(rlwire.TransportError, match=r"protocol 2\.0"):
                async with sender.open_step() as writer:
                    await writer.put(samples_of(0, 0), key="a")
        kind, why = await anyio.to_thread.run_sync(old.recv_multipart)
    assert kind == b"refuse"
    assert b"speaks ZeroMQ protocol 2.0" in why


def test_a_part_and_a_seal_are_the_documented_bytes() -> None:
    """docs/format.md: a part's head is a whole step's with ``kind`` 1, ``part``, ``key``
    and ``cost`` after ``count``; a seal's message has ``kind`` 2 and one segment, the
    msgpack array ``[keys, costs]``; a whole step's head has neither (as in 2.0)."""
    frame = rlwire.codecs.MsgpackCodec().encode(make_batch(1, 8, seed=0))
    whole = protocol.make_head(frame, session=b"S" * 8, step=4, rank=1, shared=False, checksum=True)
    head = part_head(whole, PartInfo(rank=1, index=2, key="g7", cost=12.0))
    first = protocol.first_part(head, seq=5, index=0, count=1)
    assert first[:8] == b"RLWZ\x02\x00\x02\x00"
    values = msgspec.msgpack.decode(first[8:])
    assert values[:3] == [b"S" * 8, 5, 4] and values[11:] == [0, 1, 1, 2, "g7", 12.0]
    plain = msgspec.msgpack.decode(protocol.first_part(whole, seq=5, index=0, count=1)[8:])
    assert len(plain) == 13
    seal = Seal(step=4, keys=(("g7", 3), ()), costs=((12.0, 1.0), ()))
    body = encode_seal(seal)
    assert msgspec.msgpack.decode(body) == [[["g7", 3], []], [[12.0, 1.0], []]]
    assert decode_seal(4, body, where="here") == seal
    sealing = seal_head(b"S" * 8, seal, 0, checksum="xxh3-64")
    assert (sealing.kind, sealing.segments, sealing.step) == (protocol.STEP_SEAL, 1, 4)
    for bad, words in [
        (msgspec.msgpack.encode([[["a"]], []]), "disagree"),
        (msgspec.msgpack.encode([[["a"], ["a"]], [[1.0], [1.0]]]), "listed twice"),
        (b"\xc1", "malformed seal"),
    ]:
        with pytest.raises(rlwire.CorruptFrameError, match=words):
            decode_seal(4, bad, where="here")


async def test_a_seal_never_overtakes_the_parts_a_reader_found_missing(tmp_path: Path) -> None:
    """parts() asks for the next part, and only when it is missing for the seal: a part
    and the seal that arrive between the two must not show the seal first (the reader
    would take the part for lost). The seal shows once the reads of parts took it."""
    url = url_of("ipc", tmp_path)
    source = ZmqSource(url.removeprefix("zmq+"))
    try:
        assert source.read_part(0, 0) is None  # nothing sent yet
        async with rlwire.open_sender(url) as sender:
            async with sender.open_step() as writer:
                await writer.put(samples_of(0, 0), key="a")
            await sender.finish()
            await anyio.sleep(0.2)  # the part and the seal reach the receiver's queue
            assert source.read_seal(0) is None
            with anyio.fail_after(LONG):
                while (got := source.read_part(0, 0)) is None:
                    await anyio.sleep(0.01)
            assert got[0] == PartInfo(rank=0, index=0, key="a", cost=got[0].cost)
            # The seal may still be on its way (a loaded machine): only reads of parts take it.
            with anyio.fail_after(LONG):
                while (seal := source.read_seal(0)) is None:
                    assert source.read_part(0, 1) is None
                    await anyio.sleep(0.01)
            assert seal.keys == (("a",),)
    finally:
        source.close()


async def test_a_gap_into_a_step_filled_part_by_part_is_reported_then_skipped(
    tmp_path: Path,
) -> None:
    """A receiver expecting step 0 gets parts of step 1 (the sender started there):
    StepGapError, once; ``skip()`` to step 1 reads the kept parts."""
    url = url_of("ipc", tmp_path)
    with rlwire.open_receiver(url) as receiver:

        async def produce() -> None:
            async with rlwire.open_sender(url, start_step=1) as sender:
                async with sender.open_step() as writer:
                    await writer.put(samples_of(1, 0), key="a")
                    await writer.put(samples_of(1, 1), key="b")

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            with pytest.raises(rlwire.StepGapError, match="expected step 0, got step 1"):
                await receiver.areceive(timeout=LONG)
            assert receiver.skip() == 0
            parts = [p async for p in receiver.aparts(timeout=LONG)]
    assert [(p.step, p.key) for p in parts] == [(1, "a"), (1, "b")]


async def receive_parts(receiver: rlwire.Receiver[Any], how: str) -> list[tuple[int, Any]]:
    """The next step's parts as ``(step, key)``: by ``aparts``, or (``how="whole"``) by
    ``areceive`` of the step joined, as ``(step, samples)``."""
    if how == "parts":
        return [(p.step, p.key) async for p in receiver.aparts(timeout=LONG)]
    got = await receiver.areceive(timeout=LONG)
    return [(receiver.last_step, len(got.samples))]


@pytest.mark.parametrize("how", ["parts", "whole"])
@pytest.mark.parametrize("skips", [False, True])
async def test_a_step_filled_part_by_part_follows_a_gap_said_once(
    tmp_path: Path, skips: bool, how: str
) -> None:
    """Step 1 goes whole to rank 0 alone, step 2 is filled part by part for ranks 0-2,
    step 3 for ranks 0 and 1, step 4 goes whole to ranks 0-3: rank 1 hears of step 1
    once, then (``skip()``-ped or not) reads step 2's parts, then step 3's; rank 2 hears
    of step 1, reads step 2, hears of step 3; rank 3 hears of step 1, then of steps 2-3
    (by step 4's message); each then reads step 4, and the end of the stream. (The parts
    of a step after a gap were each a gap again, and never read without skip.)"""
    url = url_of("ipc", tmp_path)

    async def produce() -> None:
        async with rlwire.open_sender(url) as sender:
            await sender.send_ranks([make_batch(1, 8, seed=r) for r in range(4)])
            await sender.send(make_batch(1, 8, seed=10))
            for step, ranks in ((2, 3), (3, 2)):
                async with sender.open_step(ranks=ranks, balance="count") as writer:
                    for g in range(2 * ranks):
                        await writer.put(samples_of(step, g), key=f"s{step}-g{g}")
            await sender.send_ranks([make_batch(1, 8, seed=40 + r) for r in range(4)])
            await sender.finish()

    async def drain(receiver: rlwire.Receiver[Any]) -> None:
        with pytest.raises(rlwire.EndOfStream):
            while True:
                await receiver.areceive(timeout=LONG)

    rank0, rank1, rank2, rank3 = (rlwire.open_receiver(url, rank=r) for r in range(4))
    with rank0, rank1, rank2, rank3:
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            tg.start_soon(drain, rank0)
            for receiver in (rank1, rank2, rank3):
                assert (await receiver.areceive(timeout=LONG)).samples
                with pytest.raises(rlwire.StepGapError, match="step 1") as told:
                    await receiver.areceive(timeout=LONG)
                assert "step 2" not in str(told.value)
                if skips:
                    assert receiver.skip() == 1
            wanted = [(2, "s2-g1"), (2, "s2-g4")] if how == "parts" else [(2, 4)]
            assert await receive_parts(rank1, how) == wanted
            wanted = [(3, "s3-g1"), (3, "s3-g3")] if how == "parts" else [(3, 3)]
            assert await receive_parts(rank1, how) == wanted
            wanted = [(2, "s2-g2"), (2, "s2-g5")] if how == "parts" else [(2, 6)]
            assert await receive_parts(rank2, how) == wanted
            with pytest.raises(rlwire.StepGapError, match="step 3"):
                await rank2.areceive(timeout=LONG)
            if skips:
                assert rank2.skip() == 3
            with pytest.raises(rlwire.StepGapError, match="expected step 2, got step 4"):
                await rank3.areceive(timeout=LONG)
            if skips:
                assert rank3.skip() == 2
            for rank, receiver in ((1, rank1), (2, rank2), (3, rank3)):
                assert_batches_equal(
                    await receiver.areceive(timeout=LONG), make_batch(1, 8, seed=40 + rank)
                )
                assert receiver.last_step == 4
                with pytest.raises(rlwire.EndOfStream):
                    await receiver.areceive(timeout=LONG)


@pytest.mark.parametrize("how", ["parts", "whole"])
@pytest.mark.parametrize("skips", [False, True])
async def test_two_steps_filled_part_by_part_follow_a_lost_step(
    tmp_path: Path, skips: bool, how: str
) -> None:
    """A receiver expecting step 0 gets steps 1 and 2 filled part by part (step 0 never
    came: the sender started at step 1): the gap is said once, by step 1's first part,
    then (``skip()``-ped or not) steps 1 and 2 are read whole, and the stream ends."""
    url = url_of("ipc", tmp_path)

    async def produce() -> None:
        async with rlwire.open_sender(url, start_step=1) as sender:
            for step in (1, 2):
                async with sender.open_step() as writer:
                    for g in range(3):
                        await writer.put(samples_of(step, g), key=f"s{step}-g{g}")
            await sender.finish()

    with rlwire.open_receiver(url) as receiver:
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            with pytest.raises(rlwire.StepGapError, match="expected step 0, got step 1"):
                await receiver.areceive(timeout=LONG)
            if skips:
                assert receiver.skip() == 0
            for step in (1, 2):
                keys = [(step, f"s{step}-g{g}") for g in range(3)]
                assert await receive_parts(receiver, how) == (
                    keys if how == "parts" else [(step, 6)]
                )
                assert receiver.last_step == step
            with pytest.raises(rlwire.EndOfStream):
                await receiver.areceive(timeout=LONG)


async def test_parts_yields_a_whole_step_after_a_gap_under_its_own_step(tmp_path: Path) -> None:
    """``parts()`` of a receiver expecting step 0 when step 2 comes whole (steps 0 and 1
    never came): the gap, then step 2 as one part, numbered 2 (it said 0)."""
    url = url_of("ipc", tmp_path)
    with rlwire.open_receiver(url) as receiver:

        async def produce() -> None:
            async with rlwire.open_sender(url, start_step=2) as sender:
                await sender.send(make_batch(2, 8, seed=2))
                await sender.finish()

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            with pytest.raises(rlwire.StepGapError, match="expected step 0, got step 2"):
                await receiver.aparts(timeout=LONG).__anext__()
            parts = [p async for p in receiver.aparts(timeout=LONG)]
            assert [(p.step, p.key) for p in parts] == [(2, None)]
            assert_batches_equal(parts[0].value, make_batch(2, 8, seed=2))
            assert (receiver.last_step, receiver.next_step) == (2, 3)
            with pytest.raises(rlwire.EndOfStream):
                await receiver.areceive(timeout=LONG)


async def captured_step_of_two_parts(tmp_path: Path) -> list[list[bytes]]:
    """The packets a real sender sends rank 0 for a step filled with parts ``k0`` and
    ``k1``, got by a raw DEALER that acknowledges each message's seal: part 0's
    packets, part 1's, then the step's seal message."""
    import threading
    import time

    from rlwire.transport.zmq import _control as control

    endpoint = f"ipc://{tmp_path}/capture.sock"
    got: list[list[bytes]] = []

    def dealer() -> None:
        with zmq.Context() as context, context.socket(zmq.DEALER) as sock:
            sock.connect(endpoint)
            sock.send_multipart(control.ready_packet(0))
            seals, deadline = 0, time.monotonic() + LONG
            while seals < 3 and time.monotonic() < deadline:
                if sock.poll(100):
                    packet = sock.recv_multipart()
                    if packet[0][:4] == b"RLWZ" or packet[0] == b"seal":
                        got.append(packet)
                    if packet[0] == b"seal":
                        seals += 1
                        sock.send_multipart([b"ack", packet[1][:16]])  # its session and seq
            sock.send_multipart([b"bye", b""])
            sock.setsockopt(zmq.LINGER, 1000)

    thread = threading.Thread(target=dealer)
    thread.start()
    async with rlwire.open_sender(f"zmq+{endpoint}") as sender:
        async with sender.open_step() as writer:
            for g in range(2):
                await writer.put(samples_of(0, g), key=f"k{g}")
    await anyio.to_thread.run_sync(thread.join)
    return got


def with_key(packet: list[bytes], key: str) -> list[bytes]:
    """``packet`` (a part's first data packet) with ``key`` in its head, which no
    checksum covers: the seal still lists the key the sender put."""
    head = msgspec.msgpack.decode(packet[0][8:], type=protocol.Head)
    head = msgspec.structs.replace(head, key=key)
    return [packet[0][:8] + msgspec.msgpack.encode(head), *packet[1:]]


@pytest.mark.parametrize("key", ["k7", "k0"])
async def test_a_part_whose_key_its_seal_contradicts_is_refused_at_the_seal(
    tmp_path: Path, key: str
) -> None:
    """A hostile peer (a raw ROUTER socket) replays a real sender's packets of a step of
    parts k0, k1, part 1's head saying ``key`` (another, or part 0's again). ``parts()``
    hands out part 1 as its head says (the seal has not been read), and at the seal
    raises CorruptFrameError naming the part and both keys: it ended the loop as if all
    were well. ``receive()`` refuses the same step."""
    packets = await captured_step_of_two_parts(tmp_path)
    first_of_part_1 = next(
        i
        for i, p in enumerate(packets)
        if p[0][:4] == b"RLWZ"
        and (head := msgspec.msgpack.decode(p[0][8:], type=protocol.Head)).kind == protocol.PART
        and head.part == 1
    )
    packets[first_of_part_1] = with_key(packets[first_of_part_1], key)
    words = f"part 1 of rank 0 of step 0 holds key {key!r}; the seal lists key 'k1' for it"
    for how in ("parts", "whole"):
        url = f"zmq+ipc://{tmp_path}/{how}.sock"
        with zmq.Context() as context, context.socket(zmq.ROUTER) as router:
            router.setsockopt(zmq.LINGER, 0)
            router.bind(url.removeprefix("zmq+"))
            async with rlwire.open_receiver(url, type=list) as receiver:
                peer, kind, _ = router.recv_multipart()
                assert kind == b"ready"
                for packet in packets:
                    router.send_multipart([peer, *packet])
                with anyio.fail_after(LONG):
                    if how == "whole":
                        with pytest.raises(rlwire.CorruptFrameError, match=words):
                            await receiver.areceive(timeout=LONG)
                        continue
                    keys = []
                    with pytest.raises(rlwire.CorruptFrameError, match=words) as info:
                        async for part in receiver.aparts(timeout=LONG):
                            keys.append(part.key)
                    assert keys == ["k0", key]
                    assert (info.value.step, info.value.rank) == (0, 0)
