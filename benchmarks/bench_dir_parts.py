"""Put-to-receive latency of one part on a local directory: woken by inotify vs polling.

A producer process fills steps part by part (``sender.open_step()`` / ``writer.put``);
the receiver, in this process, waits for them with ``receiver.parts()`` (or ``aparts()``,
``--api async``). Each part carries the producer's ``time.monotonic_ns()`` taken just
before its ``put``, and the producer prints the time its ``put`` returned; a part's
latency is the receiver's clock when ``parts()`` yields it, decoded, minus either
(CLOCK_MONOTONIC is one clock for every process of a machine). Parts are put about
``--interval`` seconds apart (uniformly from half to one and a half times it, so that
puts do not fall in step with the poll), so the figure is the latency of one part, not
of a queue.

Rounds alternate between a receiver woken by inotify (the default) and one that only
polls (``storage_options={"watch": False}``), both at ``--poll-interval``, in the same
run, so the two see the same machine.

Usage::

    .venv/bin/python benchmarks/bench_dir_parts.py
    .venv/bin/python benchmarks/bench_dir_parts.py --rounds 6 --parts 200 --api async
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import rlwire


def produce(spec: dict[str, Any]) -> None:
    """The producer process: ``steps`` steps of ``parts_per_step`` parts each; prints
    ``[key, ns]`` when each ``put`` returned."""
    import anyio

    async def main() -> None:
        tokens = list(range(spec["tokens"]))
        rng = random.Random(spec["seed"])
        async with rlwire.open_sender(spec["url"]) as sender:
            for step in range(spec["steps"]):
                async with sender.open_step() as writer:
                    for i in range(spec["parts_per_step"]):
                        await anyio.sleep(spec["interval"] * rng.uniform(0.5, 1.5))
                        sample = {"token_ids": tokens, "t": time.monotonic_ns()}
                        await writer.put([sample], key=i)
                        print(json.dumps([step, i, time.monotonic_ns()]), flush=True)
            await sender.finish()

    anyio.run(main, backend=spec["backend"])


def one_round(args: argparse.Namespace, watch: bool, seed: int) -> tuple[list[float], list[float]]:
    """The latencies of every part after ``--warmup``, in ms: from the put's start, and
    from its return."""
    root = tempfile.mkdtemp(prefix="rlwire-bench-parts-", dir=args.dir)
    steps = -(-(args.parts + args.warmup) // args.parts_per_step)
    spec = {
        "url": root,
        "steps": steps,
        "parts_per_step": args.parts_per_step,
        "tokens": args.tokens,
        "interval": args.interval,
        "backend": args.backend,
        "seed": seed,
    }
    got: dict[tuple[int, int], tuple[int, int]] = {}  # (step, key): (put started, received)
    options = {"watch": watch}
    receiver = rlwire.open_receiver(
        root, type=list[dict[str, Any]], poll_interval=args.poll_interval, storage_options=options
    )
    child = subprocess.Popen(
        [sys.executable, __file__, "--produce", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        with receiver:
            if args.api == "sync":
                for step in range(steps):
                    for part in receiver.parts(timeout=60):
                        got[(step, part.key)] = (part.value[0]["t"], time.monotonic_ns())
            else:
                import anyio

                async def receive() -> None:
                    for step in range(steps):
                        async for part in receiver.aparts(timeout=60):
                            got[(step, part.key)] = (part.value[0]["t"], time.monotonic_ns())

                anyio.run(receive, backend=args.backend)
        out, err = child.communicate(timeout=60)
        if child.returncode:
            raise SystemExit(f"the producer failed:\n{err.decode()}")
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        shutil.rmtree(root, ignore_errors=True)
    returned = {(s, k): t for s, k, t in map(json.loads, out.decode().splitlines())}
    order = sorted(got)[args.warmup :]
    from_start = [(got[p][1] - got[p][0]) / 1e6 for p in order]
    from_return = [(got[p][1] - returned[p]) / 1e6 for p in order]
    return from_start, from_return


def summary(ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return f"median {statistics.median(ms):6.3f} ms, p99 {p99:6.3f} ms, max {ms[-1]:6.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--produce", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=6, help="rounds, alternating modes")
    parser.add_argument("--parts", type=int, default=150, help="parts measured per round")
    parser.add_argument("--warmup", type=int, default=10, help="parts not measured per round")
    parser.add_argument("--parts-per-step", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=2048, help="token ids in a part")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between puts")
    parser.add_argument("--poll-interval", type=float, default=0.01)
    parser.add_argument("--api", choices=("sync", "async"), default="sync")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--dir", help="where to make the directories (default: the temp dir)")
    args = parser.parse_args()
    if args.produce:
        produce(json.loads(args.produce))
        return
    modes = {"inotify": True, "polling": False}
    results: dict[str, tuple[list[float], list[float], list[float]]] = {
        mode: ([], [], []) for mode in modes
    }
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for mode in order:
            from_start, from_return = one_round(args, modes[mode], seed=r)
            results[mode][0].extend(from_start)
            results[mode][1].extend(from_return)
            results[mode][2].append(statistics.median(from_return))
    print(
        f"directory, {args.rounds} rounds x {args.parts} parts of {args.tokens} tokens, "
        f"puts ~{args.interval * 1e3:g} ms apart, poll_interval {args.poll_interval * 1e3:g} ms, "
        f"{args.api} receiver, {args.backend}"
    )
    for mode, (from_start, from_return, medians) in results.items():
        print(f"  {mode:8s} from put start:  {summary(from_start)}")
        print(
            f"  {mode:8s} from put return: {summary(from_return)}; round medians "
            f"{min(medians):.3f}-{max(medians):.3f} ms"
        )
    # From the put's start, as a ratio; from its return, as a difference (a woken
    # receiver often holds the part before put returns: medians near or below zero).
    ratio = statistics.median(results["polling"][0]) / statistics.median(results["inotify"][0])
    gain = statistics.median(results["polling"][1]) - statistics.median(results["inotify"][1])
    print(
        f"  medians, polling vs inotify: {ratio:.2f}x from put start, "
        f"{gain:+.3f} ms from put return"
    )


if __name__ == "__main__":
    main()
