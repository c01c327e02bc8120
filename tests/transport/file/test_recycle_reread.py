"""A receiver that wrote into the arrays of a step it holds (as torch's in-place ops
do), in the main file's first page and the sidecar's: when those files come back
recycled, the step is read again through new mappings, every file of it, and arrives
correct, with no error. Real files on tmpfs, a real receiver."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

import rlwire
from rlwire import TrainingBatch
from rlwire.testing import assert_batches_equal, make_sample


def batch(step: int) -> TrainingBatch:
    return TrainingBatch(samples=[make_sample(20_000, seed=step)])


def test_pages_written_in_the_main_file_and_the_sidecar_do_not_fail_a_later_step(
    shm_dir: Path,
) -> None:
    with (
        rlwire.open_sync_sender(
            shm_dir, storage_options={"recycle": True}, keep_last=1, sidecar="routed_experts"
        ) as sender,
        rlwire.open_receiver(shm_dir) as receiver,
    ):
        for step in range(8):
            sender.send(batch(step))
            got = receiver.receive(timeout=10)  # no CorruptFrameError
            assert receiver.last_step == step
            assert_batches_equal(got, batch(step))
            sample = got.samples[0]
            assert sample.routed_experts is not None
            # The envelope's page of the main file, and the sidecar's first page.
            ctypes.memset(sample.token_ids.ctypes.data, 0, 8)
            ctypes.memset(sample.routed_experts.ctypes.data, 0, 8)
            assert not np.array_equal(sample.token_ids[:2], batch(step).samples[0].token_ids[:2])
