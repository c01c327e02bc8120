"""A recycling sink's pooled files, removed by another sender: its mappings of them go too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import forked
import numpy as np
import pytest

import rlwire
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink
from rlwire.transport._stored.marks import consumed_mark
from rlwire.transport._stored.names import POOL_RE, consumed_name

CODEC = MsgpackCodec(sidecar=["side"])

_OTHER_SENDER = (
    "import rlwire, sys; rlwire.open_sync_sender(sys.argv[1], on_existing='resume').close()"
)


def frames(step: int) -> list[rlwire.Frame]:
    return [CODEC.encode({"step": step, "side": np.full(1 << 20, step % 256, np.uint8)})]


def mapped_but_gone(root: Path) -> set[int]:
    """The inodes of files under ``root`` this process maps that no name in ``root``
    links any more: tmpfs memory nothing but the mapping holds."""
    live = {os.stat(root / name).st_ino for name in os.listdir(root)}
    with open("/proc/self/maps") as maps:
        mapped = {int(line.split()[4]) for line in maps if str(root) in line}
    return mapped - live


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_pooled_files_another_sender_removed_leave_no_mapping_behind(shm_dir: Path) -> None:
    """Another sender opening the directory removes the pooled files as leftovers (the
    write then goes to new files): the mappings the sink kept of them must go too, or
    each such step keeps a deleted step's memory for as long as the sender runs."""
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")
    try:
        for step in range(10):
            if step:
                (shm_dir / consumed_name(0)).write_bytes(consumed_mark(step))
                sink.prune(step)  # the step before is pooled, with the mapping kept of it
            if step >= 2 and step % 2 == 0:
                assert [n for n in os.listdir(shm_dir) if POOL_RE.fullmatch(n)]
                forked.run([sys.executable, "-c", _OTHER_SENDER, str(shm_dir)], check=True)
                sink.fence.write("resume", True)  # as if it opened last: not fenced off
            run_sliced(sink.stage(step, frames(step))).commit()
            assert mapped_but_gone(shm_dir) == set(), step
    finally:
        sink.close()
