"""Consumption marks part by part (issue 28, item 4), on a directory and on the test S3
server: a receiver reading parts records, for its rank, the step and the first part it
has not moved past; a receiver opened with ``resume=True`` starts there, across a real
``kill -9``; ``max_ahead`` is released as a rank's ``parts()`` pass its last part;
``keep_last`` never deletes a step a rank is part way through; and the 16-byte
consumption mark stays what senders before parts read."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import forked
import pytest
from helpers import make_sample
from s3_server import s3_client

import rlwire
from rlwire.transport.layout import consumed_mark

pytestmark = pytest.mark.anyio

TIMEOUT = 30.0


class Store:
    """A destination, and the raw bytes of what is stored there (read without rlwire)."""

    def __init__(self, url: str, options: dict[str, Any], root: Path | None) -> None:
        self.url, self.options, self.root = url, options, root

    def raw(self, name: str) -> bytes | None:
        if self.root is not None:
            path = self.root / name
            return path.read_bytes() if path.exists() else None
        bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        try:
            got = s3_client(self.options).get_object(Bucket=bucket, Key=f"{prefix}/{name}")
        except Exception as exc:  # botocore's NoSuchKey, made per client
            if "NoSuchKey" in type(exc).__name__ or "NoSuchKey" in str(exc):
                return None
            raise
        return bytes(got["Body"].read())

    def names(self) -> list[str]:
        if self.root is not None:
            return sorted(p.name for p in self.root.iterdir())
        bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        listed = s3_client(self.options).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
        return sorted(o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", []))

    def position(self, rank: int = 0) -> tuple[int, int] | None:
        """The rank's position as docs/format.md ("Marks") says to read it: the
        consumption mark's step, and the part mark's part if it is of that step."""
        step_mark = self.raw(f"consumed.rank-{rank:04d}.rlw")
        if step_mark is None:
            return None
        magic, major, minor, step = struct.unpack("<4sHHQ", step_mark)  # 16 bytes exactly
        assert (magic, major, minor) == (b"RLWC", 1, 1)
        part_mark = self.raw(f"consumed.rank-{rank:04d}.part.rlw")
        if part_mark is None:
            return step, 0
        # 24 bytes, then (format 1.6) the id of the part 0 the parts moved past followed
        magic, major, minor, marked, part = struct.unpack_from("<4sHHQQ", part_mark)
        assert (magic, major, minor) == (b"RLWP", 1, 6 if len(part_mark) > 24 else 2)
        return step, part if marked == step else 0

    def resumed_at(self, rank: int = 0) -> tuple[int, int]:
        """Where a receiver opened with ``resume=True`` starts."""
        with rlwire.open_receiver(
            self.url,
            rank=rank,
            resume=True,
            record_consumed=False,
            storage_options=self.options,
        ) as receiver:
            return receiver.next_step, receiver.next_part


@pytest.fixture(params=["dir", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "dir":
        return Store(str(tmp_path / "run"), {}, tmp_path / "run")
    url = request.getfixturevalue("s3_url")
    return Store(f"{url}/run", request.getfixturevalue("s3_endpoint"), None)


def samples(key: int) -> list[rlwire.TrainingSample]:
    return [make_sample(4 + key, seed=key)]


async def fill(sender: rlwire.TrainingBatchSender, keys: list[int], ranks: int = 1) -> None:
    """One step of ``keys``, each key's part to rank ``key % ranks``."""
    async with sender.open_step(ranks=ranks) as writer:
        for key in keys:
            await writer.put(samples(key), key=key, rank=key % ranks)


