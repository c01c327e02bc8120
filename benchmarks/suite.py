"""The whole benchmark suite in one command: ``python3 tasks.py bench``.

Runs, each in a process of its own, the benchmark scripts beside this one over a matrix
of sinks, event loops, step sizes and workloads, each row beside its baseline in the
same run, then prints one table of ratios and writes every sample as JSON:

* **file, 256 large samples** (``bench_send.py``, the numpy ``TrainingBatch`` of 8,192
  tokens a sample, 95 % of it ``routed_experts``, one rank): the send against the floor
  (one thread writing the same bytes with ``os.write``), target 1.1 x; the receive,
  checksums verified, against reading the same bytes once, target 2 x.
* **file, 8,000 small samples** (the same script, 8,000 samples of as few tokens as the
  step size gives): the same two rows.
* **zmq-tcp, zmq-ipc** (``bench_sinks.py``): rlwire's throughput to another process
  against raw pyzmq sending the same buffers as one zero-copy multipart message, target
  0.9 x.
* **s3** (``bench_sinks.py``, moto on loopback): against s3fs putting the same bytes,
  target 1.0 x. moto, a Python server, takes about 40 MB/s, so S3 rows stop at
  ``--s3-max-gb`` (default 0.4).
* **columns** (``bench_columns.py``, fixed shapes, run once per loop whatever the
  sizes): the dense (2048 x 2048), ragged (256..4096 tokens) and small (8,000 x 128)
  steps of issue 25, send against the floor and receive against one read, and 128
  multi-turn appends of ``routed_experts`` against a list of chunks written with one
  ``writev``; their stalls are judged on the difference to the idle loop's worst gap
  over the same durations, measured in the same run (shown beside them).
* **stream** (``bench_stream.py``, issue 28's shape, fixed whatever the sizes, once
  per loop; Ray only under asyncio, its actors' loop): 256 groups of 16 samples put
  part by part as they finish over 10 s, two ranks taking them with ``aparts()``, on a
  directory, S3, ZeroMQ ipc and Ray; its own table: the last put to the last part
  held, put-to-receive latency (median, p99), the ranks' token imbalance against the
  largest group, and the producer's worst stall beside the idle loop's. ``--quick``:
  32 smaller groups over 2 s.
* **users' types, 8 ranks** (``bench_user_types.py``, framework-shaped Structs with
  list fields): ``send_ranks`` against the frameworks' own raw-sidecar writer, target
  1.1 x; ``areceive`` against a msgspec decode of the same message.

Every rlwire row's worst event-loop stall (target 2 ms) and p99, and its peak extra
memory (target 64 MB for sends), come from the script's own monitor. Ratios are of
medians; the range is over the samples.

It shows a progress bar while it runs; ``--plot DIR`` also draws, from the same run, how
each row's time, worst stall and peak memory grow with the step size (``plots.py``).
It needs the source checkout (these scripts), so it is a task of ``tasks.py``, not a
command of the installed package.

Usage::

    python3 tasks.py bench                                    # every size, asyncio and trio
    python3 tasks.py bench --quick                            # 0.1 GB only, a few minutes
    python3 tasks.py bench --sizes 0.1,0.8 --sinks file,zmq-ipc --json out.json
    python3 tasks.py bench --json out.json --plot docs/plots  # the table and its charts
    python3 tasks.py bench --from-json out.json --plot DIR    # an earlier run's, again
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ratio import Ratio  # beside this file

HERE = Path(__file__).resolve().parent
#: How a run is started, as its results record it.
COMMAND = "python3 tasks.py bench"
SIZES_GB = (0.1, 0.4, 0.8, 1.6, 3.2)
SINKS = ("file", "file-small", "zmq-tcp", "zmq-ipc", "s3", "user-types", "columns", "stream")
BACKENDS = ("asyncio", "trio")
#: Bytes of array data per token of bench_send.py's workload (48 layers x top-8 experts
#: as uint8, then token id, mask, logprob, advantage).
BYTES_PER_TOKEN = 48 * 8 + 4 + 1 + 4 + 4
LARGE_TOKENS = 8192
SMALL_SAMPLES = 8000
#: bench_user_types.py's default step (256 samples x 8,192 tokens, 8 ranks), in GB.
USER_TYPES_GB = 0.88


@dataclass
class Job:
    sink: str
    backend: str
    size_gb: float
    argv: list[str]
    seconds: float = 0.0
    error: str = ""
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.sink} {self.backend} {self.size_gb:g} GB"


def jobs(args: argparse.Namespace) -> list[Job]:
    out: list[Job] = []
    rounds = ["--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    for size in args.sizes:
        for backend in args.backends:
            for sink in args.sinks:
                tokens = round(size * 1e9 / BYTES_PER_TOKEN)
                if sink == "file":
                    script = ["bench_send.py", "--samples", str(max(1, tokens // LARGE_TOKENS))]
                elif sink == "file-small":
                    per = max(1, tokens // SMALL_SAMPLES)
                    script = [
                        "bench_send.py",
                        "--samples",
                        str(SMALL_SAMPLES),
                        "--tokens",
                        str(per),
                    ]
                elif sink == "columns":
                    if size != args.sizes[0]:
                        continue  # fixed shapes: once per loop
                    script = ["bench_columns.py", "--loops", backend]
                    script += ["--quick"] if args.quick else []
                elif sink == "stream":
                    if size != args.sizes[0]:
                        continue  # a fixed shape: once per loop
                    sinks = "file,s3,zmq-ipc" + (",ray" if backend == "asyncio" else "")
                    script = ["bench_stream.py", "--backend", backend, "--sinks", sinks]
                    script += ["--quick"] if args.quick else []
                    out.append(Job(sink, backend, size, script))  # one run: no rounds
                    continue
                elif sink == "user-types":
                    if backend != args.backends[0]:
                        continue  # the script runs both loops itself
                    scale = size / USER_TYPES_GB
                    script = ["bench_user_types.py", "--scale", f"{scale:.4f}", "--backend", "both"]
                    script += ["--no-memory-round"]
                else:
                    if sink == "s3" and size > args.s3_max_gb:
                        continue
                    samples = max(1, tokens // LARGE_TOKENS)
                    script = ["bench_sinks.py", "--sink", sink, "--samples", str(samples)]
                    script += ["--no-checksum-row"] if sink != "s3" else []
                if sink not in ("user-types", "columns"):
                    script += ["--backend", backend]
                out.append(Job(sink, backend, size, [*script, *rounds]))
    return out


def run_job(job: Job, workdir: Path) -> None:
    out = workdir / f"{len(os.listdir(workdir))}.json"
    cmd = [sys.executable, str(HERE / job.argv[0]), *job.argv[1:], "--json", str(out)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    job.seconds = time.monotonic() - start
    if proc.returncode != 0 or not out.exists():
        lines = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        job.error = f"exit {proc.returncode}: {lines[-1] if lines else ''}"
        return
    job.result = json.loads(out.read_text())


def _samples(row: dict[str, Any], measure: str) -> list[float]:
    if "samples" in row:  # bench_user_types.py: a list of sample dicts
        return [s[measure] for s in row["samples"] if s.get(measure) is not None]
    return [v for v in row[measure] if v is not None]


def _pair(
    job: Job,
    rows: dict[str, Any],
    operation: str,
    mine: str,
    theirs: str,
    target: float,
    *,
    backend: str | None = None,
    throughput: bool = False,
) -> Ratio:
    a, b = _samples(rows[mine], "seconds"), _samples(rows[theirs], "seconds")
    ma, mb = statistics.median(a), statistics.median(b)
    if throughput:  # how fast rlwire goes relative to the baseline
        ratio, span = mb / ma, (min(b) / max(a), max(b) / min(a))
    else:
        ratio, span = ma / mb, (min(a) / max(b), max(a) / min(b))
    stalls = _samples(rows[mine], "stall_max")
    p99 = _samples(rows[mine], "stall_p99")
    peaks = _samples(rows[mine], "peak")
    return Ratio(
        job.sink,
        backend or job.backend,
        job.size_gb,
        operation,
        ma * 1e3,
        theirs,
        mb * 1e3,
        ratio,
        span,
        target,
        throughput,
        max(stalls) * 1e3 if stalls else None,
        statistics.median(p99) * 1e3 if p99 else None,
        max(peaks) / 1e6 if peaks else None,
    )


def column_ratios(job: Job) -> list[Ratio]:
    """bench_columns.py's pairs that have a target, one sink per shape, with the idle
    loop's worst gap beside each worst stall."""
    out = []
    for backend, shapes in job.result["loops"].items():
        for shape, data in shapes.items():
            rows = data["rows"]
            for _, mine, theirs, target in (p for p in data["pairs"] if p[0] == shape):
                if target is None or mine not in rows or theirs not in rows:
                    continue
                r = _pair(job, rows, mine, mine, theirs, target, backend=backend)
                idle = _samples(rows.get(f"idle ({mine})", {"stall_max": []}), "stall_max")
                out.append(
                    replace(
                        r,
                        sink=f"columns-{shape}",
                        size_gb=round(data["step_bytes"] / 1e9, 3),
                        idle_stall_ms=max(idle) * 1e3 if idle else None,
                    )
                )
    return out


