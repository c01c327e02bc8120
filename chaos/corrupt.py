"""Random damage to stored steps: bit flips, overwrites, truncation, junk appended,
swapped, foreign and missing sidecars, swapped main files.

Pristine steps are sent once per compression (steps 0 and 1, and a "foreign" run of
the same steps with other data). Each trial writes a damaged copy of step 0 into a fresh
directory and receives it: the data must be exactly what was sent, or a typed rlwire
error; never other data, an untyped exception, a hang or memory beyond the bound.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire

from ._model import EXACT, payload, receive_one
from ._proc import MEMORY_CONSTANT, Job

N = 3_000
MAIN0, SIDE0 = "step-00000000.rank-0000.rlw", "step-00000000.rank-0000.sidecar.rlw"
MAIN1, SIDE1 = "step-00000001.rank-0000.rlw", "step-00000001.rank-0000.sidecar.rlw"
KINDS = (
    "bit flips",
    "bit flips near the start",
    "overwrite",
    "zeroed range",
    "truncation",
    "junk appended",
    "sidecar of another step",
    "sidecar of another run",
    "sidecar missing",
    "main file of another step",
    "main file of another run",
)


def make_pristine(root: str, compression: str | None) -> dict[str, Any]:
    """Send steps 0 and 1 (and the same steps of another run, tagged 100 and 101)."""

    async def send(directory: Path, tags: tuple[int, int]) -> None:
        async with rlwire.open_sender(
            directory, sidecar=("routed_experts",), compression=compression
        ) as sender:
            for step, tag in enumerate(tags):
                await sender.send(payload(tag, 0, N), step=step)

    for name, tags in (("own", (0, 1)), ("foreign", (100, 101))):
        anyio.run(send, Path(root) / f"pristine-{compression}-{name}", tags)
    return {"outcome": EXACT}


def load_pristine(root: str, compression: str | None) -> dict[str, bytes]:
    files = {}
    for name in ("own", "foreign"):
        for f in (MAIN0, SIDE0, MAIN1, SIDE1):
            files[f"{name}/{f}"] = (Path(root) / f"pristine-{compression}-{name}" / f).read_bytes()
    return files


def damage(files: dict[str, bytes], kind: str, rng: random.Random) -> tuple[dict[str, bytes], str]:
    """Step 0's files after ``kind`` of damage, and a description."""
    main, side = files[f"own/{MAIN0}"], files[f"own/{SIDE0}"]
    target = rng.choice(("main", "sidecar")) if kind in KINDS[:6] else "main"
    data = bytearray(main if target == "main" else side)
    what = ""
    if kind.startswith("bit flips"):
        span = min(len(data), 4096) if kind.endswith("start") else len(data)
        flips = [(rng.randrange(span), rng.randrange(8)) for _ in range(rng.randint(1, 8))]
        for pos, bit in flips:
            data[pos] ^= 1 << bit
        what = f"{len(flips)} bits at {sorted(p for p, _ in flips)[:8]}"
    elif kind in ("overwrite", "zeroed range"):
        pos = rng.randrange(len(data))
        size = rng.randint(1, 64)
        fill = os.urandom(size) if kind == "overwrite" else bytes(size)
        data[pos : pos + size] = fill[: len(data) - pos]
        what = f"{size} bytes at {pos}"
    elif kind == "truncation":
        cut = rng.randrange(len(data))
        del data[cut:]
        what = f"to {cut} of {len(main if target == 'main' else side)} bytes"
    elif kind == "junk appended":
        junk = rng.randint(1, 4096)
        data += os.urandom(junk) if rng.random() < 0.5 else bytes(junk)
        what = f"{junk} bytes"
    out = {MAIN0: main, SIDE0: side}
    if kind in KINDS[:6]:
        out[MAIN0 if target == "main" else SIDE0] = bytes(data)
        return out, f"{kind} of the {target}: {what}"
    if kind == "sidecar of another step":
        out[SIDE0] = files[f"own/{SIDE1}"]
    elif kind == "sidecar of another run":
        out[SIDE0] = files[f"foreign/{SIDE0}"]
    elif kind == "sidecar missing":
        del out[SIDE0]
    elif kind == "main file of another step":
        out[MAIN0] = files[f"own/{MAIN1}"]
    elif kind == "main file of another run":
        out[MAIN0] = files[f"foreign/{MAIN0}"]
    return out, kind


def receive_damaged(root: str, files: dict[str, bytes]) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(dir=root))
    try:
        for name, data in files.items():
            (directory / name).write_bytes(data)
        return receive_one(directory, 0, 0, payload(0, 0, N), timeout=1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def jobs(
    root: str, total: int, seed: int, pristine: dict[str | None, dict[str, bytes]]
) -> Iterator[Job]:
    rng = random.Random(seed)
    for i in range(total):
        compression = rng.choice(sorted(pristine, key=str))
        kind = KINDS[i % len(KINDS)] if i < len(KINDS) * 3 else rng.choice(KINDS)
        files, what = damage(pristine[compression], kind, rng)
        size = sum(len(d) for d in files.values())
        yield Job(
            receive_damaged,
            (root, files),
            timeout=15,
            mem_limit=4 * size + MEMORY_CONSTANT,
            tag=("corruption", f"{compression}: {what}"),
        )
