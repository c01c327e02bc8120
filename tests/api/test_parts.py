"""Steps filled part by part (sender.open_step, writer.put) on the stored sinks: each part
committed on its own, read as it appears (receiver.parts / aparts), sealed last."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest
from depth import examples
from helpers import assert_batches_equal, make_sample
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire
from rlwire._api.balance import choose_rank, token_cost

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["file", "memory", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A fresh destination of each stored kind, with its storage options."""
    if request.param == "file":
        return str(tmp_path / "run"), {}
    if request.param == "memory":
        return f"memory://parts-{uuid.uuid4().hex}", {}
    endpoint = request.getfixturevalue("s3_endpoint")
    return request.getfixturevalue("s3_url") + "/run", endpoint


def groups(count: int, size: int = 2) -> dict[str, list[rlwire.TrainingSample]]:
    """``count`` groups of ``size`` samples, of different lengths, by key."""
    return {
        f"group-{g}": [make_sample(8 + 5 * g + i, seed=100 * g + i) for i in range(size)]
        for g in range(count)
    }


async def test_parts_round_trip_with_sidecar_and_compression(
    url: tuple[str, dict[str, Any]],
) -> None:
    where, options = url
    parts = groups(5)
    async with rlwire.open_sender(
        where, sidecar=("routed_experts",), compression="lz4", storage_options=options
    ) as sender:
        async with sender.open_step(ranks=2) as writer:
            for key, samples in parts.items():
                assert await writer.put(samples, key=key) is False
        assert sender.last_step == 0 and sender.next_step == 1
        assignment = writer.assignment
        whole_step = rlwire.TrainingBatch(samples=parts["group-0"])
        await sender.send_ranks([whole_step, whole_step])  # step 1, sent whole
    assert sorted(k for keys in assignment for k in keys) == sorted(parts)
    for rank in range(2):
        with rlwire.open_receiver(where, rank=rank, storage_options=options) as receiver:
            got = list(receiver.parts(timeout=10))
            assert [p.key for p in got] == list(assignment[rank])
            assert [(p.step, p.rank, p.index) for p in got] == [
                (0, rank, i) for i in range(len(got))
            ]
            for part in got:
                assert_batches_equal(part.value, rlwire.TrainingBatch(samples=parts[str(part.key)]))
            whole = list(receiver.parts(timeout=10))  # a step sent whole: one part, no key
            assert [(p.step, p.key) for p in whole] == [(1, None)]
        with rlwire.open_receiver(where, rank=rank, storage_options=options) as receiver:
            batch = receiver.receive(timeout=10)  # waits for the seal, joins in commit order
            want = [s for key in assignment[rank] for s in parts[str(key)]]
            assert_batches_equal(batch, rlwire.TrainingBatch(samples=want))


async def test_the_files_of_parts_and_seal(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, sidecar=("routed_experts",)) as sender:
        async with sender.open_step(ranks=2) as writer:
            await writer.put([make_sample(4)], key="a", rank=1)
            await writer.put([make_sample(4)], key=7, rank=1)
            assert sorted(os.listdir(tmp_path)) == [
                "step-00000000.rank-0001.part-000000.rlw",
                "step-00000000.rank-0001.part-000000.sidecar.rlw",
                "step-00000000.rank-0001.part-000001.rlw",
                "step-00000000.rank-0001.part-000001.sidecar.rlw",
            ]
    assert "step-00000000.seal.rlw" in os.listdir(tmp_path)
    with rlwire.open_receiver(tmp_path, rank=0) as receiver:  # a rank given no parts
        assert receiver.receive(timeout=5).samples == []
    with rlwire.open_receiver(tmp_path, rank=1) as receiver:
        assert [p.key for p in receiver.parts(timeout=5)] == ["a", 7]


async def test_a_receiver_holds_a_part_before_the_step_is_sealed(tmp_path: Path) -> None:
    """The trainer starts on the first part while the producer is still filling the step;
    receive() of the whole step waits for the seal."""
    first_held = anyio.Event()
    got: list[str] = []

    async def produce() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            async with sender.open_step() as writer:
                await writer.put([make_sample(8)], key="first")
                with anyio.fail_after(10):
                    await first_held.wait()
                await writer.put([make_sample(8)], key="second")

    async def consume() -> None:
        with rlwire.open_receiver(tmp_path, poll_interval=0.005) as receiver:
            async for part in receiver.aparts(timeout=10):
                got.append(str(part.key))
                if part.key == "first":
                    assert not (tmp_path / "step-00000000.seal.rlw").exists()
                    with pytest.raises(rlwire.ReceiveTimeout):
                        await receiver.areceive(timeout=0.05)  # not sealed yet
                    first_held.set()
            assert receiver.next_step == 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        tg.start_soon(produce)
    assert got == ["first", "second"]


