"""Benchmark the column-shaped steps of issue 25: dense, ragged, small and multi-turn.

Every rlwire operation runs beside its baseline in the same round, the order of the two
alternating between rounds, to a directory on tmpfs, under each event loop asked for:

* **dense** (2048 samples x 2048 tokens), **ragged** (2048 samples of 256..4096 tokens,
  seeded) and **small** (8,000 samples x 128 tokens): a ``TrainingBatch`` of
  ``TrainingSample``s with the dtypes of ``rlwire.testing.make_sample`` (token_ids
  int64, mask bool, logprobs, temperatures and advantages float32; no routed_experts),
  each array its own allocation, as samples from different rollouts are.

  - send (``await sender.send(batch)``), and the same samples sent packed (a
    ``TrainingBatch`` whose samples are a ``Columns`` of ``Ragged``, another sender to
    another directory), against the floor (one worker thread writing the bytes of the
    step's files, read into memory beforehand, with ``os.writev`` to a fresh file) and
    against ``msgspec.msgpack.encode`` of the batch in one worker thread plus the write
    (``bench_send.py``'s baseline (b));
  - the same send in steady state to a directory that recycles its files
    (``keep_last=2``, the storage option ``recycle``; a receiver takes each step, as a
    rank's trainer would), against the floor and against the floor written over a warm
    file (the same bytes written over a file of that size written before): a recycling
    sender writes into pages a retired step left, and the baseline that does the same
    is the fair one for it;
  - receive into ``TrainingBatch`` (``areceive``) against reading the step's files
    once (``bench_send.py``'s "read once"), and the same receive (and ``as_columns``)
    of a recycled step, read through the mappings the receiver kept of its files;
  - receive with ``as_columns=True``, "n/a" while ``open_receiver`` does not take it;
  - the next ``areceive`` while the previous step is still held (it is released on the
    loop when the new one replaces it), and that release alone (``del batch``).

* **multiturn**: 128 turns each appending a 98 KB ``routed_experts`` chunk (uint8
  [256, 48, 8]) to one sample: (A) concatenate every turn (O(N^2)); (B) keep a list of
  chunks and write them with one ``os.writev`` at the end (the floor; padded with zeros
  to as many bytes as rlwire writes); rlwire today: concatenate once, then send;
  ``rlwire.Chunked`` appends + send; and the same to a recycling directory, beside
  the chunks written with one ``os.writev`` over a warm file.

Stalls: every rlwire operation runs under a :class:`rlwire.LagMonitor` (1 ms sleeps; a
stall is how late a sleep wakes), and right after it the idle loop runs under the same
monitor for the same duration with nothing else running; the table shows both worst
gaps and their difference, the figure the targets are judged on. Peak memory: the RSS
high-water mark above the RSS before the operation (``bench_send.PeakMemory``).

Usage::

    .venv/bin/python benchmarks/bench_columns.py                      # every shape, both loops
    .venv/bin/python benchmarks/bench_columns.py --shapes dense --loops trio --rounds 6
    .venv/bin/python benchmarks/bench_columns.py --quick              # tiny sizes, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from bench_send import (
    MB,
    PeakMemory,
    Row,
    Sample,
    clear_dir,
    default_dir,
    faulted_buffer,
    fs_type,
    naive_encode_and_write,
    on_loop,
    progress,
    read_once,
    rows_json,
)

import rlwire

SHAPES = ("dense", "ragged", "small", "multiturn")
LOOPS = ("asyncio", "trio")
NA = "n/a"


# -- the workloads ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    dense: tuple[int, int]  # samples, tokens
    ragged: tuple[int, int, int]  # samples, shortest, longest
    small: tuple[int, int]
    turns: int
    chunk: tuple[int, int, int]  # routed_experts per turn: tokens, layers, top-k


FULL = Sizes((2048, 2048), (2048, 256, 4096), (8000, 128), 128, (256, 48, 8))
QUICK = Sizes((64, 256), (64, 16, 512), (500, 16), 16, (32, 48, 8))


def make_batch(lengths: list[int], seed: int) -> rlwire.TrainingBatch:
    """Samples of the given lengths, each array its own allocation (as make_sample)."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    token_ids = rng.integers(0, 151_936, total, dtype=np.int64)
    mask = rng.random(total, dtype=np.float32) < 0.8
    logprobs = -rng.exponential(size=total).astype(np.float32)
    advantages = rng.standard_normal(total, dtype=np.float32)
    samples = []
    start = 0
    for i, n in enumerate(lengths):
        cut = slice(start, start + n)
        samples.append(
            rlwire.TrainingSample(
                token_ids=token_ids[cut].copy(),
                mask=mask[cut].copy(),
                logprobs=logprobs[cut].copy(),
                temperatures=np.ones(n, np.float32),
                advantages=advantages[cut].copy(),
                env_name=f"env-{i % 4}",
            )
        )
        start += n
    return rlwire.TrainingBatch(samples=samples)


