"""A recycling file sink on tmpfs writes a pooled file through the writable mapping it
kept from the file's last use (transport/_file/mapped.py): real files under /dev/shm,
real mappings, a real file size limit."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
import textwrap
from pathlib import Path

import forked
import numpy as np
import pytest
from helpers import stat_type
from transport.file.test_recycle import CODEC, batch, commit, hidden, pooled, prune

import rlwire
from rlwire._core.slicing import Sliced, run_sliced
from rlwire.testing import assert_batches_equal
from rlwire.transport import FileSink, FileSource
from rlwire.transport._file.mapped import WarmMaps, map_for_writing, mount_type, on_tmpfs
from rlwire.transport._stored.names import main_name, sidecar_name


def kept(sink: FileSink) -> dict[str, mmap.mmap]:
    assert sink._warm is not None
    return {name: mapping for name, (mapping, _) in sink._warm._maps.items()}


# Where: tmpfs only.

MOUNTINFO = "\n".join(
    [
        "21 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw",
        "22 21 0:5 / /dev/shm rw - tmpfs tmpfs rw,size=1024k",
        "23 22 8:1 /data /dev/shm/disk rw - ext4 /dev/sda1 rw",
        r"24 21 0:6 / /mnt/my\040ram rw - tmpfs tmpfs rw",
        r"25 21 0:7 / /mnt/café\040é rw - tmpfs tmpfs rw",  # UTF-8 as it is, a space escaped
        "garbage",
    ]
)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/dev/shm", "tmpfs"),
        ("/dev/shm/run/a", "tmpfs"),
        ("/dev/shm/disk/run", "ext4"),  # a mount inside tmpfs
        ("/dev/shmx", "ext4"),  # a prefix of the name, not of the path
        ("/mnt/my ram/run", "tmpfs"),  # an escaped space
        ("/mnt/café é/run", "tmpfs"),
        ("/home", "ext4"),
    ],
)
def test_the_mount_is_the_longest_mount_point_that_holds_the_path(path: str, kind: str) -> None:
    assert mount_type(path, MOUNTINFO) == kind


def test_on_tmpfs_agrees_with_stat(shm_dir: Path, tmp_path: Path) -> None:
    assert on_tmpfs(shm_dir)
    assert on_tmpfs(tmp_path) == (stat_type(tmp_path) == "tmpfs")


def test_only_a_recycling_sink_on_tmpfs_keeps_mappings(shm_dir: Path, tmp_path: Path) -> None:
    for root, recycle, keeps in [
        (shm_dir / "a", True, True),
        (shm_dir / "b", False, False),
        (tmp_path, True, stat_type(tmp_path) == "tmpfs"),
    ]:
        sink = FileSink(root, recycle=recycle)
        sink.open("error")
        assert (sink._warm is not None) == keeps, root


# The mapping: kept, reused, sized.


def test_a_pooled_file_is_written_through_the_mapping_it_kept(shm_dir: Path) -> None:
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")
    sizes = [300_000, 900_000, 200_000, 900_000, 600_000, 100_000]  # shrinks and grows
    previous: mmap.mmap | None = None
    for step, size in enumerate(sizes):
        if step:
            prune(sink, step)  # the step before goes to the pool
        commit(sink, step, 1, size=size)
        got = CODEC.decode(FileSource(shm_dir, verify=True).read(step))
        assert np.array_equal(got["routed_experts"], np.full(size, step, np.uint8))
        assert os.stat(shm_dir / sidecar_name(step, 0)).st_size < size + 4096
        maps = kept(sink)
        if step == 0:
            assert maps == {}  # new files: written, not mapped
        else:  # a pooled file, now mapped, and its mapping kept under its new name
            assert set(maps) == {main_name(step, 0), sidecar_name(step, 0)}
            side = maps[sidecar_name(step, 0)]
            assert len(side) >= size
            if previous is not None:  # the pool held the step before's files
                # The same mapping while long enough (its pages already mapped); a
                # longer one, the old closed, when the file outgrows it.
                assert (side is previous) == (size <= len(previous))
                assert previous.closed == (side is not previous)
            previous = side
    sink.close()
    assert kept(sink) == {}
    assert side.closed


@pytest.mark.anyio
async def test_kept_mappings_name_only_files_that_exist(shm_dir: Path) -> None:
    # A mapping of a deleted file would keep its memory: every deletion drops it.
    sender = rlwire.open_sender(
        shm_dir, sidecar="routed_experts", storage_options={"recycle": True}, keep_last=2
    )
    receivers = [rlwire.open_receiver(shm_dir, rank=r) for r in range(2)]
    async with sender:
        sink = sender._sink
        assert isinstance(sink, FileSink)
        for step in range(10):
            sent = [batch(step, r) for r in range(2)]
            await sender.send_ranks(sent)
            for rank, receiver in enumerate(receivers):
                assert_batches_equal(await receiver.areceive(timeout=10), sent[rank])
            maps = kept(sink)
            assert set(maps) <= set(os.listdir(shm_dir)), step
            if step >= 4:
                assert maps  # recycled files are mapped
        warm = sink._warm
    assert warm is not None and len(warm) == 0  # closed with the sender
    for receiver in receivers:
        receiver.close()


def test_a_deleted_file_takes_its_mapping_with_it(shm_dir: Path) -> None:
    # Two ways a mapped file is deleted: a prune of several steps (all but the newest
    # deleted), and a pool emptied of what the next step did not take.
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")

    def check() -> None:
        maps = kept(sink)
        assert set(maps) <= set(os.listdir(shm_dir))
        assert not any(m.closed for m in maps.values())

    commit(sink, 0, 2)
    prune(sink, 1)
    commit(sink, 1, 2)  # into step 0's files, now mapped
    commit(sink, 2, 2)
    assert len(kept(sink)) == 4
    held = list(kept(sink).values())
    prune(sink, 3)  # step 1 deleted, step 2 pooled
    check()
    assert all(m.closed for m in held)
    commit(sink, 3, 1)  # takes rank 0's pooled files; rank 1's are deleted once written
    check()
    assert len(kept(sink)) == 2  # step 3's files; rank 1's of step 2 are gone
    commit(sink, 4, 1)  # new files: the pool is empty
    prune(sink, 5)  # steps 3 and 4: step 3 deleted, step 4 pooled (never mapped)
    check()
    assert len(kept(sink)) == 0
    sink.close()


def test_a_failed_write_through_a_mapping_leaves_nothing(shm_dir: Path) -> None:
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")
    commit(sink, 0, 2)
    prune(sink, 1)
    commit(sink, 1, 2)
    prune(sink, 2)  # step 1's files, mapped, in the pool
    assert len(pooled(shm_dir)) == 4 and len(kept(sink)) == 4

    def broken() -> Sliced[rlwire.Frame]:
        yield
        raise rlwire.SchemaError("rank 1 cannot be encoded")

    with pytest.raises(rlwire.SchemaError):
        first = CODEC.encode({"routed_experts": np.ones(10, np.uint8)})
        run_sliced(sink.stage(2, [first, broken()]))
    assert FileSource(shm_dir).stored_steps() == []
    assert hidden(shm_dir) == pooled(shm_dir)
    assert set(kept(sink)) == set(pooled(shm_dir))  # rank 0's are gone with its files


def test_growing_a_file_past_what_it_may_hold_is_an_error_not_a_signal(shm_dir: Path) -> None:
    # posix_fallocate sizes a pooled file before it is written through its mapping, so a
    # tmpfs that cannot grow (here: the process's RLIMIT_FSIZE, EFBIG) fails the step
    # with a TransportError instead of killing the process with SIGBUS.
    here = str(Path(__file__).parent)
    script = textwrap.dedent(
        f"""
        import os, resource, signal, sys
        sys.path[:0] = {[here, *[p for p in sys.path if p]]!r}
        from pathlib import Path
        import rlwire
        from rlwire.transport import FileSink
        from transport.file.test_recycle import commit, prune

        root = Path({str(shm_dir)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4_000_000, resource.RLIM_INFINITY))
        sink = FileSink(root, recycle=True)
        sink.open("error")
        for step in range(3):  # small steps: by the third, a pooled file is mapped
            if step:
                prune(sink, step)
            commit(sink, step, 1, size=1_000_000)
        prune(sink, 3)
        try:
            commit(sink, 3, 1, size=8_000_000)  # past the limit
        except rlwire.TransportError as exc:
            print("error:", exc)
        print("steps:", sorted(n for n in os.listdir(root) if n.startswith("step-")))
        print("hidden:", sorted(n for n in os.listdir(root) if n.startswith(".")))
        print("kept:", sorted(sink._warm._maps))
        """
    )
    run = forked.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert "File too large" in lines["error"] and ".tmp" in lines["error"]
    assert lines["steps"] == "[]"  # step 2 was pruned, step 3 never appeared
    # The pooled files step 3 took were discarded with it, and their mappings closed.
    assert lines["hidden"] == "[]" and lines["kept"] == "[]"


def test_map_for_writing_sizes_the_file_then_maps_it(shm_dir: Path) -> None:
    path = shm_dir / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 10_000)
        first = map_for_writing(fd, 50_000, None)  # grown and allocated
        assert os.fstat(fd).st_size == 50_000 and len(first) == 50_000
        assert os.fstat(fd).st_blocks * 512 >= 50_000  # allocated, not a hole
        again = map_for_writing(fd, 20_000, first)  # shrunk; the mapping is long enough
        assert again is first and os.fstat(fd).st_size == 20_000
        bigger = map_for_writing(fd, 80_000, first)  # longer than the mapping: a new one
        assert bigger is not first and first.closed and len(bigger) == 80_000
        bigger[:3] = b"abc"
        assert os.pread(fd, 3, 0) == b"abc"  # the file's own pages
        bigger.close()
    finally:
        os.close(fd)


def test_warm_maps_move_drop_and_clear(shm_dir: Path) -> None:
    maps = WarmMaps()
    mappings = [mmap.mmap(-1, 4096) for _ in range(3)]
    maps.keep("a", mappings[0])
    maps.keep("b", mappings[1])
    maps.move("a", "c")
    assert maps.take("a") is None
    maps.keep("b", mappings[2])  # replaces, closing the one before
    assert mappings[1].closed
    view = memoryview(mappings[2])  # a live view: closed when it goes
    maps.drop(["b", "missing"])
    assert not mappings[2].closed and len(maps) == 1
    view.release()
    maps.clear()
    assert mappings[0].closed and len(maps) == 0


# A receiver's kept mappings (WarmReads).


def sidecar_mapping(source: FileSource, step: int) -> object:
    view = source.load(sidecar_name(step, 0))
    assert view is not None
    return view.obj


def test_a_receiver_reads_a_recycled_file_through_the_mapping_it_kept(shm_dir: Path) -> None:
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")
    source = FileSource(shm_dir)
    assert source._warm is not None
    kept: object = None
    for step in range(6):
        if step:
            prune(sink, step)
        commit(sink, step, 1, size=300_000 - step)  # into the same files, each step
        got = CODEC.decode(source.read(step))  # checksums verified
        assert np.array_equal(got["routed_experts"], np.full(300_000 - step, step, np.uint8))
        del got
        # Step 0's files are new, and nothing is kept; step 1 comes in them, recycled:
        # the receiver has seen a file come back, and keeps its mappings from then on.
        assert source._warm.recycling == (step >= 1)
        assert len(source._warm) == (2 if step >= 1 else 0)  # main file and sidecar
        if step == 1:
            kept = sidecar_mapping(source, step)
        elif step > 1:
            assert sidecar_mapping(source, step) is kept
    source.close()
    assert len(source._warm) == 0


def test_a_directory_that_does_not_recycle_gets_no_kept_mapping(shm_dir: Path) -> None:
    # Its files never come back: keeping their mappings would only keep memory (the
    # pages a receiver wrote into, copy-on-write) and descriptors.
    sink = FileSink(shm_dir)
    sink.open("error")
    source = FileSource(shm_dir)
    for step in range(20):
        commit(sink, step, 1, size=100_000)
        experts = CODEC.decode(source.read(step))["routed_experts"]
        ctypes.memmove(experts.ctypes.data, b"\x5a" * 8192, 8192)  # as torch in place
        del experts
        if step >= 2:
            prune(sink, step - 1)
        assert source._warm is not None and len(source._warm) == 0
    assert not source._warm.recycling
    source.close()


def recycling(root: Path, *, checksum: bool = True) -> tuple[FileSink, FileSource]:
    """A recycling sink and a receiver that has read steps 0 and 1, step 1 in step 0's
    files: the receiver has seen a file come back, and keeps step 1's mappings."""
    sink = FileSink(root, recycle=True, checksum=checksum)
    sink.open("error")
    source = FileSource(root)
    for step in range(2):
        if step:
            prune(sink, step)
        commit(sink, step, 1, size=300_000)
        assert CODEC.decode(source.read(step))["step"] == step
    return sink, source


