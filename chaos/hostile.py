"""Hostile messages with valid checksums, built from docs/format.md alone.

Each case writes a main part (and maybe a sidecar) whose checksums are right but whose
contents try to make a reader allocate, recurse or loop without bound. Receiving it must
give the value (for the well-formed ones), or a typed error, within the time and memory
bounds.
"""

from __future__ import annotations

import itertools
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lz4.block
import msgspec
import numpy as np
import xxhash
import zstandard

from ._model import ANY, EXACT, receive_one
from ._proc import MEMORY_CONSTANT, Job

MAGIC = b"\x89RLW\r\n\x1a\n"
GiB = 1 << 30


def _pad(n: int) -> int:
    return -n % 64


def ext(code: int, *items: Any) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, msgspec.msgpack.encode(list(items)))


def build_main(
    header: bytes,
    buffers: list[bytes] = (),  # type: ignore[assignment]
    *,
    step: int = 0,
    rank: int = 0,
    codec: str = "msgpack",
    compression: list[int] | None = None,
    raw_sizes: list[int] | None = None,
    extra: dict[str, Any] | None = None,
    major: int = 1,
) -> bytes:
    """A main part as docs/format.md describes it, with every buffer in the main part
    and correct checksums of whatever bytes are given."""
    n = len(buffers)
    segments = [header, *buffers]
    sums = struct.pack(f"<{n + 1}Q", *(xxhash.xxh3_64_intdigest(s) for s in segments))
    size = 0
    head_off = 0
    lengths = [len(b) for b in buffers]
    spans = [length + _pad(length) for length in lengths]  # once: a case has 1M buffers
    for _ in range(4):  # the envelope's own length moves the offsets; settle them
        env: dict[str, Any] = {
            "id": b"\x01" * 16,
            "step": step,
            "rank": rank,
            "size": size,
            "header": [head_off, len(header)],
            "parts": bytes(n),
            "codec": codec,
            "checksum": "xxh3-64",
            "checksums": sums,
        }
        start = head_off + len(header) + _pad(head_off + len(header))
        offsets = list(itertools.accumulate(spans, initial=start))
        pos = offsets.pop()  # the end of the last buffer's padding
        env["offsets"] = struct.pack(f"<{n}Q", *offsets)
        env["lengths"] = struct.pack(f"<{n}Q", *lengths)
        if compression is not None:
            env["compression"] = bytes(compression)
            env["raw_sizes"] = struct.pack(f"<{n + 1}Q", *(raw_sizes or [0] * (n + 1)))
        env.update(extra or {})
        raw_env = msgspec.msgpack.encode(env)
        new_head = 24 + len(raw_env) + _pad(24 + len(raw_env))
        if new_head == head_off and size == pos:
            break
        head_off, size = new_head, pos
    out = bytearray(struct.pack("<8sHHIQ", MAGIC, major, 0, len(raw_env), 0))
    out[16:24] = struct.pack("<Q", xxhash.xxh3_64_intdigest(raw_env))
    out += raw_env
    out += bytes(head_off - len(out))
    for seg, off in zip(segments, [head_off, *offsets], strict=True):
        if seg:  # the zeros before an empty one are written with the next
            out += bytes(off - len(out))
            out += seg
    out += bytes(size - len(out))
    assert len(out) == size
    return bytes(out)


# Each case: name -> builder returning (main part bytes, expected value or None).
Case = Callable[[], tuple[bytes, Any]]


def zstd_bomb() -> tuple[bytes, Any]:
    frame = zstandard.ZstdCompressor(level=3).compress(bytes(GiB))
    header = msgspec.msgpack.encode([ext(1, i, "|u1", [GiB], "C") for i in range(3)])
    return build_main(
        header, [frame] * 3, compression=[0, 2, 2, 2], raw_sizes=[0] + [GiB] * 3
    ), None


def lz4_liar() -> tuple[bytes, Any]:
    """lz4 blocks of 4 MiB of zeros that declare 16 MiB each: within the compression
    ratio a reader allows, but not what the blocks hold."""
    block = lz4.block.compress(bytes(4 << 20), store_size=False)
    header = msgspec.msgpack.encode([ext(1, i, "|u1", [16 << 20], "C") for i in range(3)])
    sizes = [0] + [16 << 20] * 3
    return build_main(header, [block] * 3, compression=[0, 1, 1, 1], raw_sizes=sizes), None


