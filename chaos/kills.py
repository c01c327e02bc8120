"""kill -9 of a sender: at every filesystem call of a send, and at random times.

A sender runs in a forked process. For "every call", that process wraps the ``os``
functions a file sink uses so that the N-th call made while opening, sending and
closing kills the process with SIGKILL; N runs over every call of the send (counted in a
calibration run). For "random times", the parent kills a sender sending several steps
after a random delay (half of them into recycled files). Then the directory is judged
(:func:`classify`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio

import rlwire
from rlwire.transport._stored.names import MAIN_RE, REWRITE_NAME
from rlwire.transport.layout import END_NAME, consumed_mark, consumed_name

from ._model import (
    EXACT,
    HALF,
    HANG,
    PARTLY,
    UNTYPED,
    check_end_and_resume,
    check_visible,
    describe,
    payload,
    receive_one,
)
from ._proc import Job, reap

HOOKED = (
    "open",
    "write",
    "writev",
    "pwrite",
    "replace",
    "link",
    "fsync",
    "unlink",
    "rename",
    "ftruncate",
    "posix_fallocate",
)


def install_hooks(kill_at: int | None, said: Callable[[str], None] | None = None) -> list[str]:
    """Wrap the ``os`` functions in :data:`HOOKED`; the ``kill_at``-th call (from 1) kills
    this process with SIGKILL before it happens, after telling ``said`` which call and
    file it is (``said`` must not call the hooked functions). Returns the list of calls
    made so far."""
    calls: list[str] = []
    lock = threading.Lock()

    def wrap(name: str) -> Any:
        real = getattr(os, name)

        def hooked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                calls.append(name)
                if kill_at is not None and len(calls) >= kill_at:
                    if said is not None:
                        said(f"{name} {_file_of(args[0]) if args else ''}".strip())
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        return hooked

    for name in HOOKED:
        setattr(os, name, wrap(name))
    return calls


def _file_of(target: Any) -> str:
    """The name of the file a hooked call is about: its path, or its descriptor's."""
    if isinstance(target, int):
        with contextlib.suppress(OSError):
            return os.path.basename(os.readlink(f"/proc/self/fd/{target}"))
        return f"fd {target}"
    if isinstance(target, str | bytes | os.PathLike):
        return os.path.basename(os.fsdecode(target))
    return ""


def _sender_options(compression: str | None, fsync: bool) -> dict[str, Any]:
    return {
        "sidecar": ("routed_experts",),
        "compression": compression,
        "fsync": fsync,
        "on_existing": "resume",
    }


async def _send_steps(
    directory: Path,
    ranks: int,
    steps: range,
    compression: str | None,
    fsync: bool,
    n: int,
    finish: bool = False,
    **options: Any,
) -> None:
    options = {**_sender_options(compression, fsync), **options}
    async with rlwire.open_sender(directory, **options) as sender:
        for step in steps:
            if ranks == 1:
                got = await sender.send(payload(step, 0, n), step=step)
            else:
                got = await sender.send_ranks(
                    [payload(step, r, n) for r in range(ranks)], step=step
                )
            assert got == step
        if finish:
            await sender.finish()


def visible(directory: Path) -> dict[int, set[int]]:
    """The ranks whose main part is visible, by step."""
    mains: dict[int, set[int]] = {}
    for name in os.listdir(directory):
        m = MAIN_RE.fullmatch(name)
        if m:
            mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return mains


def classify(
    directory: Path, ranks: int, compression: str | None, fsync: bool, n: int
) -> dict[str, Any]:
    """Judge a directory a sender was killed in, then check a resumed sender goes on."""
    mains = visible(directory)

    def receive(step: int, rank: int) -> dict[str, Any]:
        return receive_one(directory, step, rank, payload(step, rank, n), timeout=1)

    bad = check_visible(mains, receive)
    if bad is not None:
        return bad
    if (directory / REWRITE_NAME).exists():  # killed while truncating or overwriting
        return _rewrite_cut_short(directory, ranks, compression, fsync, n, mains)
    if mains and len(mains) != max(mains) - min(mains) + 1:
        return {"outcome": HALF, "detail": f"a hole: steps {sorted(mains)} visible"}
    incomplete = sorted(s for s, have in mains.items() if len(have) != ranks)
    oldest = min(mains, default=None)
    if incomplete[:1] == [oldest] and len(mains) > 1 and 0 not in mains[oldest]:
        incomplete.pop(0)  # retention cut short: the oldest step goes rank 0 first
    if incomplete:
        last = max(mains)
        if incomplete != [last]:
            return {"outcome": HALF, "detail": f"incomplete steps {incomplete} (last {last})"}
        try:
            anyio.run(_send_steps, directory, ranks, range(0), compression, fsync, n)
        except rlwire.StepExistsError as exc:
            if f"step {last} " in str(exc) or str(exc).endswith(f"step {last}"):
                return _repair(directory, ranks, compression, fsync, n, last, mains[last], exc)
            return {"outcome": HALF, "detail": f"resume refused, but not naming {last}: {exc}"}
        except Exception as exc:
            return {"outcome": UNTYPED, "detail": describe(exc)}
        return {"outcome": HALF, "detail": f"resume accepted step {last} with ranks {mains[last]}"}
    # A consistent directory: the end mark and a resumed sender.
    nxt = max(mains) + 1 if mains else 0
    bad = check_end_and_resume(
        directory,
        ranks,
        nxt,
        has_end=(directory / END_NAME).exists(),
        receive=receive,
        send_next=lambda: anyio.run(
            _send_steps, directory, ranks, range(nxt, nxt + 1), compression, fsync, n
        ),
    )
    if bad is not None:
        return bad
    seen = "nothing visible" if not mains else f"steps {sorted(mains)} whole"
    return {"outcome": EXACT, "detail": seen}


