"""FileSink commit and open behaviour on a real filesystem, including failures mid-commit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import make_batch

import rlwire
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink, FileSource
from rlwire.transport._file.staging import FileStaging

CODEC = MsgpackCodec(sidecar=["routed_experts"])


def frames(ranks: int) -> list[rlwire.Frame]:
    return [
        CODEC.encode({"rank": r, "routed_experts": np.full(5000, r, np.uint8)})
        for r in range(ranks)
    ]


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_commit_failure_before_any_main_file_leaves_nothing(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    staged = run_sliced(sink.stage(0, frames(2)))
    assert isinstance(staged, FileStaging)
    staged.mains[0].tmp.unlink()  # rank 0's move into place will fail (ENOENT)
    with pytest.raises(rlwire.TransportError, match="nothing was made visible"):
        staged.commit()
    assert not staged.visible
    assert names(tmp_path) == []  # no sidecars, no temporary files


def test_commit_failure_after_a_main_file_reports_partial_step(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    staged = run_sliced(sink.stage(0, frames(2)))
    assert isinstance(staged, FileStaging)
    staged.mains[1].tmp.unlink()  # rank 1's move into place will fail (ENOENT)
    with pytest.raises(rlwire.TransportError, match=r"visible for ranks \[0\] only"):
        staged.commit()
    assert staged.visible
    assert not [n for n in names(tmp_path) if n.startswith(".")]  # no temporary files
    frame = FileSource(tmp_path, rank=0).read(0)
    assert frame is not None and CODEC.decode(frame)["rank"] == 0


def test_sender_never_reuses_a_partly_visible_step(tmp_path: Path) -> None:
    import anyio

    class BlockRank1(FileSink):  # a real sink; rank 1's file vanishes mid-send
        def stage(self, step: int, frames: object) -> object:  # type: ignore[override]
            staged = yield from super().stage(step, frames)  # type: ignore[arg-type]
            staged.mains[1].tmp.unlink()
            return staged

    async def main() -> None:
        codec = MsgpackCodec()
        sender = rlwire.TrainingBatchSender(BlockRank1(tmp_path), codec)
        async with sender:
            with pytest.raises(rlwire.TransportError, match="ranks"):
                await sender.send_ranks([{"a": 0}, {"a": 1}])
            assert sender.next_step == 1 and sender.last_step == 0

    anyio.run(main)


@pytest.mark.anyio
async def test_a_cancelled_async_commit_leaves_nothing_behind(tmp_path: Path) -> None:
    """A sink whose commit waits (as on a network) and is cancelled before anything is
    visible: the sender discards the staged step and does not count it."""
    import anyio

    class SlowCommit(FileSink):  # a real sink whose commit never finishes
        def stage(self, step: int, frames: object) -> object:  # type: ignore[override]
            staged = yield from super().stage(step, frames)  # type: ignore[arg-type]

            async def acommit(limiter: object) -> None:
                await anyio.sleep_forever()

            staged.acommit = acommit
            return staged

    async with rlwire.TrainingBatchSender(SlowCommit(tmp_path), MsgpackCodec()) as sender:
        with anyio.move_on_after(0.5) as scope:
            await sender.send({"a": 1})
        assert scope.cancelled_caught and sender.next_step == 0
    assert names(tmp_path) == []  # the temporary files are gone


def test_resume_refuses_a_step_missing_ranks(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    for step in (0, 1):
        run_sliced(sink.stage(step, frames(2))).commit()
    (tmp_path / "step-00000001.rank-0001.rlw").unlink()  # as if killed between renames
    with pytest.raises(rlwire.StepExistsError, match=r"step 1 is incomplete.*ranks \[0\]"):
        FileSink(tmp_path).open("resume")
    FileSink(tmp_path).open("overwrite")
    assert names(tmp_path) == ["fence.rlw"]


@pytest.mark.anyio
async def test_a_commit_of_unknown_outcome_stops_the_sender_until_resume(tmp_path: Path) -> None:
    """A sink whose commit fails without knowing whether the step became visible (as S3
    when the store cannot be asked): the sender refuses to go on, saying resume settles
    it, and a resumed sender continues from what is really stored."""

    class UnknownCommit(FileSink):  # a real sink whose first commit fails undecided
        failed = False

        def stage(self, step: int, frames: object) -> object:  # type: ignore[override]
            staged = yield from super().stage(step, frames)  # type: ignore[arg-type]
            if not UnknownCommit.failed:
                UnknownCommit.failed = True

                def commit() -> None:
                    staged.visible = None
                    raise rlwire.TransportError("the store did not answer")

                staged.commit = commit
            return staged

    async with rlwire.TrainingBatchSender(UnknownCommit(tmp_path), MsgpackCodec()) as sender:
        with pytest.raises(rlwire.TransportError, match="step 0: the store did not answer"):
            await sender.send({"a": 0})
        for attempt in ({"a": 0}, {"a": 1}):
            with pytest.raises(rlwire.TransportError, match=r"step 0 .* is unknown.*'resume'"):
                await sender.send(attempt)
    async with rlwire.open_sender(tmp_path, on_existing="resume", codec="msgpack") as again:
        assert again.next_step == 0  # nothing of step 0 was committed: it is sent again
        await again.send({"a": 0})


@pytest.mark.anyio
@pytest.mark.parametrize("error", [OSError(5, "disk gone after rank 0"), ValueError("a bug")])
async def test_a_commit_that_raises_a_foreign_error_leaves_the_step_unknown(
    tmp_path: Path, error: Exception
) -> None:
    """A plugin's commit that made rank 0 visible, did not say so (``visible`` left
    False) and raised its own error, not an rlwire one: the sender passes the error on
    and takes the step's state as unknown (never sends it again, so no receiver that
    took rank 0 sees two versions of it), until a resumed sender settles it."""

    class ForeignCommitError(FileSink):
        def stage(self, step: int, frames: object) -> object:  # type: ignore[override]
            staged = yield from super().stage(step, frames)  # type: ignore[arg-type]

            def commit() -> None:
                staged.mains[0].rename(replace=False)  # rank 0 visible, not said
                raise error

            staged.commit = commit
            return staged

    async with rlwire.TrainingBatchSender(ForeignCommitError(tmp_path), MsgpackCodec()) as sender:
        with pytest.raises(type(error), match=str(error.args[-1])):
            await sender.send_ranks([{"a": 0}, {"a": 1}])
        for attempt in ([{"a": 0}, {"a": 1}], [{"a": 2}, {"a": 3}]):
            with pytest.raises(rlwire.TransportError, match=r"step 0 .* is unknown.*'resume'"):
                await sender.send_ranks(attempt)
        assert sender.next_step == 0
    assert "step-00000000.rank-0000.rlw" in names(tmp_path)  # left visible: never sent again
    with pytest.raises(rlwire.StepExistsError, match=r"step 0 is incomplete.*ranks \[0\]"):
        FileSink(tmp_path).open("resume")


@pytest.mark.anyio
async def test_a_part_whose_commit_raises_a_foreign_error_is_unknown(tmp_path: Path) -> None:
    """A plugin's part commit that made the part visible, did not say so and raised a
    ValueError: the next put is refused (unknown), and the step opened again takes the
    part as this sender's own, never put twice."""

    class ForeignPartError(FileSink):
        def stage_part(self, step: int, part: Any, frame: Any) -> Any:
            staged = yield from super().stage_part(step, part, frame)
            if part.key == "a":

                def commit() -> None:
                    type(staged).commit(staged)
                    staged.visible = False  # the bug: visible, not said
                    raise ValueError("a bug after the part")

                staged.commit = commit
            return staged

    async with rlwire.TrainingBatchSender(ForeignPartError(tmp_path), MsgpackCodec()) as sender:
        with pytest.raises(rlwire.TransportError, match=r"a part of step 0 .* is unknown"):
            async with sender.open_step(ranks=1) as writer:
                with pytest.raises(ValueError, match="a bug after the part"):
                    await writer.put([{"token_ids": [1, 2]}], key="a")
                await writer.put([{"token_ids": [3]}], key="b")
        async with sender.open_step(0, ranks=1) as writer:
            assert writer.resumed == {"a"}


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
@pytest.mark.parametrize("part", ["main", "sidecar"])
def test_odd_files_at_a_step_path_are_typed_errors_not_hangs(
    tmp_path: Path, kind: str, part: str
) -> None:
    """Whatever sits at a step's path, a receive returns within its timeout: a FIFO would
    block a plain open forever waiting for a writer."""
    import time

    import anyio

    async def send() -> None:
        async with rlwire.open_sender(tmp_path, sidecar="routed_experts") as sender:
            await sender.send(make_batch(1))

    anyio.run(send)
    name = "step-00000000.rank-0000" + (".sidecar.rlw" if part == "sidecar" else ".rlw")
    target = tmp_path / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero")
    what = {"fifo": "FIFO", "directory": "directory", "device": "character device"}[kind]
    began = time.monotonic()
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(
            rlwire.CorruptFrameError, match=f"{name}: not a regular file but a {what}"
        ):
            receiver.receive(timeout=2)
    assert time.monotonic() - began < 2


