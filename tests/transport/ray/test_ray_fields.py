"""Fields appended to committed steps on ray://, on a real local Ray cluster: receivers
see them (rows, columns, by field), a receiver waiting for a field waits on the board
(not by polling), a reference stage's fields are the board's and outlive it, and they
go with their step. asyncio and trio where the test is async."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import anyio
import numpy as np
import pytest
import ray
from helpers import plain_sample
from ray_actors import kill_and_wait, quiet_store_bytes, settles, store_bytes
from ray_fields_actors import RefStage

import rlwire
from rlwire.transport.ray import RaySource, create_board
from rlwire.transport.ray import _source as ray_source
from rlwire.transport.ray._board import Board, board_name

TIMEOUT = 60.0


def _name(url: str) -> str:
    return url.removeprefix("ray://")


def _sample(n: int) -> rlwire.TrainingSample:
    return plain_sample(n, (4, 2))


def _per_token(lengths: list[int], start: float = 0.0) -> rlwire.Ragged:
    values = np.arange(sum(lengths), dtype=np.float32) + np.float32(start)
    return rlwire.Ragged.from_lengths(values, lengths)


def _batch(lengths: list[int]) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[_sample(n) for n in lengths])


@pytest.mark.anyio
async def test_appended_fields_come_with_the_step(ray_url: str) -> None:
    """A step sent whole to two ranks and one filled part by part, fields appended to
    each rank: rows (ref_logprobs in its field, the rest in extras), columns, by field."""
    async with rlwire.open_sender(ray_url, sidecar="routed_experts") as sender:
        await sender.send_ranks([_batch([3, 5]), _batch([2])])
        async with sender.open_step(ranks=1) as writer:
            await writer.put([_sample(4)], key="a")
            await writer.put([_sample(1), _sample(6)], key="b")
        await sender.add_fields(0, {"ref_logprobs": _per_token([3, 5])})
        await sender.add_fields(0, {"score": np.array([0.5, 1.5]), "tag": ["x", "y"]})
        await sender.add_fields(0, {"ref_logprobs": _per_token([2], 10.0)}, rank=1)
        await sender.add_fields(1, {"ref_logprobs": _per_token([4, 1, 6], 20.0)})
        with pytest.raises(rlwire.SchemaError, match="'score' was appended to the step already"):
            await sender.add_fields(0, {"score": np.zeros(2)})
        with pytest.raises(rlwire.SchemaError, match=r"'values' row 1 holds 4 values"):
            await sender.add_fields(0, {"values": _per_token([3, 4])})
        with pytest.raises(rlwire.ConfigError, match="step 2 is not committed"):
            await sender.add_fields(2, {"values": _per_token([3, 5])})
        # A rank the step does not have, even with no row (a rank with no part has none).
        for step, rank, words in [(0, 5, r"2 ranks \(0-1\)"), (1, 3, r"1 rank \(0\)")]:
            with pytest.raises(rlwire.ConfigError, match=rf"step {step} has {words}, not rank"):
                await sender.add_fields(step, {"score": np.zeros(0)}, rank=rank)
            board = ray.get_actor(board_name(_name(ray_url)))
            assert ray.get(board.read_fields.remote(step, rank))[:2] == ("fields", [])
    with anyio.fail_after(TIMEOUT):
        async with rlwire.open_receiver(ray_url) as receiver:
            rows = await receiver.areceive()
            whole = await receiver.areceive()
        async with rlwire.open_receiver(ray_url, rank=1) as receiver:
            other = await receiver.areceive()
        async with rlwire.open_receiver(ray_url, as_columns=True) as receiver:
            cols = (await receiver.areceive()).samples
        async with rlwire.open_receiver(ray_url, fields=("tag", "ref_logprobs")) as receiver:
            picked = (await receiver.areceive()).samples
        async with rlwire.open_receiver(ray_url, start_step=1, fields=("ref_logprobs",)) as rx:
            parted = (await rx.areceive()).samples
    assert [s.ref_logprobs.tolist() for s in rows.samples] == [[0, 1, 2], [3, 4, 5, 6, 7]]
    assert [(float(s.extras["score"]), s.extras["tag"]) for s in rows.samples] == [
        (0.5, "x"),
        (1.5, "y"),
    ]
    assert rows.samples[1].routed_experts.shape == (5, 4, 2)  # the sidecar, as sent
    assert [s.ref_logprobs.tolist() for s in whole.samples] == [
        [20, 21, 22, 23],
        [24],
        [25, 26, 27, 28, 29, 30],
    ]
    assert other.samples[0].ref_logprobs.tolist() == [10, 11]
    assert cols.names[-2:] == ("score", "tag")
    assert np.array_equal(cols["ref_logprobs"].values, _per_token([3, 5]).values)
    assert picked.names == ("ref_logprobs", "tag") and picked["tag"] == ["x", "y"]
    assert parted.names == ("ref_logprobs",)
    assert parted["ref_logprobs"].offsets.tolist() == [0, 4, 5, 11]


@pytest.mark.anyio
async def test_a_receiver_waits_on_the_board_for_a_field(
    ray_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step is there and the field asked for is not: the receiver times out with the
    message stores give, and a waiting one is woken by the append, having waited on
    the board, not polled it (each wait lengthened to 30 s, so only a wake-up delivers
    the step within seconds)."""
    monkeypatch.setattr(ray_source, "_WAIT_SLICE", 30.0)
    waits = []
    real_wait = RaySource.wait

    def counted(self: RaySource, timeout: float | None) -> None:
        waits.append(time.monotonic())
        real_wait(self, timeout)

    monkeypatch.setattr(RaySource, "wait", counted)
    async with rlwire.open_sender(ray_url) as sender:
        await sender.send(_batch([3, 5]))
        async with rlwire.open_receiver(ray_url, fields=("values",)) as receiver:
            with pytest.raises(
                rlwire.ReceiveTimeout,
                match=r"step 0 did not arrive .*waiting for a field: .*'values'",
            ):
                await receiver.areceive(timeout=0.3)
            got: list[Any] = []

            async def receive() -> None:
                got.append(await receiver.areceive(timeout=TIMEOUT))
                got.append(time.monotonic())

            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                await anyio.sleep(0.5)
                waited = len(waits)
                await sender.add_fields(0, {"values": _per_token([3, 5], 7.0)})
                appended = time.monotonic()
    assert got[0].samples.names == ("values",)
    assert got[0].samples["values"].values[0] == 7.0
    assert waited <= 6, waited  # 0.8 s of waiting: a few board waits, not a poll loop
    assert got[1] - appended < 5.0  # woken by the board, not at the end of a wait


