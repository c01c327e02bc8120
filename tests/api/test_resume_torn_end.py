"""A producer killed (SIGKILL) while committing a step sent whole to several ranks, right
after rank 0's main object (S3, no sidecars: nothing of the other ranks is listed, so
``resume`` may take the step for a step of one rank), then resumed. Whatever the
resumed producer does next (``finish()`` at once, steps to fewer ranks, a wait for room
with ``max_ahead``), no trainer waits for ever: a rank the step never reaches gets a
``StepGapError`` naming the step and the repair, and the repair gives it the step. On
files the same kill is refused when the sender opens (the other ranks' files are
listed, under temporary names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from killed_producer import batch, run_killed

import rlwire
from rlwire.testing import assert_batches_equal

pytestmark = pytest.mark.anyio

RANKS = 3
#: The plan before the torn step: none, or a step filled part by part for every rank.
BEFORE = {"first": [], "after parts": [["parts", RANKS, 6]]}


def torn(url: str, options: dict[str, Any], before: str) -> int:
    """Leave the step after ``BEFORE[before]`` visible for rank 0 only, by a real kill
    of its producer as it commits rank 1's main object; that step's number."""
    step = len(BEFORE[before])
    plan = [*BEFORE[before], ["send", RANKS]]
    run_killed(url, options, plan, f"step-{step:08d}.rank-0001.rlw", "before")
    return step


def resumed(url: str, options: dict[str, Any], **kwargs: Any) -> Any:
    return rlwire.open_sender(url, storage_options=options, on_existing="resume", **kwargs)


def receiver(url: str, options: dict[str, Any], rank: int, step: int) -> Any:
    return rlwire.open_receiver(url, rank=rank, start_step=step, storage_options=options)


@pytest.mark.parametrize("before", list(BEFORE))
async def test_finish_after_a_torn_step_gives_its_missing_ranks_a_step_gap_not_a_wait(
    s3_url: str, s3_endpoint: dict[str, Any], before: str
) -> None:
    url = f"{s3_url}/run"
    step = torn(url, s3_endpoint, before)
    async with resumed(url, s3_endpoint) as sender:
        assert sender.next_step == step + 1  # the listing shows a step of one rank
        await sender.finish()

    with receiver(url, s3_endpoint, 0, step) as rank0:
        assert_batches_equal(rank0.receive(timeout=10), batch(step, 0))
        with pytest.raises(rlwire.EndOfStream):
            rank0.receive(timeout=10)
    for rank in range(1, RANKS):
        with receiver(url, s3_endpoint, rank, step) as other:
            with pytest.raises(rlwire.StepGapError, match=rf"step {step} was committed") as info:
                other.receive(timeout=10)  # not a ReceiveTimeout: it never comes
            message = str(info.value)
            assert f"for ranks [0] only, and the stream ended at step {step + 1}" in message
            assert f"start_step={step}, on_existing='truncate'" in message
            assert f"rank-{rank:04d}" in message  # where: the rank's missing object
            with pytest.raises(rlwire.StepGapError):  # read part by part: the same
                next(iter(other.parts(timeout=10)))
            assert other.skip() == step
            with pytest.raises(rlwire.EndOfStream):
                other.receive(timeout=10)

    # The repair it names gives every rank the step, also a receiver that raised.
    with receiver(url, s3_endpoint, 1, step) as waiting:
        with pytest.raises(rlwire.StepGapError):
            waiting.receive(timeout=10)
        repair = {"on_existing": "truncate", "start_step": step}
        async with rlwire.open_sender(url, storage_options=s3_endpoint, **repair) as sender:
            await sender.send_ranks([batch(step, r) for r in range(RANKS)])
            await sender.finish()
        assert_batches_equal(waiting.receive(timeout=10), batch(step, 1))
        with pytest.raises(rlwire.EndOfStream):
            waiting.receive(timeout=10)
    for rank in range(RANKS):
        with receiver(url, s3_endpoint, rank, step) as again:
            assert_batches_equal(again.receive(timeout=10), batch(step, rank))


async def test_the_same_kill_on_files_is_refused_when_the_sender_opens(tmp_path: Path) -> None:
    """A file sink stages every rank's files before the first rename: the ranks a killed
    commit did not make visible are listed under temporary names, so ``resume`` refuses
    the step at once, before any ``finish()``."""
    url = str(tmp_path / "run")
    step = torn(url, {}, "first")
    with pytest.raises(rlwire.StepExistsError, match=r"step 0 is incomplete \(ranks \[0\] of"):
        async with rlwire.open_sender(url, on_existing="resume") as sender:
            await sender.finish()
    assert not (tmp_path / "run" / "end.rlw").exists()
    async with rlwire.open_sender(url, on_existing="truncate", start_step=step) as sender:
        await sender.send_ranks([batch(step, r) for r in range(RANKS)])
        await sender.finish()
    for rank in range(RANKS):
        with rlwire.open_receiver(url, rank=rank) as got:
            assert_batches_equal(got.receive(timeout=10), batch(step, rank))
            with pytest.raises(rlwire.EndOfStream):
                got.receive(timeout=10)


@pytest.mark.parametrize("then", ["whole", "parts"])
async def test_a_resumed_sender_held_back_by_max_ahead_refuses_a_torn_step_at_once(
    s3_url: str, s3_endpoint: dict[str, Any], then: str
) -> None:
    """The ranks the torn step lacks never move past it: a sender with ``max_ahead=0``
    that waited for them before checking its ranks against the step would wait for
    ever. It refuses first."""
    url = f"{s3_url}/run"
    step = torn(url, s3_endpoint, "after parts")
    for rank in range(RANKS):  # every rank read step 0; rank 0 read step 1 and moved on
        with receiver(url, s3_endpoint, rank, 0) as got:
            assert len(list(got.parts(timeout=10))) == 2
            if rank == 0:
                assert_batches_equal(got.receive(timeout=10), batch(step, 0))
                with pytest.raises(rlwire.ReceiveTimeout):
                    got.receive(timeout=0.1)
    async with resumed(url, s3_endpoint, max_ahead=0) as sender:
        with anyio.fail_after(30), pytest.raises(rlwire.StepExistsError, match="is incomplete"):
            if then == "whole":
                await sender.send_ranks([batch(step + 1, r) for r in range(RANKS)])
            else:
                async with sender.open_step(ranks=RANKS) as writer:
                    await writer.put([batch(step + 1, 0).samples[0]], key=0)
        assert sender.next_step == step + 1


async def test_steps_sent_on_to_fewer_ranks_after_a_torn_step_neither_hang_nor_hold_back(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    """A resumed producer that goes on with steps for rank 0 only (``send``), pruning
    with ``keep_last`` and held back by ``max_ahead``: rank 0 reads them all, and the
    ranks the torn step lacks get a StepGapError instead of waiting for ever."""
    url = f"{s3_url}/run"
    step = torn(url, s3_endpoint, "first")
    with receiver(url, s3_endpoint, 0, step) as rank0:
        async with resumed(url, s3_endpoint, keep_last=1, max_ahead=1) as sender:
            for n in range(step, step + 4):
                with anyio.fail_after(30):
                    if n > step:
                        await sender.send(batch(n, 0))
                assert_batches_equal(rank0.receive(timeout=10), batch(n, 0))
            await sender.finish()
        with pytest.raises(rlwire.EndOfStream):
            rank0.receive(timeout=10)
    for rank in range(1, RANKS):
        with receiver(url, s3_endpoint, rank, step) as other:
            with pytest.raises(rlwire.StepGapError, match=rf"step {step} "):
                other.receive(timeout=10)


async def test_the_repair_a_sender_names_after_steps_sent_on_to_fewer_ranks_repairs(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    """A producer resumed after a torn step 0 sends step 1 to rank 0 only, and is
    resumed again: a step for every rank is refused naming step 0, not step 1 (the
    step before it, which looks the same), so that the repair gives every rank both."""
    url = f"{s3_url}/run"
    step = torn(url, s3_endpoint, "first")
    async with resumed(url, s3_endpoint) as sender:
        assert await sender.send(batch(step + 1, 0)) == step + 1
    async with resumed(url, s3_endpoint) as sender:
        with pytest.raises(rlwire.StepExistsError, match=r"steps 0\.\.1 have ranks \[0\] only"):
            await sender.send_ranks([batch(step + 2, r) for r in range(RANKS)])
        with pytest.raises(rlwire.StepExistsError) as info:
            async with sender.open_step(ranks=RANKS) as writer:
                await writer.put([batch(step + 2, 0).samples[0]], key=0)
    assert f"start_step={step}, on_existing='truncate'" in str(info.value)

    repair = {"on_existing": "truncate", "start_step": step}
    async with rlwire.open_sender(url, storage_options=s3_endpoint, **repair) as sender:
        for n in (step, step + 1):
            await sender.send_ranks([batch(n, r) for r in range(RANKS)])
        await sender.finish()
    for rank in range(RANKS):
        with receiver(url, s3_endpoint, rank, step) as got:
            for n in (step, step + 1):
                assert_batches_equal(got.receive(timeout=10), batch(n, rank))
            with pytest.raises(rlwire.EndOfStream):
                got.receive(timeout=10)
