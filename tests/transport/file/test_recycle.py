"""FileSink with recycling (storage option ``recycle``): new steps are written into the
files of pruned steps; on a real filesystem, with real receivers and a real killed
process."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import forked
import numpy as np
import pytest

import rlwire
from rlwire import TrainingBatch
from rlwire._core.slicing import Sliced, run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.testing import assert_batches_equal, make_batch
from rlwire.transport import FileSink, FileSource
from rlwire.transport._file.staging import FileStaging
from rlwire.transport._stored.marks import consumed_mark
from rlwire.transport._stored.names import (
    POOL_RE,
    STORED_RE,
    consumed_name,
    main_name,
    sidecar_name,
)

CODEC = MsgpackCodec(sidecar=["routed_experts"])
RECYCLE = {"recycle": True}


def frames(ranks: int, step: int, size: int = 5000) -> list[rlwire.Frame]:
    return [
        CODEC.encode({"rank": r, "step": step, "routed_experts": np.full(size, step, np.uint8)})
        for r in range(ranks)
    ]


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def pooled(path: Path) -> list[str]:
    return [n for n in names(path) if POOL_RE.fullmatch(n)]


def hidden(path: Path) -> list[str]:
    return [n for n in names(path) if n.startswith(".")]


def inodes(path: Path, step: int, ranks: int) -> set[int]:
    files = [f(step, r) for r in range(ranks) for f in (main_name, sidecar_name)]
    return {os.stat(path / name).st_ino for name in files}


def commit(sink: FileSink, step: int, ranks: int, size: int = 5000) -> None:
    staged = run_sliced(sink.stage(step, frames(ranks, step, size)))
    staged.commit()  # type: ignore[attr-defined]


def prune(sink: FileSink, below: int) -> None:
    """``sink.prune(below)`` once every rank holding files of the steps before ``below``
    has moved past them (their receivers' marks say so): the sink deletes no step a rank
    holding files of it may still read."""
    steps = [int(m.group(1)) for n in names(sink.root) if (m := STORED_RE.fullmatch(n))]
    mark = min(below, max(steps, default=-1) + 1)
    for rank in range(4):
        (sink.root / consumed_name(rank)).write_bytes(consumed_mark(mark))
    sink.prune(below)


def read(path: Path, step: int, rank: int) -> dict[str, Any]:
    frame = FileSource(path, rank=rank).read(step)
    assert frame is not None
    return CODEC.decode(frame)  # type: ignore[no-any-return]


def batch(step: int, rank: int, n: int = 64) -> TrainingBatch:
    # Lengths vary with the step, so a recycled file is sometimes longer, sometimes
    # shorter than the message written into it.
    return make_batch(3, n + 37 * (step % 3), seed=100 * step + rank)


# Sink level: the pool, its bound, and what is visible when.


def test_prune_pools_the_newest_step_only_and_staging_takes_its_files(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, recycle=True)
    sink.open("error")
    for step in range(4):
        commit(sink, step, 2)
    step3 = inodes(tmp_path, 3, 2)
    prune(sink, 4)  # four steps at once: one step's files are kept, the rest deleted
    assert len(pooled(tmp_path)) == 4  # two ranks, main and sidecar
    assert {os.stat(tmp_path / n).st_ino for n in pooled(tmp_path)} == step3
    assert [n for n in names(tmp_path) if not n.startswith((".", "consumed."))] == []
    assert FileSource(tmp_path).stored_steps() == []  # readers see no pooled file

    staged = run_sliced(sink.stage(4, frames(2, 4, size=9000)))  # larger than before
    assert isinstance(staged, FileStaging)
    # Written into the pooled files, under temporary names: nothing visible yet.
    assert pooled(tmp_path) == []
    assert {os.stat(out.tmp).st_ino for out in (*staged.mains, *staged.sidecars)} == step3
    assert FileSource(tmp_path).read(4) is None
    assert not [n for n in names(tmp_path) if not n.startswith((".", "consumed."))]
    staged.commit()
    assert hidden(tmp_path) == []
    assert inodes(tmp_path, 4, 2) == step3
    for rank in range(2):
        got = read(tmp_path, 4, rank)
        assert got["rank"] == rank and got["step"] == 4
        assert np.array_equal(got["routed_experts"], np.full(9000, 4, np.uint8))


def test_a_recycled_file_is_cut_to_the_new_size_and_verifies(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, recycle=True)
    sink.open("error")
    commit(sink, 0, 1, size=1 << 20)
    big = os.stat(tmp_path / sidecar_name(0, 0)).st_size
    prune(sink, 1)
    commit(sink, 1, 1, size=100)  # into the 1 MiB files: the old bytes must not remain
    assert os.stat(tmp_path / sidecar_name(1, 0)).st_size < big // 100
    frame = FileSource(tmp_path, verify=True).read(1)  # checksums and sizes checked
    assert frame is not None
    assert np.array_equal(CODEC.decode(frame)["routed_experts"], np.full(100, 1, np.uint8))


def test_a_failed_write_into_a_pooled_file_leaves_nothing(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, recycle=True)
    sink.open("error")
    commit(sink, 0, 2)
    prune(sink, 1)
    assert len(pooled(tmp_path)) == 4

    def broken() -> Sliced[rlwire.Frame]:  # rank 1 fails to encode, after rank 0 is written
        yield
        raise rlwire.SchemaError("rank 1 cannot be encoded")

    with pytest.raises(rlwire.SchemaError, match="rank 1 cannot"):
        run_sliced(sink.stage(1, [frames(1, 1)[0], broken()]))
    # Rank 0's files, written into two pooled files, are removed; nothing is visible.
    assert len(pooled(tmp_path)) == 2
    assert hidden(tmp_path) == pooled(tmp_path)
    assert FileSource(tmp_path).stored_steps() == []


# Through the sender and receivers.


@pytest.mark.anyio
async def test_recycled_steps_round_trip_bit_exact(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with (
        rlwire.open_receiver(root, rank=0) as r0,
        rlwire.open_receiver(root, rank=1) as r1,
    ):
        async with rlwire.open_sender(
            root, storage_options=RECYCLE, keep_last=1, sidecar="routed_experts"
        ) as sender:
            seen: dict[int, set[int]] = {}
            for step in range(8):
                await sender.send_ranks([batch(step, 0), batch(step, 1)])
                seen[step] = inodes(root, step, 2)
                # Steady state: the pool is used up by each send, and holds one step at most.
                assert pooled(root) == []
                for rank, receiver in enumerate((r0, r1)):
                    got = await receiver.areceive(timeout=10)
                    assert receiver.last_step == step
                    assert_batches_equal(got, batch(step, rank))
                    assert receiver.last_stats is not None
        # Step s is pruned at the send of step s + 2 (both ranks moved past it then) and
        # step s + 2 written into its files.
        for step in range(2, 8):
            assert seen[step] == seen[step - 2], step


@pytest.mark.anyio
async def test_without_recycle_no_file_is_ever_pooled(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with rlwire.open_receiver(root) as receiver:
        async with rlwire.open_sender(root, keep_last=1, sidecar="routed_experts") as sender:
            assert isinstance(sender.sink, FileSink) and not sender.sink.recycle
            for step in range(5):
                await sender.send(batch(step, 0))
                assert hidden(root) == []
                assert_batches_equal(await receiver.areceive(timeout=10), batch(step, 0))
                assert hidden(root) == []
    assert sorted(FileSource(root).stored_steps() or []) == [3, 4]  # pruned as ever: deleted


@pytest.mark.anyio
async def test_a_held_step_is_never_recycled_before_its_receiver_moves_past_it(
    tmp_path: Path,
) -> None:
    """The promise: rank 0 holds step 1 while rank 1 runs ahead, and then step 2 while
    the sender recycles step 1's files; what it holds never changes."""
    root = tmp_path / "run"
    with (
        rlwire.open_receiver(root, rank=0) as slow,
        rlwire.open_receiver(root, rank=1) as fast,
    ):
        async with rlwire.open_sender(
            root, storage_options=RECYCLE, keep_last=1, sidecar="routed_experts"
        ) as sender:
            seen: dict[int, set[int]] = {}

            async def send(step: int) -> None:
                await sender.send_ranks([batch(step, 0, n=4096), batch(step, 1, n=4096)])
                seen[step] = inodes(root, step, 2)
                assert_batches_equal(await fast.areceive(timeout=10), batch(step, 1, n=4096))

            for step in range(2):
                await send(step)
            assert_batches_equal(await slow.areceive(timeout=10), batch(0, 0, n=4096))
            held = await slow.areceive(timeout=10)  # step 1, kept while more steps come
            for step in range(2, 6):  # step 0 is pruned and recycled; step 1 never
                await send(step)
                assert_batches_equal(held, batch(1, 0, n=4096))
            assert seen[2] == seen[0]  # recycling did happen
            assert all(not seen[s] & seen[1] for s in range(2, 6))

            later = await slow.areceive(timeout=10)  # step 2: moves past step 1
            assert slow.last_step == 2
            del held  # past the promise: its files may be written over from now on
            for step in range(6, 9):  # step 1 is pruned and recycled now; 2 never
                await send(step)
                assert_batches_equal(later, batch(2, 0, n=4096))
            assert seen[1] & (seen[6] | seen[7] | seen[8])  # step 1's files were reused


@pytest.mark.anyio
@pytest.mark.skipif(sys.platform != "linux", reason="what a private mapping shows is Linux's")
async def test_arrays_held_past_the_promise_change_which_is_why_it_is_opt_in(
    tmp_path: Path,
) -> None:
    """The other side of the promise, shown so that the test above would catch a sink
    that recycled too early: arrays of a step the receiver moved past, pruned and
    recycled, show the new step's bytes."""
    root = tmp_path / "run"
    with rlwire.open_receiver(root) as receiver:
        async with rlwire.open_sender(
            root, storage_options=RECYCLE, keep_last=1, sidecar="routed_experts"
        ) as sender:
            same = make_batch(1, 4096, seed=1)
            other = make_batch(1, 4096, seed=2)  # the same sizes: the files keep their length
            await sender.send(same)
            old = await receiver.areceive(timeout=10)
            await sender.send(same)
            await receiver.areceive(timeout=10)  # moves past step 0
            await sender.send(other)  # step 0 pruned, step 2 written into its files
            assert np.array_equal(old.samples[0].token_ids, other.samples[0].token_ids)
            assert not np.array_equal(old.samples[0].token_ids, same.samples[0].token_ids)


def test_recycle_needs_keep_last_and_a_bool(tmp_path: Path) -> None:
    with pytest.raises(rlwire.ConfigError, match="without keep_last none are"):
        rlwire.open_sender(tmp_path, storage_options=RECYCLE)
    with pytest.raises(rlwire.ConfigError, match="without keep_last none are"):
        rlwire.open_sender(tmp_path, storage_options=RECYCLE, max_ahead=2)
    with pytest.raises(rlwire.ConfigError, match="'recycle' must be True or False, got 'yes'"):
        rlwire.open_sender(tmp_path, storage_options={"recycle": "yes"}, keep_last=2)
    sender = rlwire.open_sender(tmp_path, storage_options={"recycle": False})
    assert isinstance(sender.sink, FileSink) and not sender.sink.recycle
    sender = rlwire.open_sender(tmp_path, storage_options=RECYCLE, keep_last=2)
    assert isinstance(sender.sink, FileSink) and sender.sink.recycle


# A real process killed between taking pooled files and the commit.

_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from rlwire._core.slicing import run_sliced
    from rlwire.codecs import MsgpackCodec
    from rlwire.transport import FileSink
    from rlwire.transport._stored.marks import consumed_mark

    codec = MsgpackCodec(sidecar=["routed_experts"])

    def frames(ranks, step):
        return [codec.encode({"rank": r, "step": step,
                              "routed_experts": np.full(5000, step, np.uint8)})
                for r in range(ranks)]

    sink = FileSink(sys.argv[1], recycle=True)
    sink.open("error")
    for step in range(3):
        run_sliced(sink.stage(step, frames(2, step))).commit()
    for rank in range(2):  # both ranks' receivers moved past step 1
        with open(os.path.join(sys.argv[1], f"consumed.rank-{rank:04d}.rlw"), "wb") as f:
            f.write(consumed_mark(2))
    sink.prune(2)  # steps 0 and 1: step 1's four files are pooled
    # Step 3 for one rank takes two of them (main and sidecar), written in full...
    run_sliced(sink.stage(3, frames(1, 3)))
    print(sorted(os.listdir(sys.argv[1])), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # ...and the sender dies before the commit
    """
)


@pytest.mark.anyio
async def test_a_kill_between_taking_pooled_files_and_commit_leaves_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    root.mkdir()
    proc = forked.run(
        [sys.executable, "-c", _KILLED, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left: Sequence[str] = names(root)
    assert [n for n in left if POOL_RE.fullmatch(n)] == []  # the two not taken: deleted
    assert len([n for n in left if n.startswith(".step-00000003.")]) == 2  # written, hidden
    assert [n for n in left if not n.startswith((".", "consumed."))] == sorted(
        [main_name(2, 0), main_name(2, 1), sidecar_name(2, 0), sidecar_name(2, 1)]
    )
    assert FileSource(root).read(3) is None
    assert FileSource(root).stored_steps() == [2]

    async with rlwire.open_sender(
        root, on_existing="resume", storage_options=RECYCLE, keep_last=1, sidecar="routed_experts"
    ) as sender:
        assert hidden(root) == []  # the pooled and the half-committed files are gone
        assert sender.next_step == 3
        await sender.send(batch(3, 0))
    with rlwire.open_receiver(root, start_step=3) as receiver:
        assert_batches_equal(await receiver.areceive(timeout=10), batch(3, 0))


def test_a_mark_lowered_while_its_step_is_pruned_keeps_its_files_out_of_the_pool(
    tmp_path: Path,
) -> None:
    """A trainer restarted at step 1 lowers its rank's mark before it opens the step's
    files. A prune that read the marks just before must write no later step into them:
    once the files are pooled (no reader can open them any more), it reads the marks
    again and deletes, rather than pools, files a reader may hold."""
    sink = FileSink(tmp_path, recycle=True)
    sink.open("error")
    for step in range(2):
        commit(sink, step, 1)
    (tmp_path / consumed_name(0)).write_bytes(consumed_mark(2))  # moved past both
    held: dict[str, Any] = {}
    marks = sink.read_consumption

    def a_restart_meanwhile(ranks: int, sent: int) -> list[int | None]:
        found = marks(ranks, sent)  # what the prune reads first: the old mark
        if not held:  # the trainer restarts at step 1: lowers its mark, then reads
            (tmp_path / consumed_name(0)).write_bytes(consumed_mark(1))
            held.update(read(tmp_path, 1, 0))
        return found

    sink.read_consumption = a_restart_meanwhile  # type: ignore[method-assign]
    sink.prune(2)
    assert pooled(tmp_path) == []  # step 1's files deleted, not pooled
    commit(sink, 2, 1)
    assert np.array_equal(held["routed_experts"], np.full(5000, 1, np.uint8))