@pytest.mark.parametrize("face", ["parts", "aparts"])
async def test_the_timeout_of_parts_is_a_wait_for_each_part_not_for_the_step(
    tmp_path: Path, face: str
) -> None:
    """Parts 0.4 s apart, five of them: 2 s in all, each within the 1.5 s timeout. Then
    nothing: the wait for the sixth part times out, naming the step.

    Each wait covers a gap and a put: a put of 0.3 s or more, on a loaded machine, used
    to overrun a 0.2 s gap's 0.5 s timeout. And the seal waits for the timeout, not a
    fixed time after the last put."""
    gap, timeout = 0.4, 1.5
    opened, last_put, timed_out = anyio.Event(), anyio.Event(), anyio.Event()

    async def produce() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            opened.set()  # the receiver's first wait is for the first part, not the open
            async with sender.open_step() as writer:
                for key in range(5):
                    await anyio.sleep(gap)
                    await writer.put([make_sample(4)], key=key)
                last_put.set()
                with anyio.fail_after(30):
                    await timed_out.wait()  # the receiver times out before the seal

    async def consume() -> None:
        await opened.wait()
        with rlwire.open_receiver(tmp_path, poll_interval=0.005) as receiver:
            if face == "parts":
                parts = receiver.parts(timeout=timeout)
                take = lambda: next(parts)  # noqa: E731
                for _ in range(5):
                    got.append((await anyio.to_thread.run_sync(take)).key)
                with pytest.raises(rlwire.ReceiveTimeout, match="no new part of step 0 came"):
                    await anyio.to_thread.run_sync(take)
            else:
                with pytest.raises(rlwire.ReceiveTimeout, match="no new part of step 0 came"):
                    async for part in receiver.aparts(timeout=timeout):
                        got.append(part.key)
        timed_out.set()
        assert last_put.is_set()

    got: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        tg.start_soon(produce)
    assert got == list(range(5))