def _rewrite_cut_short(
    directory: Path,
    ranks: int,
    compression: str | None,
    fsync: bool,
    n: int,
    mains: dict[int, set[int]],
) -> dict[str, Any]:
    """Resume must refuse, naming the unfinished rewrite and its repair; the repair
    (truncate at the step it names, send it again) must then deliver it exactly."""
    try:
        anyio.run(_send_steps, directory, ranks, range(0), compression, fsync, n)
    except rlwire.StepExistsError as exc:
        found = re.search(r"start_step=(\d+), on_existing='truncate'", str(exc))
        if "was cut short" not in str(exc) or not (found or "'overwrite'" in str(exc)):
            return {"outcome": HALF, "detail": f"resume refused, not naming the rewrite: {exc}"}
        step = int(found.group(1)) if found else 0
        return _repair(directory, ranks, compression, fsync, n, step, mains.get(step, set()), exc)
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc)}
    return {"outcome": HALF, "detail": "resume went on after a rewrite cut short"}


async def _truncate_and_send(
    directory: Path, ranks: int, step: int, compression: str | None, fsync: bool, n: int
) -> None:
    options = {**_sender_options(compression, fsync), "on_existing": "truncate"}
    async with rlwire.open_sender(directory, start_step=step, **options) as sender:
        await sender.send_ranks([payload(step, r, n) for r in range(ranks)])


def _repair(
    directory: Path,
    ranks: int,
    compression: str | None,
    fsync: bool,
    n: int,
    step: int,
    have: set[int],
    refusal: Exception,
) -> dict[str, Any]:
    """Follow the refusal's advice (truncate at the step, send it again): every rank
    must then receive it exactly."""
    try:
        anyio.run(_truncate_and_send, directory, ranks, step, compression, fsync, n)
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": f"repair after a partly visible step: {exc!r}"}
    for rank in range(ranks):
        got = receive_one(directory, step, rank, payload(step, rank, n), timeout=1)
        if got["outcome"] != EXACT:
            got["detail"] = f"step sent again after truncating: {got['detail']}"
            return got
    return {"outcome": PARTLY, "detail": f"ranks {sorted(have)} visible: {refusal}"}


def _before(
    directory: Path, ranks: int, compression: str | None, fsync: bool, mode: int, n: int
) -> None:
    """What is stored before the send that is killed (see :data:`MODES`)."""
    if mode < 3:
        anyio.run(_send_steps, directory, ranks, range(min(mode, 1)), compression, fsync, n)
    else:  # steps 0-2, finished, and read by every rank up to step 2
        anyio.run(_send_steps, directory, ranks, range(3), compression, fsync, n, True)
        for rank in range(ranks):
            (directory / consumed_name(rank)).write_bytes(consumed_mark(2))


def _killed_send(
    directory: Path, ranks: int, compression: str | None, fsync: bool, mode: int, n: int
) -> None:
    """The send that is killed (see :data:`MODES`)."""
    args = (directory, ranks, compression, fsync, n)
    if mode < 3:
        first = min(mode, 1)
        anyio.run(_send_steps, args[0], ranks, range(first, first + 1), *args[2:], mode == 2)
    elif mode == 3:
        options = {"start_step": 1, "on_existing": "truncate"}
        anyio.run(functools.partial(_send_steps, *args[:2], range(1, 2), *args[2:], **options))
    elif mode == 4:
        anyio.run(functools.partial(_send_steps, *args[:2], range(3, 4), *args[2:], keep_last=2))
    else:
        anyio.run(_send_recycled, directory, ranks, compression, fsync, n)


