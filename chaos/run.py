"""Run the chaos campaigns and print the table of outcomes (``python3 tasks.py chaos``).

    python -m chaos.run [--kills N] [--corruptions N] [--cancels N] [--forgeries N]
                        [--full-disks N] [--s3-trials N] [--zmq-kills N]
                        [--parts-kills N] [--reader-trials N] [--reader-s3-trials N]
                        [--ray-kills N]
                        [--ray-trainer-kills N] [--seed S]
                        [--campaign NAME ...] [--case NAME ...]
                        [--json FILE] [--jobs J] [--tmp DIR] [-v]

(with the repository and ``tests/`` on ``PYTHONPATH``, as ``python3 tasks.py chaos`` sets
them). Exit status 1 when any bad outcome was seen.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from . import (
    aliased,
    cancel,
    corrupt,
    fork,
    fulldisk,
    hostile,
    kills,
    oddfiles,
    parts,
    producers,
    raykills,
    readers,
    s3chaos,
    zmqblips,
    zmqforge,
    zmqkill,
)
from ._model import BAD, COMPRESSIONS, DUPLICATED, LOST, WRONG_SEAL, Table
from ._proc import Job, run_jobs

CAMPAIGNS = (
    "kills",
    "cancel",
    "corruption",
    "hostile",
    "aliased",
    "oddfiles",
    "fulldisk",
    "zmq",
    "zmqkill",
    "zmqblips",
    "s3",
    "fork",
    "producers",
    "parts",
    "readers",
    "ray",
)


def _setup(job: Job, result: dict[str, Any], into: dict[Any, Any]) -> None:
    if result.get("outcome") != "exact":
        raise SystemExit(f"chaos: set-up {job.tag} failed: {result}")
    into[job.tag] = result


def each_trial(record: Any) -> Any:
    """A result handler for a job that ran many trials (``{"trials": [...]}``, each with
    ``what``, ``outcome``, ``detail``, ``died`` and ``point``): ``record`` of each, as
    if each had been a job; a job that failed as a whole is recorded as one."""

    def handle(job: Job, result: dict[str, Any]) -> None:
        if "trials" not in result:
            record(job, result)
            return
        for trial in result["trials"]:
            campaign = trial.get("campaign", job.tag[0])
            one = {**trial, "kills": int(trial["died"]), "points": [trial["point"]]}
            if not trial["died"]:
                one["points"] = []
            record(Job(job.fn, tag=(campaign, trial["what"])), one)

    return handle


def run(args: argparse.Namespace) -> Table:
    table = Table()
    verbose = args.verbose
    root = tempfile.mkdtemp(prefix="rlwire-chaos-", dir=args.tmp)
    only = set(args.case) if args.case else None

    def record(job: Job, result: dict[str, Any]) -> None:
        campaign, what = job.tag
        outcome = result["outcome"]
        if "kills" in result:
            table.kills[campaign] = table.kills.get(campaign, 0) + int(result["kills"])
            points = table.points.setdefault(campaign, {})
            for point in result.get("points", []):
                points[point] = points.get(point, 0) + 1
        detail = f"{what}: {result.get('detail', '')}".strip()
        table.add(campaign, outcome, detail, what)
        if verbose or outcome in BAD:
            print(f"  [{campaign}] {outcome}: {detail[:400]}", flush=True)

    def timed(name: str, jobs: Any, on_result: Any = record, parallel: int = 0) -> None:
        start = time.monotonic()
        print(f"chaos: {name} ...", flush=True)
        run_jobs(jobs, on_result, parallel=parallel or args.jobs)
        print(f"chaos: {name} done in {time.monotonic() - start:.0f} s", flush=True)

    try:
        if "kills" in args.campaign and args.kills:
            cal: dict[Any, Any] = {}
            planned = kills.plan(args.kills, args.seed)
            run_jobs(
                kills.calibration_jobs(root, planned), lambda j, r: _setup(j, r, cal), args.jobs
            )
            timed("kill -9", kills.jobs(root, planned, cal))
        if "cancel" in args.campaign and args.cancels:
            timed("cancellation", cancel.jobs(root, args.cancels, args.seed))
        if "corruption" in args.campaign and args.corruptions:
            done: dict[Any, Any] = {}
            setup = [Job(corrupt.make_pristine, (root, c), tag=c) for c in COMPRESSIONS]
            run_jobs(setup, lambda j, r: _setup(j, r, done), args.jobs)
            pristine = {c: corrupt.load_pristine(root, c) for c in COMPRESSIONS}
            timed("corruption", corrupt.jobs(root, args.corruptions, args.seed, pristine))
        if "hostile" in args.campaign:
            gen: dict[Any, Any] = {}
            job = Job(hostile.generate, (root,), timeout=600, mem_limit=1 << 40, tag="hostile")
            run_jobs([job], lambda j, r: _setup(j, r, gen), 1)
            timed("hostile messages", hostile.jobs(root, only=only))
        if "aliased" in args.campaign and args.aliased:
            timed(
                "aliased segments and compound bounds", aliased.jobs(root, args.aliased, args.seed)
            )
        if "oddfiles" in args.campaign:
            timed("odd file types", oddfiles.jobs(root, only=only))
        if "zmq" in args.campaign and args.forgeries:
            cap: dict[Any, Any] = {}
            job = Job(zmqforge.capture, (root,), timeout=60, tag="zmq capture")
            run_jobs([job], lambda j, r: _setup(j, r, cap), 1)
            timed("forged ZeroMQ messages", zmqforge.jobs(root, args.forgeries, args.seed))
        if "zmqkill" in args.campaign and args.zmq_kills:
            timed("ZeroMQ kills", zmqkill.jobs(root, args.zmq_kills, args.seed))
        if "zmqblips" in args.campaign and args.zmq_blips:
            timed("ZeroMQ blips", zmqblips.jobs(root, args.zmq_blips, args.seed))
        if "s3" in args.campaign and args.s3_trials:
            with s3chaos.server() as endpoint:
                timed(
                    "S3 kills and faults", s3chaos.jobs(root, endpoint, args.s3_trials, args.seed)
                )
        if "fork" in args.campaign and args.forks:
            timed("forked children", fork.jobs(root, args.forks, args.seed))
        if "producers" in args.campaign and args.producers:
            timed("producers and rewrites", producers.jobs(root, args.producers, args.seed))
        if "parts" in args.campaign and args.parts_kills:
            table.show(LOST, DUPLICATED, WRONG_SEAL)
            on_s3 = args.parts_kills // 2
            timed(
                "parts kill -9 (files)",
                parts.jobs(root, "files", args.parts_kills - on_s3, args.seed),
            )
            with s3chaos.server() as endpoint:
                timed("parts kill -9 (S3)", parts.jobs(root, "s3", on_s3, args.seed, endpoint))
        if "readers" in args.campaign and args.reader_trials:
            table.show(LOST, DUPLICATED, WRONG_SEAL)
            timed(readers.CAMPAIGN["files"], readers.jobs(root, args.reader_trials, args.seed))
        if "readers" in args.campaign and args.reader_s3_trials:
            table.show(LOST, DUPLICATED, WRONG_SEAL)
            with s3chaos.server() as endpoint:
                trials = readers.jobs(root, args.reader_s3_trials, args.seed, "s3", endpoint)
                timed(readers.CAMPAIGN["s3"], trials)
        if "ray" in args.campaign and (args.ray_kills or args.ray_trainer_kills):
            why = raykills.available()
            if why:
                print(f"chaos: ray:// kills skipped: {why}", flush=True)
                table.skipped["ray:// kills"] = why
            else:
                trials = raykills.jobs(root, args.ray_kills, args.seed, args.ray_trainer_kills)
                timed("ray:// kills", trials, each_trial(record), parallel=1)
        if "fulldisk" in args.campaign and args.full_disks:
            why = fulldisk.available()
            if why:
                print(f"chaos: full disk skipped: {why}", flush=True)
                table.skipped["full disk (tmpfs)"] = why
            else:
                timed("full disk", fulldisk.jobs(root, args.full_disks, args.seed))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return table


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tasks.py chaos", description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=1000, help="kill -9 trials (default 1000)")
    p.add_argument("--corruptions", type=int, default=10_000, help="damaged steps (10000)")
    p.add_argument("--cancels", type=int, default=400, help="cancelled sends (default 400)")
    p.add_argument("--forgeries", type=int, default=300, help="forged ZeroMQ messages (300)")
    p.add_argument("--full-disks", type=int, default=100, help="full-disk trials (100)")
    p.add_argument("--zmq-kills", type=int, default=100, help="ZeroMQ process kills (100)")
    p.add_argument("--s3-trials", type=int, default=300, help="S3 kills and faults (300)")
    p.add_argument("--aliased", type=int, default=200, help="aliased tables, compound bounds (200)")
    p.add_argument("--forks", type=int, default=100, help="forked-children trials (100)")
    p.add_argument("--zmq-blips", type=int, default=100, help="ZeroMQ blips, shared ranks (100)")
    p.add_argument(
        "--producers", type=int, default=200, help="two producers, rewrites, read-only (200)"
    )
    p.add_argument(
        "--parts-kills",
        type=int,
        default=240,
        help="kills of a producer filling steps part by part, half on S3 (240)",
    )
    p.add_argument(
        "--reader-trials",
        type=int,
        default=60,
        help="receivers reading parts live, producers and receivers killed (60)",
    )
    p.add_argument(
        "--reader-s3-trials",
        type=int,
        default=20,
        help="the same on S3, the tests' server on loopback (20)",
    )
    p.add_argument(
        "--ray-kills",
        type=int,
        default=80,
        help="kills of a producer actor sending to ray://, then resumed (80)",
    )
    p.add_argument(
        "--ray-trainer-kills",
        type=int,
        default=40,
        help="kills of a trainer actor reading from ray://, then resumed (40)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="trials in parallel")
    p.add_argument("--campaign", action="append", choices=CAMPAIGNS, help="only these (repeatable)")
    p.add_argument("--case", action="append", help="only this hostile/odd-file case")
    p.add_argument("--json", help="also write the counts and examples to this file")
    p.add_argument("--tmp", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    p.add_argument("-v", "--verbose", action="store_true", help="print every trial")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.campaign = args.campaign or list(CAMPAIGNS)
    start = time.monotonic()
    table = run(args)
    print()
    print(f"rlwire chaos suite, seed {args.seed}, {time.monotonic() - start:.0f} s")
    print(table.render(markdown=False))
    for campaign, landed in table.kills.items():
        where = ", ".join(f"{p} {n}" for p, n in sorted(table.points.get(campaign, {}).items()))
        print(f"{campaign}: {landed} kills landed: {where}")
    for campaign, why in table.skipped.items():
        print(f"skipped: {campaign}: {why}")
    bad = table.bad()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": args.seed, **table.as_json(), "bad": bad}, f, indent=1)
    if bad:
        print("\nBAD OUTCOMES:")
        for (campaign, outcome), details in table.examples.items():
            if outcome in BAD:
                for d in details:
                    print(f"  [{campaign}] {outcome}: {d[:600]}")
        return 1
    print("\nno bad outcome")
    return 0


if __name__ == "__main__":
    sys.exit(main())
