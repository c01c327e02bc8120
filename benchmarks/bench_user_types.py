"""Benchmark rlwire on users' own types: framework-shaped msgspec Structs with list fields.

RL frameworks define their training batches as msgspec Structs (``array_like=True,
gc=False, omit_defaults=True``) with per-token ``list[int]`` / ``list[bool]`` /
``list[float]`` fields, optional fields defaulting to None, and large arrays as a nested
Struct ``{data: bytes, shape: list[int], dtype: str}``. This script defines such types
(``MicroBatch``, ``RoutedExperts``, ``Tensor``), builds one step of them, and measures,
in the same run:

* rlwire send: ``rlwire.open_sender(dir, sidecar=("routed_experts",))`` and
  ``await sender.send_ranks(per_rank)``, one message per data-parallel rank, each a
  ``list[MicroBatch]``; the types unchanged. Only ``send_ranks`` is timed.
* (a) ``to_thread`` encode + write: per rank, ``await anyio.to_thread.run_sync(lambda:
  write(path, encoder.encode(obj)))``, one msgspec encode of the rank's whole object and
  one file write in one worker-thread call.
* (b) raw-sidecar writer, as the frameworks' fix does it: per micro-batch, the
  routed-expert bytes go raw to a side file (``os.write`` in a worker thread), the rest
  of the micro-batch (with ``routed_experts.data`` emptied) is msgspec-encoded on the
  loop, then ``await anyio.sleep(0)``; each rank's encoded parts are written to its main
  file from a worker thread.
* (c) floor: one worker-thread call that writes as many bytes as rlwire wrote, rank by
  rank, from the same buffers (the routed-expert and multimodal ``bytes``, then zeros for
  the rest) with ``os.write``; no encoding.
* (e) msgspec encode of the non-buffer data: ``encoder.encode(obj)`` of each rank's object
  with every ``data`` field emptied, in a worker thread (the reference in the second send
  target, ``send <= floor + 1.2 x (e)``).
* rlwire areceive: ``rlwire.open_receiver(dir, type=list[MicroBatch]).areceive()`` of
  rank 0's message of the step just sent (open, read, verify, decode into the types).
* msgspec decode: ``msgspec.msgpack.Decoder(list[MicroBatch]).decode(buf)`` of rank 0's
  message as (a) encodes it, from one in-memory buffer, in a worker thread.

Each of ``--repeats`` rounds (after ``--warmup`` discarded ones, and followed by the
memory round described below) runs, in this order:
(e), floor, (b), send, areceive, decode, decode, send, areceive, (b), floor, (a), (e);
so send, (b) and floor run ABBA (two samples each per round), as do areceive and decode.
Once per run (in the first round, untimed) every rank's rlwire message is received and
compared (==) with the object sent, and (a)'s and (b)'s files are read back and compared
too; any difference stops the run.

Loop stalls come from :class:`rlwire.LagMonitor` (1 ms sleeps; a stall is how late a
sleep wakes up; epoll's millisecond timeouts alone make wake-ups up to ~1 ms late).
Peak memory comes from one extra pass after the timed rounds that runs each operation once
under ``tracemalloc`` (bench_send.py's ``PeakMemory("tracemalloc")``: the peak of Python's
and numpy's traced allocations during the operation above the level just before it); its
times are discarded, since tracing slows allocation. The timed rounds record bench_send.py's
default, the RSS high-water mark above the RSS before (``/proc/self/clear_refs`` +
``VmHWM``), listed per repeat but not used for the table: in a process that has already
freed memory, glibc reuses it without raising the RSS (worker threads' arenas keep their
freed tops even through ``malloc_trim``), so an operation's figure depends on what ran
before it (a lone msgspec decode of rank 0 reads 117 MB, or 155 MB after ``malloc_trim(0)``;
inside this benchmark's rounds 70-85 MB). ``--no-memory-round`` takes the table's figures
from the timed rounds instead.

The generated step is moved out of the garbage collector's way (``gc.freeze()``) so that
collections do not walk its 12 million list items during the timed operations.

Usage::

    .venv/bin/python benchmarks/bench_user_types.py                  # full size, asyncio and trio
    .venv/bin/python benchmarks/bench_user_types.py --backend trio
    .venv/bin/python benchmarks/bench_user_types.py --quick          # 1/16 of the tokens
    .venv/bin/python benchmarks/bench_user_types.py --json results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
from bench_send import (
    MB,
    PeakMemory,
    Row,
    Sample,
    as_ms,
    clear_dir,
    cpu_times,
    default_dir,
    fmt,
    fs_type,
    on_loop,
    progress,
    rlwire_files,
    yes,
)

import rlwire

# Targets of issue 12 for the rlwire rows.
TARGET_VS_B = 1.1  # send time / baseline (b) time
TARGET_ENCODE_FACTOR = 1.2  # send time <= floor + this x msgspec's encode of the non-buffer data
TARGET_STALL_MS = 2.0  # worst loop stall during send and during areceive
TARGET_PEAK_MB = 64.0  # peak memory during the send above the level just before it

VOCAB = 151_936
PROMPT_FRACTION = 8  # the first 1/8 of each sample's tokens is prompt (loss_mask False)


# -- the framework's types (as frameworks declare them; nothing rlwire-specific) --------


class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """Router-replay expert ids, uint8 ``[seq_len, layers, topk]``, as raw bytes."""

    data: bytes
    shape: list[int]
    dtype: str


class Tensor(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """A multimodal tensor (pixel values, grid sizes) in the same raw-bytes shape."""

    data: bytes
    shape: list[int]
    dtype: str


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """Several samples' tokens packed into one sequence, one list item per token."""

    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    temperatures: list[float]
    step: int
    num_samples: int
    seq_lens: list[int]
    teacher_logprobs: list[float] | None = None
    lora_idx: int | None = None
    routed_experts: RoutedExperts | None = None
    mm: dict[str, Tensor] | None = None


