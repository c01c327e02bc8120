"""Validation beside the write: a sender checks a column-stored list in a thread while
the step is written, and commits only once the checks pass."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import make_batch, make_sample

import rlwire
from rlwire._api.validation import ChecksBeside, Validation
from rlwire._core.offload import Resumes
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink

pytestmark = pytest.mark.anyio


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def nan_at(batch: rlwire.TrainingBatch, sample: int, token: int) -> rlwire.TrainingBatch:
    batch.samples[sample].logprobs[token] = np.nan
    return batch


class Recording(FileSink):
    """A real file sink that records the files present once each step is staged."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.staged_files: list[list[str]] = []

    def stage(self, step: int, frames: Any) -> Any:
        staged = yield from super().stage(step, frames)
        self.staged_files.append(names(Path(self.root)))
        return staged


async def test_the_step_is_written_while_its_rows_are_checked(tmp_path: Path) -> None:
    sink = Recording(tmp_path)
    async with rlwire.TrainingBatchSender(sink, MsgpackCodec(check=ChecksBeside())) as sender:
        with pytest.raises(
            rlwire.SchemaError, match=r"samples\[17\]\.logprobs: 1 non-finite"
        ) as info:
            await sender.send(nan_at(make_batch(41), 17, 3))
        # The step's files were written before the checks said no, then discarded.
        assert sink.staged_files and sink.staged_files[0]
        assert names(tmp_path) == []
        assert (info.value.step, info.value.rank) == (0, 0)
        assert sender.next_step == 0
        assert await sender.send(make_batch(41)) == 0


async def test_the_checks_error_wins_over_an_encoding_error(tmp_path: Path) -> None:
    """As when the checks ran first: sample 3's NaN, not sample 20's object array the
    encoder refuses."""
    batch = nan_at(make_batch(41), 3, 0)
    batch.samples[20].extras["info"] = np.array([{"a": 1}], dtype=object)
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"samples\[3\]\.logprobs: 1 non-finite"):
            await sender.send(batch)
        assert names(tmp_path) == []
        # Nothing of the failed send is left queued for the next one.
        assert await sender.send(make_batch(41)) == 0


async def test_an_encoding_error_stands_when_the_checks_pass(tmp_path: Path) -> None:
    checks = rlwire.Checks(finite=["score"])
    rows = [{"x": np.zeros(3), "score": 1.0, "bad": np.array([None])} for _ in range(8)]
    async with rlwire.open_sender(tmp_path, validate=checks) as sender:
        with pytest.raises(rlwire.EncodeError, match=r"bad"):
            await sender.send(rows)
        assert names(tmp_path) == []


async def test_a_checks_error_of_one_rank_names_that_rank(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"samples\[5\]") as info:
            await sender.send_ranks([make_batch(41), nan_at(make_batch(41), 5, 1)])
        assert info.value.rank == 1
        assert names(tmp_path) == []


def test_the_hook_queues_rows_until_taken() -> None:
    hook = ChecksBeside()
    batch = nan_at(make_batch(41), 2, 0)
    MsgpackCodec(check=hook).encode(batch)  # the rows are queued, not checked
    queued = hook.take()
    assert queued is not None and hook.take() is None
    with pytest.raises(rlwire.SchemaError, match=r"\$\.samples\[2\]\.logprobs"):
        for _ in queued:  # its slices, run here
            pass


def test_a_column_the_codec_did_not_join_is_checked_from_the_rows() -> None:
    """A row of another dtype leaves its field a column of one value per row; the checks
    then read the rows, and a wrong length among them is still named."""
    batch = rlwire.TrainingBatch(samples=[make_sample(8, routed=False) for _ in range(3000)])
    batch.samples[10].advantages = batch.samples[10].advantages.astype(np.float64)
    batch.samples[2000].advantages = batch.samples[2000].advantages[:-1].astype(np.float64)
    hook = ChecksBeside()
    MsgpackCodec(check=hook).encode(batch)
    queued = hook.take()
    assert queued is not None
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[2000\]\.advantages: has"):
        for _ in queued:
            pass


# -- the commit in the write's last trip ----------------------------------------------


class Committing(FileSink):
    """A real file sink whose commits are counted and can be held: ``hold`` makes the
    next commit wait (in its worker thread) until ``release`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.commits = 0
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def stage(self, step: int, frames: Any) -> Any:
        staged = yield from super().stage(step, frames)
        plain = staged.commit

        def commit() -> None:
            self.commits += 1
            if self.hold:
                self.entered.set()
                self.release.wait(30)
            plain()

        staged.commit = commit  # the default acommit, which runs it in a thread
        return staged


async def test_a_step_whose_checks_passed_is_committed_in_the_writes_last_trip(
    tmp_path: Path,
) -> None:
    """A step that needs no checks, or whose checks passed while it was written, is
    committed by ``stage`` itself; ``commit`` then commits nothing more."""
    sink = Committing(tmp_path)
    sink.open("error")
    limiter = anyio.CapacityLimiter(2)
    validation = Validation()
    staged = await validation.stage(sink.stage(0, [rlwire.Frame(b"h")]), 0, limiter, Resumes())
    assert validation.committed is staged and staged.visible and sink.commits == 1
    assert names(tmp_path) == ["step-00000000.rank-0000.rlw"]
    await validation.commit(staged, limiter)
    assert sink.commits == 1


async def test_a_step_whose_checks_still_run_is_committed_after_them(tmp_path: Path) -> None:
    sink = Committing(tmp_path)
    sink.open("error")
    limiter = anyio.CapacityLimiter(2)
    validation = Validation()
    go = threading.Event()

    def checks() -> Any:
        go.wait(30)
        yield

    def staging() -> Any:
        validation.start(0, checks())  # as the sender's encoding starts them
        return (yield from sink.stage(0, [rlwire.Frame(b"h")]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, lambda: (time.sleep(0.2), go.set()))
        staged = await validation.stage(staging(), 0, limiter, Resumes())
    assert validation.committed is None and sink.commits == 0 and not staged.visible
    await validation.commit(staged, limiter)
    assert sink.commits == 1 and staged.visible


async def test_a_cancellation_while_the_stage_commits_still_counts_the_step(
    tmp_path: Path,
) -> None:
    """A cancellation that comes while the commit in the stage's last trip runs waits
    for it (the send returns, the cancellation comes at the next checkpoint): the step
    is visible and its number used, never sent again."""
    sink = Committing(tmp_path)
    async with rlwire.TrainingBatchSender(sink, MsgpackCodec()) as sender:
        sink.hold = True
        async with anyio.create_task_group() as tg:

            async def cancel_once_committing() -> None:
                await anyio.to_thread.run_sync(sink.entered.wait, 30)
                tg.cancel_scope.cancel()
                sink.release.set()

            tg.start_soon(cancel_once_committing)
            sent = await sender.send({"a": 0})
            await anyio.sleep(30)
        assert tg.cancel_scope.cancelled_caught and sent == 0
        assert (sender.last_step, sender.next_step) == (0, 1)
        sink.hold = False
        assert await sender.send({"a": 1}) == 1
    receiver = rlwire.open_receiver(tmp_path, type=dict)
    assert [(await receiver.areceive(timeout=5))["a"] for _ in range(2)] == [0, 1]
    receiver.close()
