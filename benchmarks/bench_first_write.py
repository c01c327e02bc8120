"""Benchmark what receiving from files costs, and what the first write into a received array
costs, for each way a receiver can map the files.

Two sections, each measured in ABBA order within every round (after ``--warmup``
discarded rounds) so that drift on a shared machine hits every variant alike:

1. **Receive** of a ~800 MB step (the spine's TrainingBatch of bench_send.py: 256 samples
   x 8192 tokens, routed_experts uint8 [8192, 48, 8] in a sidecar), with checksums
   verified (the default; every page is read) and without (only the mapping is made):

   * ``ACCESS_READ (former)``: the mapping FileSource made before copy-on-write
     mappings: ``mmap.ACCESS_READ`` (MAP_SHARED, PROT_READ), reproduced here by a
     subclass, for the before/after comparison;
   * ``default``: ``FileSource(path)`` as it is now;
   * ``writable=True``: ``FileSource(path, writable=True)`` (``mmap.ACCESS_COPY``).

   Each is a :class:`rlwire.TrainingBatchReceiver` over that source, ``receive()`` of
   the step, checked against the batch sent. *anon MiB* is the growth of the process's
   anonymous memory (``/proc/self/smaps_rollup``) over the receive: pages copied out of
   the page cache would show there; a mapping that shares the page cache shows ~0.

2. **First write** into a received 192 MiB float32 array (``{"x": array}``):

   * ``default``: receive; ``np.array(arr)`` (the copy users make to get writable
     memory); ``np.copyto`` into that copy; a write into the received array's own
     memory through ``ctypes.memmove``, which ignores numpy's read-only flag as torch's
     in-place ops do (it lands in private copy-on-write pages), first and second time;
   * ``writable=True``: receive; ``np.copyto(arr, src)`` first time (copy-on-write page
     faults), second time (pages already private).

   *faults* are minor page faults (``getrusage``) during the operation.

At the end the benchmark checks that the files on disk are byte for byte what was sent
(xxh3 of each file before and after every write).

Usage::

    .venv/bin/python benchmarks/bench_first_write.py            # 800 MB step, 192 MiB array
    .venv/bin/python benchmarks/bench_first_write.py --quick    # 53 MB step, 16 MiB array
    .venv/bin/python benchmarks/bench_first_write.py --dir /tmp # a disk filesystem
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import mmap
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import xxhash

import rlwire
from rlwire.errors import CorruptFrameError, transport_error
from rlwire.transport import FileSource

MiB = 1 << 20
MB = 1e6


class FormerFileSource(FileSource):
    """FileSource as it mapped files before copy-on-write mappings: ACCESS_READ."""

    def load(self, name: str) -> memoryview | None:
        path = self.root / name
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise CorruptFrameError("empty file", where=path)
            return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))
        except OSError as exc:
            raise transport_error(exc, "map", where=path) from exc
        finally:
            os.close(fd)


VARIANTS: dict[str, Callable[[Path, bool], FileSource]] = {
    "ACCESS_READ (former)": lambda p, verify: FormerFileSource(p, verify=verify),
    "default": lambda p, verify: FileSource(p, verify=verify),
    "writable=True": lambda p, verify: FileSource(p, writable=True, verify=verify),
}


# -- measuring -------------------------------------------------------------------------


def anon_kib() -> int:
    """Anonymous memory of this process (KiB), from /proc/self/smaps_rollup; -1 if absent."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Anonymous:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@dataclass
class Sample:
    ms: float
    faults: int
    anon_mib: float


@dataclass
class Rows:
    rows: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, name: str, sample: Sample) -> None:
        self.rows.setdefault(name, []).append(sample)


def timed(op: Callable[[], Any]) -> tuple[Any, Sample]:
    a0, f0 = anon_kib(), minflt()
    t0 = time.perf_counter()
    out = op()
    ms = (time.perf_counter() - t0) * 1e3
    return out, Sample(ms, minflt() - f0, (anon_kib() - a0) / 1024)


def receive(root: Path, variant: str, verify: bool, type: Any) -> tuple[Any, Any, Sample]:
    """``receive()`` of step 0 through a receiver over ``variant``'s source."""
    gc.collect()
    source = VARIANTS[variant](root, verify)
    writable = variant == "writable=True"

    def op() -> tuple[Any, Any]:
        receiver = rlwire.TrainingBatchReceiver(source, type, rank=0, writable=writable)
        return receiver, receiver.receive(timeout=30)

    (receiver, got), sample = timed(op)
    return receiver, got, sample


