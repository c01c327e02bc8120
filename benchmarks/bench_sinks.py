"""Benchmark rlwire's network sinks against the library each one is built on.

The workload is bench_send.py's (``make_workload``: 256 samples x 8192 tokens, 849 MB of
arrays, 95 % of it ``routed_experts``), sent with ``sidecar=("routed_experts",)``. One run
measures one sink (``--sink``) under one event loop (``--backend``). Each of ``--repeats``
rounds (after ``--warmup`` discarded ones) runs every row twice, in the order A B C C B A,
so drift hits every row alike; the table shows medians.

``--sink zmq-tcp`` / ``--sink zmq-ipc`` (baseline: raw pyzmq)
    A receiver process (multiprocessing, spawn) holds ``rlwire.open_receiver(url)`` and a
    raw DEALER socket. Before each operation the sender tells it over a pipe what comes
    next; the receiver receives it, rebuilds the arrays (rlwire: a TrainingBatch of
    views, checksums verified as by default; raw: ``np.frombuffer`` per part), counts
    the bytes and acknowledges over the pipe. Time is end to end: from the start of the
    send until the acknowledgement arrives in the sending process, so throughput is what
    reached the receiving process, not what was queued.

    * raw pyzmq: ``ROUTER.send_multipart([peer, header, *array buffers], copy=False,
      track=True)`` from the async function (a msgspec header describing the arrays, then
      the 1,536 arrays' own buffers, the same buffers rlwire sends), then waiting for
      the acknowledgement and the tracker.
    * rlwire: ``await sender.send(batch)`` (ROUTER/DEALER, zero-copy frames, xxh3
      checksums on both ends), then waiting for the acknowledgement.
    * rlwire checksum=False: the same with ``open_sender(..., checksum=False)``, to show
      what the checksums cost (``--no-checksum-row`` leaves it out).

``--sink s3`` (baseline: s3fs), against a moto server started on 127.0.0.1
    * s3fs direct: ``fs.pipe({path: bytes, ...})`` in one worker thread: as many
      objects, of the same sizes, as rlwire wrote, filled from the arrays (prepared once,
      untimed: the bare upload, s3fs's concurrent multipart for large objects).
    * rlwire: ``await sender.send(batch)`` to a fresh ``s3://bucket/rlwire-N`` prefix
      (``open_sender(url, storage_options={endpoint_url, key, secret, client_kwargs})``;
      opening and closing the sender are not timed, the send returns once the step is
      visible).
    One untimed send is first read back with ``open_receiver`` and checked. Objects are
    deleted after each operation (moto keeps them in memory). Default size: 64 samples
    (212 MB), because moto, a Python server, takes ~40 MB/s here; ``--samples 256``
    gives the full size.

Loop stalls come from :class:`rlwire.LagMonitor` (1 ms sleeps) over the whole
operation, acknowledgement wait included; ~1 ms of every figure is the loop's own timer
resolution. MB/s divides the array payload (the same for every row) by the time.

Usage::

    .venv/bin/python benchmarks/bench_sinks.py --sink zmq-tcp             # asyncio, full size
    .venv/bin/python benchmarks/bench_sinks.py --sink zmq-ipc --backend trio
    .venv/bin/python benchmarks/bench_sinks.py --sink s3 --backend asyncio+uvloop
    .venv/bin/python benchmarks/bench_sinks.py --sink s3 --quick          # sanity run, < 30 s
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import zmq
from bench_send import (
    MB,
    PeakMemory,
    Row,
    Sample,
    Workload,
    as_ms,
    check_received,
    cpu_times,
    fmt,
    make_workload,
    on_loop,
    progress,
    write_json,
    yes,
)

import rlwire

TARGET_RATIO = 0.9  # rlwire throughput / baseline throughput, at least (issue 15)
TARGET_STALL_MS = 2.0  # worst event-loop stall during an rlwire send, at most

RAW = "raw pyzmq"
RLWIRE = "rlwire"
RLWIRE_NOCK = "rlwire checksum=False"
DIRECT = "s3fs direct"
BUCKET = "rlwire-bench"
ACK_TIMEOUT = 600.0

_raw_encoder = msgspec.msgpack.Encoder()
_raw_decoder = msgspec.msgpack.Decoder(list[tuple[str, list[tuple[str, str, list[int]]]]])


# -- the raw pyzmq message and its receiver ---------------------------------------------


def sample_arrays(sample: Any) -> list[tuple[str, np.ndarray]]:
    """The ndarray fields of a TrainingSample, in field order."""
    out = []
    for name in sample.__struct_fields__:
        value = getattr(sample, name)
        if isinstance(value, np.ndarray):
            out.append((name, value))
    return out


def raw_message(batch: rlwire.TrainingBatch) -> list[Any]:
    """A msgspec header describing every array, then every array's own buffer."""
    described = []
    buffers: list[Any] = []
    for sample in batch.samples:
        fields = []
        for name, arr in sample_arrays(sample):
            fields.append((name, arr.dtype.str, list(arr.shape)))
            buffers.append(arr)
        described.append((sample.env_name, fields))
    return [_raw_encoder.encode(described), *buffers]


