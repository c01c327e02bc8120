"""Measure put-to-receive latency per part on ray://, on one node.

A producer actor (async: the board owns its parts) fills one step part by part, a part
every ``--pause`` seconds; ``--ranks`` trainer actors wait in ``aparts()`` before the
first put (or, with ``--driver``, one synchronous ``parts()`` per rank in threads of the
driver). A part's latency is the time from its ``put`` returning in the producer to
the trainer holding it decoded (``time.monotonic``, one clock for every process of the
machine). Prints the median, p90, p99 and max, in ms, and the median against the 5 ms
target of issue 28.

Usage (from the repository root)::

    PYTHONPATH=src:tests python tests/transport/ray/parts_latency.py
    PYTHONPATH=src:tests python tests/transport/ray/parts_latency.py --parts 200 --tokens 2048
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray

TARGET_MS = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=120)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of a part's sample")
    parser.add_argument("--pause", type=float, default=0.02, help="seconds between puts")
    parser.add_argument("--driver", action="store_true", help="receive in the driver (sync)")
    args = parser.parse_args()

    tests = Path(__file__).resolve().parents[2]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(tests.parent / "src"), str(tests)])
    sys.path[:0] = [str(tests.parent / "src"), str(tests)]
    from ray_actors import Producer, Trainer

    from rlwire.transport.ray import create_board, drop_board

    ray.init(
        num_cpus=4,
        object_store_memory=512 << 20,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    name = f"latency-{uuid.uuid4().hex[:8]}"
    url = f"ray://{name}"
    create_board(name)
    trainers = [] if args.driver else [Trainer.remote() for _ in range(args.ranks)]
    producer = Producer.remote()
    ray.get([t.node.remote() for t in trainers] + [producer.node.remote()])  # all started
    taking = [t.take_parts.remote(url, rank) for rank, t in enumerate(trainers)]
    got: list[list[tuple[Any, float]]] = [[] for _ in range(args.ranks)]
    threads = [
        threading.Thread(target=_take, args=(url, rank, got[rank])) for rank in range(args.ranks)
    ]
    for thread in threads if args.driver else []:
        thread.start()
    time.sleep(1.0)  # every receiver waits on the board before the first put
    keys = list(range(args.parts))
    sent = ray.get(producer.fill.remote(url, keys, args.ranks, args.pause, True, args.tokens))
    if args.driver:
        for thread in threads:
            thread.join()
    else:
        got = [[(key, held) for key, _, _, held in parts] for parts in ray.get(taking)]
    lags = sorted(1000 * (held - sent["put_at"][key]) for parts in got for key, held in parts)
    assert len(lags) == args.parts, (len(lags), args.parts)
    drop_board(name)
    ray.shutdown()

    def pct(q: float) -> float:
        return lags[min(len(lags) - 1, int(q * len(lags)))]

    median = statistics.median(lags)
    print(
        f"{args.parts} parts of {args.tokens} tokens (+ routed experts), {args.ranks} ranks "
        f"({'sync parts() in the driver' if args.driver else 'aparts() in trainer actors'}), "
        f"a put every {1000 * args.pause:.0f} ms, board-owned: {sent['board_owned']}"
    )
    print(
        f"put-to-receive ms: median {median:.2f}  p90 {pct(0.9):.2f}  p99 {pct(0.99):.2f}  "
        f"max {lags[-1]:.2f}  (target: median <= {TARGET_MS} ms: "
        f"{'met' if median <= TARGET_MS else 'NOT met'})"
    )


def _take(url: str, rank: int, into: list[tuple[Any, float]]) -> None:
    import rlwire

    with rlwire.open_receiver(url, rank=rank) as receiver:
        for part in receiver.parts(timeout=60):
            into.append((part.key, time.monotonic()))


if __name__ == "__main__":
    main()