async def _send_recycled(
    directory: Path, ranks: int, compression: str | None, fsync: bool, n: int
) -> None:
    """Mode 5's send: steps 3-6, each after every rank has read the steps before it (the
    marks written here, as receivers would), so that each prunes one into the pool."""
    options = {**_sender_options(compression, fsync), "keep_last": 2}
    async with rlwire.open_sender(directory, storage_options={"recycle": True}, **options) as s:
        for step in range(3, 7):
            for rank in range(ranks):
                (directory / consumed_name(rank)).write_bytes(consumed_mark(step))
            await s.send_ranks([payload(step, r, n) for r in range(ranks)], step=step)


def calibrate(
    root: str, ranks: int, compression: str | None, fsync: bool, mode: int, n: int
) -> dict[str, Any]:
    """Count the hooked calls of one send (see :data:`MODES` for ``mode``)."""
    directory = Path(tempfile.mkdtemp(dir=root))
    _before(directory, ranks, compression, fsync, mode, n)
    calls = install_hooks(None)
    start = time.monotonic()
    _killed_send(directory, ranks, compression, fsync, mode, n)
    return {"outcome": EXACT, "calls": list(calls), "seconds": time.monotonic() - start}


def kill_at_call(
    root: str, ranks: int, compression: str | None, fsync: bool, mode: int, n: int, at: int
) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(dir=root))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the victim
        try:
            _before(directory, ranks, compression, fsync, mode, n)
            install_hooks(at)
            _killed_send(directory, ranks, compression, fsync, mode, n)
        finally:
            os._exit(0)
    if reap(pid, 20) is None:
        return {"outcome": HANG, "detail": "the sender did not end"}
    try:
        return classify(directory, ranks, compression, fsync, n)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def kill_at_random(
    root: str,
    ranks: int,
    compression: str | None,
    fsync: bool,
    n: int,
    steps: int,
    delay: float,
    recycle: bool = False,
) -> dict[str, Any]:
    """Kill a sender of ``steps`` steps after ``delay`` seconds; with ``recycle``, mode
    5's sender (steps 3-6 into recycled files) after its steps 0-2, instead."""
    directory = Path(tempfile.mkdtemp(dir=root))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the victim
        try:
            _random_victim(directory, ranks, compression, fsync, n, steps, recycle)
        finally:
            os._exit(0)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    try:
        return classify(directory, ranks, compression, fsync, n)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _random_victim(
    directory: Path,
    ranks: int,
    compression: str | None,
    fsync: bool,
    n: int,
    steps: int,
    recycle: bool,
) -> None:
    if recycle:
        _before(directory, ranks, compression, fsync, 5, n)
        _killed_send(directory, ranks, compression, fsync, 5, n)
    else:
        anyio.run(_send_steps, directory, ranks, range(steps), compression, fsync, n)


#: What the killed sender does: 0 sends step 0 to an empty directory; 1 sends step 1
#: after a whole step 0; 2 does that and then finishes the stream (the end mark); 3
#: restarts at step 1 (``on_existing="truncate"``) over steps 0-2 of a finished stream
#: that every rank has read, and sends step 1; 4 sends step 3 after those with
#: ``keep_last=2`` (retention deletes steps 0 and 1); 5 sends steps 3-6 after those with
#: ``keep_last=2`` and ``recycle``, every rank having read each step before the next: on
#: tmpfs, from step 5 on, into pruned steps' files through the mappings the sender kept
#: of them (payloads of :data:`MODE_N` elements, large enough to be copied into one).
MODES = {
    0: "step 0",
    1: "step 1 after step 0",
    2: "step 1, then finish()",
    3: "truncate at step 1 over steps 0-2, send step 1",
    4: "step 3 after steps 0-2 with keep_last=2",
    5: "steps 3-6 after steps 0-2 with keep_last=2 and recycle",
}
#: The payload size (elements a sample) of a mode's sends, where not 600.
MODE_N = {5: 20_000}
CONFIGS = [
    (ranks, compression, fsync)
    for ranks in (1, 2)
    for compression in (None, "lz4", "zstd")
    for fsync in (False, True)
]


#: A campaign of fewer kills than this picks its configurations and modes before they
#: are calibrated, and calibrates those alone (a sample, as CI's: 6 kills once took 96
#: calibration runs, most of its time).
SAMPLE_BELOW = len(CONFIGS) * len(MODES)


