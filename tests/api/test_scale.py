"""A run restarted from a checkpoint with more or fewer trainer ranks than before, on a
directory and on S3: a sender opened with ``on_existing="resume"`` sends the next step to
the new number of ranks, and so does the one after the next restart; the ranks left out
get a typed error or the end, never a wait for ever; ``keep_last`` deletes the steps the
old ranks moved past while a new rank has read nothing, and keeps the new rank's own.
A step whose commit was cut short (the hazard resume guards against) is still refused,
though it shows as many ranks as the steps before it."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest
from golden_cases import GOLDEN
from s3_server import s3_client

import rlwire
from rlwire.testing import assert_batches_equal, make_sample
from rlwire.transport.layout import main_name

pytestmark = pytest.mark.anyio


def batch(step: int, rank: int) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[make_sample(20, seed=100 * step + rank)])


def ranks(step: int, n: int) -> list[rlwire.TrainingBatch]:
    return [batch(step, rank) for rank in range(n)]


def listed(url: str, options: dict[str, Any]) -> set[str]:
    """The names stored under ``url`` (``run`` under a directory or a bucket)."""
    if url.startswith("memory://"):
        return {path.rpartition("/")[2] for path in fsspec.filesystem("memory").ls(url, False)}
    if not options:
        return {path.name for path in Path(url).iterdir()}
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    got = s3_client(options).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    return {item["Key"].rpartition("/")[2] for item in got.get("Contents", [])}


def delete(url: str, options: dict[str, Any], name: str) -> None:
    """Delete one stored file: what a commit cut short never made visible."""
    if url.startswith("memory://"):
        fsspec.filesystem("memory").rm(f"{url}/{name}")
        return
    if not options:
        (Path(url) / name).unlink()
        return
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    s3_client(options).delete_object(Bucket=bucket, Key=f"{prefix}/{name}")


async def received(url: str, options: dict[str, Any], rank: int, start: int, count: int) -> None:
    """Rank ``rank`` receives steps ``start..start + count - 1``, each its own batch."""
    async with rlwire.open_receiver(
        url, rank=rank, start_step=start, storage_options=options, record_consumed=False
    ) as receiver:
        for step in range(start, start + count):
            with anyio.fail_after(20):
                assert_batches_equal(await receiver.areceive(), batch(step, rank))


async def run_and_restarts(
    url: str, options: dict[str, Any], *, before: int, after: int, finish: bool
) -> None:
    """Steps 0-2 to ``before`` ranks; then a sender resumed sends step 3 to ``after``
    ranks, and another resumed after it step 4 (and the end, if ``finish``)."""
    async with rlwire.open_sender(url, storage_options=options) as sender:
        for step in range(3):
            await sender.send_ranks(ranks(step, before))
    for step in (3, 4):
        async with rlwire.open_sender(url, storage_options=options, on_existing="resume") as s:
            assert await s.send_ranks(ranks(step, after)) == step
            if finish and step == 4:
                await s.finish()


async def test_a_restart_with_more_ranks_goes_on(file_or_s3: tuple[str, dict[str, Any]]) -> None:
    url, options = file_or_s3
    # The second restart goes on too: the steps of 2 ranks before are whole, not short.
    await run_and_restarts(url, options, before=2, after=4, finish=True)
    for rank in (0, 1):
        await received(url, options, rank, 0, 5)
    for rank in (2, 3):  # new ranks start where the run gave them steps
        await received(url, options, rank, 3, 2)
    # A new rank opened at the run's first step is told it has no message there.
    async with rlwire.open_receiver(url, rank=3, storage_options=options) as receiver:
        with anyio.fail_after(20), pytest.raises(rlwire.StepGapError, match=r"ranks \[0, 1\]"):
            await receiver.areceive()


async def test_a_restart_with_fewer_ranks_goes_on_and_ends_the_others(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    await run_and_restarts(url, options, before=4, after=2, finish=False)
    for rank in (0, 1):
        await received(url, options, rank, 0, 5)
    # The ranks left out read their steps, then a typed error, not a wait for ever.
    for rank in (2, 3):
        await received(url, options, rank, 0, 3)
        async with rlwire.open_receiver(
            url, rank=rank, start_step=3, storage_options=options
        ) as receiver:
            with anyio.fail_after(20), pytest.raises(rlwire.StepGapError, match="step 3"):
                await receiver.areceive()


@pytest.mark.parametrize("before", [2, 4])
async def test_a_step_cut_short_is_refused_though_it_looks_whole(
    file_or_s3: tuple[str, dict[str, Any]], before: int
) -> None:
    """A sender killed while committing step 3 to 4 ranks, after rank 1's message:
    the step shows ranks 0 and 1, as the steps of 2 ranks before it (or fewer than those
    of 4); its messages say it went to 4, so resume refuses it and names the repair."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as sender:
        for step in range(3):
            await sender.send_ranks(ranks(step, before))
        await sender.send_ranks(ranks(3, 4))
    for rank in (2, 3):
        delete(url, options, main_name(3, rank))
    resume = {"storage_options": options, "on_existing": "resume"}
    with pytest.raises(
        rlwire.StepExistsError, match=r"step 3 is incomplete \(ranks \[0, 1\] of the 4"
    ) as info:
        async with rlwire.open_sender(url, **resume):
            pass
    assert "start_step=3, on_existing='truncate'" in str(info.value)
    assert not {main_name(4, rank) for rank in range(4)} & listed(url, options)


