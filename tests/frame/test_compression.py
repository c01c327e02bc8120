"""Per-segment compression (rlwire._frame.algorithms, rlwire._frame.compression), alone and
through the public API."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
from depth import examples
from helpers import assert_batches_equal, make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import ConfigError, CorruptFrameError, Frame, FrameTooLargeError
from rlwire._core.slicing import run_sliced
from rlwire._frame.algorithms import _zstd_compressor
from rlwire._frame.bounds import HEAP_FLOOR, heap_allowance
from rlwire._frame.compression import (
    _GROUP_BYTES,
    Compressor,
    _check_sizes,
    _in_groups,
    compress,
    compress_sliced,
    decompress,
)
from rlwire.aio import offload_sliced

SETTINGS = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
KiB = 1 << 10


def compressible(n: int, seed: int = 0) -> memoryview:
    """Expert-id-like bytes: few distinct values, so both algorithms shrink them."""
    rng = np.random.default_rng(seed)
    return memoryview(rng.integers(0, 4, n, dtype=np.uint8)).cast("B")


def incompressible(n: int, seed: int = 0) -> memoryview:
    return memoryview(np.random.default_rng(seed).bytes(n))


def frame_of(*buffers: memoryview, header: bytes = b"header") -> Frame:
    return Frame(header, tuple(buffers), frozenset({0}) if buffers else frozenset())


def assert_same_bytes(a: Frame, b: Frame) -> None:
    assert bytes(a.header) == bytes(b.header)
    assert [bytes(x) for x in a.buffers] == [bytes(y) for y in b.buffers]
    assert (a.sidecar, a.codec) == (b.sidecar, b.codec)


# -- choosing a compressor ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "algorithm", "level"),
    [("lz4", "lz4", 0), ("lz4:9", "lz4", 9), ("zstd", "zstd", 3), ("zstd:1", "zstd", 1)],
)
def test_parse(spec: str, algorithm: str, level: int) -> None:
    comp = Compressor.parse(spec)
    assert comp is not None and (comp.algorithm, comp.level) == (algorithm, level)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gzip", "unknown compression 'gzip'; known: lz4, zstd"),
        ("zstd:x", "level 'x' is not an integer"),
        ("zstd:0", "zstd level must be an int from 1 to 22"),
        ("zstd:23", "from 1 to 22"),
        ("lz4:13", "lz4 level must be an int from 0 to 12"),
        (3, "compression must be a string"),
    ],
)
def test_parse_errors(spec: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Compressor.parse(spec)  # type: ignore[arg-type]


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'rlwire\[zstd\]'"):
        Compressor("zstd")


def test_open_sender_rejects_unknown_compression(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown compression 'brotli'"):
        rlwire.open_sender(tmp_path, compression="brotli")


# -- what gets compressed ------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["lz4", "zstd"])
def test_only_segments_that_pay_are_compressed(algorithm: str) -> None:
    header = bytes(compressible(256 * KiB))
    frame = frame_of(
        compressible(1 << 20), incompressible(1 << 20), compressible(4 * KiB), header=header
    )
    out = compress(frame, Compressor(algorithm))
    code = Compressor(algorithm).id
    # header and the first buffer shrink; random bytes and a small buffer stay as they are
    assert out.compression == (code, code, 0, 0)
    assert out.raw_sizes == (len(header), 1 << 20, 1 << 20, 4 * KiB)
    assert len(out.header) < 0.9 * len(header) and out.buffers[0].nbytes < 0.9 * (1 << 20)
    assert out.buffers[1] is frame.buffers[1] or out.buffers[1].obj is frame.buffers[1].obj
    assert_same_bytes(decompress(out), frame)


def test_nothing_compressible_returns_the_frame_itself() -> None:
    frame = frame_of(incompressible(1 << 20))
    assert compress(frame, Compressor("zstd")) is frame
    assert decompress(frame) is frame


def test_incompressible_large_segment_is_judged_on_a_sample() -> None:
    data = incompressible(64 << 20)
    comp = Compressor("zstd", 19)  # slow level: compressing all 64 MiB would take seconds
    start = time.perf_counter()
    assert comp.segment(data) == (0, data)
    assert time.perf_counter() - start < 0.5


def test_min_size() -> None:
    data = compressible(64 * KiB)
    assert Compressor("lz4", min_size=64 * KiB + 1).segment(data)[0] == 0
    assert Compressor("lz4", min_size=64 * KiB).segment(data)[0] == 1


@SETTINGS
@given(
    algorithm=st.sampled_from(["lz4", "zstd"]),
    sizes=st.lists(st.integers(0, 300 * KiB), max_size=5),
    kinds=st.lists(st.booleans(), min_size=5, max_size=5),
    seed=st.integers(0, 2**16),
    min_size=st.sampled_from([0, 1, 4 * KiB, 64 * KiB]),
)
def test_round_trip(
    algorithm: str, sizes: list[int], kinds: list[bool], seed: int, min_size: int
) -> None:
    bufs = [
        (compressible if kind else incompressible)(n, seed + i)
        for i, (n, kind) in enumerate(zip(sizes, kinds, strict=False))
    ]
    frame = frame_of(*bufs, header=bytes(compressible(seed % 5000, seed)))
    out = compress(frame, Compressor(algorithm, min_size=min_size))
    ids = out.compression or (0,) * (len(bufs) + 1)
    sizes = out.raw_sizes or tuple(len(s) for s in [frame.header, *bufs])
    for i, (cid, seg) in enumerate(zip(ids, [out.header, *out.buffers], strict=True)):
        raw = sizes[i]
        assert raw >= min_size if cid else True
        assert len(seg) <= 0.9 * raw if cid else len(seg) == raw
    assert_same_bytes(decompress(out), frame)


# -- bad input on the way back ----------------------------------------------------------------


def compressed_frame(algorithm: str = "zstd") -> Frame:
    out = compress(frame_of(compressible(1 << 20)), Compressor(algorithm))
    assert out.compression == (0, Compressor(algorithm).id)
    return out


def replace(frame: Frame, **changes: object) -> Frame:
    fields = {
        "header": frame.header,
        "buffers": frame.buffers,
        "sidecar": frame.sidecar,
        "codec": frame.codec,
        "compression": frame.compression,
        "raw_sizes": frame.raw_sizes,
    }
    fields.update(changes)
    return Frame(**fields)  # type: ignore[arg-type]


def test_bomb_is_refused_before_allocating() -> None:
    frame = replace(compressed_frame(), raw_sizes=(6, 1 << 40))
    start = time.perf_counter()
    with pytest.raises(FrameTooLargeError, match=r"segment 1 alone declares 1099511627776"):
        decompress(frame)
    assert time.perf_counter() - start < 0.1


def test_limit_counts_all_segments() -> None:
    one = compressible(1 << 20)
    frame = compress(frame_of(one, one, one), Compressor("lz4"))
    assert decompress(frame, max_bytes=3 << 20).buffers[2] == one
    with pytest.raises(FrameTooLargeError, match=r"more than 3145727 bytes.*max_decompressed"):
        decompress(frame, max_bytes=(3 << 20) - 1)


def test_decompressing_and_decoding_share_one_budget_of_1_gib_under_1_mb() -> None:
    """Decompression may take the ratio's budget less the 256 MiB kept for decoding the
    header (HEAP_FLOOR + 16 x stored): with both at their bound, a message of 1 MB costs
    at most 1 GiB. The declared sizes are forged; nothing is decompressed."""
    stored = 1_000_000
    room = 1024 * stored - HEAP_FLOOR
    frame = Frame(b"h", (memoryview(bytes(stored - 1)),), compression=(0, 2), raw_sizes=(1, room))
    assert frame.stored_nbytes == stored
    assert room + heap_allowance(frame) <= 1 << 30
    assert [job.raw for job in _check_sizes(frame, 1 << 40, 1024)] == [room]
    with pytest.raises(FrameTooLargeError, match=r"1024x the 1000000 bytes stored, less 256"):
        decompress(replace(frame, raw_sizes=(1, room + 1)))


@pytest.mark.parametrize("algorithm", ["lz4", "zstd"])
def test_data_larger_than_declared_is_corrupt(algorithm: str) -> None:
    frame = replace(compressed_frame(algorithm), raw_sizes=(6, (1 << 20) - 1))
    with pytest.raises(CorruptFrameError, match="segment 1"):
        decompress(frame)


@pytest.mark.parametrize("algorithm", ["lz4", "zstd"])
def test_data_smaller_than_declared_is_corrupt(algorithm: str) -> None:
    frame = replace(compressed_frame(algorithm), raw_sizes=(6, (1 << 20) + 1))
    with pytest.raises(CorruptFrameError, match="segment 1"):
        decompress(frame)


def test_unknown_compression_id() -> None:
    frame = replace(compressed_frame(), compression=(0, 9))
    with pytest.raises(CorruptFrameError, match=r"segment 1: unknown compression id 9; .*2 zstd"):
        decompress(frame)


@SETTINGS
@given(
    algorithm=st.sampled_from(["lz4", "zstd"]),
    pos=st.integers(0, 10_000),
    value=st.integers(1, 255),
    cut=st.none() | st.integers(0, 10_000),
)
def test_garbled_data_is_corrupt_or_exact(
    algorithm: str, pos: int, value: int, cut: int | None
) -> None:
    frame = compressed_frame(algorithm)
    data = bytearray(frame.buffers[0])
    pos %= len(data)
    data[pos] ^= value
    if cut is not None:
        del data[cut % len(data) :]
    try:
        out = decompress(replace(frame, buffers=(memoryview(bytes(data)),)))
    except CorruptFrameError as exc:
        assert "segment 1" in str(exc)
    else:  # a flip the format cannot see (checksums catch those) still has the right size
        assert out.buffers[0].nbytes == 1 << 20


# -- threads ------------------------------------------------------------------------------


def test_groups_run_in_parallel_threads() -> None:
    barrier = threading.Barrier(2, timeout=5)  # breaks unless both groups run at once
    grouped = _in_groups(lambda x: (barrier.wait(), x * 2)[1], [1, 2], [_GROUP_BYTES] * 2, 2)
    assert run_sliced(grouped) == [2, 4]


def test_groups_run_at_most_threads_at_once() -> None:
    running, peak = 0, 0
    lock = threading.Lock()

    def work(_: int) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    run_sliced(_in_groups(work, list(range(8)), [_GROUP_BYTES] * 8, 3))
    assert peak == 3


def test_small_jobs_share_a_group_and_a_thread() -> None:
    threads: set[int] = set()
    grouped = _in_groups(
        lambda x: threads.add(threading.get_ident()), list(range(100)), [10] * 100, 4
    )
    run_sliced(grouped)
    assert len(threads) == 1  # 100 x 10 bytes is one group: no future per job


def test_closing_the_generator_cancels_groups_not_started() -> None:
    calls: list[int] = []
    grouped = _in_groups(
        lambda x: (calls.append(x), time.sleep(0.01)), list(range(50)), [_GROUP_BYTES] * 50, 2
    )
    next(grouped)  # one group finished
    grouped.close()  # what a cancelled send does
    time.sleep(0.05)
    assert len(calls) < 10


@pytest.mark.anyio
@pytest.mark.parametrize("algorithm", ["lz4", "zstd"])
async def test_the_sender_path_matches_the_receiver_path(algorithm: str) -> None:
    frame = frame_of(compressible(1 << 20, 1), incompressible(300 * KiB), compressible(1 << 19))
    limiter = anyio.CapacityLimiter(2)
    out = await offload_sliced(
        compress_sliced(frame, Compressor(algorithm), threads=2), limiter=limiter
    )
    sync = compress(frame, Compressor(algorithm))
    assert out.compression == sync.compression and out.raw_sizes == sync.raw_sizes
    assert [bytes(b) for b in out.buffers] == [bytes(b) for b in sync.buffers]
    assert_same_bytes(decompress(out, threads=2), frame)
    with pytest.raises(FrameTooLargeError):
        decompress(out, max_bytes=1000, threads=2)


def test_zstd_contexts_are_per_thread() -> None:
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(_zstd_compressor(3)))
    thread.start()
    thread.join()
    assert seen[0] is not _zstd_compressor(3)
    assert _zstd_compressor(3) is _zstd_compressor(3)


# -- through the public API -----------------------------------------------------------------


def compressible_batch(seed: int = 0) -> rlwire.TrainingBatch:
    batch = make_batch(3, n=40_000, seed=seed)
    for sample in batch.samples:
        assert sample.routed_experts is not None
        sample.routed_experts[:] = sample.routed_experts % 4  # few distinct ids
    return batch


def stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


@pytest.mark.anyio
@pytest.mark.parametrize("compression", ["lz4", "zstd", "zstd:1"])
@pytest.mark.parametrize("sidecar", [None, ("routed_experts",)])
async def test_send_and_receive_compressed(
    tmp_path: Path, compression: str, sidecar: tuple[str, ...] | None
) -> None:
    batch = compressible_batch()
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for path, comp in ((plain, None), (packed, compression)):
        async with rlwire.open_sender(path, compression=comp, sidecar=sidecar) as sender:
            await sender.send(batch)
            await sender.send(batch)
    assert stored_bytes(packed) < 0.8 * stored_bytes(plain)
    with rlwire.open_receiver(packed) as receiver:
        assert_batches_equal(receiver.receive(timeout=5), batch)
    async with rlwire.open_receiver(packed, start_step=1, limiter=3) as areceiver:
        assert_batches_equal(await areceiver.areceive(timeout=5), batch)


@pytest.mark.anyio
async def test_writable_decompressed_arrays(tmp_path: Path) -> None:
    batch = compressible_batch()
    async with rlwire.open_sender(tmp_path, compression="zstd") as sender:
        await sender.send(batch)
    with rlwire.open_receiver(tmp_path, writable=True) as receiver:
        got = receiver.receive(timeout=5)
    experts = got.samples[0].routed_experts
    assert experts is not None and experts.flags.writeable
    experts[0] = 7
    assert_batches_equal(
        rlwire.TrainingBatch(samples=got.samples[1:]),
        rlwire.TrainingBatch(samples=batch.samples[1:]),
    )


@pytest.mark.anyio
async def test_receiver_limit_refuses_large_messages(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, compression="lz4") as sender:
        await sender.send(compressible_batch())
    with rlwire.open_receiver(tmp_path, max_decompressed_bytes=100_000) as receiver:
        with pytest.raises(FrameTooLargeError, match="max_decompressed_bytes"):
            receiver.poll()
        assert receiver.next_step == 0  # nothing consumed; skip() moves on
    with pytest.raises(ConfigError, match="max_decompressed_bytes"):
        rlwire.open_receiver(tmp_path, max_decompressed_bytes=-1)
