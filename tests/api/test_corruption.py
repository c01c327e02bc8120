"""Damaged steps on disk, through the public API: every corruption of a stored,
compressed and checksummed step is a typed error naming the file, or harmless."""

from __future__ import annotations

import re
import shutil
import struct
import time
import tracemalloc
from pathlib import Path

import anyio
import msgspec
import numpy as np
import pytest
import xxhash
from depth import examples
from helpers import assert_batches_equal, make_batch, store_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import CorruptFrameError, Frame, FrameTooLargeError, RlwireError
from rlwire._frame.compression import Compressor, compress
from rlwire.codecs import MsgpackCodec

SETTINGS = settings(
    max_examples=examples(2000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
MAIN = "step-00000000.rank-0000.rlw"
SIDE = "step-00000000.rank-0000.sidecar.rlw"


def compressible_batch() -> rlwire.TrainingBatch:
    batch = make_batch(2, n=30_000)
    for sample in batch.samples:
        assert sample.routed_experts is not None
        sample.routed_experts[:] %= 3
    return batch


BATCH = compressible_batch()


def pristine(root: Path, compression: str | None) -> Path:
    path = root / f"pristine-{compression}"
    if not path.exists():

        async def send() -> None:
            async with rlwire.open_sender(
                path, sidecar=("routed_experts",), compression=compression, checksum=True
            ) as sender:
                await sender.send(BATCH)

        anyio.run(send)
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, Path]:
    root = tmp_path_factory.mktemp("stores")
    return {c: pristine(root, c) for c in (None, "lz4", "zstd")}


def test_stores_are_compressed(stores: dict[str | None, Path]) -> None:
    def size(path: Path) -> int:
        return sum(p.stat().st_size for p in path.iterdir())

    assert size(stores["lz4"]) < size(stores[None]) and size(stores["zstd"]) < size(stores[None])


def receive(path: Path) -> rlwire.TrainingBatch | None:
    with rlwire.open_receiver(path, verify=True) as receiver:
        return receiver.poll()


# The chaos suite's corruption campaign goes further.
@settings(SETTINGS, max_examples=examples(500))
@given(
    compression=st.sampled_from([None, "lz4", "zstd"]),
    in_side=st.booleans(),
    where=st.integers(0, 2**32),
    value=st.binary(min_size=1, max_size=8),
    cut=st.none() | st.integers(0, 2**32),
)
def test_damaged_files_give_typed_errors_or_the_batch(
    stores: dict[str | None, Path],
    tmp_path_factory: pytest.TempPathFactory,
    compression: str | None,
    in_side: bool,
    where: int,
    value: bytes,
    cut: int | None,
) -> None:
    path = tmp_path_factory.mktemp("damaged")
    shutil.copytree(stores[compression], path, dirs_exist_ok=True)
    target = path / (SIDE if in_side else MAIN)
    data = bytearray(target.read_bytes())
    pos = where % len(data)
    data[pos : pos + len(value)] = value  # overwrite, possibly extending at the end
    if cut is not None:
        del data[cut % (len(data) + 1) :]
    target.write_bytes(bytes(data))
    try:
        got = receive(path)
    except RlwireError as exc:
        assert isinstance(exc, CorruptFrameError)
        assert str(path) in str(exc)
    else:
        assert got is not None
        assert_batches_equal(got, BATCH)


# -- forged messages: valid checksums around hostile tables -----------------------------------


def forged(frame: Frame, **changes: object) -> Frame:
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


def compressed_frame(algorithm: str = "zstd") -> Frame:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    frame = compress(codec.encode(BATCH), Compressor(algorithm))
    assert any(frame.compression[1:])
    return frame


def test_decompression_bomb_is_refused_before_allocating(tmp_path: Path) -> None:
    frame = compressed_frame()
    i = next(k for k, c in enumerate(frame.compression) if c)
    sizes = list(frame.raw_sizes)
    sizes[i] = 1 << 40  # a terabyte
    store_frame(tmp_path, forged(frame, raw_sizes=tuple(sizes)))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(FrameTooLargeError, match=f"segment {i} alone declares 1099511627776"):
            receive(tmp_path)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0 and peak < 16 << 20, (elapsed, peak)


def test_bomb_spread_over_segments(tmp_path: Path) -> None:
    frame = compressed_frame()
    compressed = [k for k, c in enumerate(frame.compression) if c]
    assert len(compressed) >= 2
    whole = sum(frame.raw_sizes)  # every segment, compressed or not, once decompressed
    # Each segment alone fits under the limit; together they declare more.
    sizes = list(frame.raw_sizes)
    for k in compressed:
        sizes[k] = whole
    store_frame(tmp_path, forged(frame, raw_sizes=tuple(sizes)))
    with rlwire.open_receiver(tmp_path, max_decompressed_bytes=whole + 1) as receiver:
        with pytest.raises(FrameTooLargeError, match="raise max_decompressed_bytes"):
            receiver.poll()
    store_frame(tmp_path, compressed_frame())
    with rlwire.open_receiver(tmp_path, max_decompressed_bytes=whole) as receiver:
        got = receiver.poll()
    assert got is not None
    assert_batches_equal(got, BATCH)


def test_limit_is_the_receivers_choice(tmp_path: Path) -> None:
    store_frame(tmp_path, compressed_frame())
    with rlwire.open_receiver(tmp_path, max_decompressed_bytes=1000) as receiver:
        with pytest.raises(FrameTooLargeError):
            receiver.poll()
    got = receive(tmp_path)
    assert got is not None
    assert_batches_equal(got, BATCH)


def test_unknown_compression_id(tmp_path: Path) -> None:
    frame = compressed_frame()
    i = next(k for k, c in enumerate(frame.compression) if c)
    ids = list(frame.compression)
    ids[i] = 200
    store_frame(tmp_path, forged(frame, compression=tuple(ids)))
    with pytest.raises(CorruptFrameError, match=f"segment {i}: unknown compression id 200"):
        receive(tmp_path)


@pytest.mark.parametrize("algorithm", ["zstd", "lz4"])
@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_segment_that_expands_to_another_size(tmp_path: Path, delta: int, algorithm: str) -> None:
    frame = compressed_frame(algorithm)
    i = next(k for k, c in enumerate(frame.compression) if c)
    sizes = list(frame.raw_sizes)
    sizes[i] += delta
    store_frame(tmp_path, forged(frame, raw_sizes=tuple(sizes)))
    with pytest.raises(CorruptFrameError, match=f"segment {i}"):
        receive(tmp_path)


def test_garbage_that_claims_to_be_lz4(tmp_path: Path) -> None:
    frame = Frame(b"\x80", (memoryview(b"\xff" * 1000),), codec="msgpack")
    store_frame(tmp_path, forged(frame, compression=(0, 1), raw_sizes=(1, 10_000)))
    with pytest.raises(CorruptFrameError, match="segment 1: lz4 data is corrupt"):
        receive(tmp_path)


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        ([-1], "<u1", "invalid shape"),
        ([2**62, 2**62], "<u1", "needs"),
        ([10], "<U4", "not a plain bool or numeric dtype"),
        ([10], "|O8", "not a plain bool or numeric dtype"),
        ([5], "<u1", "needs 5 bytes but its buffer has 10"),
    ],
)
def test_hostile_array_descriptors(
    tmp_path: Path, shape: list[int], dtype: str, message: str
) -> None:
    ref = msgspec.msgpack.encode([0, dtype, shape, "C"])
    header = msgspec.msgpack.encode({"x": msgspec.msgpack.Ext(1, ref)})
    store_frame(tmp_path, Frame(header, (memoryview(bytes(10)),)))
    with rlwire.open_receiver(tmp_path, type=dict) as receiver:
        with pytest.raises(CorruptFrameError, match=message):
            receiver.poll()