def fingerprint(experts0: np.ndarray, tokens_last: np.ndarray, env_last: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in (experts0, tokens_last):
        h.update(np.ascontiguousarray(part).view(np.uint8).reshape(-1).data)
    h.update(env_last.encode())
    return h.hexdigest()


def batch_fingerprint(batch: rlwire.TrainingBatch) -> str:
    first, last = batch.samples[0], batch.samples[-1]
    assert first.routed_experts is not None
    return fingerprint(first.routed_experts, last.token_ids, last.env_name)


def receive_raw(sock: zmq.Socket[bytes], want_fingerprint: bool) -> tuple[int, str]:
    parts = sock.recv_multipart(copy=False)
    described = _raw_decoder.decode(parts[0].buffer)
    samples: list[dict[str, np.ndarray]] = []
    i = 1
    for _env, fields in described:
        arrays = {}
        for name, dtype, shape in fields:
            arrays[name] = np.frombuffer(parts[i].buffer, dtype=dtype).reshape(shape)
            i += 1
        samples.append(arrays)
    if i != len(parts):
        raise AssertionError(f"raw message: {len(parts)} parts, header describes {i}")
    nbytes = sum(a.nbytes for s in samples for a in s.values())
    fp = ""
    if want_fingerprint:
        fp = fingerprint(samples[0]["routed_experts"], samples[-1]["token_ids"], described[-1][0])
    return nbytes, fp


def receiver_main(conn: Connection, urls: dict[str, str], raw_endpoint: str) -> None:
    """The receiving process: one rlwire receiver per rlwire row, one raw DEALER socket."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(raw_endpoint)
    raw.send(b"hello")
    receivers = {name: rlwire.open_receiver(url) for name, url in urls.items()}
    conn.send("ready")
    try:
        while (command := conn.recv()) is not None:
            kind, want_fingerprint = command
            try:
                if kind == RAW:
                    nbytes, fp = receive_raw(raw, want_fingerprint)
                else:
                    batch = receivers[kind].receive(timeout=ACK_TIMEOUT)
                    nbytes = sum(a.nbytes for s in batch.samples for _, a in sample_arrays(s))
                    fp = batch_fingerprint(batch) if want_fingerprint else ""
                    del batch
                conn.send(("ok", nbytes, fp))
            except Exception as exc:  # report it, so the sender does not wait forever
                conn.send(("error", 0, f"{type(exc).__name__}: {exc}"))
    finally:
        for receiver in receivers.values():
            receiver.close()
        raw.close()
        context.term()


async def wait_message(conn: Connection, timeout: float = ACK_TIMEOUT) -> Any:
    """The next object from ``conn``, waiting on its descriptor without blocking the loop."""
    with anyio.fail_after(timeout):
        while not conn.poll():
            await anyio.wait_readable(conn.fileno())
    return conn.recv()


# -- the benchmark ----------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    work: Workload
    root: Path
    mem: PeakMemory
    rows: dict[str, Row] = field(default_factory=dict)
    baseline: str = ""
    extra: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    round_ratios: dict[str, list[float]] = field(default_factory=dict)
    idle: Sample | None = None
    cpu_before: list[int] | None = None
    cpu_after: list[int] | None = None

    def note(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)

    async def idle_reference(self, seconds: float) -> Sample:
        async def idle() -> int:
            await anyio.sleep(seconds)
            return 0

        return await on_loop(idle, self.mem)

    async def rounds(self, names: list[str], measure: Callable[[str], Awaitable[Sample]]) -> None:
        """Warm-up and measured rounds, each running ``names`` then ``names`` reversed."""
        self.baseline = names[0]
        for name in names:
            self.rows[name] = Row(name)
        self.idle = await self.idle_reference(0.5)
        self.cpu_before = cpu_times()
        for r in range(self.args.warmup + self.args.repeats):
            keep = r >= self.args.warmup
            got: dict[str, list[Sample]] = {name: [] for name in names}
            for name in [*names, *reversed(names)]:
                got[name].append(await measure(name))
            base = sum(s.seconds for s in got[self.baseline])
            if keep:
                for name in names:
                    self.rows[name].samples += got[name]
                    ratio = base / sum(s.seconds for s in got[name])
                    self.round_ratios.setdefault(name, []).append(ratio)
            progress(
                f"  {'round' if keep else 'warm-up'}: "
                + ", ".join(
                    f"{name} "
                    + "/".join(
                        f"{s.seconds * 1e3:.0f} ms (stall {as_ms(s.stall_max)})" for s in got[name]
                    )
                    for name in names
                )
            )
        self.cpu_after = cpu_times()

    # -- ZeroMQ --------------------------------------------------------------------------

    def zmq_endpoints(self) -> tuple[dict[str, str], str]:
        """rlwire URLs by row name, and the raw socket's endpoint."""
        names = [RLWIRE, RLWIRE_NOCK] if self.args.checksum_row else [RLWIRE]
        if self.args.sink == "zmq-ipc":
            urls = {n: f"zmq+ipc://{self.root}/rlwire-{i}.sock" for i, n in enumerate(names)}
            return urls, f"ipc://{self.root}/raw.sock"
        ports = free_ports(len(names) + 1)
        urls = {n: f"zmq+tcp://127.0.0.1:{p}" for n, p in zip(names, ports, strict=False)}
        return urls, f"tcp://127.0.0.1:{ports[-1]}"

    async def run_zmq(self) -> None:
        urls, raw_endpoint = self.zmq_endpoints()
        ctx = multiprocessing.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=receiver_main, args=(child_conn, urls, raw_endpoint), daemon=True)
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        raw = context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.bind(raw_endpoint)
        proc.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                senders = {
                    name: await stack.enter_async_context(
                        rlwire.open_sender(
                            url, sidecar=("routed_experts",), checksum=name != RLWIRE_NOCK
                        )
                    )
                    for name, url in urls.items()
                }
                if await wait_message(conn, 120) != "ready":
                    raise RuntimeError("the receiver process did not start")
                peer, hello = await anyio.to_thread.run_sync(raw.recv_multipart)
                assert hello == b"hello"
                expected = batch_fingerprint(self.work.batch)
                checked: set[str] = set()

                async def measure(name: str) -> Sample:
                    conn.send((name, name not in checked))
                    ack: list[Any] = []

                    async def op() -> int:
                        t0 = time.perf_counter()
                        if name == RAW:
                            tracker = raw.send_multipart(
                                [peer, *raw_message(self.work.batch)], copy=False, track=True
                            )
                            self.note(
                                f"{name}: send_multipart ms", (time.perf_counter() - t0) * 1e3
                            )
                            ack.append(await wait_message(conn))
                            while not tracker.done:
                                await anyio.sleep(0.0005)
                        else:
                            await senders[name].send(self.work.batch)
                            self.note(f"{name}: send returns ms", (time.perf_counter() - t0) * 1e3)
                            ack.append(await wait_message(conn))
                        return self.work.payload_bytes

                    sample = await on_loop(op, self.mem)
                    status, nbytes, fp = ack[0]
                    if status != "ok":
                        raise RuntimeError(f"receiver failed on {name}: {fp}")
                    if nbytes != self.work.payload_bytes:
                        raise AssertionError(f"{name}: received {nbytes} bytes")
                    if name not in checked:
                        if fp != expected:
                            raise AssertionError(f"{name}: received arrays differ from the sent")
                        checked.add(name)
                    return sample

                await self.rounds([RAW, *urls], measure)
        finally:
            conn.send(None)
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
            raw.close()
            context.term()
        self.notes.append(
            f"pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}; copy threshold "
            f"{zmq.COPY_THRESHOLD} bytes (smaller parts are copied even with copy=False, "
            "for both rows); rlwire default hwm 2."
        )

    # -- S3 ------------------------------------------------------------------------------

    async def run_s3(self) -> None:
        import s3fs

        async with moto_server() as endpoint:
            options = {
                "endpoint_url": endpoint,
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"},
            }
            fs = s3fs.S3FileSystem(**options)
            fs.call_s3("create_bucket", Bucket=BUCKET)
            count = 0

            def prefix(kind: str) -> str:
                nonlocal count
                count += 1
                return f"{BUCKET}/{kind}-{count}"

            async def rlwire_send(path: str) -> Sample:
                async def op() -> int:
                    await sender.send(self.work.batch)
                    return self.work.payload_bytes

                t0 = time.perf_counter()
                sender = rlwire.open_sender(
                    f"s3://{path}", sidecar=("routed_experts",), storage_options=options
                )
                await sender.aopen()
                self.note("rlwire: sender open ms", (time.perf_counter() - t0) * 1e3)
                try:
                    sample = await on_loop(op, self.mem)
                finally:
                    t1 = time.perf_counter()
                    await sender.aclose()
                    self.note("rlwire: sender close ms", (time.perf_counter() - t1) * 1e3)
                return sample

            # One untimed send: learn the objects rlwire writes, and read the step back.
            probe = prefix("probe")
            await rlwire_send(probe)
            fs.invalidate_cache()
            sizes = {
                k.removeprefix(probe + "/"): int(v["size"])
                for k, v in sorted(fs.find(probe, detail=True).items())
            }
            self.notes.append(
                "rlwire wrote "
                + ", ".join(f"{k}: {v / MB:.2f} MB" for k, v in sizes.items())
                + f" ({sum(sizes.values()) / MB:.1f} MB in {len(sizes)} objects)."
            )
            with rlwire.open_receiver(f"s3://{probe}", storage_options=options) as receiver:
                check_received(receiver.receive(timeout=ACK_TIMEOUT), self.work.batch)
            fs.rm(probe, recursive=True)
            objects = direct_objects(self.work, sizes)

            async def measure(name: str) -> Sample:
                path = prefix("rlwire" if name == RLWIRE else "direct")
                if name == RLWIRE:
                    sample = await rlwire_send(path)
                else:
                    data = {f"{path}/{k}": v for k, v in objects.items()}

                    async def op() -> int:
                        await anyio.to_thread.run_sync(fs.pipe, data)
                        return self.work.payload_bytes

                    sample = await on_loop(op, self.mem)
                fs.invalidate_cache()
                await anyio.to_thread.run_sync(lambda: fs.rm(path, recursive=True))
                return sample

            await self.rounds([DIRECT, RLWIRE], measure)
        self.notes.append(
            f"s3fs {version('s3fs')}, aiobotocore {version('aiobotocore')}, moto "
            f"{version('moto')} (moto_server on 127.0.0.1, objects in memory); s3fs "
            "default block size (50 MiB parts, up to 10 in parallel)."
        )

    async def run(self) -> None:
        if self.args.sink == "s3":
            await self.run_s3()
        else:
            await self.run_zmq()