def shape_lengths(shape: str, sizes: Sizes, seed: int) -> list[int]:
    if shape == "dense":
        return [sizes.dense[1]] * sizes.dense[0]
    if shape == "small":
        return [sizes.small[1]] * sizes.small[0]
    count, low, high = sizes.ragged
    return [int(n) for n in np.random.default_rng(seed).integers(low, high + 1, count)]


#: The per-token fields of the shapes' samples.
TOKEN_FIELDS = ("token_ids", "mask", "logprobs", "temperatures", "advantages")


def packed(batch: rlwire.TrainingBatch) -> rlwire.TrainingBatch:
    """The same samples as the user who holds them packed sends them: a Columns of one
    Ragged per per-token field (made here, untimed) and a list of env names."""
    columns: dict[str, Any] = {
        name: rlwire.Ragged.from_arrays([getattr(s, name) for s in batch.samples])
        for name in TOKEN_FIELDS
    }
    columns["env_name"] = [s.env_name for s in batch.samples]
    return rlwire.TrainingBatch(samples=rlwire.Columns(columns))  # type: ignore[arg-type]


def make_chunks(sizes: Sizes, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, sizes.chunk, dtype=np.uint8) for _ in range(sizes.turns)]


# -- helpers ---------------------------------------------------------------------------


def write_all(path: Path, buffers: list[Any]) -> int:
    """Write ``buffers`` back to back into a new file with ``os.writev`` (the floor)."""
    views = [memoryview(b).cast("B") for b in buffers]
    total = sum(v.nbytes for v in views)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        first = 0  # views before it are written: an index, as popping the list's head
        while first < len(views):  # would cost O(n) a view (25 ms for 10,240 rows)
            n = os.writev(fd, views[first : first + 1024])  # IOV_MAX
            while first < len(views) and n >= views[first].nbytes:
                n -= views[first].nbytes
                first += 1
            if n:
                views[first] = views[first][n:]
    finally:
        os.close(fd)
    return total


def write_over(path: Path, buffers: list[Any]) -> int:
    """Write ``buffers`` back to back over the start of the existing file ``path`` (as
    large as they are), with ``os.writev``: the floor for a step written into the warm
    pages of a file written before, as a recycling sender's."""
    views = [memoryview(b).cast("B") for b in buffers]
    fd = os.open(path, os.O_WRONLY)
    try:
        for first in range(0, len(views), 1024):  # IOV_MAX; tmpfs writes whole views
            os.writev(fd, views[first : first + 1024])
    finally:
        os.close(fd)
    return sum(v.nbytes for v in views)


def write_rows(path: Path, batch: rlwire.TrainingBatch) -> int:
    """Write the samples' own arrays where they are, a column after another (what a
    per-sample send must read), with ``os.writev`` to a fresh file: the floor for data
    held one array a sample, which the floor of the step's files, read from one
    contiguous block each, does not pay. The caller removes the file, untimed, as the
    floor's (freeing 88 MB of tmpfs pages costs 10 ms)."""
    samples = batch.samples
    rows = [getattr(s, name) for name in TOKEN_FIELDS for s in samples]
    return write_all(path, rows)


