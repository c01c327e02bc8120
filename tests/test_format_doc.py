"""docs/format.md is enough to read a message: an independent reader built from it alone,
checked against rlwire on every golden file and on fresh messages."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import anyio
import lz4.block
import msgspec
import numpy as np
import pytest
import xxhash
import zstandard
from golden_cases import CASES, GOLDEN

import rlwire


def read_as_documented(directory: Path, step: int, rank: int, limit: int = 1 << 30) -> Any:
    """Follow 'Reading, step by step' in docs/format.md."""
    main = (directory / f"step-{step:08d}.rank-{rank:04d}.rlw").read_bytes()
    magic, major, _minor, env_len, env_sum = struct.unpack_from("<8sHHIQ", main)
    assert magic == b"\x89RLW\r\n\x1a\n" and major == 1
    raw_env = main[24 : 24 + env_len]
    assert xxhash.xxh3_64_intdigest(raw_env) == env_sum
    env = msgspec.msgpack.decode(raw_env)
    assert env["size"] == len(main) and (env["step"], env["rank"]) == (step, rank)
    n = len(env["parts"])
    offsets = struct.unpack(f"<{n}Q", env["offsets"])
    lengths = struct.unpack(f"<{n}Q", env["lengths"])
    parts = [main, b""]
    if 1 in env["parts"]:
        side = (directory / f"step-{step:08d}.rank-{rank:04d}.sidecar.rlw").read_bytes()
        assert side[:8] == b"\x89RLS\r\n\x1a\n" and side[16:32] == env["id"]
        assert len(side) == env["sidecar_size"]
        parts[1] = side
    h_off, h_len = env["header"]
    segments = [main[h_off : h_off + h_len]]
    for part, offset, length in zip(env["parts"], offsets, lengths, strict=True):
        assert offset % 64 == 0
        segments.append(parts[part][offset : offset + length])
    if "checksum" in env:
        assert env["checksum"] == "xxh3-64"
        sums = struct.unpack(f"<{n + 1}Q", env["checksums"])
        assert [xxhash.xxh3_64_intdigest(s) for s in segments] == list(sums)
    if "compression" in env:
        raw_sizes = struct.unpack(f"<{n + 1}Q", env["raw_sizes"])
        ids = env["compression"]
        assert sum(size for cid, size in zip(ids, raw_sizes, strict=True) if cid) <= limit
        for k, (cid, size) in enumerate(zip(ids, raw_sizes, strict=True)):
            if cid == 1:
                segments[k] = lz4.block.decompress(segments[k], uncompressed_size=size)
            elif cid == 2:
                assert zstandard.frame_content_size(segments[k]) == size
                segments[k] = zstandard.ZstdDecompressor().decompress(segments[k])
            else:
                assert cid == 0
            assert len(segments[k]) == size
    header, buffers = segments[0], segments[1:]
    if env["codec"] == "json":
        assert not buffers
        return json.loads(header)
    assert env["codec"] == "msgpack"

    def ext_hook(code: int, data: memoryview) -> object:
        fields = msgspec.msgpack.decode(data)
        if code == 1:
            index, dtype, shape, order = fields
            return np.frombuffer(buffers[index], dtype).reshape(shape, order=order)
        if code == 2:
            dtype, shape, order, raw = fields
            return np.frombuffer(raw, dtype).reshape(shape, order=order)
        if code in (4, 5):
            index, count, ranges = fields
            out: Any = {} if code == 5 else []
            for start, end in zip(ranges[::2], ranges[1::2], strict=True):
                part = msgspec.msgpack.decode(buffers[index][start:end], ext_hook=ext_hook)
                if code == 5:
                    out.update(part)
                else:
                    out.extend(part)
            assert len(out) == count
            return out
        assert code == 3
        return buffers[fields[0]]

    return msgspec.msgpack.decode(header, ext_hook=ext_hook)


def assert_same(got: Any, want: Any) -> None:
    """Compare an independently read value with what rlwire returned."""
    if isinstance(want, msgspec.Struct):
        want = {f: getattr(want, f) for f in want.__struct_fields__}
    if isinstance(want, dict):
        assert isinstance(got, dict)
        for key, value in want.items():
            assert_same(got.get(key), value)
    elif isinstance(want, list):
        assert [type(x) for x in got] == [type(x) for x in want] or len(got) == len(want)
        for x, y in zip(got, want, strict=True):
            assert_same(x, y)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        assert np.array_equal(got, want)
    elif isinstance(want, bytes | memoryview):
        assert bytes(got) == bytes(want)
    else:
        assert got == want


@pytest.mark.parametrize("name", sorted(CASES))
def test_independent_reader_reads_golden_files(name: str) -> None:
    make, _, _ = CASES[name]
    assert_same(read_as_documented(GOLDEN / name, 0, 0), make())


def test_independent_reader_matches_a_fresh_message(tmp_path: Path) -> None:
    obj = {
        "routed_experts": np.arange(100_000, dtype=np.uint16).reshape(500, 50, 4) % 7,
        "fortran": np.asfortranarray(np.arange(6000, dtype=">f8").reshape(60, 100)),
        "small": np.array([1.5, 2.5], dtype=np.float32),
        "blob": b"x" * 100_000,
    }

    async def send() -> None:
        async with rlwire.open_sender(
            tmp_path, sidecar=["routed_experts"], compression="zstd"
        ) as sender:
            await sender.send({"a": 1})
            await sender.send(obj)

    anyio.run(send)
    with rlwire.open_receiver(tmp_path, type=dict, start_step=1) as receiver:
        ours = receiver.receive(timeout=5)
    assert_same(read_as_documented(tmp_path, 1, 0), ours)
    assert_same(ours, obj)


def read_mark_as_documented(path: Path, magic: bytes) -> int:
    """Follow 'Marks' in docs/format.md."""
    found, major, minor, step = struct.unpack("<4sHHQ", path.read_bytes())
    assert (found, major, minor) == (magic, 1, 1)
    return int(step)


def test_marks_are_as_documented(tmp_path: Path) -> None:
    async def send() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            for _ in range(3):
                await sender.send(rlwire.TrainingBatch(samples=[]))
            await sender.finish()

    anyio.run(send)
    with rlwire.open_receiver(tmp_path) as receiver:
        assert len(list(receiver)) == 3  # asks for step 3 last: moved past 0-2
    assert read_mark_as_documented(tmp_path / "end.rlw", b"RLWE") == 3
    assert read_mark_as_documented(tmp_path / "consumed.rank-0000.rlw", b"RLWC") == 3