def write_in_place(source: FileSource, step: int) -> None:
    """Write into a received read-only array through ctypes, as torch's in-place ops
    do: the page becomes this process's (copy-on-write)."""
    experts = CODEC.decode(source.read(step))["routed_experts"]
    assert not experts.flags.writeable
    ctypes.memmove(experts.ctypes.data, b"\x5a" * 8192, 8192)
    assert experts[0] == 0x5A


def next_step(sink: FileSink, source: FileSource, step: int, size: int = 300_000) -> None:
    """Send ``step`` into the files of the step before; it must arrive exactly."""
    prune(sink, step)
    commit(sink, step, 1, size=size)
    got = CODEC.decode(source.read(step))["routed_experts"]
    assert np.array_equal(got, np.full(size, step, np.uint8))


def test_a_page_the_receiver_wrote_into_does_not_pass_for_a_later_step(shm_dir: Path) -> None:
    # When the file comes back recycled, the kept mapping still shows the page the
    # receiver wrote into; its checksum fails and the step is read again through a new
    # mapping, correct.
    sink, source = recycling(shm_dir)
    kept_before = sidecar_mapping(source, 1)
    write_in_place(source, 1)
    next_step(sink, source, 2)
    fresh = sidecar_mapping(source, 2)
    assert fresh is not kept_before  # mapped afresh, and kept
    next_step(sink, source, 3)
    assert sidecar_mapping(source, 3) is fresh
    source.close()


