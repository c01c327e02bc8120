"""Receivers reading live while producers filling steps part by part are killed with
SIGKILL and resumed, and receivers killed themselves, at their own store calls (their
consumption marks among them), then resumed: every part a rank is handed once, in its
seal's order, bit-exact, and no temporary file left.

Each trial draws a plan as the parts campaign does (:func:`chaos.parts.make_plan`, on
files, ``finish()`` always), plus retention: none, ``keep_last=2``, ``keep_last=2`` with
``max_ahead=1`` (the producer waits for a dead rank), or ``keep_last=2`` with
``recycle`` (then 2-4 more steps sent whole, written into pruned steps' files).
Before the first producer starts, one reader per rank starts too, in a process of its
own that restarts its receiver (``resume=True``) each time a kill ends it, until one
reads to ``EndOfStream``. Each receiver goes through its rank's steps
with ``parts()`` (or, in a quarter of the trials, ``receive()``), checks every part
against the samples of its step and key, and appends ``run step key ok`` to its rank's
log (one write each: a kill leaves whole lines). Rank 0's receiver is killed 0-2 times:
after its k-th part it hooks the ``os`` calls of :func:`chaos.kills.install_hooks` and
kills itself at the m-th (1-8): writing its consumption or part mark (open, write,
rename), or reading the next part. The producers run as in :mod:`chaos.parts` (a third
of the trials kill none, the others one or two), the last to the end.

Judged, per rank: every part bit-exact (else *wrong data*); each receiver's run begins
with the part after the last one its predecessor logged, or with that one again (it
died holding it; any other start is *lost* or *duplicated*); the parts read, once those
repeats are dropped, are the step's keys of that rank in its seal's order (the seal
read from the store, or as its producer reported it where ``keep_last`` deleted it;
else *lost*, *duplicated*, *wrong seal*), every step of the plan once; every key of a
step read by one rank. And, once every reader and producer has closed, no temporary
file of a step or a mark is left (*half-visible*). The producers' own reports are
judged by :class:`chaos.parts.Ledger`.

Rewrites: in about 40 % of the trials that kill a producer (not with ``max_ahead``),
the producer after one or each kill restarts with ``overwrite`` or ``truncate``,
sending another run of the plan's steps (other keys, sizes and bits); readers then go
slower, and one that gets ``StepGapError`` reopens at its step. The judge then goes by
passes and runs (:mod:`chaos._readjudge`). The same trials run on S3 (the tests'
server), receivers killed at their S3 requests.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import time
import traceback
from collections.abc import Iterator
from typing import Any

import rlwire
from rlwire.transport._stored.names import LEFTOVER_RE, SEAL_RE
from rlwire.transport._stored.parts import parse_seal

from . import kills, parts, s3chaos
from ._model import HALF, HANG, UNTYPED, describe, same
from ._proc import Job, reap
from ._readjudge import History, judge_ranks, parse_log

__all__ = ["CAMPAIGN", "jobs", "judge", "trial"]

CAMPAIGN = {"files": "parts read live, kill -9 (files)", "s3": "parts read live, kill -9 (S3)"}
TIMEOUT = {"files": 120.0, "s3": 240.0}
RETENTION = (
    {},
    {"keep_last": 2},
    {"keep_last": 2, "max_ahead": 1},
    {"keep_last": 2, "storage_options": {"recycle": True}},
)
#: On S3, no recycling (a file sink's option).
S3_RETENTION = ({}, {"keep_last": 2}, {"keep_last": 2, "max_ahead": 1})


# ----------------------------------------------------------------------------- readers


def _which(plan: dict[str, Any], step: int, rank: int, keys: Any, value: Any) -> int:
    """The producer run (``gen``) whose bits ``value`` holds: a part (``keys`` its key),
    with ``receive()`` a step (``keys`` the list of its keys), or a step sent whole
    (``keys`` None); -1 for none."""
    for gen, steps in enumerate(plan["runs"]):
        spec = steps[step]
        if spec["whole"]:
            if keys is None and same(value, parts.whole_batch(step, rank, gen)):
                return gen
            continue
        if keys is None:
            continue
        groups = {parts._typed(g[0]): g for g in spec["groups"]}
        want: list[Any] = []
        for k in keys if plan["by_receive"] else [keys]:
            g = groups.get(parts._typed(k))
            if g is None:
                break
            want += parts.samples(step, g[0], g[1], gen)
        else:
            if same(value, rlwire.TrainingBatch(samples=want)):
                return gen
    return -1


def _keys_of(plan: dict[str, Any], step: int, batch: Any) -> list[Any] | None:
    """The keys whose groups' samples make up ``batch`` one after another (a step
    filled part by part, received whole), of the first producer run they all match."""
    for gen, steps in enumerate(plan["runs"]):
        if steps[step]["whole"]:
            continue
        sizes = {parts._typed(g[0]): g[1] for g in steps[step]["groups"]}
        rest, keys = list(batch.samples), []
        while rest:
            for (_, key), sz in sizes.items():
                want = parts.samples(step, key, sz, gen)
                head = rlwire.TrainingBatch(samples=rest[: len(want)])
                if len(want) <= len(rest) and same(head, rlwire.TrainingBatch(samples=want)):
                    keys.append(key)
                    rest = rest[len(want) :]
                    break
            else:
                break
        if not rest:
            return keys
    return None


def _read(
    url: str,
    options: dict[str, Any],
    rank: int,
    plan: dict[str, Any],
    run: int,
    kill: Any,
    log: int,
) -> None:
    """The receivers of one process of ``rank``: resumed where its marks say, reopened
    at the step after each ``StepGapError`` (as its message advises); log each part or
    step handed out; kill the process at the ``kill["at"]``-th store call after its
    ``kill["after"]``-th part (``kill`` None: not killed)."""
    write = os.write  # not the hooked one: the log is no store call
    count = 0

    def emit(event: dict[str, Any]) -> None:
        write(log, (json.dumps({"run": run, **event}) + "\n").encode())

    def said(call: str) -> None:
        emit({"e": "kill", "call": call})

    def hook() -> None:
        if "endpoint_url" in options.get("storage_options", {}):
            s3chaos.install_hooks(kill["at"], kill.get("after_call", False), said)
        else:
            kills.install_hooks(kill["at"], said)

    def took(step: int, index: int, keys: Any, value: Any) -> None:
        nonlocal count
        typed: Any = None
        if keys is not None:
            as_list = keys if plan["by_receive"] else [keys]
            typed = [list(parts._typed(k)) for k in as_list]
            typed = typed if plan["by_receive"] else typed[0]
        gen = _which(plan, step, rank, keys, value)
        emit({"e": "got", "step": step, "index": index, "key": typed, "gen": gen})
        count += 1
        if kill is not None and count == kill["after"]:
            hook()
        if plan.get("pace"):
            time.sleep(plan["pace"])

    how: dict[str, Any] = {"resume": True}
    if kill is not None and kill["after"] == 0:
        hook()
    while True:
        with rlwire.open_receiver(url, rank=rank, poll_interval=0.005, **how, **options) as rx:
            start = "resume" if "resume" in how else "start_step"
            emit({"e": "start", "step": rx.next_step, "part": rx.next_part, "how": start,
                  "t": time.monotonic()})  # fmt: skip
            try:
                while True:
                    step = rx.next_step
                    if plan["by_receive"]:
                        batch = rx.receive(timeout=TIMEOUT["files"])
                        step = rx.last_step
                        took(step, 0, _keys_of(plan, step, batch), batch)  # None: whole
                    else:
                        for part in rx.parts(timeout=TIMEOUT["files"]):
                            took(part.step, part.index, part.key, part.value)
                    emit({"e": "done", "step": step})
            except rlwire.EndOfStream:
                break
            except rlwire.StepGapError as exc:
                emit({"e": "gap", "step": rx.next_step, "msg": str(exc)[:300],
                      "t": time.monotonic()})  # fmt: skip
                how = {"start_step": rx.next_step}
    emit({"e": "end"})


def _supervise(
    url: str, options: dict[str, Any], rank: int, plan: dict[str, Any], kill_plan: list[Any],
    log: str,
) -> None:  # fmt: skip
    """Run receivers of ``rank`` one after another until one reads to the end."""
    code = 0
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for run in range(len(kill_plan) + 1):
            kill = kill_plan[run] if run < len(kill_plan) else None
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the receiver
                status = 0
                try:
                    _read(url, options, rank, plan, run, kill, fd)
                except BaseException as exc:
                    status = 3 if isinstance(exc, rlwire.RlwireError) else 4
                    with contextlib.suppress(OSError):
                        text = describe(exc) + " " + traceback.format_exc()[-600:]
                        typed = isinstance(exc, rlwire.RlwireError)
                        line = json.dumps({"run": run, "e": "error", "text": text, "typed": typed})
                        os.write(fd, (line + "\n").encode())
                os._exit(status)
            status = reap(pid, TIMEOUT["s3"])
            if status is None:
                line = json.dumps({"run": run, "e": "error", "text": "no end in time"})
                os.write(fd, (line + "\n").encode())
                break
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                break  # to the end, or failed: said in the log
    except BaseException:
        code = 4
    os._exit(code)


# ----------------------------------------------------------------------------- judging


def judge(store: parts.Store, history: History, logs: list[str]) -> tuple[str, str, int]:
    """The outcome of a trial from the readers' logs and the store; and the kills of
    readers that landed."""
    names = store.names()
    left = [n for n in names if LEFTOVER_RE.fullmatch(n)]
    if left:
        return HALF, f"temporary files left once all closed: {left[:4]}", 0
    for name in names:
        m = SEAL_RE.fullmatch(name)
        if m:
            step = int(m.group(1))
            seal = parse_seal(store.read(name), step=step, where=name)
            history.stored[step] = [list(k) for k in seal.keys]
    texts = []
    for log in logs:
        with open(log) as f:
            texts.append(parse_log(f.read()))
    return judge_ranks(history, texts)


# ------------------------------------------------------------------------------ trials


def _run_plan(plan: dict[str, Any], gen: int, rewrite: dict[str, Any] | None) -> dict[str, Any]:
    """The plan a producer of run ``gen`` fills: its steps, its bits, and how it opens
    (``rewrite``: with ``overwrite`` or ``truncate``; else ``resume``)."""
    run = {**plan, "steps": plan["runs"][gen], "run": gen}
    if rewrite is not None:
        run["on_existing"] = rewrite["mode"]
        run["start_step"] = rewrite["first"] if rewrite["mode"] == "truncate" else None
    return run


def trial(
    store_kind: str,
    root: str,
    endpoint: Any,
    plan: dict[str, Any],
    producer_kills: list[Any],
    reader_kills: list[Any],
    rewrites: dict[str, Any],
) -> dict[str, Any]:
    """Readers of every rank live while producers are killed, resumed, and (at the
    runs ``rewrites`` names) restarted with ``overwrite`` or ``truncate``."""
    store = parts.Store(store_kind, root, endpoint)
    tag = os.path.basename(store.dest.rstrip("/"))
    logs = [os.path.join(root, f"{tag}.rank-{r}.log") for r in range(plan["ranks"])]
    options = store.receiver_options()
    supervisors: list[int] = []
    history = History(plan)
    history.new_run(parts.Ledger(_run_plan(plan, 0, None)), 0, 0.0)
    points: list[str] = []
    landed = 0
    try:
        for rank, log in enumerate(logs):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - a rank's reader
                kill_plan = reader_kills if rank == 0 else []
                _supervise(store.dest, options, rank, plan, kill_plan, log)
            supervisors.append(pid)
        try:
            rewrite: dict[str, Any] | None = None  # under way: not opened yet
            for run, kill in enumerate([*producer_kills, None]):
                gen = len(history.ledgers) - 1
                if str(run) in rewrites:
                    rewrite = _begin_rewrite(history, plan, rewrites[str(run)])
                    gen += 1
                ledger = history.ledgers[gen]
                run_plan = _run_plan(plan, gen, rewrite)
                kill = parts._at_put(kill, run_plan, ledger)
                events, killed = parts.run_producer(
                    store_kind, store.dest, endpoint, run_plan, kill
                )
                if rewrite is not None and any(e["e"] == "start" for e in events):
                    rewrite = None  # its deletions done: the next producer resumes
                ledger.take(events, run)
                history.took(gen, events)
                landed += killed
                if killed:
                    points.append("producer " + parts.kill_point(events))
                elif kill is None and not any(e["e"] == "done" for e in events):
                    raise parts.Verdict(UNTYPED, "the last producer did not end")
        except parts.Verdict as verdict:
            return {"outcome": verdict.outcome, "detail": verdict.detail, "kills": landed}
        deadline = time.monotonic() + TIMEOUT[store_kind] / 2
        for pid in supervisors:
            if reap(pid, max(0.1, deadline - time.monotonic())) is None:
                return {"outcome": HANG, "detail": "a reader did not end", "kills": landed}
        supervisors = []
        outcome, detail, readers = judge(store, history, logs)
        for log in logs:
            with open(log) as f:
                for e in parse_log(f.read()):
                    if e["e"] == "kill":
                        points.append(f"reader at {_what(e['call'])}")
                    elif e["e"] == "gap":
                        points.append("reader: StepGapError, reopened at its step")
        return {"outcome": outcome, "detail": detail, "kills": landed + readers, "points": points}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc) + traceback.format_exc()[-600:]}
    finally:
        for pid in supervisors:
            # One the trial reaped already is no child any more (ChildProcessError).
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                reap(pid, 5)
        store.clean()
        for log in logs:
            with contextlib.suppress(OSError):
                os.unlink(log)


def _begin_rewrite(history: History, plan: dict[str, Any], how: dict[str, Any]) -> dict[str, Any]:
    """A new producer run: ``overwrite`` from step 0, or ``truncate`` from a step no later
    than the first one the runs so far have not done (never a hole)."""
    ledger = history.ledgers[-1]
    done = set(ledger.sealed) | ledger.sent | ledger.unreported
    first_open = min((s for s in range(len(plan["steps"])) if s not in done), default=0)
    first = 0 if how["mode"] == "overwrite" else math.floor(how["share"] * (first_open + 1))
    gen = len(history.ledgers)
    new = parts.Ledger(_run_plan(plan, gen, None))
    new.sent |= set(range(first))  # kept from the runs before: done
    history.new_run(new, first, time.monotonic())
    return {"mode": how["mode"], "first": first}


def _what(call: str) -> str:
    if "consumed" in call:
        return "a part mark" if ".part." in call else "a consumption mark"
    return "a step's file" if "step-" in call else "another file"


def jobs(
    root: str, count: int, seed: int, store: str = "files", endpoint: Any = None
) -> Iterator[Job]:
    rng = random.Random(f"readers-{seed}" if store == "files" else f"readers-s3-{seed}")
    # Rewrites are drawn apart: the trials of a seed without them stay the same.
    again = random.Random(f"rereads-{store}-{seed}")
    for _ in range(count):
        plan = parts.make_plan(rng, store)
        plan["finish"] = True
        plan["by_receive"] = rng.random() < 0.25
        plan["retention"] = rng.choice(RETENTION if store == "files" else S3_RETENTION)
        if "storage_options" in plan["retention"]:
            # Steps sent whole after those: from the third on, written into pruned
            # steps' files (recycled) while the killed and restarted reader holds one.
            plan["steps"] += [{"whole": True, "groups": []} for _ in range(rng.randint(2, 4))]
        producer_kills = [parts._kill_plan(rng, store) for _ in range(rng.choice((0, 1, 1, 2)))]
        total = parts.puts_of(plan) + len(plan["steps"])
        reader_kills = [
            {"after": rng.randint(0, max(1, total // 2)), "at": rng.randint(1, 8)}
            for _ in range(rng.choice((0, 1, 1, 2)))
        ]
        plan["runs"] = [plan["steps"]]
        rewrites = _draw_rewrites(again, plan, producer_kills, reader_kills, store)
        what = (
            f"{parts._describe(plan, producer_kills)}; retention {plan['retention']}; "
            f"{'receive()' if plan['by_receive'] else 'parts()'}; reader kills {reader_kills}"
            + (f"; rewrites {rewrites}" if rewrites else "")
        )
        yield Job(
            trial,
            (store, root, endpoint, plan, producer_kills, reader_kills, rewrites),
            timeout=TIMEOUT[store] + 30,
            mem_limit=1 << 30,
            tag=(CAMPAIGN[store], what),
        )


def _draw_rewrites(
    rng: random.Random,
    plan: dict[str, Any],
    producer_kills: list[Any],
    reader_kills: list[Any],
    store: str,
) -> dict[str, Any]:
    """In about 40 % of the trials with a producer killed (not with ``max_ahead``: a
    rank whose mark the rewrite deleted holds it back), the producers after one or each
    kill restart with ``overwrite`` or ``truncate``: another run of the plan's steps
    (keys, sizes, bits), read live. ``plan["runs"]`` gets their steps; the readers
    then go slower (``pace``). Keyed by the producer's run, as a string (JSON)."""
    if not producer_kills or "max_ahead" in plan["retention"] or rng.random() >= 0.4:
        return {}
    restarts = list(range(1, len(producer_kills) + 1))
    chosen = [r for r in restarts if rng.random() < 0.5] or [rng.choice(restarts)]
    whole = [i for i, s in enumerate(plan["runs"][0]) if s["whole"]]
    rewrites = {}
    for run in chosen:
        steps = parts.draw_steps(rng, plan["ranks"], plan["balance"], len(plan["runs"][0]), -1)
        for i in whole:  # (recycling's steps stay whole)
            steps[i] = {"whole": True, "groups": []}
        plan["runs"].append(steps)
        rewrites[str(run)] = {"mode": rng.choice(("overwrite", "truncate")), "share": rng.random()}
    plan["pace"] = rng.choice((0.0, 0.001, 0.003))
    for kill in reader_kills:
        kill["after_call"] = store == "s3" and rng.random() < 0.5
    return rewrites