def mapped(path: Path) -> bool:
    """Whether this process maps ``path`` (Linux: /proc/self/maps)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return any(line.rstrip().endswith(str(path)) for line in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_dropped_step_is_unmapped_by_the_next_read_not_where_it_was_dropped(
    tmp_path: Path,
) -> None:
    # Unmapping a large step takes ~0.1 s: it must happen in a reading thread, not in
    # the event-loop thread that drops the last array of the previous step.
    with rlwire.open_sync_sender(tmp_path, sidecar=("routed_experts",)) as sender:
        for step in range(3):
            sender.send({"routed_experts": np.full(1 << 20, step, np.uint8)})
    main = tmp_path / "step-00000000.rank-0000.rlw"
    side = tmp_path / "step-00000000.rank-0000.sidecar.rlw"
    with rlwire.open_receiver(tmp_path, type=dict) as receiver:
        got = receiver.receive(timeout=5)
        assert mapped(main) and mapped(side)
        receiver.receive(timeout=5)  # step 1: step 0's header was decoded, its array is in use
        assert not mapped(main) and mapped(side)
        assert int(got["routed_experts"][-1]) == 0
        del got
        assert mapped(side)  # dropping the array did not unmap it
        receiver.receive(timeout=5)  # the next read does
        assert not mapped(side)
    assert not any(mapped(p) for p in tmp_path.iterdir())  # close unmaps what is unused


@pytest.mark.anyio
async def test_write_batching_across_slice_and_iovec_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlwire.transport._file import staging, writev

    monkeypatch.setattr(staging, "SLICE_BYTES", 4096)  # split buffers into many chunks
    monkeypatch.setattr(writev, "_IOV_MAX", 7)  # and writev batches into many calls
    rng = np.random.default_rng(1)
    obj = {
        f"a{i}": rng.integers(0, 255, int(rng.integers(0, 20_000)), np.uint8) for i in range(300)
    }
    obj["routed_experts"] = rng.integers(0, 255, 50_001, np.uint8)
    async with rlwire.open_sender(tmp_path, sidecar="routed_experts", inline_threshold=1) as s:
        await s.send(obj)
    with rlwire.open_receiver(tmp_path, type=dict[str, np.ndarray]) as receiver:
        got = receiver.receive(timeout=5)
    assert got.keys() == obj.keys()
    for key, value in obj.items():
        assert got[key].tobytes() == value.tobytes(), key
