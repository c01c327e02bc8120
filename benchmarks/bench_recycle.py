"""Benchmark the file sink's ``recycle`` storage option: a MoE step sent again and again
to tmpfs with ``keep_last=2``, written into fresh files or into the files of the step
just pruned.

Each round runs every variant in turn (the order alternates from round to round); a
variant opens a sender on a fresh directory and two ranks' receivers, and sends
``--steps`` steps. Per step: ``await sender.send_ranks(per_rank)`` (send), then each
rank's ``await receiver.areceive()`` (receive, checksums verified, arrays are views of
the files), the previous step's arrays dropped only then, as a trainer does. The last
``--steady`` steps of each variant count. Variants:

* ``off``: ``keep_last=2``, pruned steps deleted (the default).
* ``on``: ``keep_last=2`` and ``storage_options={"recycle": True}``.
* ``on+populate`` (with ``--populate``): ``on``, and the receivers' mappings are
  populated in one call (``madvise(MADV_POPULATE_READ)``, Linux 5.14+) before they are
  read, instead of one page fault per 64 KiB.
* ``off+writers``, ``on+writers`` (with ``--writers N``): ``off`` and ``on`` with the
  storage option ``{"writers": N}``: N threads may write the step's ranks at once.

Each send is watched by a LagMonitor, and the idle loop as long right after: the stall
column is the send's worst gap less the idle loop's.

The workload is bench_send.py's ``make_workload``; by default 256 samples x 4096 tokens
with routed experts of 48 layers x top-8 (~430 MB a step), split over two ranks.

Usage::

    .venv/bin/python benchmarks/bench_recycle.py               # 4 rounds, /dev/shm
    .venv/bin/python benchmarks/bench_recycle.py --populate    # and the populate variant
    .venv/bin/python benchmarks/bench_recycle.py --writers 2   # and two writers
    .venv/bin/python benchmarks/bench_recycle.py --quick       # 32 samples, 2 rounds
"""

from __future__ import annotations

import argparse
import mmap
import shutil
import tempfile
import time
from pathlib import Path

import anyio
from bench_send import make_workload

import rlwire
from rlwire.transport._file import source as file_source

MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux's value


def populate(on: bool) -> None:
    """Make every mapping a FileSource makes populated (``on``) or not."""
    plain = getattr(populate, "plain", None) or file_source.FileSource.load
    populate.plain = plain  # type: ignore[attr-defined]
    if not on:
        file_source.FileSource.load = plain  # type: ignore[method-assign]
        return

    def load(self: file_source.FileSource, name: str) -> memoryview | None:
        view = plain(self, name)
        if view is not None:
            self._mapped[-1].madvise(MADV_POPULATE_READ)
        return view

    file_source.FileSource.load = load  # type: ignore[method-assign]


async def run_variant(
    variant: str,
    per_rank: list[rlwire.TrainingBatch],
    base: Path,
    steps: int,
    steady: int,
    writers: int | None,
) -> tuple[list[float], list[float], list[float]]:
    """Send ms, receive ms (both ranks) and the send's stall above the idle loop (ms) of
    the last ``steady`` steps."""
    root = Path(tempfile.mkdtemp(prefix=f"recycle-{variant}-", dir=base))
    populate(variant.endswith("populate"))
    options: dict[str, object] = {"recycle": True} if variant.startswith("on") else {}
    if variant.endswith("writers"):
        options["writers"] = writers
    sends: list[float] = []
    receives: list[float] = []
    stalls: list[float] = []
    try:
        receivers = [rlwire.open_receiver(root, rank=r) for r in range(len(per_rank))]
        held: list[object] = []
        async with rlwire.open_sender(
            root, storage_options=options, keep_last=2, sidecar="routed_experts"
        ) as sender:
            for _ in range(steps):
                async with rlwire.LagMonitor() as lag:
                    t0 = time.perf_counter()
                    await sender.send_ranks(per_rank)
                    t1 = time.perf_counter()
                async with rlwire.LagMonitor() as idle:
                    await anyio.sleep(t1 - t0)
                stalls.append((lag.max - idle.max) * 1e3)
                t2 = time.perf_counter()  # the receive, after the idle loop's watch
                got = [await r.areceive(timeout=60) for r in receivers]
                t3 = time.perf_counter()
                held = got  # the previous step's arrays go only now
                sends.append((t1 - t0) * 1e3)
                receives.append((t3 - t2) * 1e3)
        del held
        for r in receivers:
            r.close()
    finally:
        populate(False)
        shutil.rmtree(root, ignore_errors=True)
    return sends[-steady:], receives[-steady:], stalls[-steady:]


def spread(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}"


async def main(args: argparse.Namespace) -> None:
    work = make_workload(args.samples, args.tokens, args.layers, args.topk, seed=0)
    half = len(work.batch.samples) // 2
    per_rank = [
        rlwire.TrainingBatch(samples=work.batch.samples[:half]),
        rlwire.TrainingBatch(samples=work.batch.samples[half:]),
    ]
    print(f"step: {work.payload_bytes / 1e6:.0f} MB of arrays, 2 ranks, to {args.dir}")
    variants = ["off", "on"] + (["on+populate"] if args.populate else [])
    variants += ["off+writers", "on+writers"] if args.writers else []
    rows: dict[str, list[tuple[list[float], list[float], list[float]]]] = {v: [] for v in variants}
    base = Path(args.dir)
    for rnd in range(args.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for variant in order:
            result = await run_variant(
                variant, per_rank, base, args.steps, args.steady, args.writers
            )
            rows[variant].append(result)
        line = ", ".join(
            f"{v} send {spread(rows[v][-1][0])} recv {spread(rows[v][-1][1])}" for v in variants
        )
        print(f"round {rnd + 1} ({'/'.join(order)}): {line} ms")

    def medians(variant: str, which: int) -> list[float]:
        return [sorted(r[which])[len(r[which]) // 2] for r in rows[variant]]

    print(
        f"\nsteps {args.steps - args.steady + 1}..{args.steps} of each run, "
        f"ranges over {args.rounds} rounds"
    )
    print(
        "| variant | send ms | receive ms (2 ranks) | end to end ms | send / off (per round) "
        "| send stall above idle ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    off = medians("off", 0)
    for v in variants:
        send, recv, stall = medians(v, 0), medians(v, 1), medians(v, 2)
        e2e = [s + r for s, r in zip(send, recv, strict=True)]
        ratio = [s / o for s, o in zip(send, off, strict=True)]
        print(
            f"| {v} | {spread(send)} | {spread(recv)} | {spread(e2e)} | "
            f"{min(ratio):.2f}-{max(ratio):.2f} | {min(stall):.1f}-{max(stall):.1f} |"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="steps per variant and round")
    p.add_argument("--steady", type=int, default=6, help="the last steps, which count")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default="/dev/shm", help="where the runs go (tmpfs)")
    p.add_argument("--populate", action="store_true", help="add the on+populate variant")
    p.add_argument("--writers", type=int, help="add off and on with this many writers")
    p.add_argument("--quick", action="store_true", help="32 samples, 4 steps, 2 rounds")
    args = p.parse_args()
    if args.quick:
        args.samples, args.steps, args.steady, args.rounds = 32, 4, 2, 2
    anyio.run(main, args)