def ratios(job: Job) -> list[Ratio]:
    if not job.result:
        return []
    if job.sink == "columns":
        return column_ratios(job)
    if job.sink == "stream":
        return []  # a table of its own (stream_table): no baseline to take a ratio of
    if job.sink in ("file", "file-small"):
        rows = job.result["rows"]
        return [
            _pair(job, rows, "send", "rlwire send", "floor (c)", 1.1),
            _pair(job, rows, "receive (verified)", "receive open", "read once", 2.0),
        ]
    if job.sink == "user-types":
        out = []
        for backend, data in job.result["backends"].items():
            rows = data["rows"]
            send = next(n for n in rows if n.startswith("(b)"))
            decode = next(n for n in rows if n.startswith("msgspec decode"))
            out.append(_pair(job, rows, "send_ranks", "rlwire send", send, 1.1, backend=backend))
            out.append(
                _pair(job, rows, "areceive", "rlwire areceive", decode, 1.0, backend=backend)
            )
        return out
    rows = job.result["rows"]
    base = "s3fs direct" if job.sink == "s3" else "raw pyzmq"
    target = 1.0 if job.sink == "s3" else 0.9
    return [_pair(job, rows, "send to receiver", "rlwire", base, target, throughput=True)]


def table(found: list[Ratio]) -> str:
    head = (
        "| sink | loop | GB | operation | rlwire ms | baseline | baseline ms | ratio (range) "
        "| target | worst stall ms (idle loop) | p99 ms | peak MB | met: time, stall, memory |"
    )
    lines = [head, "|---|---|---:|---|---:|---|---:|---|---|---:|---:|---:|---|"]
    for r in found:
        sign = "≥" if r.higher_is_better else "≤"
        lo, hi = r.ratio_range
        stall = "—" if r.worst_stall_ms is None else f"{r.worst_stall_ms:.1f}"
        if r.idle_stall_ms is not None:
            stall += f" (idle {r.idle_stall_ms:.1f})"
        p99 = "—" if r.p99_stall_ms is None else f"{r.p99_stall_ms:.1f}"
        peak = "—" if r.peak_mb is None else f"{r.peak_mb:.0f}"
        lines.append(
            f"| {r.sink} | {r.backend} | {r.size_gb:g} | {r.operation} | {r.rlwire_ms:.0f} "
            f"| {r.baseline} | {r.baseline_ms:.0f} | {r.ratio:.2f} ({lo:.2f}-{hi:.2f}) "
            f"| {sign} {r.target:g}x | {stall} | {p99} | {peak} | {_verdicts(r)} |"
        )
    return "\n".join(lines)


