"""Benchmark what the life-of-a-run features add to each step: consumption marks and
retention (``keep_last``, ``max_ahead``), and the per-step statistics.

Rows, in the same run:

* plain: per step, ``await sender.send_ranks(per_rank)`` to a directory, then each rank's
  receiver (``record_consumed=False``) receives the step and looks for the next
  (``wait(timeout=0)``); nothing is deleted, so the directory grows.
* retention: the same with ``open_sender(..., keep_last=2, max_ahead=4)`` and receivers
  that record what they consumed (the default): each receiver writes its mark once per
  step, and the sender reads the marks and deletes a step before each send.
  ``(retention - plain) / ranks`` is the cost per step and rank (target: at most 1 ms).
* encode, untimed / timed: the msgpack codec's ``encode_sliced`` of a dict of three
  lists of ``--list-items`` ints, floats and bools (about a hundred slices) run to the
  end, bare and wrapped in the clock that fills ``SendStats``
  (``rlwire._core.slicing.timed``): the statistics' whole cost, as a ratio.

Each round runs plain, retention, retention, plain (ABBA), then encode untimed, timed,
timed, untimed; medians and ranges over the rounds.

Usage::

    .venv/bin/python benchmarks/bench_lifecycle.py            # 200 steps per row and round
    .venv/bin/python benchmarks/bench_lifecycle.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import anyio

import rlwire
from rlwire._core.slicing import run_sliced, timed
from rlwire.codecs import make_codec
from rlwire.testing import make_batch


def default_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


async def steps_seconds(root: Path, args: argparse.Namespace, *, retention: bool) -> float:
    """Seconds per step: send to every rank, then every rank receives it and moves on."""
    path = Path(tempfile.mkdtemp(dir=root))
    per_rank = [make_batch(args.samples, args.tokens, seed=r) for r in range(args.ranks)]
    options = {"keep_last": 2, "max_ahead": 4} if retention else {}
    receivers = [
        rlwire.open_receiver(path, rank=r, record_consumed=retention) for r in range(args.ranks)
    ]
    try:
        async with rlwire.open_sender(path, **options) as sender:  # type: ignore[arg-type]
            began = time.perf_counter()
            for _ in range(args.steps):
                await sender.send_ranks(per_rank)
                for receiver in receivers:
                    receiver.receive(timeout=10)
                    receiver.wait_next(timeout=0)
            took = time.perf_counter() - began
        if retention:
            assert len(list(path.glob("step-*.rank-0000.rlw"))) <= 2
    finally:
        for receiver in receivers:
            receiver.close()
        shutil.rmtree(path)
    return took / args.steps


def encode_seconds(args: argparse.Namespace, *, clocked: bool) -> float:
    codec = make_codec("msgpack")
    # List-typed data, as users' own types hold it: about a hundred slices per encode.
    n = args.list_items
    batch = {"ids": list(range(n)), "logprobs": [-0.5] * n, "mask": [True] * n}
    began = time.perf_counter()
    for _ in range(args.encodes):
        slices = codec.encode_sliced(batch)
        run_sliced(timed(slices, {"encode": 0.0}, "encode") if clocked else slices)
    return (time.perf_counter() - began) / args.encodes


def spread(values: list[float], scale: float = 1e3) -> str:
    return (
        f"{statistics.median(values) * scale:.3f} "
        f"({min(values) * scale:.3f}-{max(values) * scale:.3f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--samples", type=int, default=2, help="samples per rank and step")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per sample")
    p.add_argument("--steps", type=int, default=200, help="steps per row and round")
    p.add_argument("--encodes", type=int, default=5, help="encodes per row and round")
    p.add_argument("--list-items", type=int, default=1_000_000, help="items per list")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=default_dir())
    p.add_argument("--quick", action="store_true", help="30 steps, 2 encodes, 3 rounds")
    args = p.parse_args()
    if args.quick:
        args.steps, args.encodes, args.repeats = 30, 2, 3
    root = Path(tempfile.mkdtemp(prefix="rlwire-bench-", dir=args.dir))
    rows: dict[str, list[float]] = {"plain": [], "retention": [], "untimed": [], "timed": []}
    try:
        for _ in range(args.repeats):
            for retention in (False, True, True, False):
                seconds = anyio.run(
                    lambda r=retention: steps_seconds(root, args, retention=r)  # type: ignore[misc]
                )
                rows["retention" if retention else "plain"].append(seconds)
            for clocked in (False, True, True, False):
                rows["timed" if clocked else "untimed"].append(
                    encode_seconds(args, clocked=clocked)
                )
    finally:
        shutil.rmtree(root)
    added = [(r - p) / args.ranks for r, p in zip(rows["retention"], rows["plain"], strict=True)]
    ratio = [t / u for t, u in zip(rows["timed"], rows["untimed"], strict=True)]
    print(
        f"{args.ranks} ranks, {args.samples} samples x {args.tokens} tokens per rank, "
        f"{args.steps} steps per row and round, {args.repeats} rounds, dir {args.dir}"
    )
    print("| row | ms, median (range) |")
    print("|---|---:|")
    print(f"| step, plain | {spread(rows['plain'])} |")
    print(f"| step, marks + keep_last=2 + max_ahead=4 | {spread(rows['retention'])} |")
    print(f"| added per step and rank | {spread(added)} |")
    print(f"| encode, bare | {spread(rows['untimed'])} |")
    print(f"| encode, with the stats clock | {spread(rows['timed'])} |")
    print(f"\nstats clock / bare encode: {spread(ratio, 1)} (ratio)")


if __name__ == "__main__":
    main()