def declared_huge_small_data() -> tuple[bytes, Any]:
    """zstd frames claiming 4 GiB each but holding 10 bytes: a liar, not a bomb."""
    frame = zstandard.ZstdCompressor().compress(b"0123456789")
    lie = bytearray(frame)
    header = msgspec.msgpack.encode([ext(1, 0, "|u1", [10], "C")])
    return (
        build_main(header, [bytes(lie)], compression=[0, 2], raw_sizes=[0, 4 * GiB]),
        None,
    )


def over_limit() -> tuple[bytes, Any]:
    frame = zstandard.ZstdCompressor().compress(b"x")
    header = msgspec.msgpack.encode([ext(1, 0, "|u1", [1], "C")])
    return build_main(header, [frame], compression=[0, 2], raw_sizes=[0, 1 << 40]), None


def empty_arrays(count: int) -> Case:
    def build() -> tuple[bytes, Any]:
        header = b"\xdd" + struct.pack(">I", count) + b"\x90" * count
        return build_main(header), [[] for _ in range(count)] if count <= 1000 else None

    return build


def deep_nesting(depth: int, codec: str = "msgpack") -> Case:
    def build() -> tuple[bytes, Any]:
        if codec == "json":
            return build_main(b"[" * depth + b"]" * depth, codec="json"), None
        return build_main(b"\x91" * depth + b"\xc0"), None

    return build


def unknown_fields() -> tuple[bytes, Any]:
    arr = np.arange(100, dtype="<i8")
    header = msgspec.msgpack.encode({"a": 1, "arr": ext(1, 0, "<i8", [100], "C")})
    main = build_main(header, [arr.tobytes()], extra={"zz_future_field": {"x": [1, 2]}})
    return main, {"a": 1, "arr": arr}


def many_empty_buffers() -> tuple[bytes, Any]:
    n = 1_000_000
    header = msgspec.msgpack.encode(ext(1, n - 1, "|u1", [0], "C"))
    return build_main(header, [b""] * n), np.zeros(0, "|u1")


def bad_array(descr: list[Any]) -> Case:
    def build() -> tuple[bytes, Any]:
        header = msgspec.msgpack.encode(ext(1, *descr))
        return build_main(header, [b"\0" * 64]), None

    return build


def chunked_lie() -> tuple[bytes, Any]:
    chunk = msgspec.msgpack.encode([1, 2, 3])
    header = msgspec.msgpack.encode(ext(4, 0, 1 << 62, [0, len(chunk)]))
    return build_main(header, [chunk]), None


def chunked_self_reference() -> tuple[bytes, Any]:
    """A chunk that holds a chunked container over the same chunk: endless if followed."""
    inner = msgspec.msgpack.encode([ext(4, 0, 1, [0, 0])])
    size = len(inner)
    chunk = msgspec.msgpack.encode([ext(4, 0, 1, [0, size])])
    while len(chunk) != size:
        size = len(chunk)
        chunk = msgspec.msgpack.encode([ext(4, 0, 1, [0, size])])
    header = msgspec.msgpack.encode(ext(4, 0, 1, [0, size]))
    return build_main(header, [chunk]), None


def unknown_ext() -> tuple[bytes, Any]:
    return build_main(msgspec.msgpack.encode(ext(99, 1))), None


def unknown_compression() -> tuple[bytes, Any]:
    header = msgspec.msgpack.encode(ext(1, 0, "|u1", [4], "C"))
    return build_main(header, [b"abcd"], compression=[0, 7], raw_sizes=[0, 4]), None


def future_major() -> tuple[bytes, Any]:
    return build_main(msgspec.msgpack.encode(1), major=2), None


def tiny_inline_arrays() -> tuple[bytes, Any]:
    one = msgspec.msgpack.encode(ext(2, "|u1", [1], "C", b"x"))
    return build_main(b"\xdd" + struct.pack(">I", 2_000_000) + one * 2_000_000), None


def negative_fixints() -> tuple[bytes, Any]:
    count = 32_000_000
    return build_main(b"\xdd" + struct.pack(">I", count) + b"\xe0" * count), None


def one_buffer_many_times() -> tuple[bytes, Any]:
    """A 1 MiB buffer (in 1 KB of zstd) that 100,000 arrays claim: copied for a writable
    receiver, 100 GiB."""
    frame = zstandard.ZstdCompressor().compress(bytes(1 << 20))
    header = msgspec.msgpack.encode([ext(1, 0, "|u1", [1 << 20], "C")] * 100_000)
    return build_main(header, [frame], compression=[0, 2], raw_sizes=[0, 1 << 20]), None


