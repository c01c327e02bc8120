"""Forked children: a parent uses rlwire, then forks at random points, and every child
must send and receive on its own.

Fork is what PyTorch's DataLoader workers use, and Linux's default start method up to
Python 3.13. Each trial starts a parent that sends and receives (so rlwire's shared
executor, Once runs and worker threads exist), then forks two children at random moments
of one of these situations:

* ``idle``: after a send and a receive, nothing under way;
* ``sync send in flight``: a thread of the parent sends with a SyncSender, in a loop;
* ``async send in flight``: the main thread runs an event loop (asyncio or trio) that
  sends in a loop, and another thread forks;
* ``receive in flight``: a thread of the parent waits in ``receive`` for a step sent later.

Half the trials send steps of several MiB, which lz4 and zstd compress in rlwire's shared
executor. Each child sends a few steps (a SyncSender, or an async sender under asyncio or trio; one
rank or two; no compression, lz4 or zstd) to a directory of its own and receives them. A
child of a parent whose SyncSender was open must also get ClosedError from that sender.
A child must answer within :data:`CHILD_SECONDS` with the exact data (``exact``) or a typed
error (``typed error``); a hang, an untyped error, a crash or other data is bad. The parent
must then finish its own sends and receives exactly, as if nothing had forked.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire

from ._model import BAD, CRASH, EXACT, HANG, TYPED, UNTYPED, WRONG, describe, payload, receive_one
from ._proc import Job

#: How long a child may take to send and receive its steps.
CHILD_SECONDS = 20.0
#: The situations a parent forks in.
SITUATIONS = ("idle", "sync send in flight", "async send in flight", "receive in flight")
#: The ways a child sends.
SENDERS = ("sync", "asyncio", "trio")
#: Steps each child sends.
CHILD_STEPS = 2


class Plan:
    """What one trial does: drawn from its seed."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.situation = rng.choice(SITUATIONS)
        self.backend = rng.choice(("asyncio", "trio"))  # of the parent's event loop
        self.compression = rng.choice((None, "lz4", "zstd"))
        # Tokens per sample: half the trials big enough (several MiB a step) that
        # compression and decompression run in the shared executor's threads.
        self.n = rng.choice((rng.randrange(2_000, 30_000), rng.randrange(120_000, 200_000)))
        self.delays = [rng.uniform(0, 0.15) for _ in range(2)]  # before each fork
        self.children = [
            (rng.choice(SENDERS), rng.choice((1, 2)), rng.choice((None, "lz4", "zstd")))
            for _ in range(2)
        ]

    def __str__(self) -> str:
        kids = ", ".join(f"{s} {r} rank(s) {c}" for s, r, c in self.children)
        return (
            f"{self.situation} ({self.backend}, {self.compression}, n={self.n}); children: {kids}"
        )


# -- what each process sends and checks -------------------------------------------------


def _batches(step: int, ranks: int, n: int) -> list[rlwire.TrainingBatch]:
    return [payload(step, rank, n) for rank in range(ranks)]


def _check(directory: Path, steps: range, ranks: int, n: int) -> dict[str, Any]:
    """Receive every step of every rank sent to ``directory``; the first outcome that is
    not exact, else exact."""
    for step in steps:
        for rank in range(ranks):
            got = receive_one(directory, step, rank, payload(step, rank, n), timeout=5)
            if got["outcome"] != EXACT:
                got["detail"] = f"step {step} rank {rank}: {got['detail']}"
                return got
    return {"outcome": EXACT, "detail": ""}


def _send_sync(directory: Path, ranks: int, n: int, compression: str | None) -> None:
    with rlwire.open_sync_sender(directory, compression=compression) as sender:
        for step in range(CHILD_STEPS):
            sender.send_ranks(_batches(step, ranks, n))
        sender.finish()


async def _send_async(directory: Path, ranks: int, n: int, compression: str | None) -> None:
    async with rlwire.open_sender(directory, compression=compression) as sender:
        for step in range(CHILD_STEPS):
            await sender.send_ranks(_batches(step, ranks, n))
        await sender.finish()


def _child_work(
    directory: Path, how: tuple[str, int, str | None], n: int, inherited: Any
) -> dict[str, Any]:
    """What a child does; its outcome."""
    if inherited is not None:
        try:
            inherited.send(payload(0, 0, n))
        except rlwire.ClosedError:
            inherited.close()  # must return at once too
        else:
            return {"outcome": WRONG, "detail": "the parent's SyncSender sent from the child"}
    sender, ranks, compression = how
    if sender == "sync":
        _send_sync(directory, ranks, n, compression)
    else:
        anyio.run(_send_async, directory, ranks, n, compression, backend=sender)
    return _check(directory, range(CHILD_STEPS), ranks, n)


# -- forking and judging a child --------------------------------------------------------


