"""Benchmark checksums and compression on the spine's workload (benchmarks/bench_send.py).

Configurations, each sent and received in every round, in an order that rotates from
round to round so that drift on a shared machine hits all of them alike:

* ``no checksum``: ``open_sender(..., checksum=False)``, the reference for the
  checksum's cost;
* ``checksum``: the default (xxh3-64 of every segment, verified on receive);
* ``lz4``, ``zstd:1``, ``zstd:3``: compression on, checksums on;
* ``zstd:1, 1 thread``: the same with ``limiter=1``, leaving a core to the event loop.

Every send uses ``sidecar=("routed_experts",)``. *send* is ``await sender.send(batch)``
under a :class:`rlwire.LagMonitor` (stall = worst late wake-up of a 1 ms sleep);
*receive* is ``await receiver.areceive()`` of that step (read, verify, decompress,
decode) under the same monitor, checked against the batch. MB/s is the batch's payload
bytes (uncompressed) divided by the time.

Routed expert ids are not uniform in real MoE models: some experts are far more popular
than others, per layer. The workload draws each layer's ids (uint8, ``--experts`` of
them) from that layer's own popularity, a Dirichlet(``--alpha``) draw; the other fields
are the spine's (random token ids, exponential logprobs, ...). The per-field ratio table
compresses each field's arrays alone with each algorithm (what the sender would keep).

Usage::

    .venv/bin/python benchmarks/bench_codecs.py                # full size, asyncio
    .venv/bin/python benchmarks/bench_codecs.py --backend trio
    .venv/bin/python benchmarks/bench_codecs.py --quick        # 16 samples
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from bench_send import MB, PeakMemory, Sample, check_received, make_workload, on_loop

import rlwire
from rlwire._frame.compression import Compressor

CONFIGS: dict[str, dict[str, Any]] = {
    "no checksum": {"checksum": False},
    "checksum": {},
    "lz4": {"compression": "lz4"},
    "zstd:1": {"compression": "zstd:1"},
    "zstd:3": {"compression": "zstd:3"},
    "zstd:1, 1 thread": {"compression": "zstd:1", "limiter": 1},
}
TARGET_CHECKSUM_COST = 1.05  # send time with checksums / without


def skewed_experts(out: np.ndarray, experts: int, alpha: float, seed: int) -> None:
    """Fill ``out`` [samples, tokens, layers, topk] with per-layer skewed expert ids."""
    rng = np.random.default_rng(seed)
    layers = out.shape[2]
    # Per layer, a 65536-entry table whose value frequencies follow the layer's
    # popularity; indexing it with uniform u16 draws samples that popularity quickly.
    tables = np.empty((layers, 1 << 16), np.uint8)
    for layer in range(layers):
        popularity = rng.dirichlet(np.full(experts, alpha))
        edges = np.round(np.cumsum(popularity) * (1 << 16)).astype(np.int64)
        tables[layer] = np.repeat(np.arange(experts, dtype=np.uint8), np.diff(edges, prepend=0))
    for i in range(out.shape[0]):
        draws = rng.integers(0, 1 << 16, out.shape[1:], dtype=np.uint16)
        out[i] = tables[np.arange(layers)[None, :, None], draws]


@dataclass
class Result:
    send: list[Sample] = field(default_factory=list)
    receive: list[Sample] = field(default_factory=list)
    stored: int = 0

    def median(self, which: str, attr: str) -> float:
        return float(statistics.median(getattr(s, attr) for s in getattr(self, which)))


async def send_and_receive(
    directory: Path, batch: rlwire.TrainingBatch, options: dict[str, Any], mem: PeakMemory
) -> tuple[Sample, Sample, int]:
    async with rlwire.open_sender(
        directory, sidecar=("routed_experts",), on_existing="overwrite", **options
    ) as sender:

        async def send() -> int:
            await sender.send(batch)
            return 0

        sent = await on_loop(send, mem)
    stored = sum(p.stat().st_size for p in directory.iterdir())
    got: list[rlwire.TrainingBatch] = []
    limiter = options.get("limiter")
    async with rlwire.open_receiver(directory, limiter=limiter) as receiver:

        async def receive() -> int:
            got.append(await receiver.areceive(timeout=60))
            return 0

        received = await on_loop(receive, mem)
    check_received(got[0], batch)
    got.clear()
    gc.collect()
    for p in directory.iterdir():
        p.unlink()
    return sent, received, stored


async def run(
    args: argparse.Namespace, batch: rlwire.TrainingBatch, root: Path
) -> dict[str, Result]:
    mem = PeakMemory("auto")
    results = {name: Result() for name in CONFIGS}
    names = list(CONFIGS)
    for r in range(args.warmup + args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        line = []
        for name in order:
            sent, received, stored = await send_and_receive(root, batch, CONFIGS[name], mem)
            line.append(f"{name} {sent.seconds * 1e3:.0f}/{received.seconds * 1e3:.0f} ms")
            if r >= args.warmup:
                results[name].send.append(sent)
                results[name].receive.append(received)
                results[name].stored = stored
        print(
            f"  {'round' if r >= args.warmup else 'warm-up'} {r}: " + ", ".join(line),
            file=sys.stderr,
        )
    return results


def field_ratios(batch: rlwire.TrainingBatch) -> dict[str, dict[str, float]]:
    """Per field, raw bytes / stored bytes when each algorithm compresses it alone."""
    out: dict[str, dict[str, float]] = {}
    for name in ("routed_experts", "token_ids", "mask", "logprobs", "temperatures", "advantages"):
        arrays = [getattr(s, name) for s in batch.samples]
        raw = sum(a.nbytes for a in arrays)
        out[name] = {}
        for spec in ("lz4", "zstd:1", "zstd:3"):
            comp = Compressor.parse(spec)
            assert comp is not None
            stored = sum(len(comp.segment(memoryview(a).cast("B"))[1]) for a in arrays)
            out[name][spec] = raw / stored
    return out


def report(
    args: argparse.Namespace,
    payload: int,
    results: dict[str, Result],
    ratios: dict[str, dict[str, float]],
) -> str:
    lines = [
        f"Workload: {args.samples} samples x {args.tokens} tokens, routed_experts "
        f"[{args.tokens}, {args.layers}, {args.topk}] uint8 over {args.experts} experts "
        f"(Dirichlet alpha {args.alpha}); payload {payload / MB:.0f} MB; backend "
        f"{args.backend}; {args.repeats} rounds after {args.warmup} warm-up; medians.",
        "",
        "| config | stored MB | ratio | send ms | send MB/s | send stall ms | receive ms "
        "| receive MB/s | receive stall ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, res in results.items():
        send, recv = res.median("send", "seconds"), res.median("receive", "seconds")
        lines.append(
            f"| {name} | {res.stored / MB:.0f} | {payload / res.stored:.2f} | {send * 1e3:.0f} "
            f"| {payload / MB / send:.0f} | {res.median('send', 'stall_max') * 1e3:.1f} "
            f"| {recv * 1e3:.0f} | {payload / MB / recv:.0f} "
            f"| {res.median('receive', 'stall_max') * 1e3:.1f} |"
        )
    pairs = zip(results["checksum"].send, results["no checksum"].send, strict=True)
    per_round = [a.seconds / b.seconds for a, b in pairs]
    cost = statistics.median(per_round)
    lines += [
        "",
        f"Checksum cost on the send path: {cost:.3f} x the send without checksums "
        f"(median of per-round ratios {', '.join(f'{x:.3f}' for x in per_round)}; target "
        f"<= {TARGET_CHECKSUM_COST}: {'met' if cost <= TARGET_CHECKSUM_COST else 'MISSED'}).",
        "",
        "| field | lz4 | zstd:1 | zstd:3 |",
        "| --- | --- | --- | --- |",
    ]
    for name, by_algo in ratios.items():
        lines.append(
            f"| {name} | "
            + " | ".join(f"{by_algo[a]:.2f}" for a in ("lz4", "zstd:1", "zstd:3"))
            + " |"
        )
    lines += [
        "",
        f"Command: `.venv/bin/python benchmarks/bench_codecs.py {' '.join(sys.argv[1:])}`",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=None, help="samples per batch (default 256)")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=128, help="experts per layer (<= 256)")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="16 samples")
    args = p.parse_args()
    if args.samples is None:
        args.samples = 16 if args.quick else 256
    t0 = time.perf_counter()
    work = make_workload(args.samples, args.tokens, args.layers, args.topk, args.seed)
    skewed_experts(work.blocks[0], args.experts, args.alpha, args.seed)
    print(
        f"generated {work.payload_bytes / MB:.0f} MB in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
    )
    ratios = field_ratios(work.batch)
    root = Path(tempfile.mkdtemp(prefix="rlwire-codecs-", dir=args.dir))
    try:
        results = anyio.run(run, args, work.batch, root, backend=args.backend)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(args, work.payload_bytes, results, ratios))


if __name__ == "__main__":
    main()
