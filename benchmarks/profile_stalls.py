"""Which slice of rlwire's work stalled the event loop: a profile of one send and receive.

rlwire runs its CPU work as sliced generators in worker threads (``rlwire._core.offload.
drive_sliced``). A loop stall happens when a worker thread holds the GIL for long: one
C call that does not release it (a msgspec decode, a ``bytes`` copy), or Python code
that runs past the interpreter's switch interval (5 ms) while the loop waits for the GIL.
This script wraps that driver to record, for every slice, when it ran, how long it took
and where in rlwire's generators it started and stopped; a 1 ms sleeper on the loop
records every stall. Each stall over ``--over`` ms is then printed with the slices that
overlapped it: the code that held the GIL is among them (a slice that overlaps a stall
but released the GIL throughout, such as a file write, is innocent).

Workloads: ``user-types`` (bench_user_types.py's step at ``--scale``: 8 ranks of
framework-shaped Structs, ``send_ranks`` then rank 0's ``areceive``), ``file``
(bench_send.py's ``TrainingBatch`` of ``--samples`` samples, ``send`` then ``areceive``)
and ``columns`` (bench_columns.py's ``TrainingBatch`` of ``--samples`` samples of
``--tokens`` tokens, no routed experts: its dense and small shapes).

Usage::

    .venv/bin/python benchmarks/profile_stalls.py user-types --scale 1.8
    .venv/bin/python benchmarks/profile_stalls.py file --samples 256 --backend trio
    .venv/bin/python benchmarks/profile_stalls.py file --samples 8000 --tokens 31
    .venv/bin/python benchmarks/profile_stalls.py columns --samples 2048 --tokens 2048
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import anyio
from bench_send import default_dir

import rlwire
from rlwire._core import slicing
from rlwire._core.offload import drive_sliced


@dataclass
class Slice:
    began: float
    seconds: float
    start: str  # where the generator was suspended before the slice
    stop: str  # where it was suspended after it ("end" when it returned)


SLICES: list[Slice] = []


def _innermost(gen: Any) -> FrameType | None:
    """The frame of the innermost generator ``gen`` delegates to (``yield from``, or
    rlwire's ``timed`` wrapper, which drives its generator with ``next``)."""
    while True:
        inner = getattr(gen, "gi_yieldfrom", None)
        frame: FrameType | None = getattr(gen, "gi_frame", None)
        if frame is not None and frame.f_code.co_name == "timed" and inner is None:
            inner = frame.f_locals.get("slices")
        if inner is None or not hasattr(inner, "gi_frame"):
            return frame
        gen = inner


def where(gen: Generator[Any, Any, Any]) -> str:
    frame = _innermost(gen)
    if frame is None:
        return "end"
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"


def recorded(slices: Any) -> Any:
    """``slices``, recording when each of its slices ran, how long, and where it started
    and stopped."""
    while True:
        start, began = where(slices), time.perf_counter()
        try:
            next(slices)
        except StopIteration as stop:
            SLICES.append(Slice(began, time.perf_counter() - began, start, "end"))
            return stop.value
        SLICES.append(Slice(began, time.perf_counter() - began, start, where(slices)))
        yield


async def recording_offload(slices: Any, limiter: Any, *args: Any, **kwargs: Any) -> Any:
    """rlwire's own driver, ``rlwire._core.offload.drive_sliced``, over the recorded slices."""
    return await drive_sliced(recorded(slices), limiter, *args, **kwargs)


def recording_beside(slices: Any, stop: Any) -> None:
    """rlwire's driver of work beside other work (``run_sliced_beside``: the checks of a
    column-stored list beside the write, a step's release), over the recorded slices."""
    slicing.run_sliced_beside(recorded(slices), stop)


def record_every_driver() -> list[str]:
    """Make every rlwire module that drives slices drive them recorded; the modules."""
    patched = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("rlwire.") or module is slicing:
            continue
        for attr, wrapper in (
            ("drive_sliced", recording_offload),
            ("run_sliced_beside", recording_beside),
        ):
            if getattr(module, attr, None) is not None:
                setattr(module, attr, wrapper)
                patched.append(f"{name}.{attr}")
    return patched


async def measure(name: str, op: Callable[[], Awaitable[object]], over_ms: float) -> None:
    SLICES.clear()
    lags: list[tuple[float, float]] = []  # (woke at, how late)
    done = anyio.Event()

    async def sleeper() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await anyio.sleep(0.001)
            now = time.perf_counter()
            lags.append((now, now - before - 0.001))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        began = time.perf_counter()
        await op()
        seconds = time.perf_counter() - began
        done.set()
    ordered = sorted(lag for _, lag in lags)
    worst = ordered[-1] if ordered else 0.0
    p99 = ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0
    busy = sum(s.seconds for s in SLICES)
    print(
        f"\n## {name}: {seconds * 1e3:.0f} ms, {len(SLICES)} slices ({busy * 1e3:.0f} ms in "
        f"them), worst stall {worst * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
    )
    stalls = sorted(((lag, at) for at, lag in lags if lag * 1e3 > over_ms), reverse=True)
    print(f"{len(stalls)} stalls over {over_ms} ms; the worst 8, with the slices they overlap:")
    for lag, at in stalls[:8]:
        overlapping = [s for s in SLICES if s.began < at and s.began + s.seconds > at - lag]
        found = "; ".join(
            f"{s.seconds * 1e3:.1f} ms {s.start} -> {s.stop}" for s in overlapping[:3]
        )
        print(f"- {lag * 1e3:.1f} ms: {found or 'no slice (the loop itself, or the machine)'}")
    print("The longest slices (they stall only if they hold the GIL):")
    for s in sorted(SLICES, key=lambda s: -s.seconds)[:5]:
        print(f"- {s.seconds * 1e3:.1f} ms {s.start} -> {s.stop}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("workload", choices=("user-types", "file", "columns"))
    p.add_argument("--scale", type=float, default=1.0, help="user-types: step scale (1 = 0.88 GB)")
    p.add_argument("--samples", type=int, default=256, help="file: samples per batch")
    p.add_argument("--tokens", type=int, default=8192, help="file: tokens per sample")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--over", type=float, default=3.0, help="stalls listed, in ms (default 3)")
    p.add_argument("--dir", default=None, help="where to write (default: /dev/shm or /tmp)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.workload == "user-types":
        import bench_user_types as bench

        work = bench.make_workload(bench.parse_args(["--scale", str(args.scale)]))
        objects: Any = work.ranks
        receive_type: Any = bench.PerRank
    else:
        import bench_send

        objects = [bench_send.make_workload(args.samples, args.tokens, 48, 8, 0).batch]
        receive_type = rlwire.TrainingBatch
    if args.workload == "columns":
        import bench_columns

        objects = [bench_columns.make_batch([args.tokens] * args.samples, 0)]
    gc.freeze()  # the step's objects out of the collector's way, as the benchmarks do
    record_every_driver()
    root = tempfile.mkdtemp(dir=args.dir or default_dir())
    sidecar = ("routed_experts",)

    async def run() -> None:
        async with rlwire.open_sender(root, sidecar=sidecar, on_existing="overwrite") as sender:
            if len(objects) > 1:
                await measure("send_ranks", lambda: sender.send_ranks(objects), args.over)
            else:
                await measure("send", lambda: sender.send(objects[0]), args.over)
        with rlwire.open_receiver(root, type=receive_type) as receiver:
            await measure("areceive (rank 0)", lambda: receiver.areceive(timeout=60), args.over)

    try:
        anyio.run(run, backend=args.backend)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