async def test_an_error_in_the_block_leaves_the_step_open_to_finish(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(RuntimeError, match="rollout failed"):
            async with sender.open_step(ranks=2) as writer:
                await writer.put([make_sample(4)], key="a")
                raise RuntimeError("rollout failed")
        assert not (tmp_path / "step-00000000.seal.rlw").exists()
        with pytest.raises(rlwire.StepOrderError, match="step 0 is open"):
            await sender.send(rlwire.TrainingBatch(samples=[]))
        with pytest.raises(rlwire.StepOrderError, match="step 0 is open"):
            await sender.finish()
        async with sender.open_step(ranks=2) as writer:  # the same step, again
            assert writer.step == 0 and writer.resumed == {"a"}
            assert await writer.put([make_sample(4)], key="a") is True  # skipped
            assert await writer.put([make_sample(5)], key="b") is False
        assert writer.assignment == (("a",), ("b",))
        assert await sender.send(rlwire.TrainingBatch(samples=[])) == 1


async def test_bad_puts_are_typed_errors_and_write_nothing(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        async with sender.open_step(ranks=2) as writer:
            await writer.put([make_sample(4)], key="a")
            with pytest.raises(rlwire.StepExistsError, match="key 'a' was put already"):
                await writer.put([make_sample(4)], key="a")
            for key in ("", True, 1.5, None, "x" * 1025):
                with pytest.raises(rlwire.ConfigError, match="key"):
                    await writer.put([], key=key)  # type: ignore[arg-type]
            utf8 = r"key must be encodable as UTF-8, got 'g-\\udc80'"
            with pytest.raises(rlwire.ConfigError, match=utf8):
                await writer.put([make_sample(4)], key="g-\udc80")  # a lone surrogate
            with pytest.raises(rlwire.ConfigError, match="must be a list"):
                await writer.put(rlwire.TrainingBatch(samples=[]), key="c")  # type: ignore[arg-type]
            with pytest.raises(rlwire.ConfigError, match="rank must be"):
                await writer.put([], key="c", rank=2)
            bad = make_sample(4)
            bad.logprobs[0] = np.nan
            with pytest.raises(rlwire.SchemaError):
                await writer.put([bad], key="c")
        assert writer.assignment == (("a",), ())
    assert sorted(n for n in os.listdir(tmp_path) if "part" in n) == [
        "step-00000000.rank-0000.part-000000.rlw"
    ]


def test_parts_of_a_closed_receiver_raise(tmp_path: Path) -> None:
    receiver = rlwire.open_receiver(tmp_path)
    receiver.close()
    with pytest.raises(rlwire.ClosedError):
        next(receiver.parts(timeout=1))


async def test_int_and_str_keys_are_different_keys(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender, sender.open_step() as writer:
        await writer.put([], key=1)
        await writer.put([], key="1")
    with rlwire.open_receiver(tmp_path) as receiver:
        assert [p.key for p in receiver.parts(timeout=5)] == [1, "1"]


async def test_sinks_that_cannot_store_parts_say_so() -> None:
    # ZeroMQ carries parts in its "ranks" pattern only (tests/transport/zmq/test_zmq_parts.py)
    options = {"pattern": "shared"}
    sender = rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options)
    with pytest.raises(rlwire.ConfigError, match=r"part by part \(open_step\) needs pattern"):
        async with sender.open_step():
            pass
    await sender.aclose()


def test_the_sync_sender_fills_a_step_part_by_part(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path) as sender:
        with sender.open_step(ranks=2, balance="count") as writer:
            for g in range(4):
                assert writer.put([make_sample(4 + 10 * g)], key=g) is False
        assert writer.assignment == ((0, 2), (1, 3))  # counts equal, then the lighter rank
        assert sender.last_step == 0
        with pytest.raises(rlwire.ConfigError, match="balance='count'"):
            with sender.open_step(ranks=2, balance="count") as writer:
                writer.put([], key="only")
    with rlwire.open_receiver(tmp_path, rank=1) as receiver:
        assert [len(s.token_ids) for s in receiver.receive(timeout=5).samples] == [14, 34]


def test_receivers_of_other_types_get_lists_or_their_struct(tmp_path: Path) -> None:
    class Rollouts(msgspec.Struct):
        rollouts: list[dict[str, Any]]
        version: int = 0

    with rlwire.open_sync_sender(tmp_path) as sender:
        with sender.open_step() as writer:
            writer.put([{"token_ids": np.arange(3), "reward": 1.0}], key="a")
            writer.put([{"token_ids": np.arange(2), "reward": 0.0}], key="b")
    with rlwire.open_receiver(tmp_path, type=Rollouts) as receiver:
        got = receiver.receive(timeout=5)
        assert isinstance(got, Rollouts) and [r["reward"] for r in got.rollouts] == [1.0, 0.0]
    with rlwire.open_receiver(tmp_path, type=list[dict[str, Any]]) as receiver:
        assert [len(p.value) for p in receiver.parts(timeout=5)] == [1, 1]
    with rlwire.open_receiver(tmp_path, type=dict) as receiver:
        with pytest.raises(rlwire.ConfigError, match="type must be"):
            list(receiver.parts(timeout=5))  # a dict cannot hold a list of samples


async def test_retention_deletes_the_parts_and_seals_of_pruned_steps(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, keep_last=2, sidecar=("routed_experts",)) as sender:
        with rlwire.open_receiver(tmp_path) as receiver:
            for _ in range(3):
                async with sender.open_step() as writer:
                    await writer.put([make_sample(4)], key="a")
                    await writer.put([make_sample(4)], key="b")
                receiver.receive(timeout=5)
            receiver.poll()  # moves past step 2: its mark says so
            async with sender.open_step() as writer:
                await writer.put([make_sample(4)], key="a")
    left = sorted(n for n in os.listdir(tmp_path) if n.startswith("step-"))
    assert {n[:13] for n in left} == {"step-00000002", "step-00000003"}
    assert "step-00000002.seal.rlw" in left and "step-00000001.seal.rlw" not in left


def test_token_cost_counts_tokens() -> None:
    samples = [make_sample(5), make_sample(7)]
    assert token_cost(samples) == 12
    assert token_cost([{"token_ids": [1, 2]}, {"other": 1}]) == 3
    columns = rlwire.Columns({"token_ids": rlwire.Ragged(np.arange(9), [0, 4, 9])})
    assert token_cost(columns) == 9


@settings(max_examples=examples(300), deadline=None)
@given(
    ranks=st.integers(1, 8),
    costs=st.lists(st.integers(0, 10_000), min_size=0, max_size=200),
)
def test_greedy_balance_keeps_ranks_within_the_largest_part(ranks: int, costs: list[int]) -> None:
    """The bound StepWriter documents: totals differ by at most the largest part."""
    assigned: list[list[float]] = [[] for _ in range(ranks)]
    for cost in costs:
        assigned[choose_rank(assigned)].append(float(cost))
    totals = [sum(a) for a in assigned]
    assert max(totals) - min(totals) <= max(costs, default=0)


@settings(max_examples=examples(200), deadline=None)
@given(ranks=st.integers(1, 8), costs=st.lists(st.integers(0, 100), max_size=100))
def test_count_balance_keeps_part_counts_within_one(ranks: int, costs: list[int]) -> None:
    assigned: list[list[float]] = [[] for _ in range(ranks)]
    for cost in costs:
        assigned[choose_rank(assigned, "count")].append(float(cost))
        counts = [len(a) for a in assigned]
        assert max(counts) - min(counts) <= 1


def test_the_streaming_example_runs() -> None:
    example = Path(__file__).parents[2] / "examples" / "streaming_parts.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "groups per rank" in proc.stdout
    # Two threads print: count what they said, not lines, which they may share.
    assert proc.stdout.count("(4 samples)") == 8
    assert proc.stdout.count("step 0 done") == 2


async def test_parts_as_columns_and_a_joined_step_as_one_columns(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender, sender.open_step() as writer:
        await writer.put([make_sample(3), make_sample(5)], key="a")
        await writer.put([make_sample(2)], key="b")
    with rlwire.open_receiver(tmp_path, as_columns=True) as receiver:
        got = list(receiver.parts(timeout=5))
        columns = got[0].value.samples
        assert isinstance(columns, rlwire.Columns)
        assert columns["token_ids"].offsets.tolist() == [0, 3, 8]
    with rlwire.open_receiver(tmp_path) as receiver:
        joined = receiver.receive(timeout=5, as_columns=True).samples
        assert isinstance(joined, rlwire.Columns)
        assert joined["token_ids"].offsets.tolist() == [0, 3, 8, 10]


async def test_a_refused_seal_leaves_the_step_open_for_more_parts(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(rlwire.ConfigError, match=r"got \[1, 0\] parts"):
            async with sender.open_step(ranks=2, balance="count") as writer:
                await writer.put([make_sample(4)], key="a")
        async with sender.open_step(ranks=2, balance="count") as writer:
            assert await writer.put([make_sample(4)], key="a") is True
            await writer.put([make_sample(4)], key="b")
        assert writer.assignment == (("a",), ("b",)) and sender.next_step == 1


async def test_parts_end_with_the_stream(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        async with sender.open_step() as writer:
            await writer.put([make_sample(4)], key="a")
        await sender.finish()
    with rlwire.open_receiver(tmp_path) as receiver:
        parts = receiver.parts(timeout=5)
        assert next(parts).key == "a"
        for _ in parts:  # the seal ends the loop
            pytest.fail("one part only")
        with pytest.raises(rlwire.EndOfStream):
            list(receiver.parts(timeout=5))


def test_a_step_sealed_between_the_reads_of_parts_is_still_read_part_by_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """parts() looks for the next part, then the seal, then a step sent whole: a step
    whose parts and seal are committed between those reads (the producer is faster than
    the receiver's poll) comes out part by part, never joined as one part without key."""
    with rlwire.open_sync_sender(tmp_path) as sender, sender.open_step() as writer:
        with rlwire.open_receiver(tmp_path) as receiver:
            source: Any = receiver._source  # type: ignore[attr-defined]
            read_seal = source.read_seal

            def seal_meanwhile(step: int) -> Any:
                found = read_seal(step)
                if found is None and not writer.assignment[0]:
                    writer.put([make_sample(4)], key="a")  # after the part was looked for
                    writer.put([make_sample(5)], key="b")
                    writer.seal()
                return found

            monkeypatch.setattr(source, "read_seal", seal_meanwhile)
            got = list(receiver.parts(timeout=5))
    assert [(p.key, p.index) for p in got] == [("a", 0), ("b", 1)]


async def test_a_writer_not_entered_or_entered_again_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        writer = sender.open_step()
        with pytest.raises(rlwire.ClosedError, match=r"not open: use it as `async with"):
            await writer.put([make_sample(4)], key="a")
        with pytest.raises(rlwire.ClosedError, match=r"not open: use it as `async with"):
            await writer.seal()
        assert os.listdir(tmp_path) == []
        async with writer:
            await writer.put([make_sample(4)], key="a")
        with pytest.raises(rlwire.ClosedError, match=r"entered once: sender.open_step\(\)"):
            async with writer:
                pass
        assert await sender.send(rlwire.TrainingBatch(samples=[])) == 1
    with rlwire.open_sync_sender(tmp_path, on_existing="resume") as sync_sender:
        with pytest.raises(rlwire.ClosedError, match=r"not open: use it as `async with"):
            sync_sender.open_step().put([], key="b")
    assert not any("step--" in name for name in os.listdir(tmp_path))