def file_hashes(root: Path) -> dict[str, int]:
    out = {}
    for p in sorted(root.iterdir()):
        with open(p, "rb") as f:
            out[p.name] = xxhash.xxh3_64_intdigest(
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            )
    return out


# -- the workloads ---------------------------------------------------------------------


def make_batch(samples: int, tokens: int, seed: int) -> rlwire.TrainingBatch:
    """The spine's batch (bench_send.py): routed_experts uint8 [tokens, 48, 8]."""
    rng = np.random.default_rng(seed)
    experts = rng.integers(0, 256, size=(samples, tokens, 48, 8), dtype=np.uint8)
    shape = (samples, tokens)
    token_ids = rng.integers(0, 151_936, size=shape, dtype=np.int64)
    mask = rng.random(shape, dtype=np.float32) < 0.8
    logprobs = -rng.exponential(size=shape).astype(np.float32)
    advantages = rng.standard_normal(shape, dtype=np.float32)
    return rlwire.TrainingBatch(
        samples=[
            rlwire.TrainingSample(
                token_ids=token_ids[i],
                mask=mask[i],
                logprobs=logprobs[i],
                temperatures=np.ones(tokens, np.float32),
                advantages=advantages[i],
                env_name=f"env-{i % 4}",
                routed_experts=experts[i],
            )
            for i in range(samples)
        ]
    )


async def send(root: Path, obj: Any, sidecar: tuple[str, ...] | None) -> None:
    async with rlwire.open_sender(root, sidecar=sidecar) as sender:
        await sender.send(obj)


def check_batch(got: rlwire.TrainingBatch, sent: rlwire.TrainingBatch) -> None:
    last = len(sent.samples) - 1
    for i in (0, last):
        for name in ("routed_experts", "token_ids", "logprobs"):
            if not np.array_equal(getattr(got.samples[i], name), getattr(sent.samples[i], name)):
                raise AssertionError(f"samples[{i}].{name} differs after the round trip")


# -- the sections ----------------------------------------------------------------------


def receive_section(args: argparse.Namespace, root: Path, rows: Rows) -> int:
    batch = make_batch(args.samples, args.tokens, args.seed)
    anyio.run(send, root, batch, ("routed_experts",))
    step_bytes = sum(p.stat().st_size for p in root.iterdir())
    before = file_hashes(root)
    names = list(VARIANTS)
    order = names + names[::-1]
    for r in range(args.warmup + args.repeats):
        line = []
        for verify in (True, False):
            for variant in order:
                receiver, got, sample = receive(root, variant, verify, rlwire.TrainingBatch)
                check_batch(got, batch)
                receiver.close()
                del receiver, got
                if r >= args.warmup:
                    rows.add(f"{variant}, verify={verify}", sample)
                line.append(f"{sample.ms:.1f}")
        progress(f"  receive {'round' if r >= args.warmup else 'warm-up'}: {' '.join(line)} ms")
    if file_hashes(root) != before:
        raise AssertionError("a receive changed the files")
    return step_bytes


def write_section(args: argparse.Namespace, root: Path, rows: Rows) -> int:
    n = args.array_mib * MiB // 4
    rng = np.random.default_rng(args.seed)
    sent = rng.standard_normal(n, dtype=np.float32)
    src = -sent  # what every write writes; faulted in already
    anyio.run(send, root, {"x": sent}, None)
    before = file_hashes(root)
    nbytes = sent.nbytes
    for r in range(args.warmup + args.repeats):
        keep = r >= args.warmup
        line = []
        for variant in ("default", "writable=True", "writable=True", "default"):
            receiver, got, sample = receive(root, variant, True, Any)
            arr = got["x"]
            if not np.array_equal(arr, sent):
                raise AssertionError("the received array differs from the one sent")
            results = [("receive", sample)]
            if variant == "default":
                assert not arr.flags.writeable
                copy, s = timed(lambda arr=arr: np.array(arr))
                results.append(("np.array(arr) copy", s))
                _, s = timed(lambda copy=copy: np.copyto(copy, src))
                results.append(("np.copyto into that copy", s))
                del copy
                for which in ("first", "second"):
                    _, s = timed(
                        lambda arr=arr: ctypes.memmove(arr.ctypes.data, src.ctypes.data, nbytes)
                    )
                    results.append((f"ctypes.memmove into arr, {which} (flag ignored)", s))
            else:
                assert arr.flags.writeable
                for which in ("first", "second"):
                    _, s = timed(lambda arr=arr: np.copyto(arr, src))
                    results.append((f"np.copyto(arr, src), {which}", s))
            if not np.array_equal(arr, src):
                raise AssertionError("the write did not land in the received array")
            receiver.close()
            del receiver, got, arr
            for what, s in results:
                if keep:
                    rows.add(f"{variant}: {what}", s)
                line.append(f"{s.ms:.0f}")
        progress(f"  write {'round' if keep else 'warm-up'}: {' '.join(line)} ms")
    if file_hashes(root) != before:
        raise AssertionError("a write into a received array reached the file")
    return nbytes


