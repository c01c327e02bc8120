"""The encode and the checks of one column-shaped step, slice by slice, off any event loop.

What a sender does with a ``TrainingBatch`` of ``TrainingSample``s before its write: the
msgpack codec's encode (a sliced generator) with the sender's check hook, then the
queued checks of the samples (run beside the write by a sender). Each is stepped here in
this thread, every slice timed by ``time.thread_time`` (CPU time: a slice preempted by
another process on a busy machine does not look longer than it is) and by the clock;
the longest slices say how long a worker thread holds the GIL between two chances for
the event loop to take it.

Shapes as in ``bench_columns.py``: ``small`` (8,000 samples x 128 tokens) and ``dense``
(2,048 x 2,048).

Usage::

    .venv/bin/python benchmarks/encode_slices.py --shape small --rounds 10
    .venv/bin/python benchmarks/encode_slices.py --shape dense --quick   # tiny, 1 round
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Generator
from typing import Any

import msgspec
from bench_columns import FULL, QUICK, make_batch, shape_lengths

from rlwire._api.validation import ChecksBeside
from rlwire.codecs._msgpack.encode import Encoding


def stepped(slices: Generator[None, None, Any]) -> tuple[float, list[float]]:
    """Run ``slices`` to its end: the clock time it took, and each slice's CPU time."""
    cpu: list[float] = []
    began = time.perf_counter()
    while True:
        start = time.thread_time()
        try:
            next(slices)
        except StopIteration:
            cpu.append(time.thread_time() - start)
            return time.perf_counter() - began, cpu
        cpu.append(time.thread_time() - start)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=("small", "dense"), default="small")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 round: a smoke test")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    batch = make_batch(shape_lengths(args.shape, QUICK if args.quick else FULL, 0), 0)
    encoder = msgspec.msgpack.Encoder()
    rows: dict[str, list[float]] = {"encode": [], "checks": []}
    longest: dict[str, list[float]] = {"encode": [], "checks": []}
    for _ in range(args.rounds):
        gc.collect()
        hook = ChecksBeside()
        encoding = Encoding(encoder, sidecar=frozenset(), inline_threshold=4096, check=hook)
        seconds, cpu = stepped(encoding.run(batch))
        rows["encode"].append(seconds)
        longest["encode"].append(max(cpu))
        checks = hook.take()
        if checks is not None:
            seconds, cpu = stepped(checks)
            rows["checks"].append(seconds)
            longest["checks"].append(max(cpu))
    for name, times in rows.items():
        if times:
            print(
                f"{args.shape} {name}: {1e3 * min(times):.1f} ms min, "
                f"{1e3 * statistics.median(times):.1f} median; longest slice of CPU "
                f"{1e3 * statistics.median(longest[name]):.2f} ms median, "
                f"{1e3 * max(longest[name]):.2f} max"
            )


if __name__ == "__main__":
    main()
