"""A producer killed (SIGKILL) while committing a step sent whole to several ranks, right
after rank 0's main object (S3, no sidecars: nothing of the other ranks is listed, so the
listing shows a step of one rank), then resumed. The step's message records the ranks it
was sent to (1.8), so the resumed sender's open refuses it, naming the step and the
repair, and the repair gives every rank the step: the resumed producer can neither end
the stream nor send on after it, so no trainer waits for it. On files the same kill is
refused likewise (the other ranks' files are listed too, under temporary names). Steps of
writers before 1.8, which record no ranks, are ``tests/api/test_scale.py``'s."""

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
async def test_a_resumed_sender_refuses_a_torn_step_when_it_opens(
    s3_url: str, s3_endpoint: dict[str, Any], before: str
) -> None:
    url = f"{s3_url}/run"
    step = torn(url, s3_endpoint, before)
    incomplete = rf"step {step} is incomplete \(ranks \[0\] of the {RANKS} it was sent to\)"
    with pytest.raises(rlwire.StepExistsError, match=incomplete) as info:
        async with resumed(url, s3_endpoint) as sender:
            await sender.finish()
    assert f"start_step={step}, on_existing='truncate'" in str(info.value)
    with receiver(url, s3_endpoint, 1, step) as waiting:  # no end was marked
        with pytest.raises(rlwire.ReceiveTimeout):
            waiting.receive(timeout=0.2)

    # The repair it names gives every rank the step.
    repair = {"on_existing": "truncate", "start_step": step}
    async with rlwire.open_sender(url, storage_options=s3_endpoint, **repair) as sender:
        await sender.send_ranks([batch(step, r) for r in range(RANKS)])
        await sender.finish()
    for rank in range(RANKS):
        with receiver(url, s3_endpoint, rank, step) as again:
            assert_batches_equal(again.receive(timeout=10), batch(step, rank))
            with pytest.raises(rlwire.EndOfStream):
                again.receive(timeout=10)


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


async def test_a_resumed_sender_with_max_ahead_refuses_a_torn_step_at_once(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    """The ranks the torn step lacks never move past it: a sender with ``max_ahead=0``
    that waited for them before checking the step would wait for ever. Its open
    refuses first."""
    url = f"{s3_url}/run"
    step = torn(url, s3_endpoint, "after parts")
    for rank in range(RANKS):  # every rank read step 0; rank 0 read step 1 and moved on
        with receiver(url, s3_endpoint, rank, 0) as got:
            assert len(list(got.parts(timeout=10))) == 2
            if rank == 0:
                assert_batches_equal(got.receive(timeout=10), batch(step, 0))
                with pytest.raises(rlwire.ReceiveTimeout):
                    got.receive(timeout=0.1)
    with anyio.fail_after(30), pytest.raises(rlwire.StepExistsError, match="is incomplete"):
        async with resumed(url, s3_endpoint, max_ahead=0) as sender:
            await sender.send_ranks([batch(step + 1, r) for r in range(RANKS)])
