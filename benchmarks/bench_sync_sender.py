"""Benchmark the synchronous sender against the async one: the time of one send.

For each batch size, each round runs four trials in ABBA order (async, sync, sync,
async, then the other way round in the next round), so drift and order effects hit
both alike. A trial opens a sender on a fresh directory (untimed), sends the same batch
``--sends`` times as consecutive steps, timing each call, and closes the sender
(untimed):

* async: ``anyio.run`` around ``rlwire.open_sender``; each ``await sender.send(batch)``
  is timed inside the event loop.
* sync: ``open_sync_sender``; each ``sender.send(batch)`` is timed in the calling
  thread, so it includes handing the call to the sender's event-loop thread and back.

Both senders use ``sidecar=("routed_experts",)``. The batches are made by
:func:`rlwire.testing.make_batch`; ``empty`` (a TrainingBatch with no samples) shows the
fixed cost of a call. Per row: the median of all timed sends, their range, and the ratio
of the sync median to the async median; the per-round ratios (sum of the round's sync
sends / sum of its async sends) show the spread of that ratio.

Usage::

    .venv/bin/python benchmarks/bench_sync_sender.py            # 10 rounds
    .venv/bin/python benchmarks/bench_sync_sender.py --quick    # 2 rounds, a sanity run
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import anyio
import numpy as np

import rlwire
from rlwire._api.sync_sender import open_sync_sender
from rlwire.testing import make_batch

MB = 1e6  # decimal megabytes throughout

#: The sync sender's median send time may exceed the async one's by this factor.
TARGET_RATIO = 1.05

#: name -> (samples, tokens of the first sample); routed_experts of 48 layers x top-8.
SIZES: dict[str, tuple[int, int]] = {"100 MB": (32, 8192), "4 MB": (4, 2560), "empty": (0, 0)}
LAYERS, TOPK = 48, 8

OPTIONS = {"sidecar": ("routed_experts",), "on_existing": "overwrite"}


# -- the trials ------------------------------------------------------------------------


def async_trial(path: Path, batch: rlwire.TrainingBatch, sends: int) -> list[float]:
    """Seconds of each ``await sender.send(batch)``, in one ``anyio.run``."""

    async def main() -> list[float]:
        times = []
        async with rlwire.open_sender(path, **OPTIONS) as sender:
            for _ in range(sends):
                gc.collect()
                t0 = time.perf_counter()
                await sender.send(batch)
                times.append(time.perf_counter() - t0)
        return times

    return anyio.run(main)


def sync_trial(path: Path, batch: rlwire.TrainingBatch, sends: int) -> list[float]:
    """Seconds of each ``sender.send(batch)`` of a SyncSender."""
    times = []
    with open_sync_sender(path, **OPTIONS) as sender:
        for _ in range(sends):
            gc.collect()
            t0 = time.perf_counter()
            sender.send(batch)
            times.append(time.perf_counter() - t0)
    return times


TRIALS: dict[str, Callable[[Path, rlwire.TrainingBatch, int], list[float]]] = {
    "async": async_trial,
    "sync": sync_trial,
}


def call_round_trip(root: Path, calls: int) -> list[float]:
    """Seconds of each of ``calls`` no-op calls through a SyncSender's event-loop thread
    (``SyncSender._call``): the fixed cost a sync send adds to an async one."""

    async def noop() -> None:
        pass

    times = []
    path = root / "round-trip"
    try:
        with open_sync_sender(path, **OPTIONS) as sender:
            for _ in range(calls):
                t0 = time.perf_counter()
                sender._call(noop)
                times.append(time.perf_counter() - t0)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return times


@dataclass
class Row:
    name: str
    payload: int  # bytes the batch holds
    times: dict[str, list[float]] = field(default_factory=lambda: {"async": [], "sync": []})
    round_ratios: list[float] = field(default_factory=list)


def run_size(name: str, args: argparse.Namespace, root: Path) -> Row:
    samples, tokens = SIZES[name]
    if samples:
        batch = make_batch(samples, tokens, layers=LAYERS, topk=TOPK)
    else:
        batch = rlwire.TrainingBatch(samples=[])
    payload = sum(
        value.nbytes
        for sample in batch.samples
        for value in vars_of(sample)
        if isinstance(value, np.ndarray)
    )
    row = Row(name, payload)
    for r in range(args.warmup + args.repeats):
        order = ["async", "sync", "sync", "async"]
        if r % 2:
            order.reverse()
        round_times: dict[str, list[float]] = {"async": [], "sync": []}
        for i, kind in enumerate(order):
            path = root / f"{kind}-{r}-{i}"
            try:
                round_times[kind] += TRIALS[kind](path, batch, args.sends)
            finally:
                shutil.rmtree(path, ignore_errors=True)
        keep = r >= args.warmup
        if keep:
            for kind, values in round_times.items():
                row.times[kind] += values
            row.round_ratios.append(sum(round_times["sync"]) / sum(round_times["async"]))
        progress(
            f"  {name} {'round' if keep else 'warm-up'} {r}: "
            + ", ".join(
                f"{kind} {statistics.median(v) * 1e3:.3f} ms" for kind, v in round_times.items()
            )
        )
    return row


def vars_of(sample: rlwire.TrainingSample) -> list[object]:
    return [getattr(sample, f) for f in sample.__struct_fields__]


# -- reporting -------------------------------------------------------------------------


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def report(
    rows: list[Row], trips: list[float], args: argparse.Namespace, argv: list[str], root: Path
) -> str:
    out: list[str] = []
    w = out.append
    w(f"Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_sync_sender.py', *argv])}`")
    w("")
    w(
        f"Dir: {root.parent}; {args.repeats} round(s) after {args.warmup} warm-up round(s), "
        f"each async, sync, sync, async (reversed every other round), {args.sends} timed "
        f"sends per trial, so {4 * args.sends // 2} sends per round and kind."
    )
    w(
        f"Python {platform.python_version()}, numpy {np.__version__}, anyio "
        f"{version('anyio')}, rlwire {rlwire.__version__}; {os.cpu_count()} CPUs."
    )
    w("")
    w(
        "| batch | payload MB | async ms (median) | async range | sync ms (median) "
        "| sync range | sync / async | per-round ratio median (range) | target | met? |"
    )
    w("|---|---:|---:|---|---:|---|---:|---|---|---|")
    for row in rows:
        a, s = row.times["async"], row.times["sync"]
        ratio = statistics.median(s) / statistics.median(a)
        rr = row.round_ratios
        rounds = f"{statistics.median(rr):.3f} ({min(rr):.3f} to {max(rr):.3f})"
        target, met = f"≤ {TARGET_RATIO}", yes(ratio <= TARGET_RATIO)
        if row.payload == 0:
            target, met = "— (fixed cost of a call)", "—"
        w(
            f"| {row.name} | {row.payload / MB:.1f} | {ms(statistics.median(a))} "
            f"| {ms(min(a))} to {ms(max(a))} | {ms(statistics.median(s))} "
            f"| {ms(min(s))} to {ms(max(s))} | {ratio:.3f} | {rounds} | {target} | {met} |"
        )
    w("")
    w(
        "Times are of the send call alone (sender already open). sync / async: median of "
        "the sync sends over median of the async sends (the target applies to it); "
        "per-round ratio: each round's summed sync send time over its summed async send "
        "time. MB = 10^6 bytes."
    )
    for row in rows:
        w(f"Per-round ratios, {row.name}: " + ", ".join(f"{x:.3f}" for x in row.round_ratios))
    trips = sorted(trips)
    w(
        f"Round trip of one call to the sync sender's thread ({len(trips)} no-op calls "
        f"through SyncSender._call): median {statistics.median(trips) * 1e6:.0f} µs, "
        f"p90 {trips[int(0.9 * (len(trips) - 1))] * 1e6:.0f} µs."
    )
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------


def default_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark the synchronous sender's send against the async sender's."
    )
    p.add_argument(
        "--dir",
        default=default_dir(),
        help="where to write (default /dev/shm if it exists, else the temp dir); a "
        "fresh subdirectory is created and removed",
    )
    p.add_argument("--repeats", type=int, default=None, help="measured rounds (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default 1)")
    p.add_argument("--sends", type=int, default=None, help="timed sends per trial (default 3)")
    p.add_argument(
        "--sizes",
        nargs="+",
        choices=list(SIZES),
        default=list(SIZES),
        help="batch sizes to run (default: all)",
    )
    p.add_argument("--quick", action="store_true", help="2 rounds of 2 sends: a sanity run")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 10
    if args.sends is None:
        args.sends = 2 if args.quick else 3
    if args.repeats < 1 or args.sends < 1 or args.warmup < 0:
        p.error("--repeats and --sends must be positive, --warmup non-negative")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="rlwire-bench-sync-", dir=args.dir))
    try:
        rows = [run_size(name, args, root) for name in args.sizes]
        trips = call_round_trip(root, 500 if args.quick else 2000)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(rows, trips, args, argv, root))
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