def _fork(work: Callable[[], dict[str, Any]]) -> tuple[int, int]:
    """Fork a child that runs ``work`` and writes its outcome (JSON) to a pipe; the
    child's pid and the pipe's reading end."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        try:
            try:
                result = work()
            except rlwire.RlwireError as exc:
                result = {"outcome": TYPED, "detail": describe(exc)}
            except Exception as exc:
                result = {"outcome": UNTYPED, "detail": describe(exc) + traceback.format_exc()}
            os.write(w, json.dumps(result, default=str).encode()[:60_000])
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def _judge(pid: int, r: int, deadline: float) -> dict[str, Any]:
    """The outcome of a child forked by :func:`_fork`, killed (a hang) at ``deadline``."""
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return {"outcome": HANG, "detail": f"the child gave no answer in {CHILD_SECONDS:.0f} s"}
    with os.fdopen(r, "rb") as pipe:
        text = pipe.read()
    if text:
        return dict(json.loads(text))
    return {"outcome": CRASH, "detail": f"the child ended without an answer ({status})"}


# -- the parent -------------------------------------------------------------------------


class Parent:
    """The parent of one trial: its own sends and receives, the children it forked."""

    def __init__(self, root: Path, plan: Plan) -> None:
        self.root = root
        self.plan = plan
        self.forked: list[tuple[str, int, int, float]] = []  # (what, pid, fd, deadline)
        self.errors: list[dict[str, Any]] = []  # outcomes of the parent's own work
        self.sent = 0  # steps the parent's background work sent
        self.stop = threading.Event()
        self.sync_sender: rlwire.SyncSender | None = None

    def fork_children(self) -> None:
        """Fork each planned child after its delay (from whichever thread calls this)."""
        for i, (how, delay) in enumerate(zip(self.plan.children, self.plan.delays, strict=True)):
            time.sleep(delay)
            directory = self.root / f"child-{i}"
            inherited = self.sync_sender

            def work(d: Path = directory, h: Any = how, s: Any = inherited) -> dict[str, Any]:
                return _child_work(d, h, self.plan.n, s)

            pid, fd = _fork(work)
            self.forked.append((f"child {i}", pid, fd, time.monotonic() + CHILD_SECONDS))

    def guarded(self, body: Callable[..., None], *args: Any) -> None:
        """Run ``body(*args)`` (the parent's own work), recording what it raised."""
        try:
            body(*args)
        except rlwire.RlwireError as exc:
            self.errors.append({"outcome": TYPED, "detail": "parent: " + describe(exc)})
        except Exception as exc:
            detail = "parent: " + describe(exc) + traceback.format_exc()[-600:]
            self.errors.append({"outcome": UNTYPED, "detail": detail})

    def send_loop_sync(self) -> None:
        assert self.sync_sender is not None
        while not self.stop.is_set():
            self.sync_sender.send(payload(self.sent, 0, self.plan.n))
            self.sent += 1

    async def send_loop_async(self, directory: Path) -> None:
        async with rlwire.open_sender(directory, compression=self.plan.compression) as sender:
            forking = threading.Thread(target=self.fork_children)
            forking.start()
            while forking.is_alive() or self.sent < 2:
                await sender.send(payload(self.sent, 0, self.plan.n))
                self.sent += 1
            forking.join()

    def receive_late(self, directory: Path) -> None:
        got = receive_one(directory, 1, 0, payload(1, 0, self.plan.n), timeout=10)
        if got["outcome"] != EXACT:
            self.errors.append({**got, "detail": "parent's receive: " + got["detail"]})

    def run(self) -> None:
        """Use rlwire, fork the children in the planned situation, finish the parent's
        own work."""
        plan, root = self.plan, self.root
        first = root / "parent-first"
        with rlwire.open_sync_sender(first, compression=plan.compression) as sender:
            sender.send(payload(0, 0, plan.n))
        self.errors.append(_check(first, range(1), 1, plan.n))
        background = root / "parent-background"
        if plan.situation == "idle":
            self.fork_children()
        elif plan.situation == "sync send in flight":
            self.sync_sender = rlwire.open_sync_sender(background, compression=plan.compression)
            thread = threading.Thread(target=self.guarded, args=(self.send_loop_sync,))
            thread.start()
            try:
                self.fork_children()
            finally:
                self.stop.set()
                thread.join()
                self.sync_sender.close()
        elif plan.situation == "async send in flight":
            self.guarded(lambda: anyio.run(self.send_loop_async, background, backend=plan.backend))
        else:  # receive in flight: step 1 is sent after the children are forked
            with rlwire.open_sync_sender(background, compression=plan.compression) as sender:
                sender.send(payload(0, 0, plan.n))
                thread = threading.Thread(target=self.guarded, args=(self.receive_late, background))
                thread.start()
                self.fork_children()
                sender.send(payload(1, 0, plan.n))
                thread.join()
        if self.sent:
            self.errors.append(_check(background, range(self.sent), 1, plan.n))


def _worst(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """A bad outcome if any, else a typed error if any, else exact."""
    for wanted in (lambda o: o in BAD, lambda o: o == TYPED):
        for got in outcomes:
            if wanted(got["outcome"]):
                return got
    return {"outcome": EXACT, "detail": ""}


def trial(root: str, seed: int) -> dict[str, Any]:
    """One trial (see the module's docstring); its worst outcome."""
    plan = Plan(seed)
    directory = Path(tempfile.mkdtemp(dir=root))
    parent = Parent(directory, plan)
    try:
        parent.guarded(parent.run)
        outcomes = list(parent.errors)
        for what, pid, fd, deadline in parent.forked:
            got = _judge(pid, fd, deadline)
            outcomes.append({**got, "detail": f"{what}: {got.get('detail', '')}"})
        if len(parent.forked) != len(plan.children):
            outcomes.append({"outcome": UNTYPED, "detail": f"forked {len(parent.forked)}"})
        return _worst(outcomes)
    finally:
        for _, pid, _, _ in parent.forked:  # none is left running, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        shutil.rmtree(directory, ignore_errors=True)


def jobs(root: str, total: int, seed: int) -> Iterator[Job]:
    for i in range(total):
        trial_seed = seed * 1_000_003 + i
        yield Job(
            trial,
            (root, trial_seed),
            timeout=4 * CHILD_SECONDS,
            mem_limit=1 << 30,
            tag=("fork", f"seed {trial_seed}: {Plan(trial_seed)}"),
        )