PerRank = list[MicroBatch]


# -- the workload ----------------------------------------------------------------------


@dataclass
class Workload:
    ranks: list[PerRank]  # what send_ranks sends: one list of micro-batches per rank
    emptied: list[PerRank]  # the same with every `data` field b"" (for (e))
    samples_per_mb: int
    tokens_per_mb: int
    list_values: int  # per-token list items in the whole step

    def buffers(self, rank: int) -> list[bytes]:
        """The rank's raw buffers (routed experts, then multimodal tensors)."""
        out: list[bytes] = []
        for mb in self.ranks[rank]:
            if mb.routed_experts is not None:
                out.append(mb.routed_experts.data)
            for tensor in (mb.mm or {}).values():
                out.append(tensor.data)
        return out

    @property
    def expert_bytes(self) -> int:
        return sum(len(mb.routed_experts.data) for r in self.ranks for mb in r if mb.routed_experts)

    @property
    def buffer_bytes(self) -> int:
        return sum(len(b) for r in range(len(self.ranks)) for b in self.buffers(r))


def make_workload(args: argparse.Namespace) -> Workload:
    rng = np.random.default_rng(args.seed)
    n_mb = args.ranks * args.micro_batches
    k = args.samples // n_mb  # samples packed per micro-batch
    t = args.tokens
    n = k * t
    prompt = np.arange(t) >= t // PROMPT_FRACTION  # completion tokens are trained on
    positions = np.tile(np.arange(t), k)
    mask = np.tile(prompt, k)
    ranks: list[PerRank] = []
    emptied: list[PerRank] = []
    for _ in range(args.ranks):
        mbs: list[MicroBatch] = []
        empties: list[MicroBatch] = []
        for i in range(args.micro_batches):
            experts = RoutedExperts(
                rng.bytes(n * args.layers * args.topk), [n, args.layers, args.topk], "uint8"
            )
            mm = None
            if i == 0 and args.mm_kib > 0:  # one image per rank: a dict[str, Struct] field
                side = int(math.sqrt(args.mm_kib * 1024 // 6))
                pixels = rng.standard_normal((side * side, 3)).astype(np.float16)
                mm = {
                    "pixel_values": Tensor(pixels.tobytes(), list(pixels.shape), "float16"),
                    "image_grid_thw": Tensor(
                        np.array([[1, side, side]], np.int64).tobytes(), [1, 3], "int64"
                    ),
                }
            logprobs = np.where(mask, -rng.exponential(size=n), 0.0)
            mb = MicroBatch(
                input_ids=rng.integers(0, VOCAB, size=n).tolist(),
                loss_mask=mask.tolist(),
                advantages=np.repeat(rng.standard_normal(k), t).tolist(),
                inference_logprobs=logprobs.tolist(),
                position_ids=positions.tolist(),
                temperatures=np.full(n, 1.0).tolist(),
                step=7,
                num_samples=k,
                seq_lens=[t] * k,
                routed_experts=experts,
                mm=mm,
            )
            mbs.append(mb)
            empties.append(
                msgspec.structs.replace(
                    mb,
                    routed_experts=RoutedExperts(b"", experts.shape, experts.dtype),
                    mm=None
                    if mm is None
                    else {key: Tensor(b"", v.shape, v.dtype) for key, v in mm.items()},
                )
            )
        ranks.append(mbs)
        emptied.append(empties)
    return Workload(ranks, emptied, k, n, 6 * n * n_mb)


# -- the baselines ---------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(PerRank)


def write_all(fd: int, buffers: Sequence[bytes | memoryview]) -> int:
    """Write every buffer to ``fd`` with os.write (partial writes retried)."""
    total = 0
    for buf in buffers:
        view = memoryview(buf)
        pos = 0
        while pos < view.nbytes:
            pos += os.write(fd, view[pos:])
        total += pos
    return total


def write_file(path: Path, buffers: Sequence[bytes | memoryview]) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return write_all(fd, buffers)
    finally:
        os.close(fd)


def encode_and_write(obj: PerRank, path: Path) -> int:
    """Baseline (a)'s thread body: encode the whole object, write it, free it."""
    data = _encoder.encode(obj)
    return write_file(path, [data])


def msgpack_array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


async def raw_sidecar_write(ranks: list[PerRank], root: Path) -> int:
    """Baseline (b): msgspec for everything but the routed-expert bytes, which go raw to
    a side file; a yield per micro-batch; writes from worker threads.

    The main file of a rank is a msgpack array of its micro-batches with
    ``routed_experts.data`` empty; the side file holds their bytes in order (each one's
    length follows from its shape and dtype).
    """
    total = 0
    for rank, mbs in enumerate(ranks):
        parts = [msgpack_array_header(len(mbs))]
        fd = os.open(root / f"b-rank{rank}.side", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for mb in mbs:
                experts = mb.routed_experts
                if experts is not None:
                    total += await anyio.to_thread.run_sync(write_all, fd, [experts.data])
                    mb = msgspec.structs.replace(
                        mb, routed_experts=RoutedExperts(b"", experts.shape, experts.dtype)
                    )
                parts.append(_encoder.encode(mb))  # on the loop, one micro-batch
                await anyio.sleep(0)
        finally:
            os.close(fd)
        total += await anyio.to_thread.run_sync(write_file, root / f"b-rank{rank}.msgpack", parts)
    return total


def read_raw_sidecar(root: Path, rank: int) -> PerRank:
    """Read back what :func:`raw_sidecar_write` wrote for ``rank`` (untimed check)."""
    mbs = _decoder.decode((root / f"b-rank{rank}.msgpack").read_bytes())
    side = (root / f"b-rank{rank}.side").read_bytes()
    pos = 0
    out = []
    for mb in mbs:
        experts = mb.routed_experts
        if experts is not None:
            size = math.prod(experts.shape) * np.dtype(experts.dtype).itemsize
            data = side[pos : pos + size]
            pos += size
            mb = msgspec.structs.replace(
                mb, routed_experts=RoutedExperts(data, experts.shape, experts.dtype)
            )
        out.append(mb)
    if pos != len(side):
        raise AssertionError(f"(b) rank {rank}: side file has {len(side) - pos} bytes left over")
    return out


def first_difference(got: Any, sent: PerRank) -> str:
    """Where ``got`` differs from ``sent``, for the error message."""
    if not isinstance(got, list) or len(got) != len(sent):
        return f"got {type(got).__name__} of length {len(got)}, sent {len(sent)} micro-batches"
    for i, (a, b) in enumerate(zip(got, sent, strict=True)):
        if type(a) is not type(b):
            return f"[{i}]: got {type(a).__name__}, sent {type(b).__name__}"
        for name in b.__struct_fields__:
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                return f"[{i}].{name}: got {str(x)[:80]!r}, sent {str(y)[:80]!r}"
    return "equal"


def check_equal(got: Any, sent: PerRank, what: str) -> None:
    if got != sent:
        raise AssertionError(f"ROUND TRIP FAILED: {what}: {first_difference(got, sent)}")


# -- measuring -------------------------------------------------------------------------


ROWS = (
    "rlwire send",
    "(a) to_thread(encode + write)",
    "(b) raw-sidecar writer",
    "(c) floor",
    "(e) msgspec encode, data emptied",
    "rlwire areceive",
    "msgspec decode",
)
SEND, A, B, FLOOR, E, RECV, DECODE = ROWS


@dataclass
class Bench:
    args: argparse.Namespace
    work: Workload
    root: Path
    mem: PeakMemory
    backend: str
    rows: dict[str, Row] = field(default_factory=dict)  # the timed rounds
    mem_rows: dict[str, Row] = field(default_factory=dict)  # the memory round
    memory_round: bool = False  # measuring memory with tracemalloc, times discarded
    traced: PeakMemory = field(default_factory=lambda: PeakMemory("tracemalloc"))
    extra: dict[str, list[float]] = field(default_factory=dict)
    rank_bytes: list[int] = field(default_factory=list)  # what rlwire writes per rank
    sizes: dict[str, int] = field(default_factory=dict)  # rlwire's files of one send
    written: dict[str, int] = field(default_factory=dict)  # bytes written per row
    decode_buffer: bytes = b""  # rank 0's object as (a) encodes it
    pad: memoryview = field(default_factory=lambda: memoryview(b""))  # the floor's zeros
    checked: bool = False
    idle: Sample | None = None
    idle_after: Sample | None = None
    cpu_before: list[int] | None = None
    cpu_after: list[int] | None = None

    def __post_init__(self) -> None:
        self.rows = {name: Row(name) for name in ROWS}
        self.mem_rows = {name: Row(name) for name in ROWS}
        self.send_dir = self.root / "rlwire"
        self.other_dir = self.root / "other"
        self.send_dir.mkdir()
        self.other_dir.mkdir()

    def note(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)

    async def measure(self, op: Callable[[], Awaitable[int]]) -> Sample:
        return await on_loop(op, self.traced if self.memory_round else self.mem)

    async def measure_send(self) -> Sample:
        """rlwire send_ranks; the step is left in ``send_dir`` for the receivers."""
        t0 = time.perf_counter()
        sender = rlwire.open_sender(
            self.send_dir, sidecar=("routed_experts",), on_existing="overwrite"
        )
        async with sender as s:
            self.note("sender open ms", (time.perf_counter() - t0) * 1e3)

            async def send() -> int:
                await s.send_ranks(self.work.ranks)
                return 0

            sample = await self.measure(send)
            t1 = time.perf_counter()
        self.note("sender close ms", (time.perf_counter() - t1) * 1e3)
        self.sizes = {p.name: p.stat().st_size for p in rlwire_files(self.send_dir)}
        sample.nbytes = sum(self.sizes.values())
        if sample.nbytes != sum(self.rank_bytes):
            raise AssertionError(
                f"rlwire wrote {sample.nbytes} bytes, {sum(self.rank_bytes)} before"
            )
        return sample

    async def measure_receive(self) -> Sample:
        """rlwire areceive of rank 0's message of the step in ``send_dir``."""
        got: list[Any] = []

        async def receive() -> int:
            receiver = rlwire.open_receiver(self.send_dir, type=PerRank)
            got.append(await receiver.areceive(timeout=30))
            await receiver.aclose()
            return 0

        sample = await self.measure(receive)
        if not self.checked:
            check_equal(got[0], self.work.ranks[0], "rlwire areceive, rank 0")
        got.clear()
        gc.collect()
        return sample

    async def measure_decode(self) -> Sample:
        got: list[Any] = []

        async def decode() -> int:
            got.append(await anyio.to_thread.run_sync(_decoder.decode, self.decode_buffer))
            return 0

        sample = await self.measure(decode)
        got.clear()
        gc.collect()
        return sample

    async def measure_a(self) -> Sample:
        async def op() -> int:
            total = 0
            for rank, obj in enumerate(self.work.ranks):
                path = self.other_dir / f"a-rank{rank}.msgpack"
                total += await anyio.to_thread.run_sync(encode_and_write, obj, path)
            return total

        sample = await self.measure(op)
        if not self.checked:
            for rank, sent in enumerate(self.work.ranks):
                path = self.other_dir / f"a-rank{rank}.msgpack"
                check_equal(_decoder.decode(path.read_bytes()), sent, f"(a) rank {rank}")
        clear_dir(self.other_dir)
        return sample

    async def measure_b(self) -> Sample:
        sample = await self.measure(lambda: raw_sidecar_write(self.work.ranks, self.other_dir))
        if not self.checked:
            for rank, sent in enumerate(self.work.ranks):
                check_equal(read_raw_sidecar(self.other_dir, rank), sent, f"(b) rank {rank}")
        clear_dir(self.other_dir)
        return sample

    async def measure_floor(self) -> Sample:
        """As many bytes per rank as rlwire writes: the rank's buffers, then zeros."""
        work, pad = self.work, self.pad

        def floor() -> int:
            total = 0
            for rank, nbytes in enumerate(self.rank_bytes):
                buffers: list[bytes | memoryview] = list(work.buffers(rank))
                left = nbytes - sum(len(b) for b in buffers)
                if left < 0:
                    raise AssertionError(f"rlwire wrote less than the buffers for rank {rank}")
                buffers.append(pad[:left])
                total += write_file(self.other_dir / f"floor-rank{rank}.bin", buffers)
            return total

        sample = await self.measure(lambda: anyio.to_thread.run_sync(floor))
        clear_dir(self.other_dir)
        return sample

    async def measure_e(self) -> Sample:
        async def op() -> int:
            total = 0
            for obj in self.work.emptied:
                total += await anyio.to_thread.run_sync(lambda o=obj: len(_encoder.encode(o)))
            return total

        return await self.measure(op)

    async def check_all_ranks(self) -> None:
        """Receive every rank's message of the step in ``send_dir`` and compare it."""
        for rank, sent in enumerate(self.work.ranks):
            with rlwire.open_receiver(self.send_dir, type=PerRank, rank=rank) as receiver:
                got = receiver.receive(timeout=30)
            check_equal(got, sent, f"rlwire rank {rank}")
            del got
        gc.collect()
        progress(f"  round trips equal: rlwire ({len(self.work.ranks)} ranks), (a), (b)")

    async def one_round(self, kind: str) -> None:
        """One round; ``kind`` is "warm-up" (discarded), "round" (timed) or "memory" (each
        operation once, under tracemalloc, for the peak memory only)."""
        r: dict[str, list[Sample]] = {name: [] for name in ROWS}
        if kind == "memory":
            r[E].append(await self.measure_e())
            r[FLOOR].append(await self.measure_floor())
            r[B].append(await self.measure_b())
            r[SEND].append(await self.measure_send())
            r[RECV].append(await self.measure_receive())
            clear_dir(self.send_dir)
            r[DECODE].append(await self.measure_decode())
            r[A].append(await self.measure_a())
            self.mem_rows = {name: Row(name, samples) for name, samples in r.items()}
            self.extra.clear()
            progress(
                "  memory (tracemalloc, MB): "
                + ", ".join(f"{name} {fmt(r[name][0].peak / MB)}" for name in ROWS)
            )
            return
        r[E].append(await self.measure_e())
        r[FLOOR].append(await self.measure_floor())
        r[B].append(await self.measure_b())
        r[SEND].append(await self.measure_send())
        if not self.checked:
            await self.check_all_ranks()
        r[RECV].append(await self.measure_receive())
        clear_dir(self.send_dir)
        r[DECODE].append(await self.measure_decode())
        r[DECODE].append(await self.measure_decode())
        r[SEND].append(await self.measure_send())
        r[RECV].append(await self.measure_receive())
        clear_dir(self.send_dir)
        r[B].append(await self.measure_b())
        r[FLOOR].append(await self.measure_floor())
        r[A].append(await self.measure_a())
        r[E].append(await self.measure_e())
        self.checked = True
        for name, samples in r.items():
            self.written[name] = samples[0].nbytes
        if kind == "round":
            for name, samples in r.items():
                self.rows[name].samples += samples
        else:
            self.extra.clear()

        def ms(name: str) -> str:
            return "/".join(f"{s.seconds * 1e3:.0f}" for s in r[name])

        def st(name: str) -> str:
            return "/".join(as_ms(s.stall_max) for s in r[name])

        progress(
            f"  {kind}: send {ms(SEND)} ms (stall {st(SEND)}), "
            f"(b) {ms(B)}, floor {ms(FLOOR)}, (a) {ms(A)} (stall {st(A)}), (e) {ms(E)}, "
            f"areceive {ms(RECV)} (stall {st(RECV)}), decode {ms(DECODE)}"
        )

    async def probe(self) -> None:
        """One untimed rlwire send: bytes per rank (for the floor), and the decode buffer."""
        async with rlwire.open_sender(
            self.send_dir, sidecar=("routed_experts",), on_existing="overwrite"
        ) as s:
            await s.send_ranks(self.work.ranks)
        files = rlwire_files(self.send_dir)
        self.rank_bytes = [
            sum(p.stat().st_size for p in files if f".rank-{rank:04d}." in p.name)
            for rank in range(len(self.work.ranks))
        ]
        if sum(self.rank_bytes) != sum(p.stat().st_size for p in files):
            raise AssertionError(f"unexpected rlwire file names: {[p.name for p in files]}")
        self.sizes = {p.name: p.stat().st_size for p in files}
        clear_dir(self.send_dir)
        buffers = [sum(len(b) for b in self.work.buffers(r)) for r in range(len(self.rank_bytes))]
        self.pad = memoryview(
            bytes(max(n - b for n, b in zip(self.rank_bytes, buffers, strict=True)))
        )
        self.decode_buffer = _encoder.encode(self.work.ranks[0])

    async def idle_reference(self, seconds: float) -> Sample:
        async def idle() -> int:
            await anyio.sleep(seconds)
            return 0

        return await on_loop(idle, self.mem)

    async def run(self) -> None:
        await self.probe()
        self.idle = await self.idle_reference(0.5)
        self.cpu_before = cpu_times()
        for r in range(self.args.warmup + self.args.repeats):
            await self.one_round("round" if r >= self.args.warmup else "warm-up")
        if self.args.memory_round:
            self.memory_round = True
            try:
                await self.one_round("memory")
            finally:
                self.memory_round = False
                tracemalloc.stop()
        self.cpu_after = cpu_times()
        self.idle_after = await self.idle_reference(0.5)
        self.decode_buffer = b""


# -- reporting -------------------------------------------------------------------------


def med(row: Row, attr: str = "seconds") -> float:
    value = row.median(attr)
    assert value is not None
    return value


def span(row: Row, attr: str, scale: float = 1e3, spec: str = ".0f") -> str:
    values = [getattr(s, attr) for s in row.samples]
    if not values or any(v is None for v in values):
        return "—"
    return f"{min(values) * scale:{spec}}-{max(values) * scale:{spec}}"


def ms_text(seconds: float) -> str:
    return f"{seconds * 1e3:.{1 if seconds < 0.1 else 0}f}"


@dataclass
class Target:
    name: str
    measured: str
    met: bool
    value: float  # the ratio or figure compared


def peak_rows(bench: Bench) -> dict[str, Row]:
    """Where the peak memory figures come from: the memory round if there was one."""
    return bench.mem_rows if bench.args.memory_round else bench.rows


def targets(bench: Bench) -> list[Target]:
    rows = bench.rows
    send, b, floor, e = med(rows[SEND]), med(rows[B]), med(rows[FLOOR]), med(rows[E])
    recv, decode = med(rows[RECV]), med(rows[DECODE])
    bound = floor + TARGET_ENCODE_FACTOR * e
    send_stall = med(rows[SEND], "stall_max") * 1e3
    recv_stall = med(rows[RECV], "stall_max") * 1e3
    peak = med(peak_rows(bench)[SEND], "peak") / MB
    per_round = [
        (s1.seconds + s2.seconds) / (b1.seconds + b2.seconds)
        for s1, s2, b1, b2 in zip(
            rows[SEND].samples[::2],
            rows[SEND].samples[1::2],
            rows[B].samples[::2],
            rows[B].samples[1::2],
            strict=True,
        )
    ]
    return [
        Target(
            f"send ≤ {TARGET_VS_B} x (b)",
            f"{send / b:.2f} x (per round {min(per_round):.2f}-{max(per_round):.2f})",
            send / b <= TARGET_VS_B,
            send / b,
        ),
        Target(
            f"send ≤ floor + {TARGET_ENCODE_FACTOR} x (e)",
            f"{ms_text(send)} ms vs {ms_text(floor)} + {TARGET_ENCODE_FACTOR} x {ms_text(e)} = "
            f"{ms_text(bound)} ms ({send / bound:.2f} x)",
            send <= bound,
            send / bound,
        ),
        Target(
            f"send worst stall ≤ {TARGET_STALL_MS:g} ms",
            f"{send_stall:.2f} ms (range {span(rows[SEND], 'stall_max', spec='.2f')})",
            send_stall <= TARGET_STALL_MS,
            send_stall,
        ),
        Target(
            f"areceive worst stall ≤ {TARGET_STALL_MS:g} ms",
            f"{recv_stall:.2f} ms (range {span(rows[RECV], 'stall_max', spec='.2f')})",
            recv_stall <= TARGET_STALL_MS,
            recv_stall,
        ),
        Target(
            "receive-to-object ≤ msgspec decode",
            f"{ms_text(recv)} vs {ms_text(decode)} ms ({recv / decode:.2f} x)",
            recv <= decode,
            recv / decode,
        ),
        Target(
            f"send peak extra memory ≤ {TARGET_PEAK_MB:g} MB",
            f"{peak:.1f} MB",
            peak <= TARGET_PEAK_MB,
            peak,
        ),
    ]


def describe_workload(work: Workload, args: argparse.Namespace, bench: Bench) -> str:
    e_bytes = bench.written.get(E, 0)
    side = sum(v for k, v in bench.sizes.items() if "sidecar" in k)
    main = sum(v for k, v in bench.sizes.items() if "sidecar" not in k)
    return (
        f"Workload: one step of {args.samples} samples x {args.tokens} tokens "
        f"({args.samples * args.tokens:,} tokens) as {args.ranks} rank(s) x "
        f"{args.micro_batches} `MicroBatch`es of {work.samples_per_mb} packed samples "
        f"({work.tokens_per_mb:,} tokens); per-token list fields: {work.list_values / 1e6:.1f} M "
        f"items ({e_bytes / MB:.1f} MB as msgpack, data fields emptied: row (e)); "
        f"`routed_experts` uint8 [{work.tokens_per_mb}, {args.layers}, {args.topk}] per "
        f"micro-batch ({work.expert_bytes / MB:.1f} MB in total); one {args.mm_kib} KiB image "
        f"per rank in `mm`. rlwire wrote {(side + main) / MB:.1f} MB "
        f"(sidecar files {side / MB:.1f} MB, main files {main / MB:.1f} MB); (a) wrote "
        f"{bench.written.get(A, 0) / MB:.1f} MB, (b) {bench.written.get(B, 0) / MB:.1f} MB."
    )


def report(bench: Bench, argv: list[str]) -> str:
    args, rows = bench.args, bench.rows
    b, floor = med(rows[B]), med(rows[FLOOR])
    out: list[str] = []
    w = out.append
    w(f"#### {bench.backend}")
    w("")
    w(
        f"Backend: {bench.backend}; dir: {bench.root} ({fs_type(bench.root)}); {args.repeats} "
        f"round(s) after {args.warmup} warm-up round(s); send, (b), floor, (e), areceive and "
        f"decode 2 samples per round, (a) 1. {memory_note(bench)}"
    )
    w("")
    w(
        "| row | time ms | range ms | vs (b) | vs floor | worst stall ms | range ms "
        "| p99 stall ms | peak extra MB |"
    )
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        secs = med(row)
        stall, p99 = row.median("stall_max"), row.median("stall_p99")
        peak = peak_rows(bench)[name].median("peak")
        sends = name in (SEND, A, B, FLOOR)
        spec = ".1f" if secs < 0.1 else ".0f"
        w(
            f"| {name} | {ms_text(secs)} | {span(row, 'seconds', spec=spec)} "
            f"| {fmt(secs / b if sends else None, '.2f')} "
            f"| {fmt(secs / floor if sends else None, '.2f')} "
            f"| {as_ms(stall)} | {span(row, 'stall_max', spec='.2f')} | {as_ms(p99)} "
            f"| {fmt(None if peak is None else peak / MB)} |"
        )
    w("")
    w("| target (issue 12) | measured (medians) | met? |")
    w("|---|---|---|")
    for t in targets(bench):
        w(f"| {t.name} | {t.measured} | {yes(t.met)} |")
    w("")
    w(
        "Per-repeat values of the timed rounds (time ms / worst stall ms / peak extra MB "
        "by VmHWM, which memory freed earlier can hide):"
    )
    w("")
    for name, row in rows.items():
        parts = []
        for s in row.samples:
            peak = fmt(None if s.peak is None else s.peak / MB)
            parts.append(f"{s.seconds * 1e3:.1f} / {as_ms(s.stall_max)} / {peak}")
        w(f"- {name}: " + "; ".join(parts))
    if bench.args.memory_round:
        w(
            "- memory pass, peak extra MB by tracemalloc: "
            + "; ".join(
                f"{name} "
                + "/".join(fmt(None if s.peak is None else s.peak / MB) for s in row.samples)
                for name, row in bench.mem_rows.items()
            )
        )
    for key, values in bench.extra.items():
        w(f"- {key}: " + "; ".join(f"{v:.1f}" for v in values))
    w(f"- LagMonitor wake-ups per rlwire send: {[s.lag_count for s in rows[SEND].samples]}")
    for label, idle in (("before", bench.idle), ("after", bench.idle_after)):
        if idle is not None:
            w(
                f"- idle loop {label} the rounds (0.5 s, nothing running): worst stall "
                f"{as_ms(idle.stall_max)} ms, p99 {as_ms(idle.stall_p99)} ms"
            )
    if bench.cpu_before and bench.cpu_after and len(bench.cpu_after) > 7:
        delta = [a - c for a, c in zip(bench.cpu_after, bench.cpu_before, strict=False)]
        total = sum(delta[:8]) or 1
        w(
            f"- CPU time during the rounds (all CPUs, /proc/stat): system {delta[2] / total:.0%}, "
            f"user {delta[0] / total:.0%}, idle {delta[3] / total:.0%}, "
            f"steal {delta[7] / total:.1%}"
        )
    return "\n".join(out)


def memory_note(bench: Bench) -> str:
    if not bench.args.memory_round:
        return f"Peak extra memory: {bench.mem.method}, in the timed rounds."
    return (
        "Peak extra memory: tracemalloc, in one extra pass after the timed rounds that runs "
        "each operation once (its times discarded); the timed rounds' "
        f"{bench.mem.method} figures are in the per-repeat lines."
    )


def rlwire_source() -> str:
    """Where ``rlwire`` was imported from, with its git commit when it is a checkout."""
    where = Path(rlwire.__file__).parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "log", "-1", "--format=%h"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return str(where)
    return f"{where}, commit {commit}" + (" with uncommitted changes" if dirty else "")


def header(benches: list[Bench], argv: list[str]) -> str:
    bench = benches[0]
    cmd = " ".join([".venv/bin/python", "benchmarks/bench_user_types.py", *argv])
    return "\n".join(
        [
            f"Command: `{cmd}`",
            "",
            describe_workload(bench.work, bench.args, bench),
            "",
            f"Python {platform.python_version()}, msgspec {msgspec.__version__}, anyio "
            f"{version('anyio')}, trio {version('trio')}, numpy {np.__version__}, rlwire "
            f"{rlwire.__version__} ({rlwire_source()}); {os.cpu_count()} CPUs; "
            "sys.getswitchinterval() = "
            f"{sys.getswitchinterval() * 1e3:g} ms.",
            "",
            "Time: median over the row's samples; range: min-max. vs (b) / vs floor: median "
            "time / median time of (b) / of the floor, same run. Worst stall: the largest "
            "LagMonitor lag (1 ms sleeps) within one operation (median, and the range over "
            "operations); p99: the 99th percentile of its lags (median). Peak extra: the "
            "peak memory above the level just before the operation, by the method each "
            "backend's line names. MB = 10^6 bytes. areceive and decode are "
            "rank 0's message only. p99 is by nearest rank, so for an operation with fewer "
            "than 100 LagMonitor wake-ups (every one that holds the GIL throughout) it is "
            "the worst stall.",
            "",
            "Round trips (checked once per backend, untimed): every rank's rlwire message, "
            "received with `type=list[MicroBatch]`, and (a)'s and (b)'s files read back, "
            "compare equal (==) to the objects sent.",
        ]
    )


def to_json(benches: list[Bench], argv: list[str]) -> dict[str, Any]:
    bench = benches[0]
    work, args = bench.work, bench.args
    return {
        "command": " ".join(["benchmarks/bench_user_types.py", *argv]),
        "workload": {
            "samples": args.samples,
            "tokens": args.tokens,
            "ranks": args.ranks,
            "micro_batches": args.micro_batches,
            "samples_per_micro_batch": work.samples_per_mb,
            "layers": args.layers,
            "topk": args.topk,
            "mm_kib": args.mm_kib,
            "expert_bytes": work.expert_bytes,
            "buffer_bytes": work.buffer_bytes,
            "list_values": work.list_values,
            "non_buffer_msgpack_bytes": bench.written.get(E, 0),
            "rlwire_files": bench.sizes,
            "bytes_written": bench.written,
        },
        "environment": {
            "python": platform.python_version(),
            "msgspec": msgspec.__version__,
            "anyio": version("anyio"),
            "trio": version("trio"),
            "numpy": np.__version__,
            "rlwire": rlwire.__version__,
            "rlwire_source": rlwire_source(),
            "cpus": os.cpu_count(),
            "memory_method": memory_note(bench),
            "dir_fs": fs_type(bench.root),
        },
        "backends": {
            b.backend: {
                "rows": {
                    name: {
                        "median_ms": med(row) * 1e3,
                        "worst_stall_median_ms": med(row, "stall_max") * 1e3,
                        "p99_stall_median_ms": med(row, "stall_p99") * 1e3,
                        "peak_extra_median_mb": med(peak_rows(b)[name], "peak") / MB,
                        "samples": [dataclasses.asdict(s) for s in row.samples],
                        "memory_round_samples": [
                            dataclasses.asdict(s) for s in b.mem_rows[name].samples
                        ],
                    }
                    for name, row in b.rows.items()
                },
                "targets": [dataclasses.asdict(t) for t in targets(b)],
                "extra": b.extra,
                "idle_before": None if b.idle is None else dataclasses.asdict(b.idle),
                "idle_after": None if b.idle_after is None else dataclasses.asdict(b.idle_after),
            }
            for b in benches
        },
    }


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark rlwire on framework-shaped msgspec Structs (list fields, "
        "routed experts as bytes) against the frameworks' own writers and the floor.",
    )
    p.add_argument("--samples", type=int, default=256, help="samples per step (default 256)")
    p.add_argument(
        "--tokens", type=int, default=None, help="tokens per sample (default 8192 x --scale)"
    )
    p.add_argument(
        "--scale",
        type=float,
        default=None,
        help="shrink the tokens per sample, hence every byte and list, by this factor "
        "(default 1; --quick: 1/16)",
    )
    p.add_argument("--ranks", type=int, default=8, help="data-parallel ranks (default 8)")
    p.add_argument(
        "--micro-batches", type=int, default=8, help="micro-batches per rank (default 8)"
    )
    p.add_argument("--layers", type=int, default=48, help="MoE layers (default 48)")
    p.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    p.add_argument(
        "--mm-kib", type=int, default=64, help="one image of this size per rank in `mm` (0: none)"
    )
    p.add_argument(
        "--dir",
        default=default_dir(),
        help="where to write (default /dev/shm if it exists, else the temp dir); a "
        "fresh subdirectory is created and removed",
    )
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default 1)")
    p.add_argument("--backend", choices=("asyncio", "trio", "both"), default="both")
    p.add_argument(
        "--mem-method",
        choices=("auto", "vmhwm", "tracemalloc"),
        default="auto",
        help="peak memory method (auto: VmHWM via /proc/self/clear_refs if it works)",
    )
    p.add_argument(
        "--no-memory-round",
        dest="memory_round",
        action="store_false",
        help="take the table's peak memory from the timed rounds (--mem-method) instead of "
        "one extra round under tracemalloc",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="--scale 1/16: a fast sanity run")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.scale is None:
        args.scale = 1 / 16 if args.quick else 1.0
    if args.tokens is None:
        args.tokens = max(1, round(8192 * args.scale))
    if min(args.samples, args.tokens, args.ranks, args.micro_batches, args.repeats) < 1:
        p.error("sizes and --repeats must be positive")
    if args.warmup < 0 or args.mm_kib < 0:
        p.error("--warmup and --mm-kib must not be negative")
    if args.samples % (args.ranks * args.micro_batches):
        p.error("--samples must be a multiple of --ranks x --micro-batches")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    mem = PeakMemory(args.mem_method)
    t0 = time.perf_counter()
    work = make_workload(args)
    gc.collect()
    gc.freeze()  # keep the step's 12 M list items out of every collection
    progress(
        f"generated {args.samples} samples x {args.tokens} tokens "
        f"({work.expert_bytes / MB:.0f} MB of routed experts, {work.list_values / 1e6:.1f} M "
        f"list items) in {time.perf_counter() - t0:.1f} s; memory method: {mem.method}"
    )
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    benches: list[Bench] = []
    for backend in backends:
        progress(f"{backend}:")
        root = Path(tempfile.mkdtemp(prefix="rlwire-bench-", dir=args.dir))
        try:
            bench = Bench(args, work, root, mem, backend)
            anyio.run(bench.run, backend=backend)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        benches.append(bench)
    print(header(benches, argv))
    for bench in benches:
        print()
        print(report(bench, argv))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(benches, argv), indent=2) + "\n")
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
