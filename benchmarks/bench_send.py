"""Benchmark one rlwire send of a large TrainingBatch against naive baselines and the floor.

Rows measured in one run. Each of ``--repeats`` rounds (after ``--warmup`` discarded
ones) runs floor, send (+ receive), send, floor, baseline (a), baseline (b); the table
shows the median per row (the send and floor rows have two samples per round):

* rlwire send: ``await sender.send(batch)`` with ``sidecar=("routed_experts",)``.
* baseline (a): whole-batch ``msgspec.msgpack`` encode (numpy arrays through an
  ``enc_hook`` as ``(dtype, shape, arr.tobytes())``) plus a file write, directly in the
  async function, i.e. blocking the event loop.
* baseline (b): the same encode + write in one worker thread (``anyio.to_thread``).
* floor (c): writing as many bytes as rlwire wrote, straight from the arrays' buffers,
  with ``os.write`` from one worker thread into a new file in the same directory.
* receive open: ``await rlwire.open_receiver(dir).areceive()`` of the step just sent
  (mmap, zero-copy, checksums verified as by default), under the LagMonitor like the
  sends, checked for equality against the sent batch.
* read once: the same files read with ``os.readv`` into memory already faulted in, the
  reference for a receive that verifies (it reads every byte once); not a baseline of
  the send, so its ratio to the floor means nothing.

Loop stalls come from :class:`rlwire.LagMonitor` (1 ms sleeps; a stall is how late a
sleep wakes up; epoll's millisecond timeouts alone make wake-ups up to ~1 ms late).
Peak memory is the RSS high-water mark during the operation minus the RSS just before
it (``/proc/self/clear_refs`` + ``VmHWM`` on Linux).

Usage::

    .venv/bin/python benchmarks/bench_send.py                 # full size, asyncio
    .venv/bin/python benchmarks/bench_send.py --backend trio
    .venv/bin/python benchmarks/bench_send.py --quick         # 16 samples, sanity run
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np

import rlwire

MB = 1e6  # decimal megabytes throughout

# Targets for the rlwire rows.
TARGET_SEND_RATIO = 1.1  # send time / floor time
TARGET_STALL_MS = 2.0  # worst event-loop stall during the send
TARGET_PEAK_MB = 64.0  # peak RSS above the RSS just before the send
TARGET_RECEIVE_READ = 2.0  # receive (checksums verified) at most 2x reading the bytes once


# -- the workload ----------------------------------------------------------------------


@dataclass
class Workload:
    batch: rlwire.TrainingBatch
    # The preallocated blocks every sample's arrays are views of, for the floor's writes.
    blocks: list[np.ndarray]

    @property
    def payload_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)


def make_workload(samples: int, tokens: int, layers: int, topk: int, seed: int) -> Workload:
    """One TrainingBatch; each field of each sample is its own view of a big block."""
    rng = np.random.default_rng(seed)
    experts = np.empty((samples, tokens, layers, topk), np.uint8)
    flat = experts.reshape(-1)
    block = 64 << 20
    for start in range(0, flat.size, block):
        stop = min(start + block, flat.size)
        flat[start:stop] = rng.integers(0, 256, size=stop - start, dtype=np.uint8)
    shape = (samples, tokens)
    token_ids = rng.integers(0, 151_936, size=shape, dtype=np.int64)
    mask = rng.random(shape, dtype=np.float32) < 0.8
    logprobs = -rng.exponential(size=shape).astype(np.float32)
    temperatures = np.full(shape, 1.0, np.float32)
    advantages = rng.standard_normal(shape, dtype=np.float32)
    batch = rlwire.TrainingBatch(
        samples=[
            rlwire.TrainingSample(
                token_ids=token_ids[i],
                mask=mask[i],
                logprobs=logprobs[i],
                temperatures=temperatures[i],
                advantages=advantages[i],
                env_name=f"env-{i % 4}",
                routed_experts=experts[i],
            )
            for i in range(samples)
        ]
    )
    return Workload(batch, [experts, token_ids, mask, logprobs, temperatures, advantages])


# -- measuring -------------------------------------------------------------------------


class PeakMemory:
    """Peak memory above the level at :meth:`start`, by the best method available.

    ``vmhwm``: write "5" to /proc/self/clear_refs (resets VmHWM to the current RSS), read
    VmRSS, run, read VmHWM. Counts every page of the process (numpy, msgspec, malloc,
    thread stacks) but not tmpfs pages written with write(2), which belong to the file.
    ``tracemalloc``: Python and numpy allocations only, and slows allocation-heavy code.
    """

    def __init__(self, method: str) -> None:
        if method == "auto":
            method = "vmhwm" if self._vmhwm_works() else "tracemalloc"
        self.method = method
        self._base = 0

    @staticmethod
    def _status_kb(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise KeyError(key)

    @classmethod
    def _vmhwm_works(cls) -> bool:
        try:
            junk = np.ones(64 << 20, np.uint8)  # raise VmHWM, then check that it resets
            del junk
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return cls._status_kb("VmHWM") <= cls._status_kb("VmRSS") + 4096
        except (OSError, KeyError, ValueError):
            return False

    def start(self) -> None:
        if self.method == "vmhwm":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._base = self._status_kb("VmRSS") * 1024
        else:
            if not tracemalloc.is_tracing():
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._base = tracemalloc.get_traced_memory()[0]

    def stop(self) -> int:
        """Peak bytes above the start level."""
        if self.method == "vmhwm":
            return max(0, self._status_kb("VmHWM") * 1024 - self._base)
        peak = tracemalloc.get_traced_memory()[1]
        return max(0, peak - self._base)


@dataclass
class Sample:
    seconds: float
    nbytes: int = 0
    stall_max: float | None = None
    stall_p99: float | None = None
    lag_count: int = 0
    peak: int | None = None


@dataclass
class Row:
    name: str
    samples: list[Sample] = field(default_factory=list)

    def median(self, attr: str) -> float | None:
        values = [getattr(s, attr) for s in self.samples]
        if not values or any(v is None for v in values):
            return None
        return float(statistics.median(values))


async def on_loop(op: Callable[[], Awaitable[int]], mem: PeakMemory) -> Sample:
    """Run ``op`` under a LagMonitor, timing it and measuring its peak memory."""
    gc.collect()
    async with rlwire.LagMonitor() as lag:
        mem.start()
        t0 = time.perf_counter()
        nbytes = await op()
        seconds = time.perf_counter() - t0
        peak = mem.stop()
    return Sample(seconds, nbytes, lag.max, lag.percentile(99), len(lag.lags), peak)


# -- the rows --------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return (obj.dtype.str, obj.shape, obj.tobytes())
    raise NotImplementedError(f"cannot encode {type(obj)!r}")


_naive_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def naive_encode_and_write(batch: rlwire.TrainingBatch, path: Path) -> int:
    """What frameworks commonly do: encode everything into one bytes, then write it."""
    data = _naive_encoder.encode(batch)
    nbytes = len(data)
    with open(path, "wb") as f:
        f.write(data)
    del data  # free the ~0.85 GB buffer before returning
    return nbytes


def write_floor(path: Path, blocks: list[np.ndarray], total: int) -> int:
    """Write ``total`` bytes from the arrays' own buffers (zero padding for the rest)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        left = total
        for block in blocks:
            view = memoryview(block.reshape(-1).view(np.uint8))[:left]
            pos = 0
            while pos < view.nbytes:
                pos += os.write(fd, view[pos:])
            left -= view.nbytes
        if left > 0:  # rlwire's headers and alignment padding: a few tens of kB
            pad = memoryview(bytes(left))
            pos = 0
            while pos < left:
                pos += os.write(fd, pad[pos:])
    finally:
        os.close(fd)
    return total


