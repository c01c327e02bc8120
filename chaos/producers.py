"""Writers that meet at one directory, and receivers that cannot write to theirs.

Three kinds of trial, each judged EXACT, TYPED or bad:

- **two producers**: two processes send the same steps to one directory at the same
  time (a sender opened per step with ``on_existing="error"``, so a step taken by the
  other is refused at open or at commit). Exactly one may succeed per step, and every
  rank must receive the winner's message whole, never the loser's nor a mix.
- **killed rewrite**: steps of an old run are stored; a sender opened with
  ``on_existing="overwrite"`` or ``"truncate"`` is killed at its N-th filesystem call
  (:func:`chaos.kills.install_hooks`), then a sender opens with ``"resume"``. It must
  refuse (a typed error, and the repair it names then works) or go on with nothing of
  the old run at or after where the rewrite began; an old step delivered as new is bad.
- **unwritable receiver**: a receiver on a read-only bind mount, or on a tmpfs filled
  to the last byte, must receive every stored step exactly, skipping its consumption
  mark with one warning (needs root to mount; skipped with a reason otherwise).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire
from rlwire.errors import MarkSkippedWarning

from ._model import EXACT, HANG, TYPED, UNTYPED, WRONG, describe, payload, receive_one, same
from ._proc import Job, reap
from .fulldisk import available as mounts_available
from .kills import install_hooks, visible

#: Old-run payloads are ``payload(step + OLD, rank)``: told apart from the new run's.
OLD = 100_000
#: The second producer's payloads are ``payload(step + OTHER, rank)``.
OTHER = 50_000
N = 400


def _batch(step: int, rank: int, offset: int) -> rlwire.TrainingBatch:
    return payload(step + offset, rank, N)


# -- two producers ---------------------------------------------------------------------


async def _produce(directory: Path, who: int, ranks: int, steps: int, out: Path) -> None:
    won: list[int] = []
    for step in range(steps):
        try:
            async with rlwire.open_sender(
                directory, start_step=step, on_existing="error", sidecar=("routed_experts",)
            ) as sender:
                await sender.send_ranks([_batch(step, r, who * OTHER) for r in range(ranks)])
            won.append(step)
        except rlwire.StepExistsError:
            pass
    out.write_text(" ".join(map(str, won)))


def two_producers(root: str, ranks: int, steps: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(dir=root))
    start = time.monotonic() + 0.2
    pids = []
    for who in (0, 1):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - a producer
            code = 1
            try:
                time.sleep(max(0.0, start - time.monotonic()))
                anyio.run(_produce, directory, who, ranks, steps, directory / f"won.{who}")
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    try:
        for pid in pids:
            status = reap(pid, 60)
            if status is None:
                return {"outcome": HANG, "detail": "a producer did not end"}
            if status != 0:
                return {"outcome": UNTYPED, "detail": f"a producer failed (status {status})"}
        won = [{int(s) for s in (directory / f"won.{who}").read_text().split()} for who in (0, 1)]
        if won[0] & won[1]:
            return {"outcome": WRONG, "detail": f"both succeeded for steps {won[0] & won[1]}"}
        missing = set(range(steps)) - won[0] - won[1]
        if missing:
            return {"outcome": WRONG, "detail": f"neither succeeded for steps {missing}"}
        for step in range(steps):
            offset = 0 if step in won[0] else OTHER
            for rank in range(ranks):
                got = receive_one(directory, step, rank, _batch(step, rank, offset), timeout=1)
                if got["outcome"] != EXACT:
                    return {**got, "detail": f"step {step} rank {rank}: {got['detail']}"}
        return {"outcome": EXACT, "detail": f"won {len(won[0])}/{len(won[1])}"}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- a rewrite killed midway, then resume ------------------------------------------------


async def _send(directory: Path, steps: range, ranks: int, offset: int, **options: Any) -> None:
    async with rlwire.open_sender(directory, sidecar=("routed_experts",), **options) as sender:
        for step in steps:
            await sender.send_ranks([_batch(step, r, offset) for r in range(ranks)], step=step)


def _rewrite(directory: Path, mode: str, ranks: int) -> int:
    """Open with ``mode`` over the old run and send two new steps; the first new step."""
    first = 0 if mode == "overwrite" else 3
    start = None if mode == "overwrite" else first
    anyio.run(
        lambda: _send(
            directory, range(first, first + 2), ranks, 0, on_existing=mode, start_step=start
        )
    )
    return first


def _count_calls(root: str, mode: str, ranks: int) -> int:
    """The hooked calls of the rewrite, counted in a child (the parent runs no event
    loop before it forks: a child of a process with worker threads can hang)."""
    directory = Path(tempfile.mkdtemp(dir=root))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - counts, then reports through a file
        try:
            anyio.run(lambda: _send(directory, range(6), ranks, OLD))
            calls = install_hooks(None)
            _rewrite(directory, mode, ranks)
            count = len(calls)
            (directory / "calls").write_text(str(count))
        finally:
            os._exit(0)
    reap(pid, 60)
    try:
        return int((directory / "calls").read_text())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _judge_new(directory: Path, ranks: int, low: int) -> dict[str, Any] | None:
    """Every visible step at or after ``low`` must be the new run's, whole."""
    for step, have in sorted(visible(directory).items()):
        for rank in sorted(have):
            if step < low:
                continue
            got = receive_one(directory, step, rank, _batch(step, rank, 0), timeout=1)
            if got["outcome"] == EXACT:
                continue
            old = receive_one(directory, step, rank, _batch(step, rank, OLD), timeout=1)
            if old["outcome"] == EXACT:
                return {"outcome": WRONG, "detail": f"old step {step} rank {rank} kept as new"}
            return {**got, "detail": f"step {step} rank {rank}: {got['detail']}"}
    return None


