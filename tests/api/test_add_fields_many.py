"""Many stages appending to one step and rank at once (``add_fields``), on files and S3,
asyncio and trio: each whose field is new commits, however many they are; a field two
of them append is committed by one, the other gets SchemaError naming it; a receiver
reading the step meanwhile gets each message whole or not at all, in index order.

On S3 the stages reach the test server through a :class:`FaultProxy` that forwards
conditional writes (``If-None-Match: *``) one at a time: moto checks a condition and
then writes, not atomically, and lets two commits of one new key both succeed (the
later replaces the earlier, and a stage that was told it committed loses its fields),
which S3 does not. The proxy adds nothing else: every request reaches moto.

:class:`Lockstep` holds each commit until every stage still at work is at its commit
too (all of them have staged the same number, and all commit it at once), the worst
case: before session 24 the stages that lost 8 times in a row failed. It delays the
real commit; nothing is replaced."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from s3_server import s3_client

import rlwire
from rlwire.aio import run_sliced
from rlwire.codecs import make_codec
from rlwire.transport import FileSink
from rlwire.transport.layout import StoredSink

pytestmark = pytest.mark.anyio

#: How many stages append at once: more than the 8 tries add_fields made before.
STAGES = 10
LENGTHS = [4, 3]


def _values(i: int) -> rlwire.Ragged:
    """Stage ``i``'s field: one value a token, its own (``1000 * i`` up)."""
    return rlwire.Ragged.from_lengths(np.arange(7, dtype=np.float32) + 1000 * i, LENGTHS)


async def _send(url: str, options: dict[str, Any]) -> None:
    async with rlwire.open_sender(url, validate=False, storage_options=options) as sender:
        await sender.send({"samples": [{"token_ids": np.arange(n)} for n in LENGTHS]})


async def _append(url: str, options: dict[str, Any], name: str, i: int) -> str:
    """One stage (a sender of its own, never opened) appending ``name``: "ok", or the
    error's type and words."""
    stage = rlwire.open_sender(url, storage_options=options)
    try:
        await stage.add_fields(0, {name: _values(i)}, rank=0)
    except rlwire.RlwireError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await stage.aclose()
    return "ok"


def _stored(url: str, options: dict[str, Any]) -> rlwire.Columns:
    # type=dict: the samples hold token_ids alone, not the fields a TrainingSample needs.
    with rlwire.open_receiver(
        url, type=dict, as_columns=True, record_consumed=False, storage_options=options
    ) as receiver:
        samples = receiver.receive(timeout=20)["samples"]
    assert isinstance(samples, rlwire.Columns)
    return samples


def _files_of_fields(url: str, options: dict[str, Any]) -> list[bytes]:
    """The files of fields appended to step 0 rank 0, in index order, read from the
    store itself (not through rlwire)."""
    prefix = "step-00000000.rank-0000.fields-"
    if not url.startswith("s3://"):
        names = sorted(n for n in os.listdir(url) if n.startswith(prefix))
        return [Path(url, n).read_bytes() for n in names]
    bucket, key = url.removeprefix("s3://").split("/", 1)
    client = s3_client(options)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{key}/{prefix}")
    keys = sorted(item["Key"] for item in listed.get("Contents", []))
    return [client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys]


class Lockstep:
    """Holds each commit of appended fields until every stage still appending waits at
    its commit too, then lets them all go at once (a stage that returned or raised is
    not waited for)."""

    def __init__(self, stages: int) -> None:
        self.active, self.waiting, self.round = stages, 0, 0
        self.rounds = 0  # how many times all the stages were let go
        self.cond = threading.Condition()

    def wait(self) -> None:
        with self.cond:
            self.waiting += 1
            mine = self.round
            self._go()
            assert self.cond.wait_for(lambda: self.round != mine, timeout=30)

    def done(self) -> None:
        with self.cond:
            self.active -= 1
            self._go()

    def _go(self) -> None:
        if self.waiting and self.waiting >= self.active:
            self.waiting, self.round = 0, self.round + 1
            self.cond.notify_all()


def _hold_commits(monkeypatch: pytest.MonkeyPatch, before: Callable[[], None]) -> None:
    """Call ``before()`` in front of every commit of appended fields (files and S3)."""
    stage_fields = StoredSink.stage_fields

    def held(self: StoredSink, step: int, rank: int, frame: Any, **kw: Any) -> Any:
        staged = yield from stage_fields(self, step, rank, frame, **kw)
        commit = staged.commit

        def commit_held() -> None:
            before()
            commit()

        staged.commit = commit_held
        return staged

    monkeypatch.setattr(StoredSink, "stage_fields", held)