def step_files(path: Path, step: int) -> list[Path]:
    return sorted(path.glob(f"step-{step:08d}.*.rlw"))


def check_received(got: rlwire.TrainingBatch, sent: rlwire.TrainingBatch) -> None:
    if len(got.samples) != len(sent.samples):
        raise AssertionError(f"received {len(got.samples)} samples, sent {len(sent.samples)}")
    for i in (0, len(sent.samples) // 2, len(sent.samples) - 1):
        for name in TOKEN_FIELDS:
            a, b = getattr(got.samples[i], name), getattr(sent.samples[i], name)
            if a.dtype != b.dtype or not np.array_equal(a, b):
                raise AssertionError(f"samples[{i}].{name} differs after the round trip")


#: How long the loop is watched after a step is dropped: a worker thread frees it then
#: (8,000 samples: some 3 ms of work).
_SETTLE = 0.03


def _sleep_for(seconds: float) -> Callable[[], Awaitable[int]]:
    async def idle() -> int:
        await anyio.sleep(seconds)
        return 0

    return idle


class Recycled:
    """A sender whose directory recycles its files (``keep_last=2``, the storage option
    ``recycle``) and a receiver that takes each step as a rank's trainer would, both
    kept open for every round of one loop: after :meth:`warm`, each send lands in the
    files of a step the receiver moved past, through the mappings the sink keeps."""

    def __init__(self, path: Path, kind: Any) -> None:
        self.path = path
        self.kind = kind
        self.step = 0

    async def __aenter__(self) -> Recycled:
        self.sender = rlwire.open_sender(self.path, keep_last=2, storage_options={"recycle": True})
        await self.sender.__aenter__()
        self.receiver = rlwire.open_receiver(self.path, type=self.kind)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.receiver.close()
        await self.sender.__aexit__(*exc)

    async def send(self, value: Any) -> None:
        await self.sender.send(value, step=self.step)
        self.step += 1

    async def consume(self, as_columns: bool = False) -> int:
        """The receiver takes the step just sent (through the mappings it kept of the
        files, when they come back recycled), freeing the one before."""
        got = await self.receiver.areceive(timeout=60, as_columns=as_columns)
        del got
        return 0

    async def warm(self, value: Any) -> None:
        for _ in range(3):  # the third send is the first into a recycled file
            await self.send(value)
            await self.consume()


# -- one shape under one loop ----------------------------------------------------------


@dataclass
class Bench:
    shape: str
    root: Path
    mem: PeakMemory
    rounds: int
    warmup: int
    rows: dict[str, Row] = field(default_factory=dict)
    na: dict[str, str] = field(default_factory=dict)  # row -> why it was not measured
    payload_bytes: int = 0
    step_bytes: int = 0

    def __post_init__(self) -> None:
        self.dir = self.root / "steps"
        self.other = self.root / "other"
        for d in (self.dir, self.other):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
        # What stays open for every round (the recycling sender), closed after the last.
        self.stack = contextlib.AsyncExitStack()
        self.warm_file = self.other / "warm.bin"

    async def recycled(self, kind: Any, value: Any) -> Recycled:
        """A :class:`Recycled` sender and receiver kept until the last round, warmed."""
        path = self.root / "recycled"
        shutil.rmtree(path, ignore_errors=True)
        recycled = await self.stack.enter_async_context(Recycled(path, kind))
        await recycled.warm(value)
        return recycled

    def keep(self, keep: bool, name: str, sample: Sample) -> None:
        if keep:
            self.rows.setdefault(name, Row(name)).samples.append(sample)

    async def timed(
        self, keep: bool, name: str, op: Callable[[], Awaitable[int]], settle: float = 0.0
    ) -> Sample:
        """``op`` under the monitor, then the idle loop for as long, nothing else running.
        With ``settle``, the monitor watches the loop that many seconds more after ``op``
        returns (work ``op`` left to worker threads, such as freeing a dropped step, runs
        then), the idle loop is watched as long, and the time is ``op``'s alone."""
        took = 0.0

        async def watched() -> int:
            nonlocal took
            began = time.perf_counter()
            nbytes = await op()
            took = time.perf_counter() - began
            await anyio.sleep(settle)
            return nbytes

        sample = await on_loop(watched, self.mem)
        self.keep(keep, name, dataclasses.replace(sample, seconds=took))
        self.keep(keep, f"idle ({name})", await on_loop(_sleep_for(sample.seconds), self.mem))
        return sample

    async def baseline(self, keep: bool, name: str, fn: Callable[[], int]) -> None:
        async def op() -> int:
            return await anyio.to_thread.run_sync(fn)

        self.keep(keep, name, await on_loop(op, self.mem))


class BatchBench(Bench):
    """dense, ragged, small: send, receive, columns, next areceive, release."""

    def __init__(self, batch: rlwire.TrainingBatch, **kw: Any) -> None:
        super().__init__(**kw)
        self.batch = batch
        self.packed = packed(batch)
        self.files: list[bytes] = []
        self.buffer = faulted_buffer(0)

    async def prepare(self) -> None:
        """One untimed send: the step's bytes for the floor, and a checked round trip."""
        async with rlwire.open_sender(self.dir, on_existing="overwrite") as s:
            await s.send(self.batch)
        self.files = [p.read_bytes() for p in step_files(self.dir, 0)]
        self.step_bytes = sum(len(f) for f in self.files)
        self.payload_bytes = sum(
            getattr(s, name).nbytes for s in self.batch.samples for name in TOKEN_FIELDS
        )
        self.buffer = faulted_buffer(self.step_bytes)
        write_all(self.warm_file, self.files)
        self.recycling = await self.recycled(rlwire.TrainingBatch, self.batch)
        receiver = rlwire.open_receiver(self.dir, type=rlwire.TrainingBatch)
        check_received(await receiver.areceive(timeout=60), self.batch)
        receiver.close()
        gc.collect()
        clear_dir(self.dir)

    async def sends(self, keep: bool, flip: bool) -> None:
        floor = self.other / "floor.bin"
        rows = self.other / "rows.bin"
        encoded = self.other / "msgspec.bin"
        packed_dir = self.other / "packed"
        async with (
            rlwire.open_sender(self.dir, on_existing="overwrite") as sender,
            rlwire.open_sender(packed_dir, on_existing="overwrite") as packed_sender,
        ):

            async def send() -> int:
                await sender.send(self.batch, step=0)
                return 0

            async def send_packed() -> int:
                await packed_sender.send(self.packed, step=0)
                return 0

            async def send_recycled() -> int:
                await self.recycling.send(self.batch)
                return 0

            async def sends() -> None:
                await self.timed(keep, "send", send)
                await self.timed(keep, "send packed (Columns)", send_packed)
                await self.timed(keep, "send, recycled files", send_recycled)
                await self.timed(keep, "receive, recycled files", self.recycling.consume)
                await send_recycled()  # the step the next receive takes as columns

                async def as_columns() -> int:
                    return await self.recycling.consume(as_columns=True)

                await self.timed(keep, "receive as_columns, recycled files", as_columns)

            if not flip:
                await sends()
            await self.baseline(keep, "floor", lambda: write_all(floor, self.files))
            await self.baseline(
                keep, "floor over a warm file", lambda: write_over(self.warm_file, self.files)
            )
            await self.baseline(
                keep,
                "the samples' arrays, one writev",
                lambda: write_rows(rows, self.batch),
            )
            await self.baseline(
                keep,
                "msgspec encode in a thread + write",
                lambda: naive_encode_and_write(self.batch, encoded),
            )
            if flip:
                await sends()
            await sender.send(self.batch, step=1)  # for the next areceive, untimed
        floor.unlink()
        rows.unlink()
        encoded.unlink()
        shutil.rmtree(packed_dir)

    async def receives(self, keep: bool, flip: bool) -> None:
        receiver = rlwire.open_receiver(self.dir, type=rlwire.TrainingBatch)
        held: list[rlwire.TrainingBatch] = []

        async def receive() -> int:
            held.append(await receiver.areceive(timeout=60))
            return 0

        async def receive_next() -> int:
            # The held step is released here, on the loop, when the new one replaces it.
            held[0] = await receiver.areceive(timeout=60)
            return 0

        async def release() -> int:
            held.clear()
            return 0

        if flip:
            self.keep(keep, "read once", read_once(step_files(self.dir, 0), self.buffer))
        await self.timed(keep, "receive", receive)
        if not flip:
            self.keep(keep, "read once", read_once(step_files(self.dir, 0), self.buffer))
        # A dropped step is freed in a worker thread: the loop is watched while that runs.
        await self.timed(keep, "next areceive, holding a step", receive_next, _SETTLE)
        await self.timed(keep, "release a step (del batch)", release, _SETTLE)
        receiver.close()
        await self.columns(keep)

    async def columns(self, keep: bool) -> None:
        """``as_columns=True``, where ``open_receiver`` takes it (after issue 25)."""
        try:
            receiver = rlwire.open_receiver(self.dir, as_columns=True)  # type: ignore[call-overload,unused-ignore]
        except (TypeError, rlwire.ConfigError) as exc:
            self.na["receive as_columns"] = f"{type(exc).__name__}: {exc}"
            return
        got: list[Any] = []

        async def receive() -> int:
            got.append(await receiver.areceive(timeout=60))
            return 0

        await self.timed(keep, "receive as_columns", receive)
        self.keep(keep, "read once (as_columns)", read_once(step_files(self.dir, 0), self.buffer))
        got.clear()
        receiver.close()

    async def one_round(self, keep: bool, flip: bool) -> None:
        gc.collect()
        clear_dir(self.dir)
        await self.sends(keep, flip)
        await self.receives(keep, flip)
        gc.collect()  # drop the mappings before the files go
        clear_dir(self.dir)


class TurnsBench(Bench):
    """multiturn: concatenate every turn, chunks + one writev, rlwire today, Chunked."""

    def __init__(self, chunks: list[np.ndarray], **kw: Any) -> None:
        super().__init__(**kw)
        self.chunks = chunks
        self.payload_bytes = sum(c.nbytes for c in chunks)

    async def prepare(self) -> None:
        async with rlwire.open_sender(self.dir, on_existing="overwrite") as s:
            await s.send({"routed_experts": np.concatenate(self.chunks)})
        self.step_bytes = sum(p.stat().st_size for p in step_files(self.dir, 0))
        write_all(self.warm_file, self.held())
        self.recycling = await self.recycled(dict, self.chunked())
        got = await rlwire.open_receiver(self.dir, type=dict).areceive(timeout=60)
        if not np.array_equal(got["routed_experts"], np.concatenate(self.chunks)):
            raise AssertionError("routed_experts differs after the round trip")
        del got
        gc.collect()
        clear_dir(self.dir)

    def concatenate_every_turn(self) -> int:
        acc = self.chunks[0][:0]
        for chunk in self.chunks:
            acc = np.concatenate([acc, chunk])  # unpack, concatenate, repack: O(N^2)
        return int(acc.nbytes)

    def pad(self) -> bytes:
        """Zeros for rlwire's framing: the floors write as many bytes as rlwire."""
        return bytes(max(0, self.step_bytes - self.payload_bytes))

    def held(self) -> list[Any]:
        """The turns kept as a list of chunks, one append a turn, and the framing's
        zeros: what the floors write."""
        held: list[Any] = []
        for chunk in self.chunks:
            held.append(chunk)
        return [*held, self.pad()]

    def chunks_one_writev(self) -> int:
        return write_all(self.other / "floor.bin", self.held())

    def chunks_over_a_warm_file(self) -> int:
        return write_over(self.warm_file, self.held())

    def chunked(self) -> dict[str, Any]:
        """The turns appended to a ``Chunked``: the value sent."""
        grown = rlwire.Chunked()
        for chunk in self.chunks:
            grown.append(chunk)
        return {"routed_experts": grown}

    async def one_round(self, keep: bool, flip: bool) -> None:
        gc.collect()
        clear_dir(self.dir)
        async with rlwire.open_sender(self.dir, on_existing="overwrite") as sender:

            async def today() -> int:
                await sender.send({"routed_experts": np.concatenate(self.chunks)})
                return 0

            async def chunked() -> int:
                await sender.send(self.chunked())
                return 0

            async def chunked_recycled() -> int:
                await self.recycling.send(self.chunked())
                return 0

            async def accumulate() -> int:
                t0 = time.perf_counter()
                self.concatenate_every_turn()
                self.keep(keep, "concatenate every turn", Sample(time.perf_counter() - t0))
                await self.baseline(keep, "chunks + one writev", self.chunks_one_writev)
                (self.other / "floor.bin").unlink()
                await self.baseline(
                    keep, "chunks + one writev over a warm file", self.chunks_over_a_warm_file
                )
                return 0

            if flip:
                await accumulate()
            await self.timed(keep, "concatenate once + send", today)
            await self.timed(keep, "Chunked appends + send", chunked)
            await self.timed(keep, "Chunked appends + send, recycled files", chunked_recycled)
            await self.recycling.consume()
            if not flip:
                await accumulate()


async def run_bench(bench: Any) -> None:
    async with bench.stack:
        await bench.prepare()
        for r in range(bench.warmup + bench.rounds):
            keep = r >= bench.warmup
            await bench.one_round(keep, flip=r % 2 == 1)
            progress(f"    {bench.shape}: {'round' if keep else 'warm-up'} {r + 1} done")


# -- reporting -------------------------------------------------------------------------

#: (shape, rlwire row, baseline row, target ratio or None); stalls are judged on the
#: difference to the idle loop (2 ms) and sends on their peak memory (64 MB).
PAIRS: list[tuple[str, str, str, float | None]] = [
    ("dense", "send", "floor", 1.2),
    ("dense", "send", "msgspec encode in a thread + write", None),
    ("dense", "send", "the samples' arrays, one writev", None),
    ("dense", "send packed (Columns)", "floor", None),
    ("dense", "send, recycled files", "floor", 1.2),
    ("dense", "send, recycled files", "floor over a warm file", None),
    ("dense", "receive", "read once", 1.0),
    ("dense", "receive as_columns", "read once (as_columns)", 0.8),
    ("dense", "receive, recycled files", "read once", 1.0),
    ("dense", "receive as_columns, recycled files", "read once (as_columns)", 0.8),
    ("dense", "next areceive, holding a step", "", None),
    ("dense", "release a step (del batch)", "", None),
    ("ragged", "send", "floor", 1.3),
    ("ragged", "send", "msgspec encode in a thread + write", None),
    ("ragged", "send", "the samples' arrays, one writev", None),
    ("ragged", "send packed (Columns)", "floor", None),
    ("ragged", "send, recycled files", "floor", 1.3),
    ("ragged", "send, recycled files", "floor over a warm file", None),
    ("ragged", "receive", "read once", 1.0),
    ("ragged", "receive as_columns", "read once (as_columns)", None),
    ("ragged", "receive, recycled files", "read once", 1.0),
    ("ragged", "receive as_columns, recycled files", "read once (as_columns)", None),
    ("ragged", "next areceive, holding a step", "", None),
    ("ragged", "release a step (del batch)", "", None),
    ("small", "send", "floor", 1.3),
    ("small", "send", "msgspec encode in a thread + write", None),
    ("small", "send", "the samples' arrays, one writev", None),
    ("small", "send packed (Columns)", "floor", None),
    ("small", "send, recycled files", "floor", 1.3),
    ("small", "send, recycled files", "floor over a warm file", None),
    ("small", "receive", "read once", 8.0),
    ("small", "receive as_columns", "read once (as_columns)", 1.0),
    ("small", "receive, recycled files", "read once", 8.0),
    ("small", "receive as_columns, recycled files", "read once (as_columns)", 1.0),
    ("small", "next areceive, holding a step", "", None),
    ("small", "release a step (del batch)", "", None),
    ("multiturn", "concatenate every turn", "chunks + one writev", None),
    ("multiturn", "concatenate once + send", "chunks + one writev", None),
    ("multiturn", "Chunked appends + send", "chunks + one writev", 1.2),
    ("multiturn", "Chunked appends + send, recycled files", "chunks + one writev", 1.2),
    (
        "multiturn",
        "Chunked appends + send, recycled files",
        "chunks + one writev over a warm file",
        None,
    ),
]
STALL_TARGET_MS = 2.0
PEAK_TARGET_MB = 64.0


def spread(values: list[float], spec: str = ".1f") -> str:
    """``median (min…max)``: an ellipsis, since differences can be negative."""
    med = statistics.median(values)
    return f"{med:{spec}} ({min(values):{spec}}…{max(values):{spec}})"


def _ms(row: Row) -> list[float]:
    return [s.seconds * 1e3 for s in row.samples]


def table_row(loop: str, shape: str, bench_rows: dict[str, Row], pair: tuple[str, ...]) -> str:
    _, mine, theirs, target = pair
    cells = [shape, loop, mine]
    row = bench_rows.get(mine)
    if row is None:
        return "| " + " | ".join([*cells, NA, theirs or "—", NA, NA, NA, NA, NA, NA]) + " |"
    cells.append(spread(_ms(row)))
    base = bench_rows.get(theirs)
    if base is not None:
        ratios = [a / b for a, b in zip(_ms(row), _ms(base), strict=True)]
        cells += [theirs, spread(_ms(base)), spread(ratios, ".2f")]
    else:
        cells += [theirs or "—", "—", "—"]
    idle = bench_rows.get(f"idle ({mine})")
    if idle is not None and row.samples[0].stall_max is not None:
        stalls = [(s.stall_max or 0) * 1e3 for s in row.samples]
        gaps = [(s.stall_max or 0) * 1e3 for s in idle.samples]
        diffs = [a - b for a, b in zip(stalls, gaps, strict=True)]
        cells += [spread(stalls), spread(gaps), spread(diffs)]
    else:
        cells += ["—", "—", "—"]
    peaks = [(s.peak or 0) / MB for s in row.samples]
    cells.append(f"{max(peaks):.0f}" if "send" in mine else "—")
    cells.append(target_text(mine, theirs, target))
    return "| " + " | ".join(cells) + " |"


def target_text(mine: str, theirs: str, target: float | None) -> str:
    parts = [f"≤ {target:g}x {theirs}"] if target is not None else []
    if not mine.startswith("concatenate every"):
        parts.append(f"stall ≤ idle + {STALL_TARGET_MS:g} ms")
    if "send" in mine:
        parts.append(f"peak ≤ {PEAK_TARGET_MB:g} MB")
    return "; ".join(parts) or "—"


HEAD = (
    "| shape | loop | operation | rlwire ms | baseline | baseline ms | ratio "
    "| worst stall ms | idle worst gap ms | difference ms | peak MB | target |\n"
    "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"
)


def report(results: dict[str, dict[str, Bench]], argv: list[str], root: Path) -> str:
    out = [
        f"Command: `python benchmarks/bench_columns.py {' '.join(argv)}`",
        f"Directory: {root} ({fs_type(root)}); peak memory: VmHWM above the RSS before.",
        "",
    ]
    for loop, benches in results.items():
        for shape, bench in benches.items():
            out.append(
                f"- {loop} {shape}: {bench.payload_bytes / MB:.1f} MB of arrays, "
                f"{bench.step_bytes / MB:.1f} MB in the step's files, {bench.rounds} rounds "
                f"after {bench.warmup} warm-up"
                + "".join(f"; {row}: {NA} ({why})" for row, why in bench.na.items())
            )
    out += [
        "",
        "Every cell: median (min…max) over the rounds; ratios and differences per round.",
        "",
    ]
    out.append(HEAD)
    for loop, benches in results.items():
        for pair in PAIRS:
            if pair[0] in benches:
                out.append(table_row(loop, pair[0], benches[pair[0]].rows, pair))
    return "\n".join(out)


def write_json(path: str, argv: list[str], results: dict[str, dict[str, Bench]]) -> None:
    loops = {
        loop: {
            shape: {
                "payload_bytes": b.payload_bytes,
                "step_bytes": b.step_bytes,
                "na": b.na,
                "rows": rows_json(b.rows),
                "pairs": [list(p) for p in PAIRS if p[0] == shape],
            }
            for shape, b in benches.items()
        }
        for loop, benches in results.items()
    }
    Path(path).write_text(json.dumps({"argv": argv, "loops": loops}, indent=1) + "\n")


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated, of " + ", ".join(SHAPES)
    )
    p.add_argument("--loops", default=",".join(LOOPS), help="asyncio, trio or both (default)")
    p.add_argument("--rounds", "--repeats", type=int, default=4, help="measured rounds (4)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (1)")
    p.add_argument("--dir", default=default_dir(), help="where to write (default /dev/shm)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, 1 round, the set-up's objects out of the collector: a smoke test",
    )
    p.add_argument("--json", metavar="PATH", help="also write every sample as JSON to PATH")
    args = p.parse_args(argv)
    args.shapes = args.shapes.split(",")
    args.loops = args.loops.split(",")
    if args.quick:
        args.rounds, args.warmup = 1, 0
    unknown = (set(args.shapes) - set(SHAPES)) | (set(args.loops) - set(LOOPS))
    if unknown:
        p.error(f"unknown: {sorted(unknown)}")
    if args.rounds < 1 or args.warmup < 0:
        p.error("--rounds must be positive, --warmup non-negative")
    return args


