"""Put-to-receive latency of one part over ZeroMQ on one machine.

A producer process fills steps part by part (``sender.open_step()`` / ``writer.put``);
the receiver, in this process, reads them with ``receiver.parts()``. Each part carries
the producer's ``time.monotonic_ns()`` taken just before its ``put``; the latency of a
part is the receiver's clock when ``parts()`` yields it, decoded, minus that stamp
(CLOCK_MONOTONIC is one clock for every process of a machine). Parts are put
``--interval`` seconds apart, so the figure is the latency of one part, not of a queue.

Usage::

    .venv/bin/python benchmarks/bench_zmq_parts.py                  # zmq+ipc, asyncio
    .venv/bin/python benchmarks/bench_zmq_parts.py --kind tcp --parts 2000 --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import rlwire


def produce(spec: dict[str, Any]) -> None:
    """The producer process: ``steps`` steps of ``parts_per_step`` parts each."""
    import anyio

    async def main() -> None:
        tokens = list(range(spec["tokens"]))
        async with rlwire.open_sender(spec["url"]) as sender:
            for _ in range(spec["steps"]):
                async with sender.open_step() as writer:
                    for i in range(spec["parts_per_step"]):
                        await anyio.sleep(spec["interval"])
                        sample = {"token_ids": tokens, "t": time.monotonic_ns()}
                        await writer.put([sample], key=i)
            await sender.finish()

    anyio.run(main, backend=spec["backend"])


def measure(args: argparse.Namespace) -> list[float]:
    """The latency of every part, in milliseconds, after ``--warmup`` parts."""
    url = (
        f"zmq+ipc://{tempfile.mkdtemp()}/bench.sock"
        if args.kind == "ipc"
        else f"zmq+tcp://127.0.0.1:{args.port}"
    )
    steps = -(-(args.parts + args.warmup) // args.parts_per_step)
    spec = {
        "url": url,
        "steps": steps,
        "parts_per_step": args.parts_per_step,
        "tokens": args.tokens,
        "interval": args.interval,
        "backend": args.backend,
    }
    latencies: list[float] = []
    with rlwire.open_receiver(url, type=list[dict[str, Any]]) as receiver:
        child = subprocess.Popen(
            [sys.executable, __file__, "--produce", json.dumps(spec)], stderr=subprocess.PIPE
        )
        try:
            for _ in range(steps):
                for part in receiver.parts(timeout=60):
                    now = time.monotonic_ns()
                    latencies.append((now - part.value[0]["t"]) / 1e6)
            _, err = child.communicate(timeout=60)
            if child.returncode:
                raise SystemExit(f"the producer failed:\n{err.decode()}")
        finally:
            child.kill()
            child.wait()
    return latencies[args.warmup :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--produce", help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("ipc", "tcp"), default="ipc")
    parser.add_argument("--port", type=int, default=5611)
    parser.add_argument("--parts", type=int, default=1000, help="parts measured")
    parser.add_argument("--warmup", type=int, default=50, help="parts not measured")
    parser.add_argument("--parts-per-step", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=1024, help="token ids in a part")
    parser.add_argument("--interval", type=float, default=0.002, help="seconds between puts")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    if args.produce:
        produce(json.loads(args.produce))
        return
    ms = sorted(measure(args))
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    print(
        f"zmq+{args.kind}, {len(ms)} parts of {args.tokens} tokens, {args.backend} producer: "
        f"median {statistics.median(ms):.3f} ms, p99 {p99:.3f} ms, max {ms[-1]:.3f} ms"
    )


if __name__ == "__main__":
    main()
