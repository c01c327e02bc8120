"""Compare two S3 clients for rlwire's S3 sink: s3fs (as rlwire drives it) and obstore.

The same bytes (``--mb`` MB of random data, prepared once, untimed) go to one bucket
on a moto server started on 127.0.0.1 in its own process, in two shapes:

* ``many``: ``--objects`` equal objects (default 32 of 12.5 MB for 400 MB);
* ``big``: one object of the whole size (a multipart upload of ``--mb / --part-mib``
  parts).

Rows (same part size, ``--part-mib`` MiB, and at most ``--window`` part uploads in
flight for every row):

* ``s3fs (rlwire-style)``: what ``rlwire.transport.fsspec._s3_upload`` does. One worker
  thread (``asyncio.to_thread``, as rlwire's staging thread) creates each multipart
  upload, copies each part out of the source buffer into an ``io.BytesIO`` (2 MiB at a
  time, GIL held; botocore takes no memoryviews) and submits ``upload_part`` coroutines
  to fsspec's I/O loop (another thread in this process, where aiobotocore and aiohttp
  run), waiting for room when ``--window`` parts are in flight; then the uploads are
  completed on that loop. Objects below 1 MiB would be put whole (none are, at the
  default sizes).
* ``s3fs pipe`` (``--pipe-row``, default on): s3fs's own bulk put,
  ``fs._pipe({path: bytes}, chunksize=part, max_concurrency=window)`` run on fsspec's
  I/O loop (the ``s3fs direct`` baseline of bench_sinks.py, with the same part size).
  s3fs puts an object below 2 parts whole, and all objects at once.
* ``obstore``: ``await obstore.put_async(S3Store(...), key, memoryview, chunk_size=part,
  max_concurrency=...)`` straight from the event loop; the HTTP work runs on obstore's
  Rust (tokio) threads, which hold no GIL. For ``many``, objects go ``window // parts
  per object`` at a time, each with ``max_concurrency`` = its part count, so that at
  most ``--window`` parts are in flight, as for the others.

* ``obstore, other process`` (``--external-row``, default on): a control. A worker
  process does exactly the ``obstore`` row's put while this process's loop only waits
  for its answer on a pipe. Its stalls are what sharing the cores with moto and a busy
  client costs the loop without any client work in this process; a row's stalls above
  this come from its own process (GIL, Python work).

Each row's first (warm-up) operation is checked: every object's size and ETag (MD5 of
the object, or MD5 of the parts' MD5s for a multipart upload) must match the data.
Objects are deleted after every operation (moto keeps them in memory).

Measured per operation, in this process: wall time; MB/s (10^6 bytes / s); the worst and
the 99th-percentile event-loop stall from :class:`rlwire.LagMonitor` (1 ms sleeps; ~1 ms
is the loop's own timer resolution) over the whole put; the peak extra RSS (VmHWM after
``clear_refs`` minus the RSS before); and the process's CPU time (user + system, every
thread of this process, not moto's). Each of ``--repeats`` rounds, after ``--warmup``
discarded ones, runs every row twice in the order A B C C B A per shape, so drift hits
every row alike; tables show the median and the range [min-max] over the samples.

moto is a Python server and is the bottleneck (tens of MB/s on 2 cores): throughput
here says which client keeps moto busier, not what either client reaches against S3.

Usage::

    .venv/bin/pip install obstore          # not a dependency of rlwire
    .venv/bin/python benchmarks/bench_s3_clients.py                  # 400 MB, 3 rounds
    .venv/bin/python benchmarks/bench_s3_clients.py --mb 100 --repeats 3
    .venv/bin/python benchmarks/bench_s3_clients.py --mb 50 --repeats 1 --no-pipe-row
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import hashlib
import io
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any, TypeVar

import numpy as np
from bench_send import MB, PeakMemory, progress
from bench_sinks import moto_server

import rlwire

T = TypeVar("T")

BUCKET = "rlwire-bench-clients"
RLWIRE_STYLE = "s3fs (rlwire-style)"
PIPE = "s3fs pipe"
OBSTORE = "obstore"
EXTERNAL = "obstore, other process"
SHAPES = ("many", "big")
SMALL_BYTES = 1 << 20  # rlwire puts objects below this whole
COPY_BYTES = 2 << 20  # rlwire copies a part 2 MiB at a time


@dataclass
class Sample:
    seconds: float
    stall_max: float
    stall_p99: float
    peak: int
    cpu: float


@dataclass
class Row:
    shape: str
    client: str
    samples: list[Sample] = field(default_factory=list)

    def values(self, attr: str) -> list[float]:
        return [float(getattr(s, attr)) for s in self.samples]


# -- the s3fs rows ----------------------------------------------------------------------


def on_io_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on fsspec's I/O loop and wait for it (from a worker thread)."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def upload_part(
    fs: Any, bucket: str, key: str, upload_id: str, number: int, body: io.BytesIO
) -> str:
    """One part, as rlwire's ``_upload_part``: the client's ``upload_part`` with a
    BytesIO body (aiohttp streams it), straight on the aiobotocore client."""
    await fs.set_session()
    client = await fs.get_s3(bucket)
    out = await client.upload_part(
        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
    )
    return str(out["ETag"])


def s3fs_rlwire_style(fs: Any, objects: dict[str, memoryview], part: int, window: int) -> None:
    """Put ``objects`` the way rlwire's S3 staging does (runs in a worker thread)."""
    loop: asyncio.AbstractEventLoop = fs.loop
    inflight: dict[concurrent.futures.Future[str], tuple[dict[int, str], int]] = {}
    uploads: list[tuple[str, str, dict[int, str]]] = []
    small: list[tuple[str, bytes]] = []

    def reap(done: set[concurrent.futures.Future[str]]) -> None:
        for fut in done:
            etags, number = inflight.pop(fut)
            etags[number] = fut.result()

    def wait_one() -> None:
        done, _ = concurrent.futures.wait(
            inflight, timeout=0.05, return_when=concurrent.futures.FIRST_COMPLETED
        )
        reap(done)

    for key, view in objects.items():
        if view.nbytes < SMALL_BYTES:
            small.append((key, bytes(view)))
            continue
        out = on_io_loop(loop, fs._call_s3("create_multipart_upload", Bucket=BUCKET, Key=key))
        upload_id = str(out["UploadId"])
        etags: dict[int, str] = {}
        uploads.append((key, upload_id, etags))
        for number, start in enumerate(range(0, view.nbytes, part), 1):
            while len(inflight) >= window:
                wait_one()
            chunk = view[start : start + part]
            buf = io.BytesIO()
            for pos in range(0, chunk.nbytes, COPY_BYTES):
                buf.write(chunk[pos : pos + COPY_BYTES])
            buf.seek(0)
            fut = asyncio.run_coroutine_threadsafe(
                upload_part(fs, BUCKET, key, upload_id, number, buf), loop
            )
            inflight[fut] = (etags, number)
    while inflight:
        wait_one()

    async def finish() -> None:
        await asyncio.gather(
            *(
                fs._call_s3(
                    "complete_multipart_upload",
                    Bucket=BUCKET,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={
                        "Parts": [{"PartNumber": n, "ETag": e} for n, e in sorted(etags.items())]
                    },
                )
                for key, upload_id, etags in uploads
            ),
            *(fs._call_s3("put_object", Bucket=BUCKET, Key=k, Body=b) for k, b in small),
        )

    on_io_loop(loop, finish())