def test_checksum_mismatch_names_step_rank_and_buffer(
    tmp_path: Path, stores: dict[str | None, Path]
) -> None:
    shutil.copytree(stores["zstd"], tmp_path, dirs_exist_ok=True)
    side = tmp_path / SIDE
    data = bytearray(side.read_bytes())
    data[100] ^= 0x01
    side.write_bytes(bytes(data))
    with pytest.raises(
        CorruptFrameError,
        match=r"step-00000000\.rank-0000\.sidecar\.rlw, segment \d+: buffer \d+ \(\d+ bytes, in "
        r"the sidecar\) does not match its checksum",
    ) as caught:
        receive(tmp_path)
    assert (caught.value.step, caught.value.rank) == (0, 0)
    assert caught.value.segment is not None and caught.value.segment >= 1
    # verify=False hands the damage to the decompressor, which still refuses it or
    # returns a batch of the right shape; it never crashes.
    with rlwire.open_receiver(tmp_path, verify=False) as receiver:
        try:
            got = receiver.poll()
        except CorruptFrameError:
            return
    assert got is not None and len(got.samples) == len(BATCH.samples)


def test_envelope_checksum_is_checked_even_without_verify(
    tmp_path: Path, stores: dict[str | None, Path]
) -> None:
    shutil.copytree(stores[None], tmp_path, dirs_exist_ok=True)
    main = tmp_path / MAIN
    data = bytearray(main.read_bytes())
    env_len = struct.unpack_from("<I", data, 12)[0]
    assert (
        xxhash.xxh3_64_intdigest(bytes(data[24 : 24 + env_len]))
        == struct.unpack_from("<Q", data, 16)[0]
    )
    data[30] ^= 0x01
    main.write_bytes(bytes(data))
    with rlwire.open_receiver(tmp_path, verify=False) as receiver:
        with pytest.raises(CorruptFrameError, match="envelope does not match its checksum"):
            receiver.poll()


