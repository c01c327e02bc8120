"""Benchmark JSON lines: rlwire's ``dump_jsonl`` / ``load_jsonl`` (orjson) against the
standard library's ``json``, and the event-loop stall of ``adump_jsonl``.

The workload is ``--records`` rollout records (default 10,000), each a dict like the ones
RL frameworks log: a prompt and a completion string of a few kB, ``token_ids`` (an int64
array of 1k-4k tokens), ``logprobs`` (a float32 array as long), a float reward and a small
metadata dict.

Rows, measured in one run; each of ``--repeats`` rounds (after one warm-up round) runs
rlwire and the standard library alternately (ABBA order), and the tables show medians:

* write, rlwire: ``dump_jsonl(records, path)``.
* write, stdlib: ``f.write(json.dumps(record, default=...) + "\\n")`` per record into a
  text file, with arrays turned into lists by ``default=lambda a: a.tolist()``.
* read, rlwire: ``for record in load_jsonl(path)`` (plain dicts and lists).
* read, stdlib: ``json.loads(line)`` for each line of the same file.

Loop stalls (asyncio, :class:`rlwire.LagMonitor`, 1 ms sleeps; a stall is how late a
sleep wakes up) while the records are written by ``await adump_jsonl(records, path)``,
by the stdlib loop in one worker thread (``anyio.to_thread.run_sync``), and by the stdlib
loop called directly in the async function (on the event loop).

Usage::

    .venv/bin/python benchmarks/bench_jsonl.py            # 10,000 records, 3 rounds
    .venv/bin/python benchmarks/bench_jsonl.py --quick    # 1,000 records, 1 round
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import rlwire
from rlwire.codecs.jsonl import adump_jsonl, aload_jsonl, dump_jsonl, load_jsonl

MB = 1e6  # decimal megabytes throughout


# -- the workload ----------------------------------------------------------------------


def make_records(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rollout-like records; strings are slices of one random ASCII text."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      .,\n", np.uint8)
    text = rng.choice(letters, size=1 << 20).tobytes().decode("ascii")
    records = []
    for i in range(count):
        n = int(rng.integers(1024, 4097))
        p_len, c_len = int(rng.integers(1500, 3000)), int(rng.integers(2000, 5000))
        p_off, c_off = rng.integers(0, len(text) - 5000, size=2)
        records.append(
            {
                "id": f"rollout-{i:06d}",
                "prompt": text[p_off : p_off + p_len],
                "completion": text[c_off : c_off + c_len],
                "token_ids": rng.integers(0, 151_936, n, dtype=np.int64),
                "logprobs": -rng.exponential(0.5, n).astype(np.float32),
                "reward": float(rng.random()),
                "metadata": {
                    "env": f"env-{i % 8}",
                    "step": i // 256,
                    "turns": int(rng.integers(1, 5)),
                    "finish_reason": "stop" if i % 10 else "length",
                    "tags": ["math", "train"],
                },
            }
        )
    return records


# -- the operations --------------------------------------------------------------------


def _tolist(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def stdlib_write(records: list[dict[str, Any]], path: Path) -> int:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, default=_tolist) + "\n")
    return len(records)


def stdlib_read(path: Path) -> int:
    count = 0
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
            count += 1
    return count


def rlwire_read(path: Path) -> int:
    return sum(1 for _ in load_jsonl(path))


def timed(op: Callable[[], int], expect: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    got = op()
    seconds = time.perf_counter() - t0
    if got != expect:
        raise AssertionError(f"expected {expect} records, got {got}")
    return seconds


async def stalled(op: Callable[[], Awaitable[int]], expect: int) -> tuple[float, float, float]:
    """(seconds, worst stall, p99 stall) of ``op`` under a LagMonitor."""
    gc.collect()
    async with rlwire.LagMonitor() as lag:
        t0 = time.perf_counter()
        got = await op()
        seconds = time.perf_counter() - t0
    if got != expect:
        raise AssertionError(f"expected {expect} records, got {got}")
    return seconds, lag.max, lag.percentile(99)


# -- the benchmark ---------------------------------------------------------------------


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def med(values: list[float]) -> float:
    return float(statistics.median(values))


def throughput(root: Path, records: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    n = len(records)
    ours, theirs = root / "rlwire.jsonl", root / "stdlib.jsonl"
    times: dict[str, list[float]] = {k: [] for k in ("w-rl", "w-std", "r-rl", "r-std")}
    ops: dict[str, Callable[[], int]] = {
        "w-rl": lambda: dump_jsonl(records, ours),
        "w-std": lambda: stdlib_write(records, theirs),
        "r-rl": lambda: rlwire_read(ours),
        "r-std": lambda: stdlib_read(ours),  # both read the same file
    }
    for r in range(repeats + 1):  # round 0 warms up
        first, second = ("rl", "std") if r % 2 else ("std", "rl")
        round_times = {}
        for kind in ("w", "r"):
            for who in (first, second, second, first):
                key = f"{kind}-{who}"
                round_times.setdefault(key, []).append(timed(ops[key], n))
        if r:
            for key, values in round_times.items():
                times[key] += values
        progress(
            f"  {'round ' + str(r) if r else 'warm-up'}: "
            + ", ".join(f"{k} {med(v):.2f} s" for k, v in round_times.items())
        )
    # Both files must hold the same records. The stdlib writes each float32 logprob
    # widened to float64 (-0.10000000149011612), orjson its shortest float32 form (-0.1):
    # the same float32 value.
    with open(theirs, "rb") as f:
        for a, b in zip(load_jsonl(ours), map(json.loads, f), strict=True):
            la, lb = np.float32(a.pop("logprobs")), np.float32(b.pop("logprobs"))
            if a != b or not np.array_equal(la, lb):
                raise AssertionError(f"the two files differ at record {a['id']}")
    return {
        "times": {k: med(v) for k, v in times.items()},
        "sizes": {"rl": ours.stat().st_size, "std": theirs.stat().st_size},
        "samples": len(times["w-rl"]),
    }


async def stalls(root: Path, records: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    n = len(records)
    path = root / "async.jsonl"

    async def rl_write() -> int:
        return await adump_jsonl(records, path)

    async def rl_read() -> int:
        return sum([1 async for _ in aload_jsonl(path)])

    async def std_thread() -> int:
        return await anyio.to_thread.run_sync(stdlib_write, records, path)

    async def std_loop() -> int:
        return stdlib_write(records, path)  # blocks the event loop

    async def idle() -> int:
        await anyio.sleep(1.0)
        return n

    ops = {
        "rlwire adump_jsonl": rl_write,
        "rlwire aload_jsonl (read)": rl_read,
        "stdlib json, one worker thread": std_thread,
        "stdlib json, on the event loop": std_loop,
        "idle loop (1 s sleep), for reference": idle,
    }
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in ops}
    await rl_write()  # warm-up, and the file rl_read reads
    for r in range(repeats):
        for name, op in ops.items():
            results[name].append(await stalled(op, n))
        progress(
            f"  stalls round {r + 1}: "
            + ", ".join(f"{k.split(',')[0]} {v[-1][1] * 1e3:.1f} ms" for k, v in results.items())
        )
    return {
        name: tuple(med([s[i] for s in samples]) for i in range(3))
        for name, samples in results.items()
    }


def report(
    args: argparse.Namespace, records: list[dict[str, Any]], tp: dict[str, Any], st: dict[str, Any]
) -> str:
    n = len(records)
    tokens = [len(r["token_ids"]) for r in records]
    t, sizes = tp["times"], tp["sizes"]
    rl_mb, std_mb = sizes["rl"] / MB, sizes["std"] / MB
    lines = [
        f"{n:,} rollout records (prompt ~2 kB + completion ~3.5 kB of text, "
        f"{min(tokens)}-{max(tokens)} token ids as int64 and as many float32 logprobs, "
        f"a reward and a metadata dict); file: {rl_mb:.0f} MB (rlwire), "
        f"{std_mb:.0f} MB (stdlib: spaces after separators, float32 values widened to 17 digits). "
        f"Median of {tp['samples']} runs each, alternating.",
        "",
        "| operation | rlwire (orjson) | stdlib `json` | stdlib / rlwire |",
        "| --- | --- | --- | --- |",
        f"| write {n:,} records | {t['w-rl']:.2f} s ({rl_mb / t['w-rl']:.0f} MB/s) | "
        f"{t['w-std']:.2f} s ({std_mb / t['w-std']:.0f} MB/s) | "
        f"{t['w-std'] / t['w-rl']:.1f}x |",
        f"| read them back (same file) | {t['r-rl']:.2f} s ({rl_mb / t['r-rl']:.0f} MB/s) | "
        f"{t['r-std']:.2f} s ({rl_mb / t['r-std']:.0f} MB/s) | "
        f"{t['r-std'] / t['r-rl']:.1f}x |",
        "",
        f"Event-loop stalls under asyncio while {n:,} records are written or read (median of "
        f"{args.repeats} runs):",
        "",
        "| writer | time | worst loop stall | p99 stall |",
        "| --- | --- | --- | --- |",
    ]
    for name, (seconds, worst, p99) in st.items():
        lines.append(f"| {name} | {seconds:.2f} s | {worst * 1e3:.1f} ms | {p99 * 1e3:.1f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    parser.add_argument("--quick", action="store_true", help="1,000 records, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.records, args.repeats = 1_000, 1
    root = Path(tempfile.mkdtemp(prefix="bench-jsonl-", dir=args.dir))
    try:
        progress(f"making {args.records:,} records ...")
        records = make_records(args.records, args.seed)
        progress("throughput (write, read) ...")
        tp = throughput(root, records, args.repeats)
        progress("event-loop stalls ...")
        st = anyio.run(stalls, root, records, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"Python {platform.python_version()}, orjson {version('orjson')}, "
        f"numpy {np.__version__}, rlwire {version('rlwire')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {platform.system()}"
    )
    print()
    print(report(args, records, tp, st))


if __name__ == "__main__":
    main()
