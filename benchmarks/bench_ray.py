"""Benchmark rlwire on Ray beside Ray's own object store, end to end, on one node or two.

A producer actor (async, as a framework's rollout worker) sends 16 steps; two trainer
actors (async) each take their half of every step as numpy arrays. Per step, the time
from the producer starting to send to the later of the two trainers holding its arrays
is recorded; the table keeps the steady state (steps 8-15) of every round. Variants,
run one after another within a round, their order alternating between rounds:

* ``put-loop``: ``ray.put`` of each rank's half (a dict of batched arrays, as verl's
  DataProto or OpenRLHF's batches are) on the producer's event loop; the driver passes
  the references to the trainers, which ``ray.get`` them in a worker thread.
* ``put-thread``: the same, ``ray.put`` in a worker thread (``anyio.to_thread``): the
  baseline the targets are judged against.
* ``put-thread-read``: ``put-thread``, and each trainer then reads its arrays once (an
  xxh3 pass over their bytes: what rlwire's verification costs a trainer, and what a
  training step's first pass over the arrays costs anyway, page faults included). Not
  a target's baseline: it tells the first touch of the data from the checksums.
* ``ray``: ``open_sender("ray://NAME").send_ranks([half0, half1])`` of the step as a
  ``TrainingBatch`` of per-sample ``TrainingSample``s; each trainer ``areceive``s its
  rank from ``open_receiver``.
* ``ray-packed``: the same batched arrays ``put-thread`` puts, sent as they are held
  (``TrainingBatch(samples=rlwire.Columns(...))``, a ``Ragged`` per field over the
  array's memory: no gather), received with ``as_columns=True``.
* ``ray-dicts``: those very dicts sent as they are (``send_ranks(dicts)``), received with
  ``type=dict``: the program of the how-to "Coming from ray.put".
* ``-packed`` and ``-dicts`` after ``files`` or ``files-recycle`` send the step held so
  through the directory (``files-recycle-packed``, ...).
* ``files``: the same through a directory on tmpfs (``keep_last=2``); one node only.
* ``files-recycle``: the same with the directory sink recycling retired files
  (``storage_options={"recycle": True}``), where the installed rlwire offers it.
* ``-unchecked`` after any rlwire variant (``ray-packed-unchecked``) sends without
  checksums (``checksum=False``): no hash at the producer, nothing to verify at the
  trainers. Not what rlwire does by default; it tells the cost of the checksums apart.

Shapes: ``moe`` (256 samples x 4,096 tokens with routed_experts uint8 [4096, 48, 8],
~425 MB) and ``dense`` (2,048 x 2,048, no routed experts, ~88 MB). Every send runs under
:class:`rlwire.LagMonitor` in the producer, followed by the idle loop under the same
monitor for as long; the table gives the worst stall above the idle loop's worst gap,
that stall beside ``put-thread``'s (the difference of the rounds' medians: on a shared
machine the idle loop misses what the trainers' work does to the producer's core while
it sends), and the most anonymous memory (RssAnon: the object store's shared pages are not
counted) the producer held during the send above what it held before its sender opened.
``--nodes 2`` starts a ``ray.cluster_utils.Cluster`` of two nodes (a raylet and object
store each, on this machine): the producer on one, the trainers on the other, so every
step crosses Ray's object transfer.

Usage::

    .venv/bin/python benchmarks/bench_ray.py                        # both shapes, one node
    .venv/bin/python benchmarks/bench_ray.py --nodes 2 --rounds 4
    .venv/bin/python benchmarks/bench_ray.py --quick                # tiny, 1 round
    .venv/bin/python benchmarks/bench_ray.py --variants put-thread,files-recycle-packed --writers 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import anyio
import numpy as np
import ray
import xxhash

import rlwire
from rlwire.transport.ray import drop_board

SHAPES = {"moe": (256, 4096, True), "dense": (2048, 2048, False)}
QUICK = {"moe": (16, 256, True), "dense": (64, 256, False)}
VARIANTS = (
    "put-loop",
    "put-thread",
    "put-thread-read",
    "ray",
    "ray-packed",
    "ray-dicts",
    "files",
    "files-recycle",
)
BASELINE = "put-thread"
TARGETS = {("moe", "ray", 1): 1.1, ("dense", "ray", 1): 1.0, ("moe", "files-recycle", 1): 1.5}
TARGETS |= {("moe", "ray", 2): 1.0, ("dense", "ray", 2): 1.0}


def make_half(samples: int, tokens: int, moe: bool, seed: int) -> rlwire.TrainingBatch:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(samples):
        out.append(
            rlwire.TrainingSample(
                token_ids=rng.integers(0, 150_000, tokens),
                mask=rng.random(tokens) < 0.9,
                env_name="bench",
                logprobs=-rng.random(tokens, np.float32),
                temperatures=np.ones(tokens, np.float32),
                advantages=rng.standard_normal(tokens, np.float32),
                routed_experts=rng.integers(0, 64, (tokens, 48, 8), np.uint8) if moe else None,
            )
        )
    return rlwire.TrainingBatch(samples=out)


def as_dict(batch: rlwire.TrainingBatch) -> dict[str, np.ndarray]:
    """The half as a framework holds it: one batched array per field."""
    names = ["token_ids", "mask", "logprobs", "temperatures", "advantages"]
    if batch.samples[0].routed_experts is not None:
        names.append("routed_experts")
    return {n: np.stack([getattr(s, n) for s in batch.samples]) for n in names}


def as_columns(half: dict[str, np.ndarray]) -> rlwire.TrainingBatch:
    """The same batched arrays sent as they are held: one column each, no gather."""
    rows, tokens = half["token_ids"].shape[:2]
    lengths = np.full(rows, tokens)
    columns: dict[str, Any] = {
        n: rlwire.Ragged.from_lengths(a.reshape(rows * tokens, *a.shape[2:]), lengths)
        for n, a in half.items()
    }
    columns["env_name"] = ["bench"] * rows
    return rlwire.TrainingBatch(samples=rlwire.Columns(columns))


def anon_mb() -> float:
    """This process's anonymous resident memory (RssAnon), in MB: the object store's
    shared pages, which a put writes through, are not counted."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