@pytest.mark.long
def test_fields_a_reference_actor_appends_outlive_it(ray_url: str) -> None:
    """The board pulls the fields from the (async) actor that appends them and owns
    them: the actor killed, its fields are still read."""
    create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(_batch([3, 5]))
        stage = RefStage.remote()
        ray.get(stage.append.remote(ray_url, 0, [3, 5], 0.25), timeout=TIMEOUT)
        kill_and_wait(stage)
        with rlwire.open_receiver(ray_url) as receiver:
            got = receiver.receive(timeout=TIMEOUT)
    assert [s.ref_logprobs.tolist() for s in got.samples] == [
        [0.25, 1.25, 2.25],
        [3.25, 4.25, 5.25, 6.25, 7.25],
    ]


@pytest.mark.anyio
async def test_appended_fields_named_in_sidecar_go_to_a_sidecar_object(ray_url: str) -> None:
    """A stage opened with ``sidecar=`` puts those fields in a sidecar object, as a step's."""
    async with rlwire.open_sender(ray_url) as sender:
        await sender.send(_batch([2, 3]))
        stage = rlwire.open_sender(ray_url, sidecar=("values",))
        try:
            await stage.add_fields(0, {"values": _per_token([2, 3]), "score": [1.0, 2.0]})
            await stage.add_fields(0, {"other": [1, 2]})
        finally:
            await stage.aclose()
        board = ray.get_actor(board_name(_name(ray_url)))
        refs = ray.get(board.read_fields.remote(0, 0), timeout=TIMEOUT)[1]
        assert [r[1] is not None for r in refs] == [True, False]
        with anyio.fail_after(TIMEOUT):
            async with rlwire.open_receiver(ray_url) as receiver:
                got = await receiver.areceive()
    assert [s.extras["values"].tolist() for s in got.samples] == [[0, 1], [2, 3, 4]]