def test_corrupt_step_can_be_skipped(tmp_path: Path, stores: dict[str | None, Path]) -> None:
    path = tmp_path / "run"
    shutil.copytree(stores["lz4"], path)
    (path / MAIN).write_bytes(b"\x89RLW\r\n\x1a\n" + bytes(100))
    arrays = np.arange(3)

    async def more() -> None:
        async with rlwire.open_sender(path, on_existing="resume") as sender:
            await sender.send({"a": arrays})

    anyio.run(more)
    with rlwire.open_receiver(path, type=dict) as receiver:
        with pytest.raises(CorruptFrameError):
            receiver.poll()
        assert receiver.skip() == 0
        assert receiver.receive(timeout=5)["a"].tolist() == [0, 1, 2]


# -- known bugs (src/), kept here so that a fix turns them into failures to clean up --------


def hostile_frames() -> dict[str, Frame]:
    frame = compressed_frame()
    i = next(k for k, c in enumerate(frame.compression) if c)
    ids, sizes = list(frame.compression), list(frame.raw_sizes)
    ids[i] = 200
    sizes[i] += 1
    bomb = [*frame.raw_sizes]
    bomb[i] = 1 << 40
    return {
        "unknown-compression-id": forged(frame, compression=tuple(ids)),
        "size-mismatch": forged(frame, raw_sizes=tuple(sizes)),
        "bomb": forged(frame, raw_sizes=tuple(bomb)),
        "garbage-lz4": Frame(
            b"\x80", (memoryview(b"\xff" * 1000),), compression=(0, 1), raw_sizes=(1, 9)
        ),
        "unknown-codec": forged(frame, codec="pickle"),
    }


@pytest.mark.parametrize("name", ["unknown-compression-id", "size-mismatch", "bomb", "garbage-lz4"])
def test_decompression_errors_name_the_file(tmp_path: Path, name: str) -> None:
    store_frame(tmp_path, hostile_frames()[name])
    with pytest.raises(RlwireError, match=re.escape(str(tmp_path / MAIN))):
        receive(tmp_path)


def test_unknown_codec_in_a_message_is_a_decode_error(tmp_path: Path) -> None:
    store_frame(tmp_path, hostile_frames()["unknown-codec"])
    with pytest.raises(rlwire.DecodeError, match=re.escape(str(tmp_path / MAIN))):
        receive(tmp_path)


