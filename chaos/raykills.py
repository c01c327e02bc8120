"""Kill -9 of a producer actor sending to ``ray://``, then a new producer resumes; and
of a trainer actor, then a new trainer resumes.

A producer actor (async, so the board pulls its steps and owns them) sends two steps,
then three more with a kill armed: ``SIGKILL`` of its own process at the n-th call of
one of the functions of the ray:// sink it runs (``_rayactors.POINTS``: the hand-off of
a rank's values, the board's pull of them, the submission of each board call, the wait
for a board's answer, the commit, a prune), just before it or just after it returned;
or at a random time within those sends. A second producer then opens with
``on_existing="resume"`` and sends up to :data:`TOTAL` steps and the end of the stream.
Two trainer actors, one per rank, read from step 0 to the end meanwhile. The promise
checked: every rank gets every step once, in order, bit-exact, whatever the first
producer did before it died (a step it committed belongs to the board; one it staged
and never committed is never seen, and the resumed producer sends it again).

A trainer trial kills the trainer of rank 0 instead: at the n-th call of one of the
functions of the ray:// source its receiver runs (``_rayactors.TRAINER_POINTS``: reading
the rank's marks, waiting on the board, asking it for a step, getting the step's
objects, recording consumption), or at a random time, while one producer sends every
step and the end; a new trainer then opens with ``resume=True``. The killed trainer
logged each step it got and each consumption mark the board recorded. The promise
checked: the restart begins no earlier than the last recorded mark (a step the rank
moved past never comes again) and no later than the step after the last one the killed
trainer got (none is skipped; the step it held without moving past it comes again), and
reads to the end; the other rank gets every step once. Half the trainer trials send
with ``keep_last=2, max_ahead=1``: the producer waits for the dead rank, and a prune
must spare every step it has not moved past.

Every trial runs on one local Ray cluster, started in one child process of the chaos
runner (Ray's threads must not be in the parent, which forks every other trial), which
returns the outcomes of all its trials at once. Half the trials send with
``keep_last=2``, so that the prunes, and a kill in one, are tried too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._model import DUPLICATED, EXACT, HANG, LOST, UNTYPED, WRONG, describe
from ._proc import Job

RANKS = 2
#: Steps of a trial: sent before the kill is armed, with it armed, and in all.
BEFORE, ARMED, TOTAL = 2, 3, 8
#: The object store of the campaign's cluster.
STORE_BYTES = 512 << 20
#: Seconds any one Ray call or receive may take before the trial counts as a hang.
TIMEOUT = 60.0
#: The two retention settings the trials alternate.
KEEP_LAST = (None, 2)
#: The (keep_last, max_ahead) pairs the trainer trials alternate: a producer that runs
#: ahead, and one held back by the killed trainer's marks.
PACING = ((None, None), (2, 1))


def available() -> str:
    """Why the campaign cannot run here ("" when it can)."""
    return (
        "" if importlib.util.find_spec("ray") else "Ray is not installed (pip install rlwire[ray])"
    )


def jobs(root: str, trials: int, seed: int, trainer_trials: int = 0) -> list[Job]:
    """One job, the whole campaign in a child of its own (see the module's docstring):
    ``trials`` producer kills, then ``trainer_trials`` trainer kills, its notes in a
    folder of ``root``."""
    where = os.path.join(root, "ray")
    os.makedirs(where, exist_ok=True)
    timeout = 120 + 20 * (trials + trainer_trials)
    args = (trials, seed, where, trainer_trials)
    return [Job(campaign, args, timeout=timeout, mem_limit=4 << 30, tag=("ray", "all"))]


def judge(
    results: list[dict[str, Any]], expected: list[list[tuple[int, Any]]], first_rank: int = 0
) -> tuple[str, str]:
    """The outcome of one trial from what each rank got (its steps and fingerprints,
    and the error that stopped it, if one did; ``results[i]`` is rank ``first_rank +
    i``'s): a rank short of a step lost it, even to a typed error."""
    for rank, result in enumerate(results, first_rank):
        got, want = result["got"], dict(expected[rank - first_rank])
        steps = [step for step, _ in got]
        if len(set(steps)) != len(steps):
            return DUPLICATED, f"rank {rank} got steps {steps}"
        if any(prints != want.get(step) for step, prints in got):
            return WRONG, f"rank {rank}: a step's data is not what was sent"
        if steps != list(range(TOTAL)):
            # A typed error is no excuse here: every step was committed, or sent again.
            kind = UNTYPED if result["error"] and not result["typed"] else LOST
            stopped = f": {result['error']}" if result["error"] else ""
            return kind, f"rank {rank} got steps {steps}{stopped}"
    return EXACT, ""


def judge_resumed(
    lines: list[list[Any]], resumed: dict[str, Any], expected: list[tuple[int, Any]]
) -> tuple[str, str]:
    """The outcome for a rank whose trainer was killed, then restarted with
    ``resume=True``: ``lines``, what the killed trainer logged (``["step", step,
    fingerprint]`` and ``["mark", next_step]``, in order), and what the restart got.
    Each got its steps once, in order, bit-exact; the restart began no earlier than the
    last mark the board recorded and no later than the step after the last one the
    killed trainer got; together they reach the last step."""
    want = dict(expected)
    noted = [(line[1], line[2]) for line in lines if line[0] == "step"]
    marks = [int(line[1]) for line in lines if line[0] == "mark"]
    for who, got in (("the killed trainer", noted), ("its restart", resumed["got"])):
        steps = [step for step, _ in got]
        if len(set(steps)) != len(steps):
            return DUPLICATED, f"{who} got steps {steps}"
        if any(b != a + 1 for a, b in itertools.pairwise(steps)):
            return LOST, f"{who} got steps {steps}"
        if any(prints != want.get(step) for step, prints in got):
            return WRONG, f"{who}: a step's data is not what was sent"
    if noted and noted[0][0] != 0:
        return LOST, f"the killed trainer began at step {noted[0][0]}"
    after = noted[-1][0] + 1 if noted else 0  # the step after the last one it got
    again = [step for step, _ in resumed["got"]]
    start = again[0] if again else TOTAL
    if start < max(marks, default=0):
        return DUPLICATED, (
            f"the restart began at step {start}, though the board had recorded the rank "
            f"past step {max(marks) - 1}"
        )
    if start > after:
        return LOST, f"the restart began at step {start}; the killed trainer got up to {after - 1}"
    if max(after, again[-1] + 1 if again else 0) != TOTAL:
        kind = UNTYPED if resumed["error"] and not resumed["typed"] else LOST
        stopped = f": {resumed['error']}" if resumed["error"] else ""
        return kind, f"the restart got steps {again} after {after - 1}{stopped}"
    return EXACT, ""


def campaign(trials: int, seed: int, root_dir: str, trainer_trials: int = 0) -> dict[str, Any]:
    """In the child: start Ray, count the hooked calls of the armed sends (per
    ``keep_last``), run ``trials`` trials, count a trainer's hooked calls (per pace),
    run ``trainer_trials`` trials (notes in ``root_dir``); their outcomes. Ray's
    messages about the killed workers go to a log there, not to the terminal."""
    import ray

    from . import _rayactors as actors

    log = os.open(os.path.join(root_dir, "ray.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for fd in (1, 2):  # the outcomes go back through a pipe of their own
        os.dup2(log, fd)
    os.close(log)
    root = Path(__file__).resolve().parents[1]
    # Ray's workers import the actors by name: this checkout's rlwire, chaos and tests.
    os.environ["PYTHONPATH"] = os.pathsep.join(str(p) for p in (root / "src", root, root / "tests"))
    ray.init(
        num_cpus=4,
        object_store_memory=STORE_BYTES,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        trainers = [actors.Trainer.remote() for _ in range(RANKS)]
        expected = [actors.expected(rank, TOTAL) for rank in range(RANKS)]
        note = os.path.join(root_dir, "point")
        rng = random.Random(seed)
        out = []
        calls = {keep: _calibrate(keep) for keep in KEEP_LAST} if trials else {}
        for i in range(trials):
            keep_last = KEEP_LAST[i % 2]
            nth, after, delay = _kill_at(i, seed, rng, *calls[keep_last])
            out.append(_trial(trainers, expected, keep_last, nth, after, delay, note))
        paced = {p: _calibrate_trainer(p, trainers[1]) for p in PACING} if trainer_trials else {}
        for i in range(trainer_trials):
            pace = PACING[i % 2]
            nth, after, delay = _kill_at(i, seed, rng, *paced[pace])
            out.append(_trainer_trial(trainers[1], expected, pace, nth, after, delay, root_dir))
        return {"outcome": EXACT, "trials": out}
    finally:
        ray.shutdown()


def _kill_at(
    i: int, seed: int, rng: random.Random, calls: list[str], seconds: float
) -> tuple[int, bool, float]:
    """Where trial ``i`` kills (of two settings it alternates, ``calls`` and ``seconds``
    measured for its own): (the hooked call, 0 for none; just after it; else the delay):
    a quarter at random times, the others at every hooked call in turn, before it,
    then after it."""
    turn = seed + i // 2
    if i % 4 >= 2 and rng.random() < 0.5:
        return 0, False, rng.uniform(0, seconds)
    return turn % len(calls) + 1, (turn // len(calls)) % 2 == 1, 0.0


def _read(path: str) -> str:
    """The text of the file at ``path``, or "" if there is none."""
    try:
        with open(path) as file:
            return file.read()
    except FileNotFoundError:
        return ""


@contextlib.contextmanager
def _destination() -> Iterator[str]:
    """The URL of a new destination whose board this process makes (so that it outlives
    the actors of a trial), dropped at the end."""
    from rlwire import RlwireError
    from rlwire.transport.ray import create_board, drop_board

    name = f"chaos-{uuid.uuid4().hex[:10]}"
    create_board(name)
    try:
        yield f"ray://{name}"
    finally:
        with contextlib.suppress(RlwireError):
            drop_board(name)


def _aimed(nth: int, after: bool) -> str:
    """Where a trial aimed its kill, in words."""
    return "at a random time" if nth == 0 else f"at call {nth}{' (after it)' if after else ''}"


def _calibrate(keep_last: int | None) -> tuple[list[str], float]:
    """The hooked calls of the armed sends, in order, and the seconds they took."""
    import ray

    from . import _rayactors as actors

    with _destination() as url:
        producer = actors.Producer.remote()
        try:
            ray.get(producer.send.remote(url, BEFORE, keep_last), timeout=TIMEOUT)
            ray.get(producer.hook.remote(0, False), timeout=TIMEOUT)
            sent = ray.get(producer.send.remote(url, ARMED, keep_last), timeout=TIMEOUT)
            return list(sent["calls"]), float(sent["seconds"])
        finally:
            ray.kill(producer)


def _calibrate_trainer(pace: tuple[int | None, int | None], other: Any) -> tuple[list[str], float]:
    """The hooked calls of a trainer reading rank 0 to the end under ``pace``, in order,
    and the seconds it took; ``other`` reads rank 1."""
    import ray

    from . import _rayactors as actors

    with _destination() as url:
        producer, trainer = actors.Producer.remote(), actors.Trainer.remote()
        try:
            ray.get(trainer.hook.remote(0, False), timeout=TIMEOUT)
            sending = producer.send.remote(url, TOTAL, pace[0], True, RANKS, pace[1])
            rest = other.take.remote(url, 1, TIMEOUT)
            start = time.monotonic()
            took = ray.get(trainer.take.remote(url, 0, TIMEOUT, True), timeout=3 * TIMEOUT)
            seconds = time.monotonic() - start
            ray.get([sending, rest], timeout=3 * TIMEOUT)
            return list(took["calls"]), seconds
        finally:
            for actor in (producer, trainer):
                ray.kill(actor)


def _trainer_trial(
    other: Any,
    expected: list[list[tuple[int, Any]]],
    pace: tuple[int | None, int | None],
    nth: int,
    after: bool,
    delay: float,
    root_dir: str,
) -> dict[str, Any]:
    """One trainer trial: the trainer of rank 0 killed at hooked call ``nth`` (just
    ``after`` it), or ``delay`` seconds into its reads when ``nth`` is 0, while a
    producer sends every step under ``pace`` (keep_last, max_ahead) and ``other`` reads
    rank 1; a new trainer then resumes rank 0."""
    import ray

    from . import _rayactors as actors

    log, note = os.path.join(root_dir, "trainer.log"), os.path.join(root_dir, "point")
    for path in (log, note):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    with _destination() as url:
        producer, victim = actors.Producer.remote(), actors.Trainer.remote()
        sending = producer.send.remote(url, TOTAL, pace[0], True, RANKS, pace[1])
        rest = other.take.remote(url, 1, TIMEOUT)
        died = False
        try:
            ray.get(victim.keep_log.remote(log), timeout=TIMEOUT)
            ray.get(victim.hook.remote(nth, after, note), timeout=TIMEOUT)
            if nth == 0:
                ray.get(victim.kill_in.remote(delay), timeout=TIMEOUT)
            ray.get(victim.take.remote(url, 0, TIMEOUT, True), timeout=3 * TIMEOUT)
        except ray.exceptions.RayActorError:
            died = True
        except ray.exceptions.GetTimeoutError:
            pass  # judged below: the restart reads what is left
        finally:
            ray.kill(victim)
        restart = actors.Trainer.remote()
        try:
            resumed, other_rank = ray.get(
                [restart.take.remote(url, 0, TIMEOUT, True), rest], timeout=3 * TIMEOUT
            )
            ray.get(sending, timeout=TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            outcome, detail = HANG, "the trainers or the producer did not finish"
        except ray.exceptions.RayError as exc:
            outcome, detail = LOST, f"the producer: {describe(exc)}"
        else:
            with open(log) as file:
                lines = [json.loads(line) for line in file]
            outcome, detail = judge_resumed(lines, resumed, expected[0])
            if outcome == EXACT:
                outcome, detail = judge([other_rank], expected[1:], first_rank=1)
        finally:
            for actor in (producer, restart):
                ray.kill(actor)
    return {
        "campaign": "ray trainers",
        "what": f"{_aimed(nth, after)}, keep_last={pace[0]}, max_ahead={pace[1]}",
        "outcome": outcome,
        "detail": detail,
        "died": died,
        "point": _read(note) if nth else "a random time",
    }


def _trial(
    trainers: list[Any],
    expected: list[list[tuple[int, Any]]],
    keep_last: int | None,
    nth: int,
    after: bool,
    delay: float,
    note: str,
) -> dict[str, Any]:
    """One trial: the first producer killed at hooked call ``nth`` (just ``after`` it),
    or ``delay`` seconds into its armed sends when ``nth`` is 0; the second resumes.
    The producer writes the name of the function it was killed in to the file
    ``note``."""
    import ray

    from . import _rayactors as actors

    with _destination() as url:
        takes = [t.take.remote(url, rank, TIMEOUT) for rank, t in enumerate(trainers)]
        first = actors.Producer.remote()
        died = False
        try:
            ray.get(first.send.remote(url, BEFORE, keep_last), timeout=TIMEOUT)
            with contextlib.suppress(FileNotFoundError):
                os.remove(note)
            ray.get(first.hook.remote(nth, after, note), timeout=TIMEOUT)
            if nth == 0:
                ray.get(first.kill_in.remote(delay), timeout=TIMEOUT)
            ray.get(first.send.remote(url, ARMED, keep_last), timeout=TIMEOUT)
        except ray.exceptions.RayActorError:
            died = True
        finally:
            ray.kill(first)
        second = actors.Producer.remote()
        resumed: dict[str, Any] = {}
        try:
            resumed = ray.get(second.send.remote(url, 0, keep_last), timeout=TIMEOUT)
            left = TOTAL - int(resumed["first"])
            ray.get(second.send.remote(url, left, keep_last, True), timeout=TIMEOUT)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            resumed["error"] = describe(exc)
        try:
            results = ray.get(takes, timeout=3 * TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            outcome, detail = HANG, "the trainers did not finish"
        else:
            outcome, detail = judge(results, expected)
        finally:
            ray.kill(second)
    if "error" in resumed:
        detail = f"{detail}; the resumed producer: {resumed['error']}".lstrip("; ")
    return {
        "what": f"{_aimed(nth, after)}, keep_last={keep_last}",
        "outcome": outcome,
        "detail": detail,
        "died": died,
        "point": _read(note) if nth else "a random time",
    }