def make_workload(shape: str, args: argparse.Namespace) -> Any:
    """The shape's batch (or multi-turn chunks), built once for every loop."""
    sizes = QUICK if args.quick else FULL
    if shape == "multiturn":
        return make_chunks(sizes, args.seed)
    return make_batch(shape_lengths(shape, sizes, args.seed), args.seed)


def make_bench(shape: str, work: Any, args: argparse.Namespace, root: Path) -> Bench:
    kw: dict[str, Any] = {
        "shape": shape,
        "root": root,
        "mem": PeakMemory("auto"),
        "rounds": args.rounds,
        "warmup": args.warmup,
    }
    return TurnsBench(work, **kw) if shape == "multiturn" else BatchBench(work, **kw)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="rlwire-columns-", dir=args.dir))
    if args.quick:
        # Each full collection walked every imported object (30-120 ms here), some twenty
        # a shape and loop: half of a quick run. The measured runs keep them, as a
        # trainer's process does.
        gc.collect()
        gc.freeze()
    results: dict[str, dict[str, Bench]] = {}
    try:
        for shape in args.shapes:
            bench_root = root / shape
            bench_root.mkdir()
            work = make_workload(shape, args)
            for loop in args.loops:
                progress(f"  {shape} under {loop}")
                bench = make_bench(shape, work, args, bench_root)
                anyio.run(run_bench, bench, backend=loop)
                results.setdefault(loop, {})[shape] = bench
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(results, argv, Path(args.dir)))
    if args.json:
        write_json(args.json, argv, results)
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