def test_envelope_codec_name_that_is_not_utf8(
    tmp_path: Path, stores: dict[str | None, Path]
) -> None:
    shutil.copytree(stores[None], tmp_path, dirs_exist_ok=True)
    main = tmp_path / MAIN
    data = bytearray(main.read_bytes())
    env_len = struct.unpack_from("<I", data, 12)[0]
    pos = data.index(b"msgpack", 24, 24 + env_len)
    data[pos] = 0xFF
    struct.pack_into("<Q", data, 16, xxhash.xxh3_64_intdigest(data[24 : 24 + env_len]))
    main.write_bytes(bytes(data))
    with pytest.raises(CorruptFrameError, match=re.escape(str(main))):
        receive(tmp_path)


def test_a_small_file_declaring_gigabytes_is_refused_by_default(tmp_path: Path) -> None:
    """Three zstd segments declared at 1 GiB each in a file of a few KB: within the
    absolute limit, refused by the ratio to the stored size before anything is made."""
    frame = compressed_frame()
    sizes = [
        size if c == 0 else 1 << 30
        for c, size in zip(frame.compression, frame.raw_sizes, strict=True)
    ]
    store_frame(tmp_path, forged(frame, raw_sizes=tuple(sizes)))
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLargeError, match=r"raise max_compression_ratio \(now 1024x"):
            receive(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_data_that_compresses_beyond_the_ratio_needs_the_option(tmp_path: Path) -> None:
    zeros = {"mask": np.zeros(1 << 27, np.uint8)}  # 128 MiB that zstd stores in kilobytes

    async def send() -> None:
        async with rlwire.open_sender(tmp_path, compression="zstd") as sender:
            await sender.send(zeros)

    anyio.run(send)
    with rlwire.open_receiver(tmp_path, type=dict) as receiver:
        with pytest.raises(FrameTooLargeError, match="max_compression_ratio"):
            receiver.poll()
    with rlwire.open_receiver(tmp_path, type=dict, max_compression_ratio=1e9) as receiver:
        got = receiver.receive(timeout=5)
    assert got["mask"].nbytes == 1 << 27 and not got["mask"].any()


@pytest.mark.parametrize("array_like", [False, True])
def test_unknown_fields_in_a_header_cost_nothing(tmp_path: Path, array_like: bool) -> None:
    """A checksum-valid header with millions of empty arrays in a field the receiving
    type does not know: skipped in C, not built and then thrown away."""

    class Known(msgspec.Struct, array_like=array_like):
        name: str
        count: int = 0

    junk = [[] for _ in range(1_000_000)]
    raw: object = ["a", 3, junk] if array_like else {"name": "a", "count": 3, "junk": junk}
    header = msgspec.msgpack.encode(raw)
    del junk, raw
    store_frame(tmp_path, Frame(header))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with rlwire.open_receiver(tmp_path, type=Known) as receiver:
            assert receiver.receive(timeout=5) == Known("a", 3)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(header) and elapsed < 1.0  # building them: ~60 MB, ~4 s before


def test_a_flood_of_empty_buffers_is_refused_before_any_view(tmp_path: Path) -> None:
    """Empty buffers take no room in a file, so millions fit in a few MB; each would
    cost the reader a view and a checksum."""
    flood = Frame(msgspec.msgpack.encode({}), tuple(memoryview(b"") for _ in range(200_000)))
    store_frame(tmp_path, flood)
    start = time.perf_counter()
    with pytest.raises(CorruptFrameError, match="200000 buffers in a message of"):
        receive(tmp_path)
    assert time.perf_counter() - start < 0.5
    few = Frame(msgspec.msgpack.encode({}), tuple(memoryview(b"") for _ in range(3000)))
    store_frame(tmp_path, few)  # a few thousand empty ones are fine
    with rlwire.open_receiver(tmp_path, type=dict) as receiver:
        assert receiver.receive(timeout=5) == {}


def test_a_header_of_the_wrong_shape_is_refused_without_building_it(tmp_path: Path) -> None:
    """An array of a million empty arrays received as a TrainingBatch (a map): refused
    from its first byte, not built into a million lists and then refused."""
    header = b"\xdd" + struct.pack(">I", 1_000_000) + b"\x90" * 1_000_000
    store_frame(tmp_path, Frame(header))
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(rlwire.DecodeError, match="does not match TrainingBatch"):
            receive(tmp_path)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(header) and elapsed < 0.5  # building them: ~60 MB
