"""Cancellation of a send at a random point, under asyncio and trio.

Each trial sends step 0, then a send of step 1 under ``anyio.move_on_after`` (or, a third
of the time, ``asyncio.timeout``: asyncio's own cancellation, which anyio's shields do not
hold off) with a random deadline around the time a send takes, then sends one more batch
with the same sender.
The directory must then hold whole steps only (the cancelled one whole on every rank, or
absent with nothing of it left behind), with no hole, and every visible step must
receive exactly as sent.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire
from rlwire.transport._stored.names import FILE_RE as PART_RE
from rlwire.transport._stored.names import MAIN_RE

from ._model import EXACT, HALF, TYPED, UNTYPED, describe, payload, receive_one
from ._proc import Job

N = 30_000


async def _send(sender: rlwire.TrainingBatchSender, ranks: int, tag: int) -> int:
    if ranks == 1:
        return await sender.send(payload(tag, 0, N))
    return await sender.send_ranks([payload(tag, r, N) for r in range(ranks)])


async def _cut_short(send: Awaitable[int], seconds: float, native: bool) -> int | None:
    """``send``, cancelled after ``seconds``: by anyio, or by asyncio itself
    (``native``); None when cancelled."""
    if native:
        try:
            async with asyncio.timeout(seconds):
                return await send
        except TimeoutError:
            return None
    with anyio.move_on_after(seconds):
        return await send
    return None


async def trial(
    directory: Path, ranks: int, compression: str | None, fraction: float, native: bool = False
) -> dict[str, Any]:
    """``fraction`` of the time the first send took is the deadline of the second."""
    sent: dict[int, int] = {}  # step -> payload tag
    async with rlwire.open_sender(
        directory, sidecar=("routed_experts",), compression=compression
    ) as sender:
        start = time.monotonic()
        sent[await _send(sender, ranks, 0)] = 0
        took = time.monotonic() - start
        step = await _cut_short(_send(sender, ranks, 1), took * fraction, native)
        cancelled = step is None
        if step is not None:
            sent[step] = 1
        mains: dict[int, set[int]] = {}
        parts: set[int] = set()
        for name in os.listdir(directory):
            m = MAIN_RE.fullmatch(name)
            if m:
                mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
            m = PART_RE.fullmatch(name)
            if m:
                parts.add(int(m.group(1)))
        if cancelled:
            if mains.get(1) and len(mains[1]) != ranks:
                return {"outcome": HALF, "detail": f"cancelled: step 1 visible for {mains[1]}"}
            if not mains.get(1) and 1 in parts:
                left = [n for n in os.listdir(directory) if ".rank-" in n and "00000001" in n]
                return {"outcome": HALF, "detail": f"cancelled send left {left} behind"}
            if mains.get(1):
                if sender.next_step != 2:
                    return {"outcome": HALF, "detail": "cancelled: step 1 visible, not counted"}
                sent[1] = 1
        step = await _send(sender, ranks, 2)
        sent[step] = 2
    for s in range(max(sent) + 1):
        if s not in sent:
            return {"outcome": HALF, "detail": f"hole at step {s}: sent {sent}"}
        for rank in range(ranks):
            got = receive_one(directory, s, rank, payload(sent[s], rank, N), timeout=2)
            if got["outcome"] != EXACT:
                got["detail"] = f"step {s} rank {rank}: {got['detail']}"
                return got
    return {"outcome": EXACT, "detail": "cancelled" if cancelled else "finished"}


def run_trial(
    root: str, backend: str, ranks: int, compression: str | None, fraction: float
) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(dir=root))
    native = backend == "asyncio-native"
    try:
        return anyio.run(
            trial,
            directory,
            ranks,
            compression,
            fraction,
            native,
            backend="asyncio" if native else backend,
        )
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": describe(exc)}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def jobs(root: str, total: int, seed: int) -> Iterator[Job]:
    rng = random.Random(seed)
    for i in range(total):
        backend = ("asyncio", "trio", "asyncio-native")[i % 3]
        ranks = rng.choice((1, 2))
        compression = rng.choice((None, "lz4", "zstd"))
        fraction = rng.uniform(0, 1.3)
        yield Job(
            run_trial,
            (root, backend, ranks, compression, fraction),
            timeout=60,
            tag=(
                "cancel (asyncio, trio, asyncio's own)",
                f"{backend} {ranks} rank(s) {compression} deadline {fraction:.2f} x",
            ),
        )
