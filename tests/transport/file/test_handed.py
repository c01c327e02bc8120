"""A file source unmaps the mappings it handed out once nothing uses them, in the reading
thread, trying each a bounded number of times (transport/_file/handed.py): real
mappings, a clock that ticks at each reading of it."""

from __future__ import annotations

import functools
import itertools
import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import rlwire
from rlwire.transport._file.handed import FEW, WAIT_FACTOR, HandedMappings


class Counted(mmap.mmap):
    """An anonymous page whose tries to unmap are counted."""

    tries = 0

    def close(self) -> None:
        Counted.tries += 1
        super().close()


def page() -> Counted:
    return Counted(-1, mmap.PAGESIZE)


def ticking() -> HandedMappings:
    """Mappings held under a clock that ticks by one at each reading: a try of them all
    takes 1, a waiting reader tries them all again once WAIT_FACTOR readings later."""
    return HandedMappings(clock=functools.partial(next, itertools.count()))


@contextmanager
def counting_unmaps() -> Iterator[list[int]]:
    """How many times this thread calls ``mmap.close`` (a profile hook)."""
    count = [0]

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "close":
            count[0] += isinstance(getattr(arg, "__self__", None), mmap.mmap)

    sys.setprofile(hook)
    try:
        yield count
    finally:
        sys.setprofile(None)


def test_receiving_a_step_of_many_parts_tries_each_mapping_a_few_times(tmp_path: Path) -> None:
    # Each part's load tried to unmap every part loaded before it, all held until the
    # step is joined: N²/2 tries, each a raised BufferError (16,000 parts: 230 s).
    parts = 200
    with rlwire.open_sync_sender(tmp_path) as sender, sender.open_step(ranks=1) as writer:
        for i in range(parts):
            writer.put([{"token_ids": [i]}], key=i)
    with rlwire.open_receiver(tmp_path, type=list, record_consumed=False) as receiver:
        with counting_unmaps() as tries:
            rows = receiver.receive(timeout=10)
        assert sorted(row["token_ids"][0] for row in rows) == list(range(parts))
    assert tries[0] < 5 * parts  # 20,000 before


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_step_of_many_parts_dropped_while_its_receiver_waits_is_unmapped(
    tmp_path: Path,
) -> None:
    parts = 3 * FEW  # more than are all tried at each read
    with rlwire.open_sync_sender(tmp_path) as sender, sender.open_step(ranks=1) as writer:
        for i in range(parts):
            writer.put([{"token_ids": [i]}], key=i)

    def mapped() -> int:
        return sum(str(tmp_path) in line for line in Path("/proc/self/maps").read_text().split())

    with rlwire.open_receiver(tmp_path, type=list, record_consumed=False) as receiver:
        rows = receiver.receive(timeout=10)
        assert mapped() >= parts  # every part
        del rows
        assert mapped() >= parts  # not where it was dropped
        with pytest.raises(rlwire.ReceiveTimeout):
            receiver.receive(timeout=0.5)  # polls for the next step
        assert mapped() == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_step_of_more_parts_than_descriptors_says_why_it_cannot_be_mapped(
    tmp_path: Path,
) -> None:
    # Each part received whole stays mapped, and CPython's mmap keeps a descriptor of
    # its file: a step of more parts than the open-file limit (often 1,024) fails.
    import resource

    with rlwire.open_sync_sender(tmp_path) as sender, sender.open_step(ranks=1) as writer:
        for i in range(80):
            writer.put([{"token_ids": [i]}], key=i)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with rlwire.open_receiver(tmp_path, type=list, record_consumed=False) as receiver:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
        try:
            with pytest.raises(rlwire.TransportError) as raised:
                receiver.receive(timeout=10)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "part-0000" in str(raised.value)
    assert "files this receiver has mapped" in str(raised.value)
    assert "every part of a step received whole, holds a descriptor" in str(raised.value)
    assert "ulimit -n" in str(raised.value) and "parts()" in str(raised.value)


def test_reading_many_files_held_at_once_is_linear_in_tries() -> None:
    handed, held = ticking(), []
    Counted.tries = 0
    for _ in range(2000):
        handed.unmap_due()
        held.append(memoryview(mapping := page()))
        handed.append(mapping)
    assert len(handed) == 2000
    assert Counted.tries < 4 * 2000  # 2,000,000 tried before each read


def test_a_mapping_dropped_goes_at_the_next_read_while_few_are_held() -> None:
    handed = ticking()
    views = [memoryview(page()) for _ in range(FEW)]
    for view in views:
        handed.append(view.obj)  # type: ignore[arg-type]
    handed.unmap_due()
    assert len(handed) == FEW
    views.pop().release()
    handed.unmap_due()
    assert len(handed) == FEW - 1


def test_a_part_dropped_as_the_next_is_read_goes_at_once_while_many_are_held() -> None:
    handed = ticking()
    held = [memoryview(page()) for _ in range(4 * FEW)]
    for view in held:
        handed.append(view.obj)  # type: ignore[arg-type]
    handed.unmap_due()  # all in use: not tried again for 4 * FEW reads
    for _ in range(10):
        handed.append(mapping := page())  # a part, handed out then dropped
        view = memoryview(mapping)
        view.release()
        handed.append(page())
        handed.unmap_due()
        assert len(handed) == 4 * FEW
    Counted.tries = 0
    for view in held:
        view.release()
    reads = 0
    while len(handed):  # reading on, with nothing new in use
        handed.append(page())
        handed.unmap_due()
        reads += 1
    assert reads == 4 * FEW - 10  # once as many reads as were held: all go
    assert Counted.tries < 4 * 4 * FEW


def test_a_step_dropped_while_its_reader_waits_goes_within_a_bounded_wait() -> None:
    handed = ticking()
    held = [memoryview(page()) for _ in range(4 * FEW)]
    for view in held:
        handed.append(view.obj)  # type: ignore[arg-type]
    handed.unmap_due()  # a try of them all, that took 1
    for view in held:
        view.release()
    polls = 0
    while len(handed):
        handed.unmap_due()  # nothing handed out since the last read
        polls += 1
    assert polls == WAIT_FACTOR  # the clock is read once a poll


def test_unmap_unused_tries_them_all_and_clear_lets_go() -> None:
    handed = ticking()
    in_use = memoryview(kept := page())
    handed.append(kept)
    handed.append(page())
    handed.unmap_unused()
    assert len(handed) == 1 and not kept.closed
    handed.clear()
    assert len(handed) == 0
    in_use.release()