def many_small_strings() -> tuple[bytes, Any]:
    count = 4_000_000
    header = b"\xdd" + struct.pack(">I", count) + b"\xa1a" * count
    return build_main(header), ["a"] * count


def huge_map() -> tuple[bytes, Any]:
    count = 1_000_000
    value = dict.fromkeys(range(count))
    header = msgspec.msgpack.encode(value)  # map32, each key an int, each value nil
    assert header[:5] == b"\xdf" + struct.pack(">I", count)
    return build_main(header), value


CASES: dict[str, Case] = {
    "zstd segments declared 1 GiB each": zstd_bomb,
    "lz4 blocks declaring 4x what they hold": lz4_liar,
    "zstd frame declaring 4 GiB, holding 10 bytes": declared_huge_small_data,
    "raw sizes over the limit": over_limit,
    "header of 32M empty arrays": empty_arrays(32_000_000),
    "header of 1,000 empty arrays": empty_arrays(1000),
    "msgpack nested 1M deep": deep_nesting(1_000_000),
    "json nested 1M deep": deep_nesting(1_000_000, "json"),
    "unknown envelope fields": unknown_fields,
    "1M empty buffers": many_empty_buffers,
    "shape product overflows": bad_array([0, "|u1", [1 << 62, 1 << 62], "C"]),
    "shape of 65 dimensions": bad_array([0, "|u1", [1] * 65, "C"]),
    "negative shape": bad_array([0, "|u1", [-64], "C"]),
    "object dtype": bad_array([0, "|O", [8], "C"]),
    "buffer index out of range": bad_array([5, "|u1", [64], "C"]),
    "order neither C nor F": bad_array([0, "|u1", [64], "K"]),
    "chunked list claiming 2**62 items": chunked_lie,
    "chunked list inside its own chunk": chunked_self_reference,
    "unknown extension type": unknown_ext,
    "unknown compression id": unknown_compression,
    "major version 2": future_major,
    "header of 2M tiny inline arrays": tiny_inline_arrays,
    "header of 32M negative fixints": negative_fixints,
    "one buffer referred to 100,000 times": one_buffer_many_times,
    "header of 4M one-letter strings": many_small_strings,
    "map of 1M entries": huge_map,
}


def generate(root: str) -> dict[str, Any]:
    """Write every case's main part under ``root/hostile/<index>/``."""
    for i, build in enumerate(CASES.values()):
        main, expected = build()
        directory = Path(root) / "hostile" / str(i)
        directory.mkdir(parents=True)
        (directory / "step-00000000.rank-0000.rlw").write_bytes(main)
        if expected is not None:
            (directory / "expected.msgpack").write_bytes(
                msgspec.msgpack.encode(expected, enc_hook=_enc)
            )
    return {"outcome": EXACT}


def _enc(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"__nd__": [obj.dtype.str, list(obj.shape), obj.tobytes()]}
    raise NotImplementedError(type(obj))


def _dec(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__nd__" in obj:
            dtype, shape, data = obj["__nd__"]
            return np.frombuffer(data, dtype).reshape(shape)
        return {k: _dec(v) for k, v in obj.items()}
    if isinstance(obj, list):
        if {str, int, float, bool, type(None)}.issuperset(map(type, obj)):
            return obj  # nothing to rebuild, at C speed (millions of items)
        return [_dec(v) for v in obj]
    return obj


def receive_case(root: str, index: int, as_type: str) -> dict[str, Any]:
    source = Path(root) / "hostile" / str(index)
    directory = Path(tempfile.mkdtemp(dir=root))
    os.link(source / "step-00000000.rank-0000.rlw", directory / "step-00000000.rank-0000.rlw")
    expected = None
    if (source / "expected.msgpack").exists() and as_type == "Any":
        expected = _dec(msgspec.msgpack.decode((source / "expected.msgpack").read_bytes()))
    import rlwire

    kind = ANY if as_type == "Any" else rlwire.TrainingBatch
    return receive_one(directory, 0, 0, expected, type=kind, timeout=1)


def jobs(root: str, repeat: int = 1, only: set[str] | None = None) -> Iterator[Job]:
    for _ in range(repeat):
        for i, name in enumerate(CASES):
            if only is not None and name not in only:
                continue
            size = os.path.getsize(Path(root) / "hostile" / str(i) / "step-00000000.rank-0000.rlw")
            for as_type in ("Any", "TrainingBatch"):
                yield Job(
                    receive_case,
                    (root, i, as_type),
                    timeout=30,
                    mem_limit=4 * size + MEMORY_CONSTANT,
                    tag=("hostile messages", f"{name} (type={as_type})"),
                )
