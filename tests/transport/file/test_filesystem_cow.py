"""FileSource maps files private and copy-on-write: received arrays are read-only to numpy
by default, yet a library that ignores numpy's flag (ctypes here, as torch's in-place ops
do) writes into private pages instead of killing the process, and never into the file.

Writes that may crash run in real subprocesses (``sys.executable``), on real files the
test wrote with ``rlwire.open_sender``.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import forked
import numpy as np
import pytest
from helpers import assert_batches_equal, make_batch

import rlwire
from rlwire.transport import FileSource

pytestmark = pytest.mark.anyio

MAIN = "step-00000000.rank-0000.rlw"
SIDECAR = "step-00000000.rank-0000.sidecar.rlw"

# Run by a subprocess: argv[1] is the step's directory, argv[2] how to get the arrays.
# Writes 0x5A into every byte of token_ids (main file) and routed_experts (sidecar) of
# sample 0 through ctypes.memmove, which ignores numpy's read-only flag, then checks the
# bytes landed and prints "wrote".
CHILD = textwrap.dedent(
    """
    import ctypes, mmap, os, resource, sys
    import numpy as np
    import rlwire
    from rlwire.transport import FileSource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file when a mode crashes
    path, mode = sys.argv[1], sys.argv[2]

    class FormerFileSource(FileSource):
        # The mapping FileSource made before: mmap.ACCESS_READ (MAP_SHARED, PROT_READ).
        def load(self, name):
            try:
                fd = os.open(self.root / name, os.O_RDONLY)
            except FileNotFoundError:  # not there yet (a source's load returns None)
                return None
            try:
                return memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
            finally:
                os.close(fd)

    if mode == "plain ACCESS_READ mmap":
        with open(os.path.join(path, "step-00000000.rank-0000.rlw"), "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        arrays = [np.frombuffer(mm, np.uint8)]
    else:
        if mode == "default":
            receiver = rlwire.open_receiver(path)
        elif mode == "writable":
            receiver = rlwire.open_receiver(path, writable=True)
        elif mode == "former ACCESS_READ source":
            receiver = rlwire.TrainingBatchReceiver(FormerFileSource(path), rlwire.TrainingBatch)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        sample = receiver.receive(timeout=10).samples[0]
        arrays = [sample.token_ids, sample.routed_experts]
        assert all(a.flags.writeable == (mode == "writable") for a in arrays), mode
    for arr in arrays:
        fill = np.full(arr.nbytes, 0x5A, np.uint8)
        ctypes.memmove(arr.ctypes.data, fill.ctypes.data, arr.nbytes)
        assert (arr.reshape(-1).view(np.uint8) == 0x5A).all(), "the write did not land"
    print("wrote", flush=True)
    """
)


def run_child(path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return forked.run(
        [sys.executable, "-c", CHILD, str(path), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )


def digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


async def send_step(path: Path, n: int = 600, **options: Any) -> rlwire.TrainingBatch:
    batch = make_batch(2, n=n, seed=7)
    async with rlwire.open_sender(path, sidecar=("routed_experts",), **options) as sender:
        await sender.send(batch)
    assert sorted(digests(path)) == [MAIN, SIDECAR]
    return batch


def receive_fresh(path: Path, **options: Any) -> rlwire.TrainingBatch:
    with rlwire.open_receiver(path, **options) as receiver:
        return receiver.receive(timeout=5)


@pytest.mark.parametrize("mode", ["default", "writable"])
async def test_write_ignoring_the_flag_lands_in_private_pages(tmp_path: Path, mode: str) -> None:
    batch = await send_step(tmp_path)
    before = digests(tmp_path)
    done = run_child(tmp_path, mode)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "wrote"
    assert digests(tmp_path) == before  # neither the main file nor the sidecar changed
    assert_batches_equal(receive_fresh(tmp_path), batch)


@pytest.mark.parametrize("mode", ["plain ACCESS_READ mmap", "former ACCESS_READ source"])
async def test_the_same_write_into_a_read_only_mapping_crashes(tmp_path: Path, mode: str) -> None:
    """The failure copy-on-write mappings prevent: a write through ctypes into a
    read-only (ACCESS_READ) mapping kills the process with SIGSEGV."""
    batch = await send_step(tmp_path)
    before = digests(tmp_path)
    done = run_child(tmp_path, mode)
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stderr)
    assert "wrote" not in done.stdout
    assert digests(tmp_path) == before
    assert_batches_equal(receive_fresh(tmp_path), batch)


async def test_default_arrays_and_bytes_are_read_only(tmp_path: Path) -> None:
    await send_step(tmp_path)
    got = receive_fresh(tmp_path)
    fields = [getattr(s, f) for s in got.samples for f in s.__struct_fields__]
    arrays = [a for a in fields if isinstance(a, np.ndarray)]
    assert len(arrays) == 12  # out of band (main file, sidecar) and inline in the header
    for arr in arrays:
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 0
    blob = bytes(range(256)) * 64  # out of band: larger than the inline threshold
    sub = tmp_path / "bytes"
    async with rlwire.open_sender(sub) as sender:
        await sender.send({"blob": blob})
    with rlwire.open_receiver(sub, type=Any) as receiver:
        view = receiver.receive(timeout=5)["blob"]
    assert isinstance(view, memoryview) and view.readonly and view == blob


async def test_writable_arrays_are_writable_views_and_spare_the_file(tmp_path: Path) -> None:
    batch = await send_step(tmp_path)
    before = digests(tmp_path)
    got = receive_fresh(tmp_path, writable=True)
    for sample in got.samples:
        for arr in (sample.token_ids, sample.routed_experts):
            assert arr.flags.writeable and not arr.flags.owndata  # a view, not a copy
            arr[...] = 3
            assert (arr == 3).all()
    assert digests(tmp_path) == before
    assert_batches_equal(receive_fresh(tmp_path), batch)


def _mapping_of(path: Path) -> dict[str, str]:
    """The /proc/self/smaps entry of the one mapping of ``path``: perms and kB fields."""
    found: list[dict[str, str]] = []
    entry: dict[str, str] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a new mapping's header line
                entry: dict[str, str] | None = None
                if line.rstrip("\n").endswith(str(path)):
                    entry = {"perms": head[1]}
                    found.append(entry)
            elif entry is not None and line.rstrip().endswith("kB"):
                entry[head[0].rstrip(":")] = head[1]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
async def test_reads_share_the_page_cache_writes_copy_only_written_pages(tmp_path: Path) -> None:
    """A private mapping maps the page cache's own pages until a page is written."""
    big = np.arange(4 << 20, dtype=np.uint8)  # 4 MiB, the only buffer of the sidecar
    async with rlwire.open_sender(tmp_path, sidecar=("routed_experts",)) as sender:
        await sender.send({"routed_experts": big})
    with rlwire.open_receiver(tmp_path, type=Any) as receiver:
        arr = receiver.receive(timeout=5)["routed_experts"]  # verified: every page read
    assert not arr.flags.writeable
    side = tmp_path / SIDECAR
    mapping = _mapping_of(side)
    assert mapping["perms"] == "rw-p"  # private (copy-on-write), though read-only to numpy
    assert int(mapping["Rss"]) >= big.nbytes // 1024  # mapped ...
    assert int(mapping["Anonymous"]) == 0  # ... straight from the page cache, no copy
    before = digests(tmp_path)
    fill = np.full(1 << 20, 1, np.uint8)
    ctypes.memmove(arr.ctypes.data, fill.ctypes.data, fill.nbytes)  # the first MiB
    start, end = arr.ctypes.data, arr.ctypes.data + fill.nbytes
    touched = (end - 1) // mmap.PAGESIZE - start // mmap.PAGESIZE + 1
    # only the written pages were copied out of the page cache
    assert int(_mapping_of(side)["Anonymous"]) == touched * mmap.PAGESIZE // 1024
    assert (arr[: 1 << 20] == 1).all() and (arr[1 << 20 :] == big[1 << 20 :]).all()
    assert digests(tmp_path) == before
    with rlwire.open_receiver(tmp_path, type=Any) as receiver:
        assert np.array_equal(receiver.receive(timeout=5)["routed_experts"], big)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
@pytest.mark.parametrize("writable", [False, True])
async def test_verification_and_decompression_over_private_mappings(
    tmp_path: Path, compression: str | None, writable: bool
) -> None:
    batch = await send_step(tmp_path, n=20_000, compression=compression)  # 64 KiB+ buffers
    frame = FileSource(tmp_path).read(0)
    assert frame is not None
    assert any(frame.compression) == (compression is not None)  # decompression is taken
    got = receive_fresh(tmp_path, writable=writable)
    assert_batches_equal(got, batch)
    for sample in got.samples:
        assert sample.routed_experts is not None
        assert sample.token_ids.flags.writeable == writable
        assert sample.routed_experts.flags.writeable == writable
    # flip one payload byte near the end of the sidecar: verification still catches it
    side = tmp_path / SIDECAR
    data = bytearray(side.read_bytes())
    data[-100] ^= 0xFF
    side.write_bytes(bytes(data))
    with pytest.raises(rlwire.CorruptFrameError, match="checksum"):
        receive_fresh(tmp_path, writable=writable)


def test_file_source_hands_out_read_only_views_unless_writable(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    ro, rw = FileSource(tmp_path).load("f"), FileSource(tmp_path, writable=True).load("f")
    assert ro is not None and rw is not None
    assert ro.readonly and not rw.readonly
    rw[0] = ord("x")
    assert bytes(rw) == b"xbc" and bytes(ro) == b"abc"
    assert (tmp_path / "f").read_bytes() == b"abc"


TORCH_CHILD = textwrap.dedent(
    """
    import sys, warnings
    import torch
    import rlwire

    with rlwire.open_receiver(sys.argv[1]) as receiver:
        arr = receiver.receive(timeout=10).samples[0].token_ids
    before = arr.copy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = torch.from_numpy(arr)
    assert any("not writable" in str(w.message) for w in caught), caught
    t.add_(1)  # torch ignores numpy's read-only flag: lands in private pages
    assert (arr == before + 1).all()
    print("wrote", flush=True)
    """
)


async def test_torch_in_place_op_on_a_received_array(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed")
    batch = await send_step(tmp_path)
    before = digests(tmp_path)
    done = forked.run(
        [sys.executable, "-c", TORCH_CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "wrote"
    assert digests(tmp_path) == before
    assert_batches_equal(receive_fresh(tmp_path), batch)
