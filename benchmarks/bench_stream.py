"""Streaming parts (issue 28, shape "stream"): groups put as they finish, two ranks take them.

One producer fills one step part by part: 256 groups of 16 ``TrainingSample``s of 1-8k
tokens each (``bench_columns.make_batch``: token_ids int64, mask, logprobs, temperatures,
advantages; no routed_experts, which at 384 bytes a token would make the step 7 GB),
each group finishing at a seeded random time over ``--seconds`` (uniform), and put by
its own task as soon as it finishes (``sender.open_step()``, one ``writer.put`` per
group, default balance: fewest tokens). Two ranks each take their parts with
``receiver.aparts()`` as they come, each in a process of its own: subprocesses for a
directory (tmpfs), S3 (a moto server on loopback) and ZeroMQ ipc; for Ray (a local
cluster, ``ray.init(address="local")``) the producer and both receivers are async
actors (the board owns the producer's parts), so the Ray producer's loop is asyncio
whatever ``--backend`` says.

Per sink it reports:

* **last put -> last part**: from the last ``put`` returning to the last rank holding
  its last part, decoded (target <= 50 ms on a directory and ZeroMQ);
* **latency**: put returning -> receiver holding the decoded part, per part, median and
  p99 (targets: directory <= 5 ms, ZeroMQ ipc <= 1 ms, S3 <= one poll interval + one
  GET, Ray <= 5 ms). Every process stamps ``time.monotonic_ns()``: CLOCK_MONOTONIC is
  one clock for every process of a Linux machine;
* **imbalance**: the two ranks' token totals at the seal, their difference against the
  largest group's tokens (the bound: difference <= largest group);
* **stall**: the producer's worst event-loop stall (``rlwire.LagMonitor``, 1 ms sleeps)
  while it streams, beside two idle loops: the same loop, idle, over as long just
  before, in the same process; and a bystander, an idle asyncio loop in a process of
  its own over the same time (its worst gap in the producer's streaming window): what
  the machine's scheduler alone costs a loop while the receivers (and the S3 server)
  share its CPUs. Target: <= 2 ms above the larger of the two.

A full garbage collection (generation 2) stalls a loop for as long as it walks the
process's heap, in whichever thread's allocation set it off: here the pre-made groups
and the libraries' own objects (botocore's S3 model) make ~100k objects, and one such
collection in s3fs's I/O thread cost 57-85 ms. A long-running producer keeps its
set-up objects out of the collector (``gc.freeze()``); so does this one, after making
the groups and opening the sender (``--no-gc-freeze`` to measure without). The full
collections that still ran while streaming are counted under the table.

Usage::

    .venv/bin/python benchmarks/bench_stream.py                       # every sink, asyncio
    .venv/bin/python benchmarks/bench_stream.py --sinks file,zmq-ipc --backend trio
    .venv/bin/python benchmarks/bench_stream.py --quick               # 32 groups, ~2 s
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import rlwire

HERE = Path(__file__).resolve().parent
SINKS = ("file", "s3", "zmq-ipc", "ray")
RANKS = 2
#: Median put-to-receive latency targets of issue 28, ms (S3: one poll interval + one GET).
LATENCY_TARGET_MS = {"file": 5.0, "zmq-ipc": 1.0, "ray": 5.0}
#: From the last put returning to the last rank holding its last part, ms.
DRAIN_TARGET_MS = {"file": 50.0, "zmq-ipc": 50.0}
STALL_TARGET_MS = 2.0
S3_OPTIONS = {
    "key": "testing",
    "secret": "testing",
    "client_kwargs": {"region_name": "us-east-1"},
}


# -- the workload ----------------------------------------------------------------------


def schedule(args: argparse.Namespace) -> dict[str, Any]:
    """The seeded shape: each group's sample lengths and its finishing time (seconds)."""
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(args.min_tokens, args.max_tokens + 1, (args.groups, args.samples))
    finish = np.sort(rng.uniform(0.0, args.seconds, args.groups))
    order = rng.permutation(args.groups)  # groups finish in no particular key order
    return {
        "lengths": lengths.tolist(),
        "finish": {int(g): float(t) for g, t in zip(order, finish, strict=True)},
        "seconds": args.seconds,
        "seed": args.seed,
    }


