"""Retention when the ranks change from one send to the next: a step is deleted (or
recycled) only once every rank holding files of it moved past it, not only the ranks of
the send that prunes. Real files, real receivers; the scenario that could kill a reader
with SIGBUS runs in a subprocess."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import forked
import pytest

import rlwire
from rlwire import TrainingBatch
from rlwire.testing import assert_batches_equal, make_batch
from rlwire.transport._stored.names import main_name

RECYCLE = {"recycle": True}


def batch(step: int, rank: int, n: int = 4096) -> TrainingBatch:
    return make_batch(1, n, seed=100 * step + rank)


def stored(root: Path, step: int, rank: int) -> bool:
    return (root / main_name(step, rank)).exists()


@pytest.mark.anyio
@pytest.mark.parametrize("recycle", [False, True])
async def test_a_send_to_fewer_ranks_keeps_the_step_a_dropped_rank_has_not_read(
    tmp_path: Path, recycle: bool
) -> None:
    root = tmp_path / "run"
    options = RECYCLE if recycle else {}
    with (
        rlwire.open_receiver(root, rank=0) as r0,
        rlwire.open_receiver(root, rank=1) as r1,
    ):
        async with rlwire.open_sender(
            root, storage_options=options, keep_last=1, sidecar="routed_experts"
        ) as sender:
            await sender.send_ranks([batch(0, 0), batch(0, 1)])
            assert_batches_equal(await r0.areceive(timeout=10), batch(0, 0))
            for step in range(1, 4):  # rank 0 only from now on; rank 0 keeps up
                await sender.send(batch(step, 0, n=64))
                assert_batches_equal(await r0.areceive(timeout=10), batch(step, 0, n=64))
            assert stored(root, 0, 1)  # rank 1 has not read it: kept
            assert_batches_equal(await r1.areceive(timeout=10), batch(0, 1))  # no StepGapError
            # Asks for step 1 (moved past step 0): sent to rank 0 only, and step 2 is
            # stored, so it never comes for rank 1; a StepGapError says so, not a wait.
            with pytest.raises(rlwire.StepGapError, match="step 1 was committed for ranks"):
                r1.poll()
            await sender.send(batch(4, 0, n=64))
            assert_batches_equal(await r0.areceive(timeout=10), batch(4, 0, n=64))
            await sender.send(batch(5, 0, n=64))
            assert not stored(root, 0, 1)  # pruned once rank 1 moved past it
            assert sorted(rlwire.transport.FileSource(root).stored_steps() or []) == [4, 5]


@pytest.mark.anyio
async def test_a_sender_resumed_with_fewer_ranks_keeps_the_earlier_runs_held_step(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    kw: dict[str, object] = {"storage_options": RECYCLE, "keep_last": 1}
    with (
        rlwire.open_receiver(root, rank=0) as r0,
        rlwire.open_receiver(root, rank=1) as r1,
    ):
        async with rlwire.open_sender(root, **kw) as sender:  # type: ignore[arg-type]
            await sender.send_ranks([batch(0, 0), batch(0, 1)])
        held = await r1.areceive(timeout=10)  # rank 1 works on step 0
        async with rlwire.open_sender(root, on_existing="resume", **kw) as sender:  # type: ignore[arg-type]
            for step in range(1, 4):
                assert_batches_equal(await r0.areceive(timeout=10), batch(step - 1, 0))
                await sender.send(batch(step, 0))
            assert stored(root, 0, 1)
            assert_batches_equal(held, batch(0, 1))


def test_a_dropped_ranks_held_step_is_never_written_over(tmp_path: Path) -> None:
    """With recycle, the pruned step's files were those rank 1 holds: rank 0's new,
    shorter sidecar went into rank 1's main file, and reading rank 1's array raised
    SIGBUS (so this runs in a subprocess)."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    root = root / f"rlwire-test-shrink-{os.getpid()}-{os.urandom(4).hex()}"
    script = textwrap.dedent(
        f"""
        import shutil, numpy as np, rlwire
        from rlwire.testing import make_batch
        root = {str(root)!r}
        try:
            s = rlwire.open_sync_sender(root, storage_options={{"recycle": True}},
                                        keep_last=1, sidecar="routed_experts")
            r0 = rlwire.open_receiver(root, rank=0)
            r1 = rlwire.open_receiver(root, rank=1)
            s.send_ranks([make_batch(1, 4096, seed=0), make_batch(1, 4096, seed=1)])
            held = r1.receive(timeout=5).samples[0].token_ids
            r0.receive(timeout=5); r0.poll()
            s.send(make_batch(1, 64, seed=2))
            s.send(make_batch(1, 64, seed=3))
            print(np.array_equal(held, make_batch(1, 4096, seed=1).samples[0].token_ids))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        """
    )
    try:
        done = forked.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
    finally:  # a child killed by SIGBUS cleans nothing up
        shutil.rmtree(root, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
