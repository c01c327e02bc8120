"""The pool of a recycling file sink holds pruned files only between the pruning and
the write: a step sent to fewer ranks than the step it recycles leaves none of the
other ranks' files behind, nor does closing the sender. Real files, real receivers."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlwire
from rlwire import TrainingBatch
from rlwire.testing import assert_batches_equal, make_batch


def batch(step: int, rank: int) -> TrainingBatch:
    return make_batch(2, 512, seed=100 * step + rank)


def hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


@pytest.mark.anyio
async def test_a_step_to_fewer_ranks_leaves_no_pooled_file(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with (
        rlwire.open_receiver(root, rank=0) as r0,
        rlwire.open_receiver(root, rank=1) as r1,
    ):
        async with rlwire.open_sender(
            root, storage_options={"recycle": True}, keep_last=1, sidecar="routed_experts"
        ) as sender:
            for step in range(2):
                await sender.send_ranks([batch(step, 0), batch(step, 1)])
                for rank, receiver in enumerate((r0, r1)):
                    assert_batches_equal(await receiver.areceive(timeout=10), batch(step, rank))
            assert r1.poll() is None  # rank 1 moved past step 1 too
            await sender.send(batch(2, 0))  # step 0 pruned, step 1 pooled; rank 0 only
            assert hidden(root) == []
            assert_batches_equal(await r0.areceive(timeout=10), batch(2, 0))
            await sender.finish()
        assert hidden(root) == []


@pytest.mark.anyio
async def test_closing_after_a_failed_send_leaves_no_pooled_file(tmp_path: Path) -> None:
    root = tmp_path / "run"
    with rlwire.open_receiver(root) as receiver:
        async with rlwire.open_sender(
            root, storage_options={"recycle": True}, keep_last=1
        ) as sender:
            for step in range(2):
                await sender.send(batch(step, 0))
                assert_batches_equal(await receiver.areceive(timeout=10), batch(step, 0))
            assert receiver.poll() is None
            with pytest.raises(rlwire.EncodeError):
                await sender.send({"x": object()})  # step 0 pruned, step 1 pooled first
            assert hidden(root) != []  # the pool waits for the next write...
        assert hidden(root) == []  # ...or the close