def faulted_buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of ``size`` bytes with every page already faulted in, for
    :func:`read_once`.

    Page-aligned because the kernel's copy into a destination 16 bytes past an alignment
    boundary (where malloc puts a large ``bytearray``) measured twice as slow here (19-22
    against 8-11 ms for 22 MB): the baseline then depended on where malloc put it.
    """
    buffer = mmap.mmap(-1, max(size, 1))
    np.frombuffer(buffer, np.uint8)[:: mmap.PAGESIZE] = 1
    return buffer


def read_once(paths: list[Path], buffer: mmap.mmap) -> Sample:
    """Read ``paths`` back to back into ``buffer`` with ``os.readv``, timed: the reference
    for a receive that verifies checksums (it reads every byte once)."""
    view = memoryview(buffer)
    t0 = time.perf_counter()
    done = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            got = 0
            while got < size:
                got += os.readv(fd, [view[done + got : done + size]])
        finally:
            os.close(fd)
        done += size
    return Sample(time.perf_counter() - t0, nbytes=done)


def rlwire_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".rlw"))


def clear_dir(path: Path) -> None:
    for p in path.iterdir():
        p.unlink()


def check_received(got: rlwire.TrainingBatch, sent: rlwire.TrainingBatch) -> None:
    if len(got.samples) != len(sent.samples):
        raise AssertionError(f"received {len(got.samples)} samples, sent {len(sent.samples)}")
    last = len(sent.samples) - 1
    checks = [
        (0, "routed_experts"),
        (last, "routed_experts"),
        (last // 2, "token_ids"),
        (last, "logprobs"),
        (0, "mask"),
        (last, "advantages"),
    ]
    for i, name in checks:
        a, b = getattr(got.samples[i], name), getattr(sent.samples[i], name)
        if a.dtype != b.dtype or not np.array_equal(a, b):
            raise AssertionError(f"samples[{i}].{name} differs after the round trip")
    if got.samples[last].env_name != sent.samples[last].env_name:
        raise AssertionError("env_name differs after the round trip")


@dataclass
class Bench:
    args: argparse.Namespace
    work: Workload
    root: Path
    mem: PeakMemory
    rows: dict[str, Row] = field(default_factory=dict)
    extra: dict[str, list[float]] = field(default_factory=dict)
    total_bytes: int = 0  # what one rlwire send writes (both files); the floor writes as much
    sizes: dict[str, int] = field(default_factory=dict)
    idle: Sample | None = None
    idle_after: Sample | None = None
    cpu_before: list[int] | None = None
    cpu_after: list[int] | None = None
    read_buffer: mmap.mmap | None = None

    def __post_init__(self) -> None:
        for name in (
            "rlwire send",
            "baseline (a)",
            "baseline (b)",
            "floor (c)",
            "receive open",
            "read once",
        ):
            self.rows[name] = Row(name)
        self.send_dir = self.root / "rlwire"
        self.other_dir = self.root / "other"
        self.send_dir.mkdir()
        self.other_dir.mkdir()

    def note(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)

    async def measure_floor(self) -> Sample:
        """floor (c): as many bytes as rlwire writes, from memory, one thread, os.write."""
        path = self.other_dir / "floor.bin"

        async def floor() -> int:
            return await anyio.to_thread.run_sync(
                write_floor, path, self.work.blocks, self.total_bytes
            )

        sample = await on_loop(floor, self.mem)
        path.unlink()
        return sample

    async def measure_send(self) -> Sample:
        """rlwire send; the step is left in ``send_dir`` for the receiver."""
        t0 = time.perf_counter()
        sender = rlwire.open_sender(
            self.send_dir, sidecar=("routed_experts",), on_existing="overwrite"
        )
        async with sender as s:
            self.note("sender open ms", (time.perf_counter() - t0) * 1e3)

            async def send() -> int:
                await s.send(self.work.batch)
                return 0

            sample = await on_loop(send, self.mem)
            t1 = time.perf_counter()
        self.note("sender close ms", (time.perf_counter() - t1) * 1e3)
        self.sizes = {p.name: p.stat().st_size for p in rlwire_files(self.send_dir)}
        sample.nbytes = sum(self.sizes.values())
        if sample.nbytes != self.total_bytes:
            raise AssertionError(f"rlwire wrote {sample.nbytes} bytes, {self.total_bytes} before")
        return sample

    async def measure_receive(self) -> Sample:
        """receive open of the step in ``send_dir``, as an async trainer runs it."""
        receivers: list[rlwire.TrainingBatchReceiver[Any]] = []
        got: list[rlwire.TrainingBatch] = []

        async def receive() -> int:
            receivers.append(rlwire.open_receiver(self.send_dir))
            got.append(await receivers[0].areceive(timeout=30))
            return 0

        sample = await on_loop(receive, self.mem)
        check_received(got[0], self.work.batch)
        receivers[0].close()
        receivers.clear()
        got.clear()
        gc.collect()  # drop the mmaps before unlinking, so tmpfs frees the pages
        return sample

    def measure_read_once(self) -> Sample:
        """read once: the step's files read into memory already faulted in (os.readv),
        the reference for a receive that verifies checksums (it reads every page)."""
        if self.read_buffer is None or len(self.read_buffer) < self.total_bytes:
            self.read_buffer = faulted_buffer(self.total_bytes)
        return read_once(rlwire_files(self.send_dir), self.read_buffer)

    async def measure_baseline(self, threaded: bool) -> Sample:
        """baseline (a) (on the loop) or (b) (one worker thread): encode + write."""
        path = self.other_dir / f"baseline-{'b' if threaded else 'a'}.msgpack"

        async def op() -> int:
            if threaded:
                return await anyio.to_thread.run_sync(naive_encode_and_write, self.work.batch, path)
            return naive_encode_and_write(self.work.batch, path)  # blocks the event loop

        sample = await on_loop(op, self.mem)
        path.unlink()
        return sample

    async def one_round(self, keep: bool) -> None:
        """floor, send (+ receive), send, floor, then baselines (a) and (b).

        The floor and rlwire sends run back to back in ABBA order, so drift and order
        effects (the first write after a big free, the VM's free page reporting) hit
        both alike; each contributes two samples per round.
        """
        floor1 = await self.measure_floor()
        send1 = await self.measure_send()
        receive = await self.measure_receive()
        read = self.measure_read_once()
        clear_dir(self.send_dir)
        send2 = await self.measure_send()
        clear_dir(self.send_dir)
        floor2 = await self.measure_floor()
        base_a = await self.measure_baseline(threaded=False)
        base_b = await self.measure_baseline(threaded=True)
        if keep:
            self.rows["rlwire send"].samples += [send1, send2]
            self.rows["floor (c)"].samples += [floor1, floor2]
            self.rows["receive open"].samples.append(receive)
            self.rows["read once"].samples.append(read)
            self.rows["baseline (a)"].samples.append(base_a)
            self.rows["baseline (b)"].samples.append(base_b)
        else:
            self.extra.clear()
        progress(
            f"  {'round' if keep else 'warm-up'}: floor {floor1.seconds * 1e3:.0f} ms, "
            f"send {send1.seconds * 1e3:.0f} ms (stall {as_ms(send1.stall_max)} ms), "
            f"receive {receive.seconds * 1e3:.2f} ms, send {send2.seconds * 1e3:.0f} ms "
            f"(stall {as_ms(send2.stall_max)} ms), floor {floor2.seconds * 1e3:.0f} ms, "
            f"(a) {base_a.seconds * 1e3:.0f} ms, (b) {base_b.seconds * 1e3:.0f} ms"
        )

    async def probe_size(self) -> int:
        """One untimed rlwire send, to learn how many bytes it writes (for the floor)."""
        async with rlwire.open_sender(
            self.send_dir, sidecar=("routed_experts",), on_existing="overwrite"
        ) as s:
            await s.send(self.work.batch)
        total = sum(p.stat().st_size for p in rlwire_files(self.send_dir))
        clear_dir(self.send_dir)
        return total

    async def idle_reference(self, seconds: float) -> Sample:
        """Loop lag with nothing running: the machine's own noise."""

        async def idle() -> int:
            await anyio.sleep(seconds)
            return 0

        return await on_loop(idle, self.mem)

    async def run(self) -> None:
        self.total_bytes = await self.probe_size()
        self.idle = await self.idle_reference(0.5)
        self.cpu_before = cpu_times()
        for r in range(self.args.warmup + self.args.repeats):
            await self.one_round(keep=r >= self.args.warmup)
        self.cpu_after = cpu_times()
        self.idle_after = await self.idle_reference(0.5)


# -- reporting -------------------------------------------------------------------------


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def as_ms(seconds: float | None) -> str:
    return fmt(None if seconds is None else seconds * 1e3, ".2f")


def yes(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def cpu_times() -> list[int] | None:
    """The aggregate ``cpu`` line of /proc/stat (user nice system idle iowait irq softirq
    steal ...), in clock ticks; None where unavailable."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu "):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return None


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mount = parts[1]
                if str(path).startswith(mount) and len(mount) > len(best):
                    best, kind = mount, parts[2]
    except OSError:
        pass
    return kind


def report(bench: Bench, argv: list[str]) -> str:
    args = bench.args
    rows = bench.rows
    floor_s = rows["floor (c)"].median("seconds")
    assert floor_s is not None
    out: list[str] = []
    w = out.append
    cmd = " ".join([".venv/bin/python", "benchmarks/bench_send.py", *argv])
    w(f"Command: `{cmd}`")
    w("")
    payload = bench.work.payload_bytes
    experts = bench.work.blocks[0].nbytes
    w(
        f"Workload: {args.samples} samples x {args.tokens} tokens, routed_experts uint8 "
        f"[{args.tokens}, {args.layers}, {args.topk}] ({experts / MB:.1f} MB in total), "
        f"{payload / MB:.1f} MB of array data; rlwire wrote "
        f"{bench.total_bytes / MB:.1f} MB "
        f"({', '.join(f'{k}: {v / MB:.2f} MB' for k, v in bench.sizes.items())})."
    )
    w(
        f"Backend: {args.backend}; dir: {bench.root} ({fs_type(bench.root)}); "
        f"{args.repeats} round(s) after {args.warmup} warm-up round(s), median shown (rlwire "
        f"send and floor: 2 samples per round, in the order floor, send, send, floor); "
        f"peak memory method: {bench.mem.method}."
    )
    w(
        f"Python {platform.python_version()}, numpy {np.__version__}, msgspec "
        f"{msgspec.__version__}, anyio {version('anyio')}, rlwire {rlwire.__version__}; "
        f"{os.cpu_count()} CPUs; sys.getswitchinterval() = {sys.getswitchinterval() * 1e3:g} ms."
    )
    w("")
    w(
        "| row | time ms | ratio to floor | MB/s | worst loop stall ms | p99 stall ms "
        "| peak extra MB | target | met? |"
    )
    w("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for name, row in rows.items():
        secs = row.median("seconds")
        assert secs is not None
        nbytes = row.median("nbytes")
        stall = row.median("stall_max")
        p99 = row.median("stall_p99")
        peak = row.median("peak")
        ratio = secs / floor_s
        mbps = nbytes / MB / secs if nbytes else None
        stall_ms = None if stall is None else stall * 1e3
        p99_ms = None if p99 is None else p99 * 1e3
        peak_mb = None if peak is None else peak / MB
        target, met = "— (reference)", "—"
        if name == "rlwire send":
            target = (
                f"time ≤ {TARGET_SEND_RATIO}x floor; stall ≤ {TARGET_STALL_MS:g} ms; "
                f"peak ≤ {TARGET_PEAK_MB:g} MB"
            )
            met = (
                f"time {yes(ratio <= TARGET_SEND_RATIO)}; "
                f"stall {yes(stall_ms is not None and stall_ms <= TARGET_STALL_MS)}; "
                f"peak {yes(peak_mb is not None and peak_mb <= TARGET_PEAK_MB)}"
            )
        elif name == "receive open":
            read = rows["read once"].median("seconds") or float("nan")
            target = f"≤ {TARGET_RECEIVE_READ:g}x read once ({secs / read:.2f}x)"
            met = yes(secs <= TARGET_RECEIVE_READ * read)
        elif name == "floor (c)":
            target = "— (the floor)"
        ms = f"{secs * 1e3:.{1 if secs < 0.1 else 0}f}"
        w(
            f"| {name} | {ms} | {ratio:.2f} | {fmt(mbps, '.0f')} | {fmt(stall_ms, '.2f')} "
            f"| {fmt(p99_ms, '.2f')} | {fmt(peak_mb)} | {target} | {met} |"
        )
    w("")
    w(
        "Every figure is the median over the samples of that row. Worst loop stall: the "
        "largest LagMonitor lag (1 ms sleeps) within one operation; p99: the 99th "
        "percentile of its lags. Peak extra: RSS high-water mark minus RSS just before. "
        "MB = 10^6 bytes. Ratio to floor: time / median floor time."
    )
    over = {
        name: sum(1 for s in rows[name].samples if (s.stall_max or 0) * 1e3 > TARGET_STALL_MS)
        for name in ("rlwire send", "floor (c)")
    }
    w(
        f"Operations whose worst stall exceeded {TARGET_STALL_MS:g} ms: rlwire send "
        f"{over['rlwire send']} of {len(rows['rlwire send'].samples)}, floor (c) (a thread "
        f"in os.write, GIL released) {over['floor (c)']} of {len(rows['floor (c)'].samples)}."
    )
    w("")
    w("Per-repeat values (time ms / worst stall ms / peak extra MB):")
    w("")
    for name, row in rows.items():
        parts = []
        for s in row.samples:
            peak = fmt(None if s.peak is None else s.peak / MB)
            parts.append(f"{s.seconds * 1e3:.1f} / {as_ms(s.stall_max)} / {peak}")
        w(f"- {name}: " + "; ".join(parts))
    for key, values in bench.extra.items():
        w(f"- {key}: " + "; ".join(f"{v:.1f}" for v in values))
    sends, floors = rows["rlwire send"].samples, rows["floor (c)"].samples
    w(
        "- rlwire sends / floors of each round (floor, send, send, floor): "
        + "; ".join(
            f"{(a.seconds + b.seconds) / (c.seconds + d.seconds):.2f}"
            for a, b, c, d in zip(sends[::2], sends[1::2], floors[::2], floors[1::2], strict=True)
        )
    )
    lag_counts = [s.lag_count for s in rows["rlwire send"].samples]
    w(f"- LagMonitor wake-ups recorded per rlwire send: {lag_counts}")
    for label, idle in (("before", bench.idle), ("after", bench.idle_after)):
        if idle is None:
            continue
        w(
            f"- idle loop {label} the rounds (0.5 s, nothing running): worst stall "
            f"{as_ms(idle.stall_max)} ms, p99 {as_ms(idle.stall_p99)} ms"
        )
    if bench.cpu_before and bench.cpu_after and len(bench.cpu_after) > 7:
        delta = [a - b for a, b in zip(bench.cpu_after, bench.cpu_before, strict=False)]
        total = sum(delta[:8]) or 1
        w(
            f"- CPU time during the rounds (all CPUs, /proc/stat): system {delta[2] / total:.0%}, "
            f"user {delta[0] / total:.0%}, idle {delta[3] / total:.0%}, "
            f"steal {delta[7] / total:.1%} (time the hypervisor ran something else)"
        )
    return "\n".join(out)


def rows_json(rows: dict[str, Row]) -> dict[str, dict[str, list[float | None]]]:
    """Every sample of every row, by measure: what ``--json`` writes."""
    measures = ("seconds", "nbytes", "stall_max", "stall_p99", "peak")
    return {
        name: {m: [getattr(s, m) for s in row.samples] for m in measures}
        for name, row in rows.items()
    }


def write_json(path: str, argv: list[str], payload_bytes: int, rows: dict[str, Row]) -> None:
    """The run's samples as JSON, for benchmarks/suite.py (``python3 tasks.py bench``)."""
    Path(path).write_text(
        json.dumps(
            {"argv": argv, "payload_bytes": payload_bytes, "rows": rows_json(rows)}, indent=1
        )
        + "\n"
    )


# -- main ------------------------------------------------------------------------------


def default_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark one rlwire send of a large TrainingBatch against naive "
        "msgspec baselines and the raw-write floor.",
    )
    p.add_argument("--samples", type=int, default=None, help="samples per batch (default 256)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per sample (default 8192)")
    p.add_argument("--layers", type=int, default=48, help="MoE layers (default 48)")
    p.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    p.add_argument(
        "--dir",
        default=default_dir(),
        help="where to write (default /dev/shm if it exists, else the temp dir); a "
        "fresh subdirectory is created and removed",
    )
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default 1)")
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument(
        "--mem-method",
        choices=("auto", "vmhwm", "tracemalloc"),
        default="auto",
        help="peak memory method (auto: VmHWM via /proc/self/clear_refs if it works)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="16 samples: a fast sanity run")
    p.add_argument("--json", metavar="PATH", help="also write every sample as JSON to PATH")
    args = p.parse_args(argv)
    if args.samples is None:
        args.samples = 16 if args.quick else 256
    if args.samples < 1 or args.tokens < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--samples, --tokens and --repeats must be positive, --warmup non-negative")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    mem = PeakMemory(args.mem_method)
    t0 = time.perf_counter()
    work = make_workload(args.samples, args.tokens, args.layers, args.topk, args.seed)
    progress(
        f"generated {args.samples} samples ({work.payload_bytes / MB:.0f} MB) in "
        f"{time.perf_counter() - t0:.1f} s; memory method: {mem.method}"
    )
    root = Path(tempfile.mkdtemp(prefix="rlwire-bench-", dir=args.dir))
    try:
        bench = Bench(args, work, root, mem)
        anyio.run(bench.run, backend=args.backend)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(bench, argv))
    if args.json:
        write_json(args.json, argv, work.payload_bytes, bench.rows)
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