def make_groups(spec: dict[str, Any]) -> list[list[rlwire.TrainingSample]]:
    from bench_columns import make_batch  # beside this file

    return [
        list(make_batch(lengths, seed=spec["seed"] + g).samples)
        for g, lengths in enumerate(spec["lengths"])
    ]


# -- the two ends, in whichever process runs them ----------------------------------------


async def produce(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the sender, watch the idle loop for the stream's duration, then stream the
    step; when each put returned, the assignment and both loops' worst gaps."""
    groups = make_groups(spec)  # made before anything is timed
    finish = {int(g): t for g, t in spec["finish"].items()}
    put_at: dict[int, int] = {}
    options = spec.get("storage_options") or None
    full_collections: list[float] = []
    async with rlwire.open_sender(spec["url"], storage_options=options) as sender:
        if spec["gc_freeze"]:
            gc.collect()
            gc.freeze()
        # The idle loop, with the sender open (its background work, if any, included);
        # receivers connect meanwhile, so the first put finds them there.
        async with rlwire.LagMonitor() as idle:
            await anyio.sleep(spec["seconds"] + 0.2)
        began = anyio.Event()
        async with rlwire.LagMonitor() as busy:
            async with sender.open_step(ranks=RANKS) as writer:

                async def group(g: int) -> None:
                    await began.wait()
                    await anyio.sleep(max(0.0, start + finish[g] - time.monotonic()))
                    await writer.put(groups[g], key=g)
                    put_at[g] = time.monotonic_ns()

                async with anyio.create_task_group() as tg:
                    for g in finish:
                        tg.start_soon(group, g)
                    # Starting 256 tasks at once is the benchmark's own stall, not the
                    # sender's: the watch starts once they all wait.
                    await anyio.sleep(0.05)
                    busy.reset()
                    start = time.monotonic()
                    busy_from = time.monotonic_ns()
                    gc.callbacks.append(watch := collections_of(2, full_collections))
                    began.set()
            sealed_at = time.monotonic_ns()
            gc.callbacks.remove(watch)
        busy_to = time.monotonic_ns()
        streamed = time.monotonic() - start
        await sender.finish()
    return {
        "put_at": put_at,
        "sealed_at": sealed_at,
        "busy_ns": [busy_from, busy_to],
        "streamed_s": streamed,
        "assignment": [list(keys) for keys in writer.assignment],
        "stall_max": busy.max,
        "stall_p99": busy.percentile(99),
        "idle_max": idle.max,
        "idle_p99": idle.percentile(99),
        "full_collections": full_collections,
    }


def collections_of(generation: int, seconds: list[float]) -> Any:
    """A ``gc.callbacks`` entry appending how long each collection of ``generation`` took."""
    began = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != generation:
            return
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            seconds.append(time.perf_counter() - began[0])

    return callback


async def receive(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    """Take this rank's parts of the step as they come: each part's key, tokens and when
    it was held."""
    got = []
    options = spec.get("storage_options") or None
    async with rlwire.open_receiver(spec["url"], rank=rank, storage_options=options) as receiver:
        print("ready", flush=True)  # to the orchestrator, when a subprocess
        async for part in receiver.aparts(timeout=spec["seconds"] + 30):
            held = time.monotonic_ns()
            tokens = sum(len(s.token_ids) for s in part.value.samples)
            got.append((part.key, tokens, held))
    return {"rank": rank, "parts": got}


async def bystander() -> dict[str, Any]:
    """An idle loop beside the run, until its stdin closes: each gap over 0.5 ms as
    (when it ended, monotonic ns; seconds late) for a 1 ms sleep."""
    gaps: list[tuple[int, float]] = []
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("ready", flush=True)
    while not done.is_set():
        before = time.monotonic()
        await anyio.sleep(0.001)
        late = time.monotonic() - before - 0.001
        if late > 0.0005:
            gaps.append((time.monotonic_ns(), late))
    return {"gaps": gaps}


def bystander_max(gaps: list[tuple[int, float]], window: list[int]) -> float:
    """The bystander's worst gap that ended in ``window`` (or began in it), seconds."""
    lo, hi = window
    return max((late for at, late in gaps if lo <= at <= hi + late * 1e9), default=0.0)


def start_bystander() -> subprocess.Popen[str]:
    """The bystander's process, once its loop runs."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "bystander", "{}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": python_path()},
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the bystander failed to start")
    return proc


def stop_bystander(proc: subprocess.Popen[str]) -> list[tuple[int, float]]:
    out, _ = proc.communicate(input="", timeout=60)
    gaps: list[tuple[int, float]] = json.loads(out.strip().splitlines()[-1])["gaps"]
    return gaps


def child(role: str, spec: dict[str, Any]) -> None:
    """A subprocess's body: run one end under ``spec['backend']``, print its result."""
    if role == "bystander":
        print(json.dumps(anyio.run(bystander)), flush=True)
        return
    rank = int(role.removeprefix("receive-")) if role.startswith("receive-") else None
    # A hung end prints where each of its threads is, then exits, before the run's own
    # deadline: the error names what hung, not only that the run timed out.
    faulthandler.dump_traceback_later(spec["deadline_s"], exit=True)

    async def main() -> dict[str, Any]:
        return await produce(spec) if rank is None else await receive(spec, rank)

    result = anyio.run(main, backend=spec["backend"] if rank is None else "asyncio")
    print(json.dumps(result), flush=True)


def ray_actor() -> Any:
    """An async Ray actor that runs either end (its loop: asyncio)."""
    import ray

    @ray.remote(num_cpus=0)
    class End:
        async def ready(self) -> bool:
            return True

        async def produce(self, spec: dict[str, Any]) -> dict[str, Any]:
            return await produce(spec)

        async def receive(self, spec: dict[str, Any], rank: int) -> dict[str, Any]:
            return await receive(spec, rank)

    return End


# -- one sink ----------------------------------------------------------------------------


def python_path() -> str:
    """PYTHONPATH for the other processes: this directory, then the rlwire this process
    imported (a checkout's src, whatever is installed), then the caller's."""
    src = str(Path(rlwire.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(HERE), src, *([old] if old else [])])


def run_processes(spec: dict[str, Any], timeout: float) -> tuple[dict[str, Any], list[Any]]:
    """Receivers first (each says ``ready`` once open), then the producer; their results."""
    env = {**os.environ, "PYTHONPATH": python_path()}
    argv = [sys.executable, __file__, "--child"]
    procs = [
        subprocess.Popen(
            [*argv, f"receive-{rank}", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(RANKS)
    ]
    watcher: subprocess.Popen[str] | None = None
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a receiver failed to start: {line}{proc.stderr.read()}")  # type: ignore[union-attr]
        watcher = start_bystander()
        producer = subprocess.Popen(
            [*argv, "produce", json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        procs.append(producer)
        outputs: list[tuple[str, str]] = [("", "")] * len(procs)

        def collect(i: int) -> None:
            try:
                outputs[i] = procs[i].communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                procs[i].kill()
                out, err = procs[i].communicate()
                outputs[i] = (out, f"{err}\n(killed after {timeout:.0f} s)")

        threads = [threading.Thread(target=collect, args=(i,)) for i in range(len(procs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gaps = stop_bystander(watcher)
        results = []
        roles = [*(f"receiver {rank}" for rank in range(RANKS)), "producer"]
        for role, proc, (out, err) in zip(roles, procs, outputs, strict=True):
            if proc.returncode != 0:
                raise RuntimeError(f"the {role}: exit {proc.returncode}: {err.strip()[-4000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        results[-1]["bystander_max"] = bystander_max(gaps, results[-1]["busy_ns"])
        return results[-1], results[:-1]
    finally:
        for proc in [*procs, *([watcher] if watcher else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def run_ray(spec: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    import ray

    from rlwire.transport.ray import create_board, drop_board

    # Ray's workers are new processes: they import this checkout's rlwire and this
    # directory's modules (bench_stream, bench_columns) from PYTHONPATH.
    os.environ["PYTHONPATH"] = python_path()
    ray.init(
        address="local",
        num_cpus=4,
        object_store_memory=max(512 << 20, int(spec["step_bytes"] * 1.5)),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        from bench_stream import ray_actor as make_actor  # by name, for the workers

        end = make_actor()
        name = f"stream-{uuid.uuid4().hex[:8]}"
        create_board(name)
        spec = {**spec, "url": f"ray://{name}"}
        receivers = [end.remote() for _ in range(RANKS)]
        producer = end.remote()
        ray.get([a.ready.remote() for a in [*receivers, producer]])  # every actor is up
        taking = [a.receive.remote(spec, rank) for rank, a in enumerate(receivers)]
        time.sleep(1.0)  # the receivers open; the producer's idle phase gives them more
        watcher = start_bystander()
        produced = ray.get(producer.produce.remote(spec))
        produced["bystander_max"] = bystander_max(stop_bystander(watcher), produced["busy_ns"])
        got = ray.get(taking)
        drop_board(name)
        return produced, got
    finally:
        ray.shutdown()


def run_sink(sink: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    # Children dump their stacks and exit at deadline_s; the run kills them a minute on.
    spec = {**spec, "deadline_s": spec["seconds"] * 3 + 60}
    timeout = spec["deadline_s"] + 60
    if sink == "ray":
        produced, got = run_ray(spec)
        return summarize(sink, spec, produced, got, "asyncio (Ray actor)")
    # --dir for the files; the system's for a socket, whose path must stay short
    where = Path(
        tempfile.mkdtemp(prefix="rlwire-stream-", dir=args.dir if sink == "file" else None)
    )
    try:
        if sink == "file":
            produced, got = run_processes({**spec, "url": str(where / "run")}, timeout)
        elif sink == "zmq-ipc":
            produced, got = run_processes({**spec, "url": f"zmq+ipc://{where}/s.sock"}, timeout)
        else:
            produced, got = run_s3(spec, timeout)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return summarize(sink, spec, produced, got, spec["backend"])


def run_s3(spec: dict[str, Any], timeout: float) -> tuple[dict[str, Any], list[Any]]:
    from bench_sinks import moto_server  # beside this file

    async def main() -> tuple[dict[str, Any], list[Any]]:
        async with moto_server() as endpoint:
            import s3fs

            options = {**S3_OPTIONS, "endpoint_url": endpoint}
            s3fs.S3FileSystem(**options).call_s3("create_bucket", Bucket="stream")
            s3 = {**spec, "url": "s3://stream/run", "storage_options": options}
            produced, got = await anyio.to_thread.run_sync(run_processes, s3, timeout)
            produced["get_ms"] = await anyio.to_thread.run_sync(time_gets, options)
            return produced, got

    return anyio.run(main)


def time_gets(options: dict[str, Any], count: int = 16) -> float:
    """The median time of one GET of a stored object of the step's median size, from a
    new client (no cache): the "one GET" of the S3 latency target."""
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    sizes = sorted((int(v["size"]), k) for k, v in fs.find("stream/run", detail=True).items())
    middle = len(sizes) // 2
    times = []
    for _, key in sizes[max(0, middle - count // 2) : middle + count // 2]:
        start = time.perf_counter()
        fs.cat_file(key)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# -- figures -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summarize(
    sink: str, spec: dict[str, Any], produced: dict[str, Any], got: list[Any], loop: str
) -> dict[str, Any]:
    put_at = {int(k): v for k, v in produced["put_at"].items()}
    lengths = spec["lengths"]
    held = {int(key): at for r in got for key, _, at in r["parts"]}
    keys = [int(key) for r in got for key, _, _ in r["parts"]]
    if sorted(keys) != sorted(put_at) or len(keys) != len(lengths):
        raise RuntimeError(f"{sink}: {len(keys)} parts received, {len(lengths)} put")
    latencies = [(held[k] - put_at[k]) / 1e6 for k in put_at]
    tokens = [sum(t for _, t, _ in r["parts"]) for r in sorted(got, key=lambda r: r["rank"])]
    return {
        "sink": sink,
        "loop": loop,
        "groups": len(lengths),
        "step_tokens": sum(tokens),
        "streamed_s": produced["streamed_s"],
        "drain_ms": (max(held.values()) - max(put_at.values())) / 1e6,
        "latency_ms": latencies,
        "median_ms": statistics.median(latencies),
        "p99_ms": pct(latencies, 99),
        "rank_tokens": tokens,
        "imbalance": max(tokens) - min(tokens),
        "largest_group": max(sum(g) for g in lengths),
        "parts_per_rank": [len(r["parts"]) for r in sorted(got, key=lambda r: r["rank"])],
        "stall_ms": produced["stall_max"] * 1e3,
        "stall_p99_ms": produced["stall_p99"] * 1e3,
        "idle_ms": produced["idle_max"] * 1e3,
        "bystander_ms": produced["bystander_max"] * 1e3,
        "get_ms": produced.get("get_ms"),
        "full_collections_ms": [t * 1e3 for t in produced["full_collections"]],
    }


def target_text(row: dict[str, Any]) -> str:
    sink = row["sink"]
    if sink == "s3":  # the receiver polls every 10 ms, backing off to 1 s while idle
        return f"≤ 10 (to 1,000) + GET {row['get_ms']:.0f}"
    return f"≤ {LATENCY_TARGET_MS[sink]:g}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| sink | producer loop | parts (per rank) | last put → last part ms (target) "
        "| latency median ms | p99 ms | target ms | imbalance tokens ≤ largest group "
        "| worst stall ms (idle before; bystander) | stall p99 ms |"
    )
    lines = [head, "|---|---|---|---:|---:|---:|---|---|---|---:|"]
    for r in rows:
        drain = f"{r['drain_ms']:.1f}"
        if r["sink"] in DRAIN_TARGET_MS:
            drain += f" (≤ {DRAIN_TARGET_MS[r['sink']]:g})"
        ok = "yes" if r["imbalance"] <= r["largest_group"] else "**no**"
        baseline = max(r["idle_ms"], r["bystander_ms"])
        stall_ok = r["stall_ms"] - baseline <= STALL_TARGET_MS
        lines.append(
            f"| {r['sink']} | {r['loop']} | {r['groups']} "
            f"({'/'.join(map(str, r['parts_per_rank']))}) | {drain} "
            f"| {r['median_ms']:.2f} | {r['p99_ms']:.2f} | {target_text(r)} "
            f"| {r['imbalance']:,} ≤ {r['largest_group']:,}: {ok} "
            f"| {r['stall_ms']:.1f} ({r['idle_ms']:.1f}; {r['bystander_ms']:.1f})"
            f"{'' if stall_ok else ' **no**'} "
            f"| {r['stall_p99_ms']:.1f} |"
        )
    full = ", ".join(
        f"{r['sink']} {len(r['full_collections_ms'])}"
        + (f" (worst {max(r['full_collections_ms']):.0f} ms)" if r["full_collections_ms"] else "")
        for r in rows
    )
    lines.append(f"\nFull collections (generation 2) in the producer while it streamed: {full}.")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--sinks", default=",".join(SINKS), help=f"of {', '.join(SINKS)}")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--groups", type=int, default=256)
    p.add_argument("--samples", type=int, default=16, help="samples per group")
    p.add_argument("--min-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--seconds", type=float, help="groups finish over this (default 10, --quick 2)")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    p.add_argument("--json", help="write every figure here")
    p.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the producer's set-up objects in the collector (see the docstring)",
    )
    p.add_argument("--quick", action="store_true", help="32 groups of 256-2048 tokens, 2 s")
    args = p.parse_args(argv)
    if args.quick:
        args.groups, args.min_tokens, args.max_tokens = 32, 256, 2048
    if args.seconds is None:  # given, it holds with --quick too (the smoke test's 0.5 s)
        args.seconds = 2.0 if args.quick else 10.0
    args.sinks = args.sinks.split(",")
    if set(args.sinks) - set(SINKS):
        p.error(f"unknown sinks: {sorted(set(args.sinks) - set(SINKS))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return 0
    spec = schedule(args) | {"backend": args.backend, "gc_freeze": args.gc_freeze}
    tokens = sum(map(sum, spec["lengths"]))
    spec["step_bytes"] = tokens * 21  # int64 ids, bool mask, three float32 columns
    print(
        f"shape stream: {args.groups} groups x {args.samples} samples x "
        f"{args.min_tokens}-{args.max_tokens} tokens ({tokens:,} tokens, "
        f"{spec['step_bytes'] / 1e6:.0f} MB), finishing over {args.seconds:g} s "
        f"(seed {args.seed}), {RANKS} ranks",
        file=sys.stderr,
        flush=True,
    )
    rows = []
    for sink in args.sinks:
        print(f"  {sink} ...", file=sys.stderr, flush=True)
        rows.append(run_sink(sink, spec, args))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
