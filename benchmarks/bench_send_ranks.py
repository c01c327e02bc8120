"""One step of 8,000 small samples (128 tokens) sent to a directory, cut among 1, 2 and 4
ranks (``send_ranks``): the time of a send, by the sender's own ``on_stats``.

The same bytes go out whatever the number of ranks, so the three should take about as
long. On glibc they need not: the rows of each column are joined into new ``bytes`` of
about 512 KiB a step (``codecs/_msgpack/joined_rows.py``), and whether malloc hands a
step the pages the step before freed, or pages it must fault in again, follows glibc's
own heuristics (its dynamic mmap and trim thresholds). Each count of ranks runs in a
process of its own, in alternating order, so that one's heap does not shape another's;
``--malloc-env`` runs them again with glibc's thresholds fixed
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``).

Command: ``python benchmarks/bench_send_ranks.py [--rounds 4] [--malloc-env]``
(docs/benchmarks.md, "Sends of one small step to 1, 2 and 4 ranks").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from bench_columns import make_batch

import rlwire

SAMPLES, TOKENS, SENDS, SKIP = 8000, 128, 10, 3
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "67108864", "MALLOC_TRIM_THRESHOLD_": "4000000000"}


async def _sends(ranks: int, where: Path) -> list[float]:
    """Seconds of each send after the first :data:`SKIP`, of the step cut in ``ranks``."""
    samples = make_batch([TOKENS] * SAMPLES, 1).samples
    cut = [samples[i * SAMPLES // ranks : (i + 1) * SAMPLES // ranks] for i in range(ranks)]
    batches = [rlwire.TrainingBatch(samples=part) for part in cut]
    stats: list[rlwire.SendStats] = []
    async with rlwire.open_sender(where, on_existing="overwrite", on_stats=stats.append) as s:
        for _ in range(SENDS):
            await s.send_ranks(batches)
            for path in where.glob("step-*"):  # a full directory is not what is timed
                path.unlink()
    return [x.total_seconds for x in stats[SKIP:]]


def _child(ranks: int, where: Path) -> None:
    print(json.dumps(anyio.run(_sends, ranks, where)))


def _run(ranks: int, env: dict[str, str], root: Path) -> list[float]:
    where = root / f"ranks-{ranks}"
    here = str(Path(__file__).parent)
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([here, *sys.path[1:]])}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(ranks), str(where)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    shutil.rmtree(where, ignore_errors=True)
    return list(json.loads(out.stdout.splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    p.add_argument("--malloc-env", action="store_true", help="also with glibc's thresholds fixed")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(int(args.child[0]), Path(args.child[1]))
        return
    settings = {"default": {}, **({"fixed thresholds": FIXED_MALLOC} if args.malloc_env else {})}
    root = Path(tempfile.mkdtemp(prefix="rlwire-ranks-", dir=args.dir))
    medians: dict[tuple[str, int], list[float]] = {}
    try:
        for r in range(args.rounds):
            order = [1, 2, 4] if r % 2 == 0 else [4, 2, 1]
            for name, env in settings.items():
                for ranks in order:
                    times = _run(ranks, env, root)
                    medians.setdefault((name, ranks), []).append(statistics.median(times))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"| malloc | ranks | send ms: median of {args.rounds} rounds' medians (range) |")
    print("|---|---:|---:|")
    for (name, ranks), values in medians.items():
        ms = [v * 1e3 for v in values]
        print(f"| {name} | {ranks} | {statistics.median(ms):.1f} ({min(ms):.1f}…{max(ms):.1f}) |")


if __name__ == "__main__":
    main()
