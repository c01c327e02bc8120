"""The groups of small rows the codec joins stay alive a while after their frame is
gone (``joined_rows._KEPT``), so that malloc reuses their memory for the next steps
instead of giving it back to the system; never more than a bound, and never a group
of a few huge rows. What that buys is measured by benchmarks/bench_send_ranks.py."""

from __future__ import annotations

import sys

import numpy as np

import rlwire
from rlwire.codecs import MsgpackCodec
from rlwire.codecs._msgpack import joined_rows
from rlwire.testing import make_sample


def small_batch(seed: int) -> rlwire.TrainingBatch:
    """3,000 samples of 64 tokens: every column's rows are joined, in groups."""
    return rlwire.TrainingBatch(samples=[make_sample(64, seed=seed + i) for i in range(3000)])


def refs(objects: list[bytes]) -> set[int]:
    return {sys.getrefcount(obj) for obj in objects}


def test_a_frames_groups_outlive_it_and_the_kept_are_bounded() -> None:
    codec = MsgpackCodec()
    frame = codec.encode(small_batch(0))
    runs = [run.obj for buffer in frame.buffers for run in getattr(buffer, "runs", ())]
    assert runs and all(type(run) is bytes for run in runs)  # groups of joined rows
    del frame
    (alone,) = refs([bytes(bytearray(10))])  # a bytes object in a list, held nowhere else
    assert refs(runs) == {alone + 1}  # held by the kept groups, and by this test
    cap = joined_rows._KEPT.maxlen
    assert cap is not None and cap * 2 * joined_rows._JOIN_BYTES <= 128 << 20
    other = small_batch(10_000)
    for _ in range(30):
        codec.encode(other)
    assert len(joined_rows._KEPT) == cap  # the oldest went as the newest came
    assert refs(runs) == {alone}


def test_a_group_of_a_few_huge_rows_is_not_kept() -> None:
    """Rows 4 KiB each on average, one of them 4 MiB: its group is not held on to."""
    rows = [np.ones(4 << 20, np.uint8), *(np.zeros(1, np.uint8) for _ in range(2000))]
    frame = MsgpackCodec().encode({"rows": [{"x": row} for row in rows]})
    sizes = [run.nbytes for buffer in frame.buffers for run in getattr(buffer, "runs", ())]
    assert max(sizes) >= 4 << 20  # the huge row's group went out joined
    assert all(len(kept) <= 2 * joined_rows._JOIN_BYTES for kept in joined_rows._KEPT)
