"""A full disk: a sender writing to a small tmpfs until it fills.

Needs root (to mount the tmpfs); skipped with a reason otherwise. Each trial mounts a
tmpfs of a random size, sends steps until a send fails, and checks that the failure is a
typed error, that the failed step left nothing behind (no main, no sidecar, no temporary
file), that every visible step receives exactly, and that after space is freed (a
remount, larger) the same sender sends the next step.
"""

from __future__ import annotations

import os
import random
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire
from rlwire.transport._stored.names import MAIN_RE

from ._model import EXACT, HALF, TYPED, UNTYPED, describe, payload, receive_one
from ._proc import Job

N = 4_000


def available() -> str | None:
    """``None`` if tmpfs mounts work here, else why not."""
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs"
    with tempfile.TemporaryDirectory() as mnt:
        try:
            _mount(mnt, 64 << 10)
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"cannot mount a tmpfs: {exc}"
        _umount(mnt)
    return None


def _mount(path: str, size: int, remount: bool = False) -> None:
    opts = f"{'remount,' if remount else ''}size={size}"
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path], check=True, capture_output=True
    )


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], check=False, capture_output=True)


async def _fill(directory: Path, ranks: int, compression: str | None) -> dict[str, Any]:
    sent = 0
    async with rlwire.open_sender(
        directory, sidecar=("routed_experts",), compression=compression
    ) as sender:
        failure = None
        for step in range(10_000):
            try:
                if ranks == 1:
                    await sender.send(payload(step, 0, N), step=step)
                else:
                    await sender.send_ranks([payload(step, r, N) for r in range(ranks)], step=step)
                sent = step + 1
            except rlwire.RlwireError as exc:
                failure = exc
                break
        if failure is None:
            return {"outcome": EXACT, "detail": "the disk never filled"}
        left = [n for n in os.listdir(directory) if f"{sent:08d}" in n]
        if left:
            return {"outcome": HALF, "detail": f"failed step {sent} left {left}: {failure}"}
        _mount(str(directory), 64 << 20, remount=True)
        await (
            sender.send(payload(sent, 0, N), step=sent)
            if ranks == 1
            else sender.send_ranks([payload(sent, r, N) for r in range(ranks)], step=sent)
        )
    for name in os.listdir(directory):
        m = MAIN_RE.fullmatch(name)
        if m:
            step, rank = int(m.group(1)), int(m.group(2))
            got = receive_one(directory, step, rank, payload(step, rank, N), timeout=1)
            if got["outcome"] != EXACT:
                got["detail"] = f"step {step} rank {rank}: {got['detail']}"
                return got if got["outcome"] != TYPED else {**got, "outcome": HALF}
    return {"outcome": TYPED, "detail": describe(failure)}


def trial(root: str, size: int, ranks: int, compression: str | None) -> dict[str, Any]:
    mnt = tempfile.mkdtemp(dir=root)
    _mount(mnt, size)
    try:
        return anyio.run(_fill, Path(mnt), ranks, compression)
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": f"after freeing space: {describe(exc)}"}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc)}
    finally:
        _umount(mnt)


def jobs(root: str, total: int, seed: int) -> Iterator[Job]:
    rng = random.Random(seed)
    for _ in range(total):
        size = rng.randint(64 << 10, 1 << 20)
        ranks = rng.choice((1, 2))
        compression = rng.choice((None, "lz4", "zstd"))
        yield Job(
            trial,
            (root, size, ranks, compression),
            timeout=60,
            tag=("full disk (tmpfs)", f"{size >> 10} KiB {ranks} rank(s) {compression}"),
        )