async def test_keep_last_deletes_what_the_old_ranks_passed_and_keeps_a_new_ranks_steps(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """After a restart from 2 ranks to 4, the new ranks 2 and 3 have read nothing: the
    steps before the restart (none of theirs) go once ranks 0 and 1 moved past them;
    the steps from the restart on stay until the new ranks read them."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options, keep_last=1) as sender:
        for step in range(3):
            await sender.send_ranks(ranks(step, 2))
    resume = {"storage_options": options, "on_existing": "resume", "keep_last": 1}
    async with rlwire.open_sender(url, **resume) as sender:
        await sender.send_ranks(ranks(3, 4))
        for rank in (0, 1):  # each moves past steps 0-3 (it asks for step 4)
            async with rlwire.open_receiver(url, rank=rank, storage_options=options) as rx:
                for step in range(4):
                    with anyio.fail_after(20):
                        assert_batches_equal(await rx.areceive(), batch(step, rank))
                assert not await rx.await_next(timeout=0)
        for step in (4, 5):
            await sender.send_ranks(ranks(step, 4))
        stored = listed(url, options)
        assert not {main_name(step, rank) for step in range(3) for rank in (0, 1)} & stored
        assert {main_name(step, rank) for step in (3, 4, 5) for rank in (2, 3)} <= stored
    for rank in (2, 3):
        await received(url, options, rank, 3, 3)


async def test_steps_that_record_no_ranks_still_refuse_more_ranks(tmp_path: Path) -> None:
    """A step written before 1.8 does not say how many ranks it was sent to: one of a
    single rank may be a step of more cut short, so a resumed sender still refuses to
    send the next to more ranks; the message says why, without calling the step cut
    short, and names both ways on: the repair if it was cut short, and for a step sent
    to fewer ranks on purpose, a truncate past it, which keeps it and goes on (and a
    later resume with it). To as many ranks it goes on."""
    shutil.copytree(GOLDEN / "msgpack-1.1-batch", tmp_path / "run")
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url, on_existing="resume") as sender:
        with pytest.raises(rlwire.StepExistsError, match=r"before wire format 1\.8") as info:
            await sender.send_ranks(ranks(1, 2))
        message = str(info.value)
        assert "step 1 to 2 ranks" in message
        assert "step 0 has ranks [0] only" in message
        assert "may be a step of more ranks cut short" in message
        assert "incomplete" not in message  # it may be whole
        assert "start_step=0, on_existing='truncate' to delete step 0" in message
        assert "sent to fewer ranks on purpose" in message
        assert "start_step=1, on_existing='truncate', which keeps" in message
    async with rlwire.open_sender(url, start_step=1, on_existing="truncate") as sender:
        assert await sender.send_ranks(ranks(1, 2)) == 1
    async with rlwire.open_sender(url, on_existing="resume") as sender:
        assert await sender.send_ranks(ranks(2, 2)) == 2
    await received(url, {}, 1, 1, 2)
    async with rlwire.open_sender(url, on_existing="resume") as sender:
        assert await sender.send_ranks(ranks(3, 1)) == 3  # to as many: goes on


@pytest.fixture(params=["file", "memory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` of every store that keeps steps: a new directory, a
    new memory:// root, a new bucket on the test session's S3 server."""
    if request.param == "memory":
        return f"memory://scale-{uuid.uuid4().hex}/run", {}
    if request.param == "file":
        return str(tmp_path / "run"), {}
    return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")


async def test_a_step_cut_short_between_steps_of_as_few_ranks_is_refused(
    store: tuple[str, dict[str, Any]],
) -> None:
    """Step 2 to 2 ranks, its commit failing after rank 0's message (the sender goes on:
    the step's number is used), then step 3 to 1 rank, as steps 0 and 1: step 2 shows
    rank 0 as the steps around it do, in the middle of their run. Its message says it
    went to 2, so resume, which reads every step's (on S3 concurrently), refuses it."""
    url, options = store
    async with rlwire.open_sender(url, storage_options=options) as sender:
        for step, n in enumerate((1, 1, 2, 1)):
            await sender.send_ranks(ranks(step, n))
    delete(url, options, main_name(2, 1))
    resume = {"storage_options": options, "on_existing": "resume"}
    with pytest.raises(
        rlwire.StepExistsError, match=r"step 2 is incomplete \(ranks \[0\] of the 2"
    ) as info:
        async with rlwire.open_sender(url, **resume):
            pass
    assert "start_step=2, on_existing='truncate'" in str(info.value)