def test_appended_fields_go_with_their_step(ray_url: str) -> None:
    board = create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url, keep_last=1) as sender:
        sender.send(_batch([2]))
        sender.add_fields(0, {"ref_logprobs": _per_token([2])})
        with rlwire.open_receiver(ray_url) as receiver:
            assert receiver.receive(timeout=TIMEOUT).samples[0].ref_logprobs is not None
            sender.send(_batch([2]))
            sender.add_fields(1, {"ref_logprobs": _per_token([2])})
            receiver.receive(timeout=TIMEOUT)
            sender.send(_batch([2]))  # every rank moved past step 0: it goes
    assert ray.get(board.read_fields.remote(0, 0), timeout=TIMEOUT)[:2] == ("fields", [])
    assert len(ray.get(board.read_fields.remote(1, 0), timeout=TIMEOUT)[1]) == 1
    with rlwire.open_sync_sender(ray_url, on_existing="overwrite"):
        pass
    assert ray.get(board.read_fields.remote(1, 0), timeout=TIMEOUT)[:2] == ("fields", [])


def test_a_step_sent_again_while_a_receiver_reads_it_comes_without_the_old_fields(
    ray_url: str,
) -> None:
    """The step is deleted and sent again (a producer restarted with ``overwrite``)
    between the receiver's read of its appended fields and its read of the step
    (forced: right after the first): the receiver reads both again, and the new step
    comes without the old one's fields."""
    create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(_batch([2]))
        sender.add_fields(0, {"ref_logprobs": _per_token([2])})
    sent_again: list[int] = []
    with rlwire.open_receiver(ray_url) as receiver:
        source = receiver._source  # type: ignore[attr-defined]
        read_appended = source.read_appended

        def then_send_again(step: int) -> list[rlwire.Frame]:
            got = read_appended(step)
            if not sent_again:
                sent_again.append(step)
                with rlwire.open_sync_sender(ray_url, on_existing="overwrite") as again:
                    again.send(_batch([3]))
            return got

        source.read_appended = then_send_again
        batch = receiver.receive(timeout=TIMEOUT)
    assert sent_again == [0]
    assert len(batch.samples[0].token_ids) == 3
    assert batch.samples[0].ref_logprobs is None


def test_a_stage_needs_a_board_a_sender_made(ray_cluster: None) -> None:
    name = f"nobody-{time.monotonic_ns()}"

    async def append() -> None:
        stage = rlwire.open_sender(f"ray://{name}")  # never opened: finds no board
        try:
            await stage.add_fields(0, {"score": np.zeros(1)})
        finally:
            await stage.aclose()

    with pytest.raises(rlwire.ConfigError, match="no sender has made this destination"):
        anyio.run(append)
    assert board_name(name) not in ray.util.list_named_actors()  # looked for, not made


def test_the_board_commits_one_message_per_index() -> None:
    """Two senders appending to one step and rank at once, naming the index and not
    their fields: the second commit at an index taken fails (the sender raises
    StepExistsError), as a link onto a taken name does on files; a step deleted
    meanwhile refuses the commit, saying so (the ConfigError of add_fields)."""

    async def run() -> list[tuple[Any, ...]]:
        board = Board("ray://logic")
        await board.stage(0, "s", 0, None, False, ["main"], 1.0)
        await board.commit("s", 1)
        answers = [await board.stage_fields(0, k, 0, None, False, [k], 1.0) for k in "ab"]
        answers += [await board.commit_fields("a", 0, 0), await board.commit_fields("b", 0, 0)]
        answers.append(await board.stage_fields(0, "c", 0, None, False, ["c"], 1.0))
        await board.mark(0, 1)  # rank 0 moved past step 0: the prune may drop it
        await board.prune(1)
        answers.append(await board.commit_fields("c", 0, 1))
        answers.append(await board.stage_fields(1, "d", 0, None, False, ["d"], 1.0))
        answers.append(await board.wait_fields(0, 0, 5, 0.05))
        return answers

    answers = asyncio.run(run())
    assert [a[0] for a in answers] == ["ok", "ok", "ok", "exists", "ok", "none", "none", "ready"]
    assert "step 0 was deleted" in answers[5][1]