class Plan(NamedTuple):
    """Which kills a campaign makes, as far as is known before calibrating.

    ``calls``: (configuration, mode, where among the send's calls, 0 to 1) for a
    sample, None for every call of every configuration and mode. ``randoms``: (
    configuration, recycle, when, 0 to 1.2 of the send's time) for a sample, None when
    the random-time kills fill up to ``total`` after the calls (known once calibrated)."""

    total: int
    seed: int
    calls: list[tuple[tuple[Any, ...], int, float]] | None
    randoms: list[tuple[tuple[Any, ...], bool, float]] | None


def plan(total: int, seed: int) -> Plan:
    """The kills of a campaign of ``total``: a sample picked now when ``total`` is below
    :data:`SAMPLE_BELOW` (three in four at calls, the rest at random times)."""
    if total >= SAMPLE_BELOW:
        return Plan(total, seed, None, None)
    rng = random.Random(seed)
    pairs = [(cfg, mode) for cfg in CONFIGS for mode in MODES]
    calls = [(cfg, mode, rng.random()) for cfg, mode in rng.sample(pairs, total - total // 4)]
    randoms = [
        (rng.choice(CONFIGS), rng.random() < 0.5, rng.uniform(0, 1.2)) for _ in range(total // 4)
    ]
    return Plan(total, seed, calls, randoms)


def calibration_jobs(root: str, planned: Plan) -> Iterator[Job]:
    """The runs that count each send's calls and time the random-time sends: those the
    planned kills need."""
    if planned.calls is None:
        modes = [(cfg, mode) for cfg in CONFIGS for mode in MODES]
        timed = [(cfg, recycle) for cfg in CONFIGS for recycle in (False, True)]
    else:
        modes = list(dict.fromkeys((cfg, mode) for cfg, mode, _ in planned.calls))
        timed = list(dict.fromkeys((cfg, recycle) for cfg, recycle, _ in planned.randoms or ()))
    for cfg, mode in modes:
        n = MODE_N.get(mode, 600)
        yield Job(calibrate, (root, *cfg, mode, n), timeout=60, tag=(*cfg, mode))
    for cfg, recycle in timed:
        tag = ("random", *cfg, recycle)
        yield Job(time_random, (root, *cfg, recycle), timeout=60, tag=tag)


def jobs(root: str, planned: Plan, calibration: dict[Any, Any]) -> Iterator[Job]:
    """Kill jobs: every call of a send for each configuration (with and without an
    earlier step), then random-time kills up to the total; or the planned sample."""
    rng = random.Random(planned.seed)
    if planned.calls is None:
        calls = [
            (cfg, mode, at)
            for cfg in CONFIGS
            for mode in MODES
            for at in range(1, len(calibration[(*cfg, mode)]["calls"]) + 1)
        ]
        if planned.total < len(calls):  # a sample: mostly calls, some random times
            calls = rng.sample(calls, planned.total - planned.total // 4)
        randoms = [
            (rng.choice(CONFIGS), rng.random() < 0.5, rng.uniform(0, 1.2))
            for _ in range(planned.total - len(calls))
        ]
    else:
        counted = [len(calibration[(*cfg, mode)]["calls"]) for cfg, mode, _ in planned.calls]
        calls = [
            (cfg, mode, 1 + min(int(where * n), n - 1))
            for (cfg, mode, where), n in zip(planned.calls, counted, strict=True)
        ]
        randoms = planned.randoms or []
    for (ranks, compression, fsync), mode, at in calls:
        call = calibration[(ranks, compression, fsync, mode)]["calls"][at - 1]
        yield Job(
            kill_at_call,
            (root, ranks, compression, fsync, mode, MODE_N.get(mode, 600), at),
            timeout=60,
            tag=(
                "kill -9 at each fs call",
                f"{ranks} rank(s) {compression} fsync={fsync} {MODES[mode]}, call #{at} ({call})",
            ),
        )
    for (ranks, compression, fsync), recycle, when in randoms:
        seconds = calibration[("random", ranks, compression, fsync, recycle)]["seconds"]
        delay = seconds * when
        what = " recycle" if recycle else ""
        yield Job(
            kill_at_random,
            (root, ranks, compression, fsync, 20_000, 3, delay, recycle),
            timeout=60,
            tag=(
                "kill -9 at random times",
                f"{ranks} rank(s) {compression} fsync={fsync}{what} after {delay * 1000:.1f} ms",
            ),
        )


def time_random(
    root: str, ranks: int, compression: str | None, fsync: bool, recycle: bool
) -> dict[str, Any]:
    """How long a forked sender of the random-time campaign takes."""
    directory = Path(tempfile.mkdtemp(dir=root))
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        try:
            _random_victim(directory, ranks, compression, fsync, 20_000, 3, recycle)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    shutil.rmtree(directory, ignore_errors=True)
    return {"outcome": EXACT, "seconds": time.monotonic() - start}