def stream_table(jobs: list[Job]) -> str:
    """bench_stream.py's rows, of every loop, as one table."""
    from bench_stream import table as stream_rows  # beside this file

    rows = [row for job in jobs if job.sink == "stream" for row in job.result.get("rows", [])]
    return stream_rows(rows) if rows else ""


def growth(found: list[Ratio], backend: str = "asyncio") -> str:
    """How each row's time and worst stall grow with the step size, under ``backend``."""
    sizes = sorted({r.size_gb for r in found if not r.sink.startswith("columns-")})
    rows: dict[str, dict[float, Ratio]] = {}
    for r in found:
        if r.backend == backend and not r.sink.startswith("columns-"):  # fixed sizes
            rows.setdefault(f"{r.sink} {r.operation}", {})[r.size_gb] = r
    head = "| row | " + " | ".join(f"{s:g} GB" for s in sizes) + " |"
    lines = [head, "| --- |" + " ---: |" * len(sizes)]
    for label, attribute in (("", "rlwire_ms"), ("*worst stall:* ", "worst_stall_ms")):
        for name, by_size in rows.items():
            cells = []
            for size in sizes:
                value = getattr(by_size[size], attribute) if size in by_size else None
                cells.append(
                    "—" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"
                )
            lines.append(f"| {label}{name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdicts(r: Ratio) -> str:
    def word(ok: bool | None) -> str:
        return "—" if ok is None else "yes" if ok else "**no**"

    return ", ".join(word(ok) for ok in (r.met_time, r.met_stall, r.met_memory))


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if "model name" in line), "")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "memory_gb": round(mem / 1e9, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    p.add_argument("--sizes", help="step sizes in GB, comma-separated (default all)")
    p.add_argument("--sinks", help=f"comma-separated, of {', '.join(SINKS)} (default all)")
    p.add_argument("--backends", default="asyncio,trio")
    p.add_argument("--repeats", type=int, default=2, help="measured rounds per script (2)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds first (1)")
    p.add_argument("--s3-max-gb", type=float, default=0.4, help="largest S3 step (0.4)")
    p.add_argument("--json", default="bench-results.json", help="where to write the results")
    p.add_argument("--quick", action="store_true", help="0.1 GB, one measured round")
    p.add_argument(
        "--plot",
        metavar="DIR",
        help="also draw PNG charts of time, worst stall and memory against step size, per "
        "sink, into DIR (needs matplotlib: pip install 'rlwire[plot]')",
    )
    p.add_argument(
        "--from-json",
        metavar="PATH",
        help="run nothing: print the table of an earlier run's results (and --plot them)",
    )
    args = p.parse_args(argv)
    args.sizes = (
        [float(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([0.1] if args.quick else list(SIZES_GB))
    )
    args.sinks = args.sinks.split(",") if args.sinks else list(SINKS)
    args.backends = args.backends.split(",")
    if args.quick:
        args.repeats = 1
    unknown = set(args.sinks) - set(SINKS) or set(args.backends) - set(BACKENDS)
    if unknown:
        p.error(f"unknown: {sorted(unknown)}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - checked before a run of an hour, not after
        except ImportError:
            p.error("--plot needs matplotlib: pip install 'rlwire[plot]'")
    return args


def progress(todo: list[Job], done: int, began: float, doing: str) -> str:
    """``[#####.......] 12/49  8:12 elapsed, ~21 min left  <what runs now>``; the time left
    assumes a job takes time in proportion to its step size, as the rows do."""
    width, total = 24, len(todo)
    filled = width * done // max(1, total)
    elapsed = time.monotonic() - began
    weight = [job.size_gb + 0.05 for job in todo]  # + a script's start-up
    finished = sum(weight[:done])
    left = f", ~{elapsed / finished * sum(weight[done:]) / 60:.0f} min left" if done else ""
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  "
        f"{int(elapsed // 60)}:{int(elapsed % 60):02d} elapsed{left}  {doing}"
    )


def run_all(args: argparse.Namespace, command: str) -> dict[str, Any]:
    todo = jobs(args)
    started = datetime.datetime.now(datetime.UTC)
    began = time.monotonic()
    found: list[Ratio] = []
    with tempfile.TemporaryDirectory(prefix="rlwire-suite-") as tmp:
        for i, job in enumerate(todo):
            print(progress(todo, i, began, job.name), file=sys.stderr, flush=True)
            print(f"    {' '.join(job.argv)}", file=sys.stderr, flush=True)
            run_job(job, Path(tmp))
            found += ratios(job)
            state = f"failed: {job.error}" if job.error else "done"
            print(f"    {state} in {job.seconds:.0f} s", file=sys.stderr, flush=True)
    print(progress(todo, len(todo), began, "finished"), file=sys.stderr, flush=True)
    return {
        "command": command,
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "ratios": [
            asdict(r)
            | {
                "met": r.met,
                "met_time": r.met_time,
                "met_stall": r.met_stall,
                "met_memory": r.met_memory,
            }
            for r in found
        ],
        "runs": [asdict(j) for j in todo],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = run_all(args, " ".join([COMMAND, *argv]))
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    found = [Ratio(**_fields_of(r)) for r in results["ratios"]]
    mach = results["machine"]
    print(
        f"Command: `{results['command']}`; {results['date'][:10]}; {mach['cpus']} CPUs, "
        f"{mach['memory_gb']} GB, {mach['cpu']}"
    )
    if found:
        print()
        print(table(found))
    if any(not r.sink.startswith("columns-") for r in found):
        print()
        print(
            "How each cost grows with the step size: rlwire ms, and the worst stall in ms, asyncio."
        )
        print()
        print(growth(found))
    if args.plot:
        from plots import plot_all  # beside this file; imports matplotlib

        for path in plot_all(found, Path(args.plot), results["command"], results):
            print(f"plot: {path}")
    runs = [Job(**run) for run in results["runs"]]
    streamed = stream_table(runs)
    if streamed:
        print()
        print("Streaming parts (shape stream, bench_stream.py):")
        print()
        print(streamed)
    failed = [job for job in runs if job.error]
    for job in failed:
        print(f"\nfailed: {job.name}: {job.error}")
    if not args.from_json:
        print(f"\nresults: {args.json}")
    return 1 if failed else 0


def _fields_of(row: dict[str, Any]) -> dict[str, Any]:
    """A Ratio's constructor arguments from its JSON form (which adds the verdicts)."""
    out = {k: v for k, v in row.items() if k in Ratio.__dataclass_fields__}
    out["ratio_range"] = tuple(out["ratio_range"])
    return out


if __name__ == "__main__":
    sys.exit(main())