def direct_objects(work: Workload, sizes: dict[str, int]) -> dict[str, bytes]:
    """As many bytes per object as rlwire wrote, from the arrays (the largest object,
    the sidecar, gets routed_experts); zero padding makes up rlwire's headers."""
    data = b"".join(memoryview(b.reshape(-1).view(np.uint8)) for b in work.blocks)
    total = sum(sizes.values())
    data += bytes(max(0, total - len(data)))
    out: dict[str, bytes] = {}
    pos = 0
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        out[name] = data[pos : pos + size]
        pos += size
    return out


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextlib.asynccontextmanager
async def moto_server() -> AsyncIterator[str]:
    """A moto S3 server in a subprocess on a free local port; yields its URL."""
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                await anyio.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- reporting --------------------------------------------------------------------------


def report(bench: Bench, argv: list[str]) -> str:
    args = bench.args
    rows = bench.rows
    base_s = rows[bench.baseline].median("seconds")
    assert base_s is not None
    payload = bench.work.payload_bytes
    out: list[str] = []
    w = out.append
    w(f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/bench_sinks.py', *argv])}`")
    w("")
    w(
        f"Sink: {args.sink}; backend: {args.backend}; workload: {args.samples} samples x "
        f"{args.tokens} tokens, routed_experts uint8 [{args.tokens}, {args.layers}, "
        f"{args.topk}], {payload / MB:.1f} MB of array data; {args.repeats} round(s) after "
        f"{args.warmup} warm-up round(s), 2 samples per row per round (order "
        f"{', '.join([*rows, *reversed(rows)])}), median shown."
    )
    w(
        f"Python {platform.python_version()}, numpy {np.__version__}, anyio "
        f"{version('anyio')}, rlwire {rlwire.__version__}; {os.cpu_count()} CPUs."
    )
    w("")
    w(
        f"| sink | backend | row | MB/s | time ms | throughput vs {bench.baseline} "
        "| median of per-round ratios | worst stall ms | p99 stall ms | peak extra MB "
        "| target | met? |"
    )
    w("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for name, row in rows.items():
        secs = row.median("seconds")
        assert secs is not None
        stall = row.median("stall_max")
        p99 = row.median("stall_p99")
        peak = row.median("peak")
        ratio = base_s / secs
        per_round = statistics.median(bench.round_ratios[name])
        stall_ms = None if stall is None else stall * 1e3
        target, met = "— (baseline)" if name == bench.baseline else "— (reference)", "—"
        if name == RLWIRE:
            target = f"≥ {TARGET_RATIO}x; stall ≤ {TARGET_STALL_MS:g} ms"
            met = (
                f"throughput {yes(ratio >= TARGET_RATIO)}; "
                f"stall {yes(stall_ms is not None and stall_ms <= TARGET_STALL_MS)}"
            )
        w(
            f"| {args.sink} | {args.backend} | {name} | {payload / MB / secs:.0f} "
            f"| {secs * 1e3:.0f} | {ratio:.2f} | {per_round:.2f} | {fmt(stall_ms, '.2f')} "
            f"| {fmt(None if p99 is None else p99 * 1e3, '.2f')} "
            f"| {fmt(None if peak is None else peak / MB)} | {target} | {met} |"
        )
    w("")
    w(
        "MB/s: array payload (10^6 bytes) / median time. Throughput vs baseline: median "
        "baseline time / median row time; per-round ratios pair each row's two samples with "
        "the baseline's two of the same round. Worst / p99 stall: LagMonitor (1 ms sleeps) "
        "over the whole operation, median over samples. Peak extra: RSS high-water mark "
        "minus RSS before, in the sending process."
    )
    over = sum(1 for s in rows[RLWIRE].samples if (s.stall_max or 0) * 1e3 > TARGET_STALL_MS)
    w(
        f"rlwire operations whose worst stall exceeded {TARGET_STALL_MS:g} ms: {over} of "
        f"{len(rows[RLWIRE].samples)}."
    )
    w("")
    w("Per-sample values (time ms / worst stall ms / p99 stall ms):")
    w("")
    for name, row in rows.items():
        w(
            f"- {name}: "
            + "; ".join(
                f"{s.seconds * 1e3:.0f} / {as_ms(s.stall_max)} / {as_ms(s.stall_p99)}"
                for s in row.samples
            )
        )
    for name, ratios in bench.round_ratios.items():
        if name != bench.baseline:
            w(
                f"- per-round throughput ratio {name} / {bench.baseline}: "
                + "; ".join(f"{r:.2f}" for r in ratios)
            )
    for key, values in bench.extra.items():
        w(f"- {key} (all samples, warm-up included): " + "; ".join(f"{v:.1f}" for v in values))
    if bench.idle is not None:
        w(
            f"- idle loop before the rounds (0.5 s): worst stall {as_ms(bench.idle.stall_max)} "
            f"ms, p99 {as_ms(bench.idle.stall_p99)} ms"
        )
    if bench.cpu_before and bench.cpu_after and len(bench.cpu_after) > 7:
        delta = [a - b for a, b in zip(bench.cpu_after, bench.cpu_before, strict=False)]
        total = sum(delta[:8]) or 1
        w(
            f"- CPU time during the rounds (all CPUs): system {delta[2] / total:.0%}, user "
            f"{delta[0] / total:.0%}, idle {delta[3] / total:.0%}, steal {delta[7] / total:.1%}"
        )
    for text in bench.notes:
        w(f"- {text}")
    return "\n".join(out)


# -- main -------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark rlwire's ZeroMQ and S3 sinks against raw pyzmq and s3fs."
    )
    p.add_argument("--sink", choices=("zmq-tcp", "zmq-ipc", "s3"), required=True)
    p.add_argument("--backend", choices=("asyncio", "asyncio+uvloop", "trio"), default="asyncio")
    p.add_argument(
        "--samples", type=int, default=None, help="samples per batch (default 256; s3: 64)"
    )
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default 1)")
    p.add_argument(
        "--checksum-row",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ZeroMQ: also measure rlwire with checksum=False (default: yes)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="16 samples (s3: 8): a sanity run")
    p.add_argument("--json", metavar="PATH", help="also write every sample as JSON to PATH")
    args = p.parse_args(argv)
    if args.samples is None:
        s3 = args.sink == "s3"
        args.samples = (8 if s3 else 16) if args.quick else (64 if s3 else 256)
    if args.samples < 1 or args.tokens < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--samples, --tokens and --repeats must be positive, --warmup non-negative")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    t0 = time.perf_counter()
    work = make_workload(args.samples, args.tokens, args.layers, args.topk, args.seed)
    progress(f"generated {args.samples} samples ({work.payload_bytes / MB:.0f} MB)")
    root = Path(tempfile.mkdtemp(prefix="rlwire-bench-sinks-"))
    bench = Bench(args, work, root, PeakMemory("auto"))
    backend, options = args.backend, {}
    if backend == "asyncio+uvloop":
        backend, options = "asyncio", {"use_uvloop": True}
    try:
        anyio.run(bench.run, backend=backend, backend_options=options)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(bench, argv))
    if args.json:
        write_json(args.json, argv, work.payload_bytes, bench.rows)
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