async def s3fs_pipe(fs: Any, objects: dict[str, bytes], part: int, window: int) -> None:
    """s3fs's own bulk put, on fsspec's I/O loop, awaited from this loop."""
    data = {f"{BUCKET}/{k}": v for k, v in objects.items()}
    fut = asyncio.run_coroutine_threadsafe(
        fs._pipe(data, chunksize=part, max_concurrency=window), fs.loop
    )
    await asyncio.wrap_future(fut)


# -- the obstore row --------------------------------------------------------------------


async def obstore_put(store: Any, objects: dict[str, memoryview], part: int, window: int) -> None:
    """``obstore.put_async`` per object, at most ``window`` parts in flight in all."""
    import obstore

    most_parts = max(-(-v.nbytes // part) for v in objects.values())
    per_object = max(1, min(window, most_parts))
    gate = asyncio.Semaphore(max(1, window // per_object))

    async def one(key: str, view: memoryview) -> None:
        async with gate:
            await obstore.put_async(store, key, view, chunk_size=part, max_concurrency=per_object)

    await asyncio.gather(*(one(k, v) for k, v in objects.items()))


def split(data: bytes, shape: str, prefix: str, n: int) -> dict[str, memoryview]:
    """The objects of ``shape``: views of ``data``, by key."""
    view = memoryview(data)
    if shape == "big":
        return {f"{prefix}/big": view}
    size = -(-view.nbytes // n)
    return {
        f"{prefix}/obj-{i:04d}": view[i * size : (i + 1) * size]
        for i in range(n)
        if i * size < view.nbytes
    }


def worker_main(args: argparse.Namespace) -> None:
    """The control row's process: put what each stdin line (shape, prefix) names with
    obstore, answer "ok" (or the error) on stdout."""
    from obstore.store import S3Store

    data = np.random.default_rng(args.seed).bytes(int(args.mb * MB))
    store = S3Store(BUCKET, **store_options(args.worker))
    part = int(args.part_mib * (1 << 20))
    print("ready", flush=True)
    for line in sys.stdin:
        shape, prefix = line.split()
        try:
            objects = split(data, shape, prefix, args.objects)
            asyncio.run(obstore_put(store, objects, part, args.window))
            print("ok", flush=True)
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}".replace("\n", " "), flush=True)


def store_options(endpoint: str) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "access_key_id": "testing",
        "secret_access_key": "testing",
        "region": "us-east-1",
        "client_options": {"allow_http": True},
    }


# -- measuring --------------------------------------------------------------------------


def process_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def measure(op: Callable[[], Awaitable[None]], mem: PeakMemory) -> Sample:
    """Run ``op`` under a LagMonitor: time, stalls, peak extra RSS, CPU time."""
    gc.collect()
    async with rlwire.LagMonitor() as lag:
        mem.start()
        c0 = process_cpu()
        t0 = time.perf_counter()
        await op()
        seconds = time.perf_counter() - t0
        cpu = process_cpu() - c0
        peak = mem.stop()
    return Sample(seconds, lag.max, lag.percentile(99), peak, cpu)


def expected_etags(view: memoryview, part: int) -> set[str]:
    """The ETags an object of these bytes may get: MD5 of the whole (a single put), or
    MD5 of the parts' MD5s with the part count (a multipart upload of ``part`` bytes)."""
    whole = hashlib.md5(view).hexdigest()
    digests = [hashlib.md5(view[i : i + part]).digest() for i in range(0, view.nbytes, part)]
    multi = f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"
    return {f'"{whole}"', f'"{multi}"'}


@dataclass
class Bench:
    args: argparse.Namespace
    fs: Any
    store: Any
    data: bytes
    mem: PeakMemory
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    count: int = 0
    idle: Sample | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def part(self) -> int:
        return int(self.args.part_mib * (1 << 20))

    worker: asyncio.subprocess.Process | None = None

    def objects(self, shape: str, prefix: str) -> dict[str, memoryview]:
        return split(self.data, shape, prefix, self.args.objects)

    async def external(self, shape: str, prefix: str) -> None:
        """Have the worker process put the objects; wait for it without blocking."""
        worker = self.worker
        assert worker is not None and worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(f"{shape} {prefix}\n".encode())
        await worker.stdin.drain()
        answer = (await worker.stdout.readline()).decode().strip()
        if answer != "ok":
            raise RuntimeError(f"the worker process failed: {answer or 'it exited'}")

    async def run_one(self, shape: str, client: str, check: bool) -> Sample:
        self.count += 1
        prefix = f"{client.split()[0]}-{shape}-{self.count}"
        objects = self.objects(shape, prefix)
        part, window = self.part, self.args.window
        op: Callable[[], Awaitable[None]]
        if client == RLWIRE_STYLE:

            async def op() -> None:
                await asyncio.to_thread(s3fs_rlwire_style, self.fs, objects, part, window)

        elif client == PIPE:
            # s3fs wants bytes; the copies are made before the timer starts.
            as_bytes = {
                k: self.data if v.nbytes == len(self.data) else bytes(v) for k, v in objects.items()
            }

            async def op() -> None:
                await s3fs_pipe(self.fs, as_bytes, part, window)

        elif client == EXTERNAL:

            async def op() -> None:
                await self.external(shape, prefix)

        else:

            async def op() -> None:
                await obstore_put(self.store, objects, part, window)

        sample = await measure(op, self.mem)
        if client == PIPE:
            del as_bytes
        if check:
            await asyncio.to_thread(self.check, prefix, objects)
        await asyncio.to_thread(self.clear, prefix)
        return sample

    def check(self, prefix: str, objects: dict[str, memoryview]) -> None:
        self.fs.invalidate_cache()
        found = self.fs.find(f"{BUCKET}/{prefix}", detail=True)
        got = {k.removeprefix(f"{BUCKET}/"): v for k, v in found.items()}
        if sorted(got) != sorted(objects):
            raise AssertionError(f"{prefix}: stored {sorted(got)[:3]}..., not the objects put")
        for key, view in objects.items():
            info = got[key]
            if int(info["size"]) != view.nbytes:
                raise AssertionError(f"{key}: {info['size']} bytes stored, {view.nbytes} put")
            etag = str(info.get("ETag", ""))
            if etag not in expected_etags(view, self.part):
                raise AssertionError(f"{key}: ETag {etag} does not match the data put")

    def clear(self, prefix: str) -> None:
        self.fs.rm(f"{BUCKET}/{prefix}", recursive=True)
        self.fs.invalidate_cache()

    async def run(self) -> None:
        clients = [
            RLWIRE_STYLE,
            *([PIPE] if self.args.pipe_row else []),
            OBSTORE,
            *([EXTERNAL] if self.worker is not None else []),
        ]
        for shape in self.args.shapes:
            for client in clients:
                self.rows[(shape, client)] = Row(shape, client)

        async def idle() -> None:
            await asyncio.sleep(0.5)

        self.idle = await measure(idle, self.mem)
        checked: set[tuple[str, str]] = set()
        for r in range(self.args.warmup + self.args.repeats):
            keep = r >= self.args.warmup
            for shape in self.args.shapes:
                got: dict[str, list[Sample]] = {c: [] for c in clients}
                for client in [*clients, *reversed(clients)]:
                    check = (shape, client) not in checked
                    got[client].append(await self.run_one(shape, client, check))
                    checked.add((shape, client))
                    if keep:
                        self.rows[(shape, client)].samples.append(got[client][-1])
                progress(
                    f"  {'round' if keep else 'warm-up'} {shape}: "
                    + ", ".join(
                        f"{c} "
                        + "/".join(
                            f"{s.seconds:.2f} s (stall {s.stall_max * 1e3:.1f} ms)" for s in got[c]
                        )
                        for c in clients
                    )
                )


# -- reporting --------------------------------------------------------------------------


def med_range(values: list[float], spec: str) -> str:
    if not values:
        return "—"
    med = format(statistics.median(values), spec)
    return f"{med} [{format(min(values), spec)}-{format(max(values), spec)}]"


def report(bench: Bench, argv: list[str]) -> str:
    args = bench.args
    nbytes = len(bench.data)
    out: list[str] = []
    w = out.append
    w(f"Command: `{' '.join(['.venv/bin/python', 'benchmarks/bench_s3_clients.py', *argv])}`")
    w("")
    w(
        f"{nbytes / MB:.0f} MB per operation; shapes: "
        + ", ".join(f"{s} ({len(bench.objects(s, 'x'))} object(s))" for s in args.shapes)
        + f"; {args.part_mib:g} MiB parts, at most {args.window} parts in flight; "
        f"{args.repeats} round(s) after {args.warmup} warm-up round(s), 2 samples per row "
        "per round (A B C C B A); median [min-max] over the samples."
    )
    w(
        f"Python {platform.python_version()}, s3fs {version('s3fs')}, aiobotocore "
        f"{version('aiobotocore')}, botocore {version('botocore')}, aiohttp "
        f"{version('aiohttp')}, obstore {version('obstore')}, moto {version('moto')}; "
        f"{os.cpu_count()} CPUs."
    )
    w("")
    w(
        "| shape | client | MB/s | time s | worst stall ms | p99 stall ms | peak extra MB "
        "| client CPU s | throughput vs s3fs (rlwire-style) |"
    )
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (shape, client), row in bench.rows.items():
        base = bench.rows[(shape, RLWIRE_STYLE)]
        secs = row.values("seconds")
        ratio = statistics.median(base.values("seconds")) / statistics.median(secs)
        w(
            f"| {shape} | {client} | {med_range([nbytes / MB / s for s in secs], '.0f')} "
            f"| {med_range(secs, '.2f')} "
            f"| {med_range([v * 1e3 for v in row.values('stall_max')], '.1f')} "
            f"| {med_range([v * 1e3 for v in row.values('stall_p99')], '.2f')} "
            f"| {med_range([v / MB for v in row.values('peak')], '.0f')} "
            f"| {med_range(row.values('cpu'), '.2f')} | {ratio:.2f} |"
        )
    w("")
    if bench.idle is not None:
        w(
            f"Idle loop (0.5 s, before the rounds): worst stall "
            f"{bench.idle.stall_max * 1e3:.2f} ms, p99 {bench.idle.stall_p99 * 1e3:.2f} ms. "
            "Client CPU: user + system time of this process (every thread), not moto's."
        )
    for text in bench.notes:
        w(f"- {text}")
    return "\n".join(out)


# -- main -------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Put the same bytes to a local moto S3 with s3fs and with obstore."
    )
    p.add_argument("--mb", type=float, default=400, help="MB per operation (default 400)")
    p.add_argument("--objects", type=int, default=32, help="objects of the 'many' shape")
    p.add_argument("--part-mib", type=float, default=8, help="part size (default 8 MiB)")
    p.add_argument(
        "--window", type=int, default=10, help="parts in flight (default 10, s3fs's default)"
    )
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    p.add_argument("--repeats", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (default 1)")
    p.add_argument(
        "--pipe-row",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure s3fs's own fs._pipe (default: yes)",
    )
    p.add_argument(
        "--external-row",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time obstore putting the same objects from another process while "
        "this loop only waits: the stalls that CPU contention alone causes (default: yes)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", metavar="ENDPOINT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mb <= 0 or args.objects < 1 or args.window < 1 or args.repeats < 1:
        p.error("--mb, --objects, --window and --repeats must be positive")
    if args.part_mib < 5 or args.warmup < 0:
        p.error("--part-mib must be at least 5 (S3's smallest part), --warmup non-negative")
    return args


async def amain(args: argparse.Namespace, data: bytes) -> Bench:
    import s3fs
    from obstore.store import S3Store

    async with moto_server() as endpoint:
        options = {
            "endpoint_url": endpoint,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }
        fs = s3fs.S3FileSystem(**options)  # synchronous: requests go to fsspec's I/O loop
        await asyncio.to_thread(fs.call_s3, "create_bucket", Bucket=BUCKET)
        store = S3Store(BUCKET, **store_options(endpoint))
        bench = Bench(args, fs, store, data, PeakMemory("auto"))
        if args.external_row:
            bench.worker = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                *argv_of(args),
                "--worker",
                endpoint,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            assert bench.worker.stdout is not None
            if (await bench.worker.stdout.readline()).strip() != b"ready":
                raise RuntimeError("the worker process did not start")
        bench.notes.append(
            f"moto_server on {endpoint}; obstore S3Store(endpoint, allow_http, path-style, "
            "default signing: the payload's SHA-256 is signed); s3fs with default options."
        )
        try:
            await bench.run()
        finally:
            if bench.worker is not None and bench.worker.stdin is not None:
                bench.worker.stdin.close()
                await bench.worker.wait()
        return bench


def argv_of(args: argparse.Namespace) -> list[str]:
    """The options the worker process needs to make the same data and objects."""
    return [
        f"--mb={args.mb}",
        f"--objects={args.objects}",
        f"--part-mib={args.part_mib}",
        f"--window={args.window}",
        f"--seed={args.seed}",
    ]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        import obstore
    except ImportError:
        print("obstore is not installed (.venv/bin/pip install obstore): nothing to compare.")
        return
    if args.worker:
        worker_main(args)
        return
    progress(f"obstore {obstore.__version__}")
    t0 = time.perf_counter()
    data = np.random.default_rng(args.seed).bytes(int(args.mb * MB))
    bench = asyncio.run(amain(args, data))
    print(report(bench, argv))
    progress(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