def _all_old(directory: Path, ranks: int, steps: int) -> bool:
    return all(
        receive_one(directory, step, rank, _batch(step, rank, OLD), timeout=1)["outcome"] == EXACT
        for step in range(steps)
        for rank in range(ranks)
    )


def killed_rewrite(root: str, mode: str, ranks: int, fraction: float) -> dict[str, Any]:
    at = max(1, int(_count_calls(root, mode, ranks) * fraction))
    directory = Path(tempfile.mkdtemp(dir=root))
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the victim
            try:
                anyio.run(lambda: _send(directory, range(6), ranks, OLD))
                install_hooks(at)
                _rewrite(directory, mode, ranks)
            finally:
                os._exit(0)
        if reap(pid, 30) is None:
            return {"outcome": HANG, "detail": "the rewriting sender did not end"}
        low = 0 if mode == "overwrite" else 3
        try:

            async def resume() -> int:
                async with rlwire.open_sender(
                    directory, sidecar=("routed_experts",), on_existing="resume"
                ) as sender:
                    step = sender.next_step
                    await sender.send_ranks([_batch(step, r, 0) for r in range(ranks)])
                    return step

            step = anyio.run(resume)
        except rlwire.StepExistsError as exc:
            # Refused: the repair it names (the same rewrite again) must then work.
            try:
                _rewrite(directory, mode, ranks)
            except Exception as again:
                return {"outcome": UNTYPED, "detail": f"the repair failed: {describe(again)}"}
            bad = _judge_new(directory, ranks, low)
            return bad or {"outcome": TYPED, "detail": describe(exc)}
        except rlwire.RlwireError as exc:
            return {"outcome": TYPED, "detail": describe(exc)}
        except Exception as exc:
            return {"outcome": UNTYPED, "detail": describe(exc)}
        if step == 6 and _all_old(directory, ranks, 6):
            # Killed before it deleted anything: the old run, whole, goes on.
            bad = _judge_new(directory, ranks, 6)
        else:  # the rewrite had finished deleting: from ``low`` on, only new steps
            bad = _judge_new(directory, ranks, low)
        return bad or {"outcome": EXACT, "detail": f"resumed at step {step}"}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- receivers that cannot write their marks ---------------------------------------------


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def unwritable_receiver(root: str, kind: str, ranks: int, steps: int) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(dir=root))
    mounted = False
    try:
        if kind == "full":
            _sh("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(directory))
            mounted = True
        anyio.run(lambda: _send(directory, range(steps), ranks, 0))
        if kind == "full":
            try:
                with open(directory / "filler", "wb") as filler:
                    while True:
                        filler.write(bytes(4096))
                        filler.flush()
            except OSError:
                pass
        else:
            _sh("mount", "--bind", str(directory), str(directory))
            mounted = True
            _sh("mount", "-o", "remount,ro,bind", str(directory))
        for rank in range(ranks):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with rlwire.open_receiver(directory, rank=rank) as receiver:
                    for step in range(steps):
                        got = receiver.receive(timeout=2)
                        if not same(got, _batch(step, rank, 0)):
                            return {"outcome": WRONG, "detail": f"step {step} rank {rank}"}
                        del got
            skipped = [w for w in caught if issubclass(w.category, MarkSkippedWarning)]
            if len(skipped) != 1:
                messages = [str(w.message)[:120] for w in caught]
                return {"outcome": UNTYPED, "detail": f"rank {rank} warned {messages}"}
        return {"outcome": EXACT, "detail": f"{steps} steps read, the mark skipped"}
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": describe(exc)}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc)}
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(directory)], check=False, capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)


def jobs(root: str, total: int, seed: int) -> Iterator[Job]:
    """``total`` trials: about 2/5 two producers, 2/5 killed rewrites, 1/5 unwritable
    receivers (killed rewrites instead when mounts are not available)."""
    rng = random.Random(seed)
    mounts = mounts_available() is None
    for i in range(total):
        kind = i % 5
        ranks = rng.choice((1, 2))
        if kind in (0, 1):
            steps = rng.randint(3, 8)
            yield Job(
                two_producers,
                (root, ranks, steps),
                timeout=120,
                tag=("two producers", f"{ranks} rank(s), {steps} steps"),
            )
        elif kind == 4 and mounts:
            what = rng.choice(("read-only", "full"))
            yield Job(
                unwritable_receiver,
                (root, what, ranks, 3),
                timeout=60,
                tag=("unwritable receiver", f"{what} directory, {ranks} rank(s)"),
            )
        else:
            mode = rng.choice(("overwrite", "truncate"))
            fraction = rng.random()
            yield Job(
                killed_rewrite,
                (root, mode, ranks, fraction),
                timeout=120,
                tag=("kill during rewrite", f"{mode}, {ranks} rank(s), at {fraction:.0%} of calls"),
            )


__all__ = ["jobs", "killed_rewrite", "two_producers", "unwritable_receiver"]