def test_the_board_refuses_fields_for_a_rank_the_step_does_not_have() -> None:
    """Asked for rank 2 of a step committed for ranks 0-1, the board says so (a step it
    holds, not one missing), and holds nothing staged for it."""

    async def run() -> list[tuple[Any, ...]]:
        board = Board("ray://logic")
        for rank in (0, 1):
            await board.stage(0, "s", rank, None, False, [f"main{rank}"], 1.0)
        await board.commit("s", 2)
        return [
            await board.committed_refs(0, 2),
            await board.stage_fields(0, "f", 2, None, False, ["f"], 1.0),
            await board.committed_refs(1, 2),
        ]

    why = "step 0 has 2 ranks (0-1), not rank 2"
    assert asyncio.run(run()) == [("ranks", why), ("none", why), ("none",)]


def test_the_board_keeps_a_step_a_rank_left_out_of_later_sends_has_not_read() -> None:
    """After a step to two ranks and steps to rank 0 alone, a prune keeps the step rank
    1 has not moved past (it dropped every step before the cut-off: rank 1 met a gap),
    then drops it once rank 1 moves past it."""

    async def run() -> list[list[int]]:
        board = Board("ray://logic")
        for rank in (0, 1):
            await board.stage(0, "s0", rank, None, False, [f"main{rank}"], 1.0)
        await board.commit("s0", 2)
        for step in (1, 2):
            await board.stage(step, f"s{step}", 0, None, False, ["main"], 1.0)
            await board.commit(f"s{step}", 1)
        await board.mark(0, 3)  # rank 0 moved past every step; rank 1 read none
        await board.prune(2)
        kept = [await board.steps()]
        await board.mark(1, 1)
        await board.prune(2)
        return [*kept, await board.steps()]

    assert asyncio.run(run()) == [[0, 1, 2], [2]]


@pytest.mark.anyio
async def test_a_field_left_none_is_waited_for_on_the_board(
    ray_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ref_logprobs`` left None in every row counts as not there yet on ray:// too,
    and the append wakes the waiting receiver (each wait on the board lengthened to
    30 s, so only a wake-up delivers it within seconds)."""
    monkeypatch.setattr(ray_source, "_WAIT_SLICE", 30.0)
    async with rlwire.open_sender(ray_url) as sender:
        await sender.send(_batch([2, 3]))
        async with rlwire.open_receiver(ray_url, fields=("ref_logprobs",)) as receiver:
            with pytest.raises(rlwire.ReceiveTimeout, match="'ref_logprobs' is None in every row"):
                await receiver.areceive(timeout=0.3)
            got: list[Any] = []

            async def receive() -> None:
                got.append(await receiver.areceive(timeout=TIMEOUT))
                got.append(time.monotonic())

            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                await anyio.sleep(0.2)
                await sender.add_fields(0, {"ref_logprobs": _per_token([2, 3], 1.0)})
                appended = time.monotonic()
    assert got[0].samples["ref_logprobs"].values.tolist() == [1, 2, 3, 4, 5]
    assert got[1] - appended < 5.0


def test_fields_read_and_appended_leave_the_store_to_keep_last(ray_url: str) -> None:
    """add_fields and a fields= receiver scan the step's header with a decoder whose hook
    held the scan: a reference cycle that kept views of the step's objects, and with them
    the object store's memory, after keep_last dropped the step, until Python's cyclic
    collector ran (never here: it is off)."""
    pytest.importorskip("grpc")  # the store's figures come over gRPC
    batch = _batch([1 << 17])  # the step's arrays in its main object, some 1.7 MB
    baseline = quiet_store_bytes()
    gc.collect()
    gc.disable()
    try:
        with (
            rlwire.open_sync_sender(ray_url, keep_last=1) as sender,
            rlwire.open_receiver(ray_url, fields=("logprobs",)) as receiver,
        ):
            for step in range(4):
                sender.send(batch)
                sender.add_fields(step, {"score": [1.0]})
                assert len(receiver.receive(timeout=TIMEOUT).samples) == 1
                receiver.wait_next(timeout=0)  # moves past it: the next send deletes it
            stats = sender.last_stats
            assert stats is not None
            # One step kept (the newest), and at most one on its way: never all four.
            assert settles(lambda: store_bytes() - baseline <= 2.2 * stats.bytes), (
                store_bytes() - baseline,
                stats.bytes,
            )
    finally:
        gc.enable()