async def test_every_stage_of_many_committing_at_once_commits(
    file_or_atomic_s3: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 stages, each committing the same number at once every time: one wins each
    round, the others check their fields again and take the next number, 10 rounds in
    all. Before, those that lost 8 rounds raised StepExistsError (2 of them)."""
    url, options = file_or_atomic_s3
    await _send(url, options)
    lockstep = Lockstep(STAGES)
    _hold_commits(monkeypatch, lockstep.wait)
    got: dict[str, str] = {}

    async def stage(i: int) -> None:
        try:
            got[f"field_{i:02d}"] = await _append(url, options, f"field_{i:02d}", i)
        finally:
            lockstep.done()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(STAGES):
                tg.start_soon(stage, i)
    assert got == {f"field_{i:02d}": "ok" for i in range(STAGES)}
    assert lockstep.round == STAGES  # every round, all of those left collided
    samples = _stored(url, options)
    for i in range(STAGES):
        assert samples[f"field_{i:02d}"].values.tolist() == _values(i).values.tolist()
    assert len(_files_of_fields(url, options)) == STAGES


async def test_a_field_appended_by_two_stages_is_committed_by_one(
    file_or_atomic_s3: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage A checks ``score`` against the step (not appended yet), then B appends
    ``score`` and returns before A stages its file: A gets SchemaError naming the field,
    the step and the rank. Before, A took the next number and both committed."""
    url, options = file_or_atomic_s3
    await _send(url, options)
    b_done = threading.Event()
    first = rlwire.open_sender(url, storage_options=options)
    stage_fields = StoredSink.stage_fields

    def held(self: StoredSink, step: int, rank: int, frame: Any, **kw: Any) -> Any:
        if self is first.sink:  # checked already: wait for B's commit, then stage
            assert b_done.wait(30)
        return (yield from stage_fields(self, step, rank, frame, **kw))

    monkeypatch.setattr(StoredSink, "stage_fields", held)
    got: dict[str, str] = {}

    async def a() -> None:
        try:
            await first.add_fields(0, {"score": _values(1)})
            got["a"] = "ok"
        except rlwire.SchemaError as exc:
            got["a"] = str(exc)
        finally:
            await first.aclose()

    async def b() -> None:
        got["b"] = await _append(url, options, "score", 2)
        b_done.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(a)
            await anyio.sleep(0.2)  # A has checked, and waits
            tg.start_soon(b)
    assert got["b"] == "ok"
    assert "field 'score' was appended to the step already" in got["a"], got["a"]
    assert "step 0" in got["a"] and "rank 0" in got["a"], got["a"]
    assert _stored(url, options)["score"].values.tolist() == _values(2).values.tolist()
    assert len(_files_of_fields(url, options)) == 1


async def test_of_many_stages_appending_one_field_at_once_one_commits(
    file_or_atomic_s3: tuple[str, dict[str, Any]],
) -> None:
    """10 stages append ``score`` at once, nothing held: one commits, the 9 others get
    SchemaError naming it (before, 2 to 4 of 12 committed it, on files and S3 alike)."""
    url, options = file_or_atomic_s3
    await _send(url, options)
    got: list[str] = []

    async def stage(i: int) -> None:
        got.append(await _append(url, options, "score", i))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(STAGES):
                tg.start_soon(stage, i)
    assert got.count("ok") == 1, got
    refused = [g for g in got if g != "ok"]
    assert all("SchemaError" in g and "'score' was appended" in g for g in refused), refused
    assert len(_files_of_fields(url, options)) == 1


# On S3 in the long suite: its reads again and again load the shared test server.
@pytest.mark.parametrize(
    "file_or_atomic_s3", ["file", pytest.param("s3", marks=pytest.mark.long)], indirect=True
)
async def test_a_receiver_reading_meanwhile_gets_whole_messages_in_index_order(
    file_or_atomic_s3: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While 8 stages commit in lockstep, a receiver reads the step again and again:
    each read holds the fields of the first k messages (in index order, as stored),
    each whole, never a later message without an earlier one."""
    url, options = file_or_atomic_s3
    stages = 8
    await _send(url, options)
    lockstep = Lockstep(stages)
    _hold_commits(monkeypatch, lockstep.wait)
    seen: list[tuple[str, ...]] = []
    finished = anyio.Event()

    async def stage(i: int) -> None:
        try:
            assert await _append(url, options, f"field_{i:02d}", i) == "ok"
        finally:
            lockstep.done()

    async def read() -> None:
        while not finished.is_set():
            async with rlwire.open_receiver(
                url, type=dict, as_columns=True, record_consumed=False, storage_options=options
            ) as receiver:
                samples = (await receiver.areceive(timeout=20))["samples"]
            appended = tuple(n for n in samples.names if n != "token_ids")
            for name in appended:  # whole: every value of the stage's field
                i = int(name.removeprefix("field_"))
                assert samples[name].values.tolist() == _values(i).values.tolist()
            seen.append(appended)
            await anyio.sleep(0.01)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            async with anyio.create_task_group() as group:
                for i in range(stages):
                    group.start_soon(stage, i)
            finished.set()
    files = _files_of_fields(url, options)
    order = [
        next(f"field_{i:02d}" for i in range(stages) if f"field_{i:02d}".encode() in data)
        for data in files
    ]
    assert sorted(order) == [f"field_{i:02d}" for i in range(stages)]
    assert [n for n in _stored(url, options).names if n != "token_ids"] == order
    for appended in seen:
        assert list(appended) == order[: len(appended)], (appended, order)
    assert len({len(a) for a in seen}) > 2, seen  # it read while they committed


CHILD = textwrap.dedent("""
    import json, sys, anyio, numpy as np, rlwire
    url, options, backend = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    names = sys.argv[4:]

    async def append(name, i, out):
        stage = rlwire.open_sender(url, storage_options=options)
        try:
            values = np.arange(7, dtype=np.float32) + 1000 * i
            await stage.add_fields(0, {name: rlwire.Ragged.from_lengths(values, [4, 3])})
            out[name + "#" + str(i)] = "ok"
        except rlwire.RlwireError as exc:
            out[name + "#" + str(i)] = type(exc).__name__ + ": " + str(exc)
        finally:
            await stage.aclose()

    async def main():
        print("ready", flush=True)
        sys.stdin.readline()  # every process imported and ready: go at once
        out = {}
        async with anyio.create_task_group() as tg:
            for spec in names:
                name, i = spec.split("#")
                tg.start_soon(append, name, int(i), out)
        print(json.dumps(out), flush=True)

    anyio.run(main, backend=backend)
""")


# On S3 in the long suite: three processes on the shared test server are its slowest
# case; S3's commits are covered by the tasks above, the processes by files here.
@pytest.mark.parametrize(
    "file_or_atomic_s3", ["file", pytest.param("s3", marks=pytest.mark.long)], indirect=True
)
async def test_stages_in_processes_all_commit_and_one_field_twice_is_refused(
    file_or_atomic_s3: tuple[str, dict[str, Any]], anyio_backend: str
) -> None:
    """3 processes, each with 3 stages appending fields of their own and one appending
    ``shared``, all at once: the 9 fields are committed, ``shared`` by one stage, the
    2 others get SchemaError naming it."""
    url, options = file_or_atomic_s3
    await _send(url, options)
    procs = []
    for p in range(3):
        specs = [f"field_{3 * p + k:02d}#{3 * p + k}" for k in range(3)] + [f"shared#{100 + p}"]
        procs.append(
            await anyio.open_process(
                [sys.executable, "-c", CHILD, url, json.dumps(options), anyio_backend, *specs]
            )
        )
    got: dict[str, str] = {}
    try:
        with anyio.fail_after(60):
            outs = [BufferedByteReceiveStream(p.stdout) for p in procs if p.stdout]
            for out in outs:
                assert await out.receive_until(b"\n", 1 << 20) == b"ready"
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.send(b"go\n")
            for out, proc in zip(outs, procs, strict=True):
                got.update(json.loads(await out.receive_until(b"\n", 1 << 20)))
                assert await proc.wait() == 0
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.aclose()
    own = {k: v for k, v in got.items() if not k.startswith("shared")}
    assert own == {f"field_{i:02d}#{i}": "ok" for i in range(9)}
    shared = [v for k, v in got.items() if k.startswith("shared")]
    assert shared.count("ok") == 1 and len(shared) == 3, shared
    refused = [s for s in shared if s != "ok"]
    assert all(s.startswith("SchemaError") and "'shared' was appended" in s for s in refused)
    samples = _stored(url, options)
    for i in range(9):
        assert samples[f"field_{i:02d}"].values.tolist() == _values(i).values.tolist()
    winner = next(k for k, v in got.items() if k.startswith("shared") and v == "ok")
    assert samples["shared"].values.tolist() == _values(int(winner[7:])).values.tolist()


def test_a_number_taken_at_the_commit_is_named_with_its_file(tmp_path: Path) -> None:
    """Two stages that staged the same number on files: the later commit raises
    StepExistsError naming the fields file in the way (not its own temporary file) and
    saying another stage appended (add_fields checks again and retries it)."""
    url = str(tmp_path / "run")
    anyio.run(_send, url, {})
    frame = make_codec("msgpack").encode({"fields": rlwire.Columns({"score": [1.0, 2.0]})})
    staged = []
    for _ in range(2):
        sink = FileSink(url)
        sink.attach_fields()
        sink.read_appended(0, 0)  # none yet: both take number 0
        staged.append(run_sliced(sink.stage_fields(0, 0, frame, names=frozenset({"score"}))))
    staged[0].commit()
    with pytest.raises(rlwire.StepExistsError) as caught:
        staged[1].commit()
    staged[1].discard()
    assert "another stage appended to this step and rank first" in str(caught.value)
    assert str(caught.value.where).endswith("/step-00000000.rank-0000.fields-000.rlw")
    assert sorted(n for n in os.listdir(url) if "fields" in n) == [
        "step-00000000.rank-0000.fields-000.rlw"
    ]