# -- reporting -------------------------------------------------------------------------


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def table(rows: Rows, out: list[str], nbytes: int | None = None) -> None:
    rate = " | GB/s" if nbytes else ""
    out.append(f"| operation | median ms | range ms | median faults | median anon MiB{rate} |")
    out.append("|---|---:|---:|---:|---:|" + ("---:|" if nbytes else ""))
    for name, samples in rows.rows.items():
        ms = [s.ms for s in samples]
        med = statistics.median(ms)
        faults = statistics.median(s.faults for s in samples)
        anon = statistics.median(s.anon_mib for s in samples)
        extra = f" | {nbytes / 1e9 / (med / 1e3):.2f}" if nbytes and med > 0 else ""
        out.append(
            f"| {name} | {med:.1f} | {min(ms):.1f} to {max(ms):.1f} | {faults:.0f} "
            f"| {anon:.1f}{extra} |"
        )


def page_cache_note() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = "?"
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            overcommit = f.read().strip()
    except OSError:
        overcommit = "?"
    return f"transparent hugepages: {thp}; vm.overcommit_memory = {overcommit}"


# -- main ------------------------------------------------------------------------------


def default_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Receive time and first-write cost of received arrays, per mapping."
    )
    p.add_argument("--samples", type=int, default=None, help="samples in the receive step")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per sample (default 8192)")
    p.add_argument("--array-mib", type=int, default=None, help="MiB of the written array")
    p.add_argument("--dir", default=default_dir(), help="where to write (default /dev/shm)")
    p.add_argument("--repeats", type=int, default=None, help="measured rounds (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="16 samples, 16 MiB, 2 rounds")
    p.add_argument(
        "--section",
        choices=("both", "receive", "write"),
        default="both",
        help="run only one section (default both)",
    )
    args = p.parse_args(argv)
    if args.samples is None:
        args.samples = 16 if args.quick else 256
    if args.array_mib is None:
        args.array_mib = 16 if args.quick else 192
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if min(args.samples, args.tokens, args.array_mib, args.repeats) < 1 or args.warmup < 0:
        p.error("sizes and --repeats must be positive, --warmup non-negative")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="rlwire-bench-", dir=args.dir))
    receive_rows, write_rows = Rows(), Rows()
    step_bytes = array_bytes = 0
    try:
        (root / "receive").mkdir()
        (root / "write").mkdir()
        if args.section != "write":
            step_bytes = receive_section(args, root / "receive", receive_rows)
        gc.collect()
        if args.section != "receive":
            array_bytes = write_section(args, root / "write", write_rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out: list[str] = []
    w = out.append
    w(f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/bench_first_write.py', *argv])}`")
    w("")
    w(
        f"Dir: {root} ({fs_type(root)}); {args.repeats} round(s) after {args.warmup} "
        f"warm-up round(s), ABBA order in each; Python {platform.python_version()}, numpy "
        f"{np.__version__}, rlwire {rlwire.__version__}, Linux {platform.release()}, "
        f"{os.cpu_count()} CPUs; {page_cache_note()}."
    )
    if args.section != "write":
        w("")
        w(
            f"Receive of one step of {step_bytes / MB:.1f} MB ({args.samples} samples x "
            f"{args.tokens} tokens), `receive()` through a TrainingBatchReceiver; GB/s is "
            "the step's size over the time:"
        )
        w("")
        table(receive_rows, out, step_bytes)
    if args.section != "receive":
        w("")
        w(
            f"First write into a received {array_bytes / MiB:.0f} MiB float32 array "
            "(receive verifies checksums); GB/s is the array's size over the time:"
        )
        w("")
        table(write_rows, out, array_bytes)
    w("")
    w("The files were byte for byte unchanged at the end of each section.")
    print("\n".join(out))
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
