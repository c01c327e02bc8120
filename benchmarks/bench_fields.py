"""Partial reads by field: the bytes a receiver with ``fields=`` touches or fetches.

A packed step of five ragged columns (``rlwire.Columns``, about ``--mb`` MB) is written
once; then two of its columns are read with ``open_receiver(..., fields=...)`` and, for
comparison, the whole step.

* files: the file is dropped from the page cache first (fsync, then
  ``posix_fadvise(POSIX_FADV_DONTNEED)``); after the read, the file's resident pages
  are counted with ``mincore`` (through ctypes, on a fresh mapping), and the process's
  ``/proc/self/io`` ``read_bytes`` is reported beside them.
* S3 (the tests' moto server on loopback, ``--s3-mb`` MB): the bytes of every ranged GET
  the receiver sends, counted in the tests' proxy (tests/s3_server.py).

Each figure is also given as a ratio to the bytes of the two columns (values and
offsets). The target (issue 28) is at most 1.1x.

Usage::

    .venv/bin/python benchmarks/bench_fields.py                 # files, 1 GB; S3, 200 MB
    .venv/bin/python benchmarks/bench_fields.py --mb 200 --s3-mb 0
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import rlwire

NAMES = ("token_ids", "mask", "logprobs", "temperatures", "advantages")
WANTED = ("token_ids", "advantages")
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def packed_step(megabytes: float, rows: int = 64) -> rlwire.Columns:
    """Five int32/float32 ragged columns of ``rows`` rows, ``megabytes`` MB in all
    (sent as ``{"samples": columns}``: no TrainingSample rules to satisfy)."""
    tokens = int(megabytes * 1e6 / (4 * len(NAMES)))
    offsets = np.linspace(0, tokens, rows + 1).astype(np.int64)
    rng = np.random.default_rng(0)
    columns: dict[str, Any] = {}
    for name in NAMES:
        values = rng.integers(0, 50_000, tokens, dtype=np.int32)
        columns[name] = rlwire.Ragged(
            values if name == "token_ids" else values.view(np.float32), offsets
        )
    return rlwire.Columns(columns)


def wanted_bytes(cols: rlwire.Columns) -> int:
    return sum(cols[n].values.nbytes + cols[n].offsets.nbytes for n in WANTED)


def dropped(path: Path) -> bool:
    """Drop ``path`` from the page cache; True if no page of it is resident after."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_bytes(path) == 0


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (``mincore`` on a fresh mapping)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(mapping, np.uint8)  # its address, no page touched
        ptr = view.ctypes.data
        del view
        if _libc.mincore(ctypes.c_void_p(ptr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1)) * mmap.PAGESIZE
    finally:
        mapping.close()


def _io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def _send(url: str, obj: Any, options: dict[str, Any] | None = None) -> None:
    async def send() -> None:
        async with rlwire.open_sender(url, storage_options=options or {}) as sender:
            await sender.send(obj)

    anyio.run(send)


def _read_file(path: Path, fields: tuple[str, ...] | None) -> dict[str, int]:
    main = path / "step-00000000.rank-0000.rlw"
    dropped(main)
    before = _io_read_bytes()
    with rlwire.open_receiver(str(path), type=dict, fields=fields) as receiver:
        batch = receiver.receive(timeout=30)
        del batch
    return {"resident": resident_bytes(main), "read_bytes": _io_read_bytes() - before}


def bench_files(megabytes: float) -> dict[str, Any]:
    cols = packed_step(megabytes)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = Path(tmp) / "run"
        _send(str(path), {"samples": cols})
        size = (path / "step-00000000.rank-0000.rlw").stat().st_size
        partial = _read_file(path, WANTED)
        whole = _read_file(path, None)
    wanted = wanted_bytes(cols)
    return {
        "sink": "files",
        "step_bytes": size,
        "wanted_bytes": wanted,
        "partial": partial,
        "whole": whole,
        "partial_ratio": round(partial["resident"] / wanted, 3),
        "whole_ratio": round(whole["resident"] / wanted, 3),
    }


def bench_s3(megabytes: float) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3_server import FaultProxy, moto_server, s3_client

    cols = packed_step(megabytes)
    with moto_server() as endpoint:
        options = {
            "endpoint_url": endpoint,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }
        s3_client(options).create_bucket(Bucket="rlwire-bench-fields")
        url = "s3://rlwire-bench-fields/run"
        _send(url, {"samples": cols}, options)
        out: dict[str, Any] = {"sink": "s3", "wanted_bytes": wanted_bytes(cols)}
        for label, fields in (("partial", WANTED), ("whole", None)):
            with FaultProxy(options) as proxy:
                with rlwire.open_receiver(
                    url, type=dict, fields=fields, storage_options=proxy.options
                ) as r:
                    r.receive(timeout=120)
                gets = [x for x in proxy.ranges if x[0] == "GET" and "step-" in x[1]]
            fetched = 0
            for _, _, ranged in gets:
                start, _, end = (ranged or "bytes=0-0").removeprefix("bytes=").partition("-")
                fetched += int(end) - int(start) + 1
            out[label] = {"gets": len(gets), "fetched": fetched}
            out[f"{label}_ratio"] = round(fetched / out["wanted_bytes"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1000, help="step size on files (MB)")
    parser.add_argument("--s3-mb", type=float, default=200, help="step size on S3 (MB); 0: skip")
    args = parser.parse_args()
    rows = [bench_files(args.mb)] if args.mb else []
    if args.s3_mb:
        rows.append(bench_s3(args.s3_mb))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