def taker(receiver: rlwire.TrainingBatchReceiver[Any], face: str) -> Any:
    """An awaitable of the next part of the receiver's next step (``None`` once the step
    is done), through ``parts()`` or ``aparts()``."""
    if face == "sync":
        sync_parts = receiver.parts(timeout=TIMEOUT)

        async def take_sync() -> rlwire.Part[Any] | None:
            return next(sync_parts, None)

        return take_sync
    async_parts = receiver.aparts(timeout=TIMEOUT)

    async def take_async() -> rlwire.Part[Any] | None:
        try:
            return await async_parts.__anext__()
        except StopAsyncIteration:
            return None

    return take_async


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_marks_move_part_by_part(store: Store, face: str) -> None:
    async with rlwire.open_sender(store.url, storage_options=store.options) as sender:
        await fill(sender, [0, 1, 2])
        await fill(sender, [3, 4])
    async with rlwire.open_receiver(store.url, storage_options=store.options) as receiver:
        take = taker(receiver, face)
        seen: list[tuple[int, int] | None] = []
        while (part := await take()) is not None:
            seen.append(store.position())  # holding the part: moved past the ones before
            assert part.key == [0, 1, 2][part.index]
        seen.append(store.position())  # asked for part 3: past the step's last part
        assert seen == [None, (0, 1), (0, 2), (1, 0)]
        assert store.resumed_at() == (1, 0)
        assert (receiver.next_step, receiver.next_part) == (1, 0)
        take = taker(receiver, face)
        assert (await take()) is not None and store.position() == (1, 0)
        assert (await take()) is not None and store.position() == (1, 1)
        assert store.resumed_at() == (1, 1) and receiver.next_part == 2
        assert (await take()) is None and store.position() == (2, 0)


async def test_a_resumed_receiver_yields_the_parts_after_the_mark(store: Store) -> None:
    async with rlwire.open_sender(store.url, storage_options=store.options) as sender:
        await fill(sender, [0, 1, 2, 3])
    options = store.options
    with rlwire.open_receiver(store.url, storage_options=options) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        assert [next(parts).key, next(parts).key] == [0, 1]
        next(parts)  # asked for part 2 (and holds it): moved past 0 and 1
    async with rlwire.open_receiver(store.url, storage_options=options, resume=True) as receiver:
        assert (receiver.next_step, receiver.next_part) == (0, 2)
        assert [p.key async for p in receiver.aparts(timeout=TIMEOUT)] == [2, 3]
        assert store.position() == (1, 0)
    # receive() of the step is still the whole step, wherever parts() would begin.
    with rlwire.open_receiver(store.url, storage_options=options, start_step=0) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        next(parts), next(parts)  # position (0, 1), written
    with rlwire.open_receiver(store.url, storage_options=options, resume=True) as receiver:
        assert receiver.next_part == 1
        batch = receiver.receive(timeout=TIMEOUT)
        assert len(batch.samples) == 4 and receiver.last_step == 0
        assert receiver.next_part == 0


def test_resume_without_marks_starts_at_start_step(tmp_path: Path) -> None:
    with rlwire.open_receiver(tmp_path, resume=True, start_step=3) as receiver:
        assert (receiver.next_step, receiver.next_part) == (3, 0)
    with pytest.raises(rlwire.ConfigError, match="resume must be True or False"):
        rlwire.open_receiver(tmp_path, resume=1)  # type: ignore[arg-type]


def test_resume_on_a_socket_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("zmq")
    with pytest.raises(rlwire.ConfigError, match="records no consumption marks"):
        rlwire.open_receiver(f"zmq+ipc://{tmp_path}/sock", resume=True)


# ------------------------------------------------------------------ kill -9

#: A trainer in a process of its own: receives parts with resume=True, appends
#: "run step key" to the log as each is yielded (one write: a kill leaves whole lines),
#: and sleeps for good holding a part whose key is in argv[5:].
_CONSUMER = textwrap.dedent(
    """
    import json, os, random, sys, time
    import rlwire

    url, options, log, run, hold = (
        sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], set(sys.argv[5:])
    )
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with rlwire.open_receiver(
        url, resume=True, storage_options=options, poll_interval=0.005
    ) as receiver:
        print(f"start {receiver.next_step} {receiver.next_part}", flush=True)
        while True:
            try:
                for part in receiver.parts(timeout=60):
                    os.write(fd, f"{run} {part.step} {part.key}\\n".encode())
                    print(f"got {part.key}", flush=True)
                    if str(part.key) in hold:
                        time.sleep(600)
                    if "random" in hold:
                        time.sleep(random.random() * 0.02)
            except rlwire.EndOfStream:
                break
    print("end", flush=True)
    """
)