class PeakMemory:
    """The most anonymous memory above ``base`` (MB), sampled every 5 ms in a thread."""

    def __init__(self, base: float) -> None:
        self.base = base

    def __enter__(self) -> PeakMemory:
        self.peak = anon_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, anon_mb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_mb())

    @property
    def extra(self) -> float:
        return self.peak - self.base


async def idle_gap(seconds: float) -> float:
    async with rlwire.LagMonitor() as lag:
        await anyio.sleep(seconds)
    return lag.max


@ray.remote
class Producer:
    def __init__(self, shape: tuple[int, int, bool], seed: int) -> None:
        samples, tokens, moe = shape
        self.halves = [make_half(samples // 2, tokens, moe, seed + r) for r in range(2)]
        self.dicts = [as_dict(h) for h in self.halves]
        self.sent = {
            "samples": self.halves,
            "packed": [as_columns(d) for d in self.dicts],
            "dicts": self.dicts,
        }
        self.sender: Any = None
        self.base = anon_mb()  # the steps' data made, no sender yet

    async def open(self, url: str, **options: Any) -> None:
        self.base = anon_mb()
        self.sender = rlwire.open_sender(url, on_existing="overwrite", **options)
        await self.sender.aopen()

    async def close(self) -> None:
        if self.sender is not None:
            await self.sender.aclose()
            self.sender = None

    async def send(self, variant: str) -> tuple[list[Any], float, float, float, float]:
        """(references or [], start time, worst stall in ms, seconds taken, the most MB
        of the producer's own memory above what it held before the sender opened: what
        the sender keeps from step to step included)."""
        began = time.time()
        with PeakMemory(self.base) as memory:
            async with rlwire.LagMonitor() as lag:
                t0 = time.perf_counter()
                if variant == "put-loop":
                    refs = [ray.put(d) for d in self.dicts]
                elif variant.startswith("put-thread"):
                    refs = [await anyio.to_thread.run_sync(ray.put, d) for d in self.dicts]
                else:
                    await self.sender.send_ranks(self.sent[held_as(variant)[1]])
                    refs = []
                took = time.perf_counter() - t0
        return refs, began, lag.max * 1e3, took, memory.extra

    async def idle(self, seconds: float) -> float:
        """The idle loop's worst gap over ``seconds``, in ms."""
        return await idle_gap(max(seconds, 0.05)) * 1e3


@ray.remote
class Trainer:
    def __init__(self) -> None:
        self.receiver: Any = None

    async def open(self, url: str, rank: int, **options: Any) -> None:
        self.receiver = rlwire.open_receiver(url, rank=rank, **options)

    async def close(self) -> None:
        if self.receiver is not None:
            await self.receiver.aclose()
            self.receiver = None

    async def take(self, refs: list[Any] | None, read: bool = False) -> float:
        """The time this rank holds its arrays (and, with ``read``, has read them once)."""
        if refs is None:
            batch = await self.receiver.areceive(timeout=120)
            if isinstance(batch, dict):
                assert batch["advantages"].dtype == np.float32
            elif isinstance(batch.samples, rlwire.Columns):
                assert batch.samples["advantages"].values.dtype == np.float32
            else:
                assert batch.samples[-1].advantages.dtype == np.float32
        else:
            half = await refs[0]  # as an async actor awaits an object (asyncio)
            assert half["advantages"].dtype == np.float32
            if read:
                for array in half.values():
                    xxhash.xxh3_64_intdigest(array.data)
        return time.time()


def held_as(variant: str) -> tuple[str, str]:
    """An rlwire variant's destination (``ray``, ``files``, ``files-recycle``) and how its
    producer holds the step: ``samples``, or the batched arrays ``packed`` as columns, or
    ``dicts`` (``ray-packed``, ``files-recycle-dicts``, ...)."""
    variant = variant.removesuffix("-unchecked")
    for held in ("packed", "dicts"):
        if variant.endswith(f"-{held}"):
            return variant.removesuffix(f"-{held}"), held
    return variant, "samples"


def url_of(variant: str, root: str, writers: int | None = None) -> tuple[str, dict[str, Any]]:
    where = held_as(variant)[0]
    options: dict[str, Any] = {"keep_last": 2}
    if variant.endswith("-unchecked"):
        options["checksum"] = False
    if where == "ray":
        return f"ray://bench-{uuid.uuid4().hex[:8]}", options
    path = tempfile.mkdtemp(dir=root)
    storage: dict[str, Any] = {"writers": writers} if writers else {}
    if where == "files-recycle":
        storage["recycle"] = True
    if storage:
        options["storage_options"] = storage
    return path, options


def run_variant(
    variant: str,
    producer: Any,
    trainers: list[Any],
    steps: int,
    root: str,
    writers: int | None = None,
) -> list[tuple[float, float, float]]:
    """(end to end ms, stall above idle ms, extra producer MB) of every step; a
    directory's sender with the storage option ``writers`` if given."""
    rlwire_side = not variant.startswith("put-")
    if rlwire_side:
        url, options = url_of(variant, root, writers)
        ray.get(producer.open.remote(url, **options))
        received = {"packed": {"as_columns": True}, "dicts": {"type": dict}}
        taken = received.get(held_as(variant)[1], {})
        ray.get([t.open.remote(url, r, **taken) for r, t in enumerate(trainers)])
    out = []
    try:
        for _ in range(steps):
            if rlwire_side:
                takes = [t.take.remote(None) for t in trainers]
                _, began, stall, took, extra = ray.get(producer.send.remote(variant))
            else:  # the single-controller pattern: references pass through the driver
                refs, began, stall, took, extra = ray.get(producer.send.remote(variant))
                read = variant.endswith("-read")
                takes = [t.take.remote([r], read) for t, r in zip(trainers, refs, strict=True)]
            done = max(ray.get(takes))
            idle = ray.get(producer.idle.remote(took))
            out.append(((done - began) * 1e3, stall - idle, extra))
    finally:
        if rlwire_side:
            ray.get([t.close.remote() for t in trainers])
            ray.get(producer.close.remote())
            if url.startswith("ray://"):
                # The board keeps its last steps after the sender closes: drop it, or
                # every round's steps stay in the store and later rounds spill to disk.
                drop_board(url.removeprefix("ray://"))
            else:
                shutil.rmtree(url, ignore_errors=True)
    return out


def start(nodes: int) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Ray with the producer's and the trainers' placement options."""
    store = 2 * 1024**3
    if nodes == 1:
        ray.init(num_cpus=4, object_store_memory=store, include_dashboard=False)
        return None, {}, {}
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    cluster.add_node(num_cpus=2, object_store_memory=store, resources={"producer": 1})
    cluster.add_node(num_cpus=3, object_store_memory=store, resources={"trainer": 2})
    ray.init(address=cluster.address, include_dashboard=False)
    return cluster, {"resources": {"producer": 1}}, {"resources": {"trainer": 1}}


def has_recycle() -> bool:
    try:
        probe = tempfile.mkdtemp()
        rlwire.open_sender(probe, keep_last=2, storage_options={"recycle": True})
        return True
    except rlwire.ConfigError:
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def spread(values: list[float], spec: str = ".1f") -> str:
    return f"{statistics.median(values):{spec}} ({min(values):{spec}}…{max(values):{spec}})"


def round_medians(
    rounds: list[list[tuple[float, float, float]]], steady: slice, column: int
) -> list[float]:
    """Each round's median over its ``steady`` steps of one column (0: end to end ms,
    1: stall above idle ms, 2: extra producer MB)."""
    return [statistics.median(step[column] for step in rnd[steady]) for rnd in rounds]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="moe,dense")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="tiny steps, 1 round, 4 steps")
    parser.add_argument("--writers", type=int, help="the directory sink's storage option")
    args = parser.parse_args(argv)
    shapes = QUICK if args.quick else SHAPES
    rounds, steps = (1, 4) if args.quick else (args.rounds, args.steps)
    steady = slice(steps // 2, steps)
    variants = [v for v in args.variants.split(",") if v]
    if args.nodes == 2:
        variants = [v for v in variants if not v.startswith("files")]
    if any(v.startswith("files-recycle") for v in variants) and not has_recycle():
        print("files-recycle: this rlwire has no recycling; left out", file=sys.stderr)
        variants = [v for v in variants if not v.startswith("files-recycle")]
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    cluster, at_producer, at_trainer = start(args.nodes)
    print(f"Command: `python benchmarks/bench_ray.py {' '.join(argv or sys.argv[1:])}`")
    print(f"ray {ray.__version__}, rlwire {rlwire.__version__}, {args.nodes} node(s)\n")
    print("| shape | variant | end to end ms | ratio to put-thread | stall above idle ms |", end="")
    print(" stall beside put-thread ms | extra producer MB | target |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    try:
        for shape in args.shapes.split(","):
            producer = Producer.options(**at_producer).remote(shapes[shape], 0)
            trainers = [Trainer.options(**at_trainer).remote() for _ in range(2)]
            results: dict[str, list[list[tuple[float, float, float]]]] = {v: [] for v in variants}
            for r in range(rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for variant in order:
                    results[variant].append(
                        run_variant(variant, producer, trainers, steps, root, args.writers)
                    )
                print(f"  {shape}: round {r + 1} done", file=sys.stderr)
            base = round_medians(results[BASELINE], steady, 0)
            # The anchor's own stall, round by round: on a shared machine the idle loop
            # misses what the trainers' work does to the producer's core meanwhile.
            base_stall = round_medians(results[BASELINE], steady, 1)
            for variant in variants:
                ends = [e for rnd in results[variant] for e, _, _ in rnd[steady]]
                stalls = [s for rnd in results[variant] for _, s, _ in rnd[steady]]
                extras = [m for rnd in results[variant] for _, _, m in rnd[steady]]
                mine = round_medians(results[variant], steady, 0)
                ratios = [m / b for m, b in zip(mine, base, strict=True)] if base else [0.0]
                mine_stall = round_medians(results[variant], steady, 1)
                beside = [m - b for m, b in zip(mine_stall, base_stall, strict=True)] or [0.0]
                target = TARGETS.get((shape, variant, args.nodes))
                goal = f"≤ {target:.1f}x" if target else ""
                print(
                    f"| {shape} | {variant} | {spread(ends)} | {spread(ratios, '.2f')} | "
                    f"{spread(stalls)} | {spread(beside)} | {spread(extras)} | {goal} |"
                )
            for actor in (producer, *trainers):
                ray.kill(actor)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


if __name__ == "__main__":
    main()