def test_a_step_without_checksums_turns_kept_mappings_off(shm_dir: Path) -> None:
    # Nothing would tell a page this process wrote into: the step is read again through
    # new mappings, and no mapping is kept from then on.
    sink, source = recycling(shm_dir, checksum=False)
    assert source._warm is None
    for step in range(2, 6):
        write_in_place(source, step - 1)
        next_step(sink, source, step)
    source.close()


def test_a_file_that_grew_past_its_kept_mapping_is_mapped_again(shm_dir: Path) -> None:
    sink, source = recycling(shm_dir)
    small = sidecar_mapping(source, 1)
    next_step(sink, source, 2, size=900_000)
    assert sidecar_mapping(source, 2) is not small
    source.close()


def deleted_mappings(root: Path) -> list[str]:
    """This process's mappings of files under ``root`` that were deleted."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if str(root) in line and line.rstrip().endswith("(deleted)")]


def test_a_receiver_keeps_no_mapping_of_a_deleted_file(shm_dir: Path) -> None:
    # A receiver waiting for a step that does not come (the run deleted, or another
    # sender overwriting it) must not keep the deleted files' memory meanwhile.
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")
    source = FileSource(shm_dir)
    for step in range(5):
        if step:
            prune(sink, step)
        commit(sink, step, 1)
        assert CODEC.decode(source.read(step))["step"] == step
    assert source._warm is not None and len(source._warm) == 2
    sink.close()  # the sender's own mappings: gone with it
    sink.remove(os.listdir(shm_dir))
    assert deleted_mappings(shm_dir)  # kept by the receiver, until it looks again
    assert source.read(5) is None  # a waiting receiver's poll
    assert deleted_mappings(shm_dir) == [] and len(source._warm) == 0
    source.close()


def test_a_receiver_dropped_unclosed_leaves_no_descriptor(shm_dir: Path) -> None:
    sink = FileSink(shm_dir, recycle=True)
    sink.open("error")
    before = 0
    commit(sink, 0, 1)
    for step in range(1, 7):
        if step == 2:  # the sender's own mappings made (an mmap holds a descriptor)
            before = len(os.listdir("/proc/self/fd"))
        source = FileSource(shm_dir)
        source.read(step - 1)
        prune(sink, step)
        commit(sink, step, 1)  # in the files of the step before: it comes back
        source.read(step)
        assert source._warm is not None and len(source._warm) == 2  # two files kept open
        del source
        gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before
    sink.close()


def test_only_a_verifying_read_only_receiver_on_tmpfs_keeps_mappings(
    shm_dir: Path, tmp_path: Path
) -> None:
    assert FileSource(shm_dir)._warm is not None
    assert FileSource(shm_dir, verify=False)._warm is None  # nothing would catch a stale page
    assert FileSource(shm_dir, writable=True)._warm is None  # writes are expected there
    assert (FileSource(tmp_path)._warm is not None) == (stat_type(tmp_path) == "tmpfs")