class Consumer:
    def __init__(self, store: Store, log: Path, run: int, hold: tuple[str, ...] = ()) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        args = [store.url, json.dumps(store.options), str(log), str(run), *hold]
        self.proc = forked.Popen(
            [sys.executable, "-c", _CONSUMER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def expect(self, line: str) -> None:
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        if got != line:
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"expected {line!r}, the consumer said {got!r}: {err[-2000:]}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=TIMEOUT)
        assert self.proc.returncode == -signal.SIGKILL

    def wait(self) -> None:
        """Wait for it to end on its own (what it says of its parts is in the log)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "end":
                break
        else:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the consumer ended without its last line: {err[-2000:]}")
        assert self.proc.wait(timeout=TIMEOUT) == 0


def settles(check: Any, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def logged(log: Path) -> list[tuple[int, int, int]]:
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]  # type: ignore[misc]


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    started: list[Consumer] = []
    yield started
    for consumer in started:
        if consumer.proc.poll() is None:
            consumer.proc.kill()
        consumer.proc.communicate(timeout=TIMEOUT)  # closes its pipes


def test_a_receiver_killed_mid_step_resumes_at_the_next_part(
    store: Store, tmp_path: Path, consumers: list[Consumer]
) -> None:
    log = tmp_path / "log"
    with rlwire.open_sync_sender(store.url, storage_options=store.options) as sender:
        consumers.append(consumer := Consumer(store, log, 0))
        consumer.expect("start 0 0")
        with sender.open_step() as writer:
            for key in (0, 1, 2):
                writer.put(samples(key), key=key)
            for key in (0, 1, 2):
                consumer.expect(f"got {key}")
            # It asked for part 3, which is not there yet: it moved past part 2.
            settles(lambda: store.position() == (0, 3))
            consumer.kill()
            consumers.append(consumer := Consumer(store, log, 1, hold=("4",)))
            consumer.expect("start 0 3")
            for key in (3, 4, 5):
                writer.put(samples(key), key=key)
            consumer.expect("got 3")
            consumer.expect("got 4")  # and holds it, without asking for part 5
            time.sleep(0.1)
            assert store.position() == (0, 4)
            consumer.kill()
        consumers.append(consumer := Consumer(store, log, 2))
        consumer.expect("start 0 4")  # part 4 again: it had not moved past it
        with sender.open_step() as writer:
            for key in (6, 7):
                writer.put(samples(key), key=key)
        sender.finish()
        consumer.wait()
    assert logged(log) == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 0, 2),
        (1, 0, 3),
        (1, 0, 4),  # killed holding it
        (2, 0, 4),
        (2, 0, 5),
        (2, 1, 6),
        (2, 1, 7),
    ]
    assert store.position() == (2, 0)


def test_receivers_killed_at_random_lose_and_repeat_nothing_they_moved_past(
    tmp_path: Path, consumers: list[Consumer]
) -> None:
    """kill -9 at random times, the producer done: across the runs every part is
    yielded, in order; one is yielded twice only when a run was killed holding it
    (the next run starts with the part the killed one logged last)."""
    store = Store(str(tmp_path / "run"), {}, tmp_path / "run")
    log = tmp_path / "log"
    steps = [list(range(s * 8, s * 8 + 8)) for s in range(3)]

    async def produce() -> None:
        async with rlwire.open_sender(store.url) as sender:
            for keys in steps:
                await fill(sender, keys)
            await sender.finish()

    anyio.run(produce)
    rng = random.Random(28)
    runs = 0
    while True:
        consumers.append(consumer := Consumer(store, log, runs, hold=("random",)))
        assert consumer.proc.stdout is not None
        assert consumer.proc.stdout.readline().startswith("start")
        if runs == 5:
            consumer.wait()
            break
        time.sleep(rng.random() * 0.15)
        if consumer.proc.poll() is not None:  # it finished first: that run is the last
            assert consumer.proc.returncode == 0
            break
        consumer.kill()
        runs += 1
    by_run: dict[int, list[tuple[int, int]]] = {}
    for run, step, key in logged(log):
        by_run.setdefault(run, []).append((step, key))
    delivered: list[tuple[int, int]] = []
    for run in sorted(by_run):
        got = by_run[run]
        if delivered and got and got[0] == delivered[-1]:
            got = got[1:]  # the part the killed run held: yielded again
        delivered += got
    assert delivered == [(s, key) for s, keys in enumerate(steps) for key in keys]
    assert store.position() == (3, 0)


# ------------------------------------------------------------------ retention


async def test_max_ahead_is_released_as_parts_pass_the_last_part(store: Store) -> None:
    """max_ahead=0: the producer opens step 1 only once both ranks' parts() have passed
    their last part of step 0; holding the last part is not enough."""
    async with rlwire.open_sender(store.url, storage_options=store.options, max_ahead=0) as sender:
        await fill(sender, [0, 1, 2, 3], ranks=2)
        receivers = [
            rlwire.open_receiver(store.url, rank=rank, storage_options=store.options)
            for rank in (0, 1)
        ]
        try:
            firsts = [r.aparts(timeout=TIMEOUT) for r in receivers]
            assert [p.key async for p in firsts[0]] == [0, 2]  # rank 0: past step 0
            assert (await firsts[1].__anext__()).key == 1
            assert (await firsts[1].__anext__()).key == 3  # rank 1 holds its last part
            with anyio.move_on_after(0.5) as scope:
                await fill(sender, [4, 5], ranks=2)
            assert scope.cancelled_caught  # waits for rank 1
            assert store.position(0) == (1, 0) and store.position(1) == (0, 1)
            assert [p async for p in firsts[1]] == []  # asks past its last part
            assert store.position(1) == (1, 0)
            with anyio.fail_after(TIMEOUT):
                await fill(sender, [4, 5], ranks=2)
            assert sender.last_step == 1
        finally:
            for receiver in receivers:
                await receiver.aclose()


async def test_keep_last_never_deletes_a_step_a_rank_is_part_way_through(tmp_path: Path) -> None:
    store = Store(str(tmp_path), {}, tmp_path)
    async with rlwire.open_sender(tmp_path, keep_last=1) as sender:
        await fill(sender, [0, 1, 2])
        async with rlwire.open_receiver(tmp_path) as receiver:
            parts = receiver.aparts(timeout=TIMEOUT)
            await parts.__anext__()
            await parts.__anext__()  # position (0, 1)
            await fill(sender, [3])
            await fill(sender, [4])
            assert "step-00000000.seal.rlw" in store.names()  # rank 0 is in step 0
            assert store.position() == (0, 1)
            assert [p.key async for p in parts] == [2]  # past its last part: (1, 0)
            await fill(sender, [5])  # step 3 deletes step 0 (every rank is past it)
            names = store.names()
            assert not [n for n in names if n.startswith("step-00000000")]
            assert "step-00000001.seal.rlw" in names  # step 1: not moved past yet


# ------------------------------------------------------------------ formats


async def test_a_consumption_mark_of_an_older_receiver_is_read(tmp_path: Path) -> None:
    """A receiver before part marks wrote the 16-byte mark only: senders go by it, and a
    resumed receiver starts at its step, from the first part."""
    async with rlwire.open_sender(tmp_path, max_ahead=0) as sender:
        await fill(sender, [0, 1])
        (tmp_path / "consumed.rank-0000.rlw").write_bytes(consumed_mark(1))
        with anyio.fail_after(TIMEOUT):
            await fill(sender, [2, 3])  # rank 0 moved past step 0
    with rlwire.open_receiver(tmp_path, resume=True) as receiver:
        assert (receiver.next_step, receiver.next_part) == (1, 0)
        assert [p.key for p in receiver.parts(timeout=TIMEOUT)] == [2, 3]


async def test_the_marks_a_new_receiver_writes_are_what_older_senders_read(
    tmp_path: Path,
) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await fill(sender, [0, 1, 2])
    with rlwire.open_receiver(tmp_path) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        next(parts), next(parts)
        # The consumption mark is the 16-byte mark of format 1.1, as before parts;
        # the part is in a file of its own, which older senders never look at; since
        # format 1.6 it names the run of the parts moved past: part 0's message id.
        assert (tmp_path / "consumed.rank-0000.rlw").read_bytes() == consumed_mark(0)
        data = (tmp_path / "consumed.rank-0000.part.rlw").read_bytes()
        assert struct.unpack_from("<4sHHQQ", data) == (b"RLWP", 1, 6, 0, 1)
        assert len(data) == 24 + 16


async def test_a_part_mark_of_another_step_or_garbled(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await fill(sender, [0, 1])
        await fill(sender, [2, 3])
    (tmp_path / "consumed.rank-0000.rlw").write_bytes(consumed_mark(1))
    part = tmp_path / "consumed.rank-0000.part.rlw"
    part.write_bytes(struct.pack("<4sHHQQ", b"RLWP", 1, 2, 0, 1))  # left from step 0
    assert Store(str(tmp_path), {}, tmp_path).resumed_at() == (1, 0)
    part.write_bytes(b"RLWP" + bytes(4))
    with pytest.raises(rlwire.CorruptFrameError, match="is 24 to 4096 bytes, this one 8") as e:
        rlwire.open_receiver(tmp_path, resume=True)
    assert "consumed.rank-0000.part.rlw" in str(e.value)
    part.write_bytes(struct.pack("<4sHHQQ", b"RLWP", 2, 0, 1, 1))
    with pytest.raises(rlwire.UnsupportedVersionError, match="part mark format major version 2"):
        rlwire.open_receiver(tmp_path, resume=True)


async def test_overwrite_and_truncate_delete_part_marks(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await fill(sender, [0, 1])
    with rlwire.open_receiver(tmp_path) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        next(parts), next(parts)
    leftover = tmp_path / ".consumed.rank-0000.part.rlw.0123abcd.tmp"  # a killed write's
    leftover.write_bytes(b"x")
    assert (tmp_path / "consumed.rank-0000.part.rlw").exists()
    async with rlwire.open_sender(tmp_path, on_existing="overwrite"):
        pass
    assert not (tmp_path / "consumed.rank-0000.part.rlw").exists()
    assert not leftover.exists()


#: A trainer restarted from a checkpoint: opens the rank at argv[3] (no resume), reads
#: the steps before argv[4] whole, says which part of step argv[4] it holds, then sleeps.
_RESTARTED = textwrap.dedent(
    """
    import json, sys, time
    import rlwire

    url, options, start, step = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:])
    receiver = rlwire.open_receiver(url, start_step=start, storage_options=options)
    for _ in range(start, step):
        receiver.receive(timeout=30)
    part = next(iter(receiver.parts(timeout=30)))
    print(f"holds {part.step} {part.key}", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("start", [1, 2])
def test_a_restart_from_a_checkpoint_killed_holding_a_part_resumes_at_it(
    store: Store, start: int
) -> None:
    """The rank had moved past parts 0-2 of step 2 (mark (2, 3)); a trainer restarted
    from a checkpoint at ``start`` reads up to step 2 and is killed with SIGKILL while
    it holds part 0: resumed, the rank is handed part 0 again, not part 3 (the part
    mark of the earlier pass, left beside the mark of the same step, skipped three)."""

    async def produce() -> None:
        async with rlwire.open_sender(store.url, storage_options=store.options) as sender:
            for step in range(3):
                await fill(sender, [step * 10 + k for k in range(5)])

    anyio.run(produce)
    with rlwire.open_receiver(store.url, storage_options=store.options) as receiver:
        receiver.receive(timeout=TIMEOUT), receiver.receive(timeout=TIMEOUT)
        parts = receiver.parts(timeout=TIMEOUT)
        assert [next(parts).key for _ in range(4)] == [20, 21, 22, 23]
    assert store.position() == (2, 3)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [store.url, json.dumps(store.options), str(start), "2"]
    proc = forked.Popen(
        [sys.executable, "-c", _RESTARTED, *args], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "holds 2 20"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=TIMEOUT)
    assert store.resumed_at() == (2, 0)
    with rlwire.open_receiver(store.url, storage_options=store.options, resume=True) as receiver:
        assert [p.key for p in receiver.parts(timeout=TIMEOUT)] == [20, 21, 22, 23, 24]


def test_a_restart_at_a_deleted_step_puts_the_part_mark_back(tmp_path: Path) -> None:
    """A trainer restarted at a step ``keep_last`` deleted leaves the rank's position as
    it found it, its part too (the restart reset the part mark before it lowered the
    consumption mark)."""
    store = Store(str(tmp_path), {}, tmp_path)

    def fill_step(sender: rlwire.SyncSender, step: int) -> None:
        with sender.open_step() as writer:
            for key in range(step * 10, step * 10 + 3):
                writer.put(samples(key), key=key)

    with rlwire.open_sync_sender(tmp_path, keep_last=2) as sender:
        for step in range(4):
            fill_step(sender, step)
        with rlwire.open_receiver(tmp_path) as receiver:
            for _ in range(3):
                receiver.receive(timeout=TIMEOUT)
            parts = receiver.parts(timeout=TIMEOUT)
            next(parts), next(parts), next(parts)
        assert store.position() == (3, 2)
        fill_step(sender, 4)  # deletes steps 0-2
    with rlwire.open_receiver(tmp_path, start_step=1) as late:
        with pytest.raises(rlwire.StepGapError):
            late.receive(timeout=5)
    assert store.position() == (3, 2)
    with rlwire.open_receiver(tmp_path, resume=True) as receiver:
        assert [p.key for p in receiver.parts(timeout=TIMEOUT)] == [32]


#: A receiver killed (SIGKILL) at the rename of the mark that says it moved past part 0
#: (argv[2] "part") or step 0 (argv[2] "step").
_KILLED_AT_RENAME = textwrap.dedent(
    """
    import os, signal, sys
    import rlwire

    receiver = rlwire.open_receiver(sys.argv[1], resume=True)
    parts = receiver.parts(timeout=30)
    next(parts)
    if sys.argv[2] == "step":
        next(parts), next(parts)  # holds the last part of step 0
    os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
    next(parts, None)  # asks for the next part, or past the step's last
    """
)


@pytest.mark.parametrize("mark", ["part", "step"])
def test_a_receiver_killed_writing_its_mark_leaves_no_file_once_resumed(
    tmp_path: Path, mark: str
) -> None:
    """The temporary file of a mark whose writer was killed is removed by the rank's
    next receiver as it first writes a mark, with the producer open all along (a
    sender removes such files only when one opens)."""
    with rlwire.open_sync_sender(tmp_path) as sender:
        for _ in range(2):
            with sender.open_step() as writer:
                for key in (0, 1, 2):
                    writer.put(samples(key), key=key)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = forked.Popen([sys.executable, "-c", _KILLED_AT_RENAME, str(tmp_path), mark], env=env)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
        left = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        assert len(left) == 1 and left[0].startswith(".consumed.rank-0000."), left
        with rlwire.open_receiver(tmp_path, resume=True) as receiver:
            parts = receiver.parts(timeout=TIMEOUT)
            first = next(parts)
            assert (first.step, first.index) == ((0, 0) if mark == "part" else (0, 2))
            next(parts, None)
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
