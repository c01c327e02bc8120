"""Aliased segment tables and compound bounds: stored messages under 1 MB that try to
make a receiver (or ``rlwire inspect``) allocate, hash or walk far more than they hold.

Each trial writes one message with rlwire's own FileSink, then edits it the way an
adversary would (the checksums made right again), and reads it in a forked child under
a memory bound: as ``Any``, into a type, or with ``rlwire inspect`` run as a subprocess
with a timeout and an address-space limit. The classes:

* aliased: several buffers over one stored range (same offset and length, or
  overlapping), compressed or not;
* compound: zstd chunks of empty lists that decompress within the compression bound,
  then decode up to the decode bound (the two must add up, not multiply);
* json: a zstd JSON document of empty lists or objects (accepted only when parsing it
  stays within the decode bound of the few kB stored, and then it must be exact);
* honest: the same shapes, small and well-formed, which must come back exact.

A typed error is TYPED, the value sent is EXACT, anything else is bad.
"""

from __future__ import annotations

import random
import resource
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import lz4.block
import msgspec
import numpy as np
import orjson
import xxhash
import zstandard

from ._model import ANY, CRASH, EXACT, HANG, TYPED, UNTYPED, receive_one
from ._proc import Job, MiB

PRELUDE = struct.Struct("<8sHHIQ")
U64 = np.dtype("<u8")
KINDS = ("aliased", "overlapping", "compound", "json", "honest")
READS = ("Any", "list[list[int]]", "inspect")
#: What a trial's RSS may grow by: the decompression floor (64 MiB), the decode
#: allowance of a small message (256 MiB), and the trial's own building of the file.
MEM_LIMIT = 700 * MiB


def _write(directory: Path, frame: Any) -> Path:
    from rlwire._core.slicing import run_sliced
    from rlwire.transport import FileSink

    sink = FileSink(directory)
    sink.open("resume")
    run_sliced(sink.stage(0, [frame])).commit()
    return directory / "step-00000000.rank-0000.rlw"


def _edit(path: Path, **changes: Any) -> None:
    """Replace envelope fields (as many bytes), and the prelude's checksum of it."""
    data = bytearray(path.read_bytes())
    size = PRELUDE.unpack_from(data)[3]
    env = msgspec.msgpack.decode(bytes(data[PRELUDE.size : PRELUDE.size + size]))
    env.update(changes)
    new = msgspec.msgpack.encode(env)
    assert len(new) == size
    data[PRELUDE.size : PRELUDE.size + size] = new
    struct.pack_into("<Q", data, 16, xxhash.xxh3_64_intdigest(new))
    path.write_bytes(bytes(data))


def _aliased(directory: Path, rng: random.Random, overlap: bool) -> None:
    """``count`` uint8 arrays, all over one stored (maybe compressed) range."""
    from rlwire import Frame

    count = rng.choice([2, 16, 1024, 131_072]) if not overlap else rng.choice([2, 16])
    raw = rng.choice([4096, MiB, 100 * MiB])
    algo = rng.choice([0, 1, 2])
    data = bytes(raw)
    if algo == 1:
        data = lz4.block.compress(data, store_size=False)
    elif algo == 2:
        data = zstandard.ZstdCompressor().compress(data)
    if count > 1024:  # the table then costs more than one array per buffer
        header = msgspec.msgpack.encode([msgspec.msgpack.Ext(3, msgspec.msgpack.encode([0]))])
    else:
        refs = [[i, "|u1", [raw], "C"] for i in range(count)]
        header = msgspec.msgpack.encode(
            [msgspec.msgpack.Ext(1, msgspec.msgpack.encode(r)) for r in refs]
        )
    stored = len(data) + 64 if overlap else len(data)
    buffers = (memoryview(data + bytes(64 if overlap else 0)),) + (memoryview(b""),) * (count - 1)
    compression = (0,) + (algo,) * count if algo else ()
    raw_sizes = (len(header),) + (raw,) * count if algo else ()
    path = _write(directory, Frame(header, buffers, compression=compression, raw_sizes=raw_sizes))
    head = path.read_bytes()
    env = msgspec.msgpack.decode(head[PRELUDE.size : PRELUDE.size + PRELUDE.unpack_from(head)[3]])
    first = int(np.frombuffer(env["offsets"], U64)[0])
    shift = [rng.randrange(1, 64) * (i % 2) if overlap else 0 for i in range(count)]
    offsets = np.array([first + s for s in shift], U64)
    lengths = np.full(count, len(data) if not overlap else stored - 64, U64)
    body = path.read_bytes()
    digests: dict[tuple[int, int], int] = {}  # aliased ranges repeat: hash each once
    for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True):
        if (o, n) not in digests:
            digests[o, n] = xxhash.xxh3_64_intdigest(body[o : o + n])
    sums = [xxhash.xxh3_64_intdigest(header)] + [
        digests[o, n] for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)
    ]
    _edit(
        path,
        offsets=offsets.tobytes(),
        lengths=lengths.tobytes(),
        checksums=np.array(sums, U64).tobytes(),
    )


