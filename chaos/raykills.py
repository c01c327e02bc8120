"""Kill -9 of a producer actor sending to ``ray://``, then a new producer resumes.

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

Every trial runs on one local Ray cluster, started in one child process of the chaos
runner (Ray's threads must not be in the parent, which forks every other trial), which
returns the outcomes of all its trials at once. Half the trials send with
``keep_last=2``, so that the prunes, and a kill in one, are tried too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import uuid
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


def available() -> str:
    """Why the campaign cannot run here ("" when it can)."""
    return (
        "" if importlib.util.find_spec("ray") else "Ray is not installed (pip install rlwire[ray])"
    )


def jobs(root: str, trials: int, seed: int) -> list[Job]:
    """One job, the whole campaign in a child of its own (see the module's docstring),
    its notes in a folder of ``root``."""
    where = os.path.join(root, "ray")
    os.makedirs(where, exist_ok=True)
    timeout = 120 + 20 * trials
    job = Job(
        campaign, (trials, seed, where), timeout=timeout, mem_limit=4 << 30, tag=("ray", "all")
    )
    return [job]


def judge(results: list[dict[str, Any]], expected: list[list[tuple[int, Any]]]) -> tuple[str, str]:
    """The outcome of one trial from what each rank got (its steps and fingerprints,
    and the error that stopped it, if one did): a rank short of a step lost it, even
    to a typed error."""
    for rank, result in enumerate(results):
        got, want = result["got"], dict(expected[rank])
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


def campaign(trials: int, seed: int, root_dir: str) -> dict[str, Any]:
    """In the child: start Ray, count the hooked calls of the armed sends (per
    ``keep_last``), run ``trials`` trials (notes in ``root_dir``); their outcomes.
    Ray's messages about the killed workers go to a log there, not to the terminal."""
    import ray

    from . import _rayactors as actors

    log = os.open(os.path.join(root_dir, "ray.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
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
        calls = {keep: _calibrate(keep) for keep in KEEP_LAST}
        note = os.path.join(root_dir, "point")
        rng = random.Random(seed)
        out = []
        for i in range(trials):
            keep_last = KEEP_LAST[i % 2]
            count, seconds = len(calls[keep_last][0]), calls[keep_last][1]
            turn = seed + i // 2
            if i % 4 >= 2 and rng.random() < 0.5:  # a quarter at random times
                nth, after, delay = 0, False, rng.uniform(0, seconds)
            else:  # the others at every hooked call in turn, before it, then after it
                nth, after, delay = turn % count + 1, (turn // count) % 2 == 1, 0.0
            out.append(_trial(trainers, expected, keep_last, nth, after, delay, note))
        return {"outcome": EXACT, "trials": out}
    finally:
        ray.shutdown()


def _read(path: str) -> str:
    """The text of the file at ``path``, or "" if there is none."""
    try:
        with open(path) as file:
            return file.read()
    except FileNotFoundError:
        return ""


def _calibrate(keep_last: int | None) -> tuple[list[str], float]:
    """The hooked calls of the armed sends, in order, and the seconds they took."""
    import ray

    from rlwire.transport.ray import create_board, drop_board

    from . import _rayactors as actors

    name = f"chaos-{uuid.uuid4().hex[:10]}"
    url = f"ray://{name}"
    create_board(name)
    producer = actors.Producer.remote()
    try:
        ray.get(producer.send.remote(url, BEFORE, keep_last), timeout=TIMEOUT)
        ray.get(producer.hook.remote(0, False), timeout=TIMEOUT)
        sent = ray.get(producer.send.remote(url, ARMED, keep_last), timeout=TIMEOUT)
        return list(sent["calls"]), float(sent["seconds"])
    finally:
        ray.kill(producer)
        drop_board(name)


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

    from rlwire import RlwireError
    from rlwire.transport.ray import create_board, drop_board

    from . import _rayactors as actors

    name = f"chaos-{uuid.uuid4().hex[:10]}"
    url = f"ray://{name}"
    create_board(name)  # this process's: it outlives the producers
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
        with contextlib.suppress(RlwireError):
            drop_board(name)
    where = "at a random time" if nth == 0 else f"at call {nth}{' (after it)' if after else ''}"
    if "error" in resumed:
        detail = f"{detail}; the resumed producer: {resumed['error']}".lstrip("; ")
    return {
        "what": f"{where}, keep_last={keep_last}",
        "outcome": outcome,
        "detail": detail,
        "died": died,
        "point": _read(note) if nth else "a random time",
    }
