"""An old recycling producer still running beside its replacement, opened with
``on_existing="truncate"``: the replacement deletes a step's file and writes a new one
under its name, which the old producer then pools and writes its next step into. That
step must hold what the old producer sent, with or without checksums: never bytes
written through the old producer's mapping of the deleted file. Real files on tmpfs
(where the sink keeps its mappings)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlwire
from rlwire.transport._file.mapped import WarmMaps, inode_of


def obj(tag: int) -> dict[str, Any]:
    rng = np.random.default_rng(tag)
    return {"tag": tag, "big": rng.integers(0, 2**62, 300_000, dtype=np.int64)}


@pytest.mark.parametrize("checksum", [True, False])
def test_the_old_producers_step_in_a_file_the_replacement_wrote_holds_its_own_bytes(
    shm_dir: Path, checksum: bool
) -> None:
    options: dict[str, Any] = {
        "storage_options": {"recycle": True},
        "keep_last": 1,
        "inline_threshold": 0,
        "integrity": rlwire.Integrity(checksum=checksum),
    }
    old = rlwire.open_sync_sender(shm_dir, **options)
    with rlwire.open_receiver(shm_dir, type=dict) as receiver:
        for step in range(5):  # the old producer's mappings of its files are warm
            old.send(obj(step))
            assert receiver.receive(timeout=10)["tag"] == step
            receiver.poll()
    new = rlwire.open_sync_sender(shm_dir, on_existing="truncate", start_step=4, **options)
    new.send(obj(104))  # step 4 again: a new file under the old one's name
    with rlwire.open_receiver(shm_dir, start_step=4, type=dict) as receiver:
        assert receiver.receive(timeout=10)["tag"] == 104
        receiver.poll()  # moved past step 4: the old producer may prune it
        with pytest.raises(rlwire.ClosedError):  # fenced off: it prunes and writes nothing
            old.send(obj(5))
        assert new.send(obj(105)) == 5
        got = receiver.receive(timeout=10)  # no CorruptFrameError
        assert got["tag"] == 105
        assert np.array_equal(got["big"], obj(105)["big"])
        del got
    old.close()
    new.close()


def test_a_kept_mapping_is_handed_out_only_for_the_file_it_maps(shm_dir: Path) -> None:
    maps = WarmMaps()
    path = shm_dir / "f"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDWR)
    mapping = mmap.mmap(fd, 4096)
    maps.keep("f", mapping, inode_of(fd))
    assert maps.take("f", fd) is mapping
    maps.keep("f", mapping, inode_of(fd))
    os.close(fd)
    path.unlink()  # another sender deletes it, and writes a new file under its name
    path.write_bytes(b"y" * 4096)
    fd = os.open(path, os.O_RDWR)
    try:
        assert maps.take("f", fd) is None
        assert mapping.closed and len(maps) == 0
    finally:
        os.close(fd)