def _empty_lists(directory: Path, rng: random.Random, honest: bool) -> Any:
    """Chunks of empty lists, zstd-compressed; the value sent when ``honest``."""
    from rlwire import Frame

    per_chunk = 1000 if honest else MiB
    chunks = rng.randint(1, 4) if honest else rng.randint(8, 60)
    chunk = b"\xdd" + struct.pack(">I", per_chunk) + b"\x90" * per_chunk
    ranges = [b for i in range(chunks) for b in (i * len(chunk), (i + 1) * len(chunk))]
    header = msgspec.msgpack.encode(
        msgspec.msgpack.Ext(4, msgspec.msgpack.encode([0, chunks * per_chunk, ranges]))
    )
    bulk = chunk * chunks
    packed = zstandard.ZstdCompressor(level=9).compress(bulk)
    frame = Frame(
        header, (memoryview(packed),), compression=(0, 2), raw_sizes=(len(header), len(bulk))
    )
    _write(directory, frame)
    return [[] for _ in range(chunks * per_chunk)] if honest else None


def _json(directory: Path, rng: random.Random) -> Any:
    """A zstd JSON document of tiny values; the value sent if parsing it stays within
    the decode bound of the few kB stored (then accepting it is right), else None."""
    from rlwire import Frame
    from rlwire._frame.bounds import heap_bytes
    from rlwire.codecs._json.cost import json_cost

    item = rng.choice([b"[],", b"{},", b"[[]],"])
    count = rng.randint(1 << 20, (60 << 20) // len(item))
    doc = b"[" + item * count + b"[]]"
    packed = zstandard.ZstdCompressor(level=9).compress(doc)
    path = _write(
        directory, Frame(packed, (), codec="json", compression=(2,), raw_sizes=(len(doc),))
    )
    allowance = heap_bytes(path.stat().st_size)
    return orjson.loads(doc) if json_cost(doc, allowance) <= allowance else None


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _inspect(directory: Path) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rlwire._api.cli", "inspect", str(directory)],
            capture_output=True,
            text=True,
            timeout=30,
            preexec_fn=_limit,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"outcome": HANG, "detail": "rlwire inspect ran over 30 s"}
    if "Traceback" in proc.stderr or "MemoryError" in proc.stderr:
        return {"outcome": UNTYPED, "detail": proc.stderr[-600:]}
    if proc.returncode == 2 and proc.stderr.startswith("rlwire: "):
        return {"outcome": TYPED, "detail": proc.stderr[:300]}
    if proc.returncode == 0 and len(proc.stdout) < 20_000:
        return {"outcome": EXACT, "detail": ""}
    return {"outcome": CRASH, "detail": f"exit {proc.returncode}: {proc.stderr[-300:]}"}


def trial(root: str, seed: int, index: int, kind: str, read: str) -> dict[str, Any]:
    """One message of ``kind``, read as ``read``."""
    rng = random.Random(seed * 1_000_003 + index)
    directory = Path(root) / "aliased" / str(index)
    directory.mkdir(parents=True)
    expected = None
    if kind in ("aliased", "overlapping"):
        _aliased(directory, rng, overlap=kind == "overlapping")
    elif kind == "compound":
        _empty_lists(directory, rng, honest=False)
    elif kind == "json":
        expected = _json(directory, rng)
    else:
        expected = _empty_lists(directory, rng, honest=True)
    if read == "inspect":
        return _inspect(directory)
    result = receive_one(
        directory, 0, 0, expected, type=ANY if read == "Any" else list[list[int]], timeout=2
    )
    if expected is None and result["outcome"] == EXACT:  # nothing is right but an error
        return {"outcome": "wrong data", "detail": f"{kind} read as {read} was accepted"}
    return result


def jobs(root: str, count: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        kind, read = KINDS[index % len(KINDS)], rng.choice(READS)
        out.append(
            Job(
                trial,
                (root, seed, index, kind, read),
                timeout=60,
                mem_limit=MEM_LIMIT,
                tag=("aliased segments and compound bounds", f"{kind} read as {read}"),
            )
        )
    return out
