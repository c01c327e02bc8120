"""docs/format.md is enough to read a message: an independent reader built from it alone."""

from __future__ import annotations

import struct
from pathlib import Path

import anyio
import msgspec
import numpy as np

import rlwire


def read_as_documented(directory: Path, step: int, rank: int) -> dict[str, np.ndarray]:
    """Follow 'Reading, step by step' in docs/format.md with struct and msgspec only."""
    main = (directory / f"step-{step:08d}.rank-{rank:04d}.rlw").read_bytes()
    magic, major, _minor, env_len = struct.unpack_from("<8sHHI", main)
    assert magic == b"\x89RLW\r\n\x1a\n" and major == 1
    env = msgspec.msgpack.decode(main[16 : 16 + env_len])
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
    buffers = []
    for part, offset, length in zip(env["parts"], offsets, lengths, strict=True):
        assert offset % 64 == 0
        buffers.append(parts[part][offset : offset + length])
    h_off, h_len = env["header"]

    def ext_hook(code: int, data: memoryview) -> object:
        fields = msgspec.msgpack.decode(data)
        if code == 1:
            index, dtype, shape, order = fields
            return np.frombuffer(buffers[index], dtype).reshape(shape, order=order)
        if code == 2:
            dtype, shape, order, raw = fields
            return np.frombuffer(raw, dtype).reshape(shape, order=order)
        assert code == 3
        return buffers[fields[0]]

    result: dict[str, np.ndarray] = msgspec.msgpack.decode(
        main[h_off : h_off + h_len], ext_hook=ext_hook
    )
    return result


def test_independent_reader_matches(tmp_path: Path) -> None:
    obj = {
        "routed_experts": np.arange(5000, dtype=np.uint16).reshape(50, 25, 4),
        "fortran": np.asfortranarray(np.arange(6000, dtype=">f8").reshape(60, 100)),
        "small": np.array([1.5, 2.5], dtype=np.float32),
        "blob": b"x" * 10_000,
    }

    async def send() -> None:
        async with rlwire.open_sender(tmp_path, sidecar=["routed_experts"]) as sender:
            await sender.send({"a": 1})
            await sender.send(obj)

    anyio.run(send)
    got = read_as_documented(tmp_path, 1, 0)
    for key in ("routed_experts", "fortran", "small"):
        assert got[key].dtype == obj[key].dtype and np.array_equal(got[key], obj[key])
    assert bytes(got["blob"]) == obj["blob"]
