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
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import rlwire
from rlwire.transport._stored.names import LEFTOVER_RE, SEAL_RE
from rlwire.transport._stored.parts import parse_seal

from . import kills, parts
from ._model import DUPLICATED, EXACT, HALF, HANG, LOST, TYPED, UNTYPED, WRONG, describe, same
from ._proc import Job, reap

__all__ = ["CAMPAIGN", "jobs", "judge", "trial"]

CAMPAIGN = "parts read live, kill -9 (files)"
TIMEOUT = 120.0
RETENTION = (
    {},
    {"keep_last": 2},
    {"keep_last": 2, "max_ahead": 1},
    {"keep_last": 2, "storage_options": {"recycle": True}},
)


# ----------------------------------------------------------------------------- readers


def _read(dest: str, rank: int, plan: dict[str, Any], run: int, kill: Any, log: int) -> None:
    """One receiver of ``rank``, resumed where its marks say: log each part it is
    handed; kill itself at the ``kill["at"]``-th hooked call after its ``kill["after"]``-th
    part (``kill`` None: not killed)."""
    write = os.write  # not the hooked one: the log is no store call
    groups = [{parts._typed(g[0]): g for g in spec["groups"]} for spec in plan["steps"]]
    count = 0

    def said(call: str) -> None:
        write(log, f"{run} kill {call.replace(' ', ':')}\n".encode())

    def took(part_step: int, keys: Any, value: Any) -> None:
        """Log what the receiver was handed: a part (``keys`` its key), or with
        ``receive()`` a step (``keys`` the list of its keys, as the samples show)."""
        nonlocal count
        spec = plan["steps"][part_step]
        if spec["whole"]:
            ok = keys is None and same(value, parts.whole_batch(part_step, rank))
            typed: Any = None
        else:
            as_list = keys if plan["by_receive"] else [keys]
            typed = [list(parts._typed(k)) for k in as_list]
            want: list[Any] = []
            for k in typed:
                g = groups[part_step].get(tuple(k))
                want += [] if g is None else parts.samples(part_step, g[0], g[1])
            ok = same(value, rlwire.TrainingBatch(samples=want))
            typed = typed if plan["by_receive"] else typed[0]
        write(log, f"{run} got {part_step} {_enc(typed)} {int(ok)}\n".encode())
        count += 1
        if kill is not None and count == kill["after"]:
            kills.install_hooks(kill["at"], said)

    with rlwire.open_receiver(dest, rank=rank, resume=True, poll_interval=0.005) as receiver:
        write(log, f"{run} start {receiver.next_step} {receiver.next_part}\n".encode())
        if kill is not None and kill["after"] == 0:
            kills.install_hooks(kill["at"], said)
        while True:
            try:
                if plan["by_receive"]:
                    batch = receiver.receive(timeout=TIMEOUT)
                    step = receiver.last_step
                    keys = None if plan["steps"][step]["whole"] else _keys_of(plan, step, batch)
                    took(step, keys, batch)
                else:
                    for part in receiver.parts(timeout=TIMEOUT):
                        took(part.step, part.key, part.value)
            except rlwire.EndOfStream:
                break
    write(log, f"{run} end\n".encode())


def _keys_of(plan: dict[str, Any], step: int, batch: Any) -> list[Any]:
    """The keys whose groups' samples make up ``batch`` one after another (a step
    filled part by part, received whole), as far as they match."""
    sizes = {parts._typed(g[0]): g[1] for g in plan["steps"][step]["groups"]}
    rest, keys = list(batch.samples), []
    while rest:
        for (_, key), sz in sizes.items():
            want = parts.samples(step, key, sz)
            head = rlwire.TrainingBatch(samples=rest[: len(want)])
            if len(want) <= len(rest) and same(head, rlwire.TrainingBatch(samples=want)):
                keys.append(key)
                rest = rest[len(want) :]
                break
        else:
            return keys  # the rest matches no group: "ok" will say so
    return keys


def _enc(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


def _supervise(dest: str, rank: int, plan: dict[str, Any], kill_plan: list[Any], log: str) -> None:
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
                    _read(dest, rank, plan, run, kill, fd)
                except BaseException as exc:
                    status = 3 if isinstance(exc, rlwire.RlwireError) else 4
                    with contextlib.suppress(OSError):
                        text = describe(exc) + " " + traceback.format_exc()[-600:]
                        os.write(fd, f"{run} error {text!r}\n".encode())
                os._exit(status)
            status = reap(pid, TIMEOUT)
            if status is None:
                os.write(fd, f"{run} error 'no end in time'\n".encode())
                break
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                break  # to the end, or failed: said in the log
    except BaseException:
        code = 4
    os._exit(code)


# ----------------------------------------------------------------------------- judging


def _logged(log: str) -> list[list[str]]:
    with open(log) as f:
        return [line.split(" ", 3) for line in f.read().splitlines()]


def judge(
    dest: str, plan: dict[str, Any], ledger: parts.Ledger, logs: list[str]
) -> tuple[str, str, int]:
    """The outcome of a trial from the readers' logs and the store; and the kills of
    readers that landed."""
    import json

    names = sorted(os.listdir(dest))
    left = [n for n in names if LEFTOVER_RE.fullmatch(n)]
    if left:
        return HALF, f"temporary files left once all closed: {left[:4]}", 0
    seals: dict[int, list[list[Any]]] = {}
    for name in names:
        m = SEAL_RE.fullmatch(name)
        if m:
            step = int(m.group(1))
            seal = parse_seal((Path(dest) / name).read_bytes(), step=step, where=name)
            seals[step] = [list(k) for k in seal.keys]
    for step, keys in ledger.sealed.items():
        seals.setdefault(step, [list(k) for k in keys])
    landed = 0
    read_by: dict[int, dict[tuple[str, Any], int]] = {}
    for rank, log in enumerate(logs):
        delivered: list[tuple[int, Any]] = []
        last: tuple[int, Any] | None = None
        ended = False
        for fields in _logged(log):
            run, what = fields[0], fields[1]
            if what == "error":
                outcome = TYPED if "Error" in fields[2] else UNTYPED
                return outcome, f"rank {rank} run {run}: {' '.join(fields[2:])[:500]}", landed
            if what == "kill":
                landed += 1
            elif what == "start":
                last = None if not delivered else delivered[-1]
            elif what == "got":
                step, ok = int(fields[2]), fields[3][-1]
                item = (step, _frozen(json.loads(fields[3].split(" ")[0])))
                if ok != "1":
                    return WRONG, f"rank {rank} run {run}: step {step} {item[1]} other bits", landed
                if last is not None:
                    first, last = item, None
                    if first == delivered[-1]:
                        continue  # held by the killed receiver: handed again
                delivered.append(item)
            elif what == "end":
                ended = True
        if not ended:
            return LOST, f"rank {rank}: no receiver read to the end", landed
        if len(set(delivered)) != len(delivered):
            return DUPLICATED, f"rank {rank} was handed {_dups(delivered)} twice", landed
        want: list[tuple[int, Any]] = []
        for step, spec in enumerate(plan["steps"]):
            if spec["whole"]:
                want.append((step, None))
            elif step not in seals:
                if step not in ledger.unreported:
                    return LOST, f"step {step}: no seal stored and none reported", landed
                # Sealed by a producer killed before it said so, then deleted by
                # keep_last: its order is unknown, what was read is checked below.
                want += [item for item in delivered if item[0] == step]
            elif plan["by_receive"]:
                want.append((step, tuple(tuple(parts._typed(k)) for k in seals[step][rank])))
            else:
                want += [(step, tuple(parts._typed(k))) for k in seals[step][rank]]
        if delivered != want:
            extra = [x for x in delivered if x not in want]
            missing = [x for x in want if x not in delivered]
            outcome = LOST if missing else DUPLICATED if extra else WRONG
            return (
                outcome,
                f"rank {rank}: handed {len(delivered)} parts, its seals list {len(want)}; "
                f"missing {missing[:4]}, extra {extra[:4]}, in another order: "
                f"{not (missing or extra)}",
                landed,
            )
        for step, key in delivered:
            if key is not None:
                for one in key if plan["by_receive"] else (key,):
                    if one in read_by.setdefault(step, {}):
                        return DUPLICATED, f"step {step} key {one} read by two ranks", landed
                    read_by[step][one] = rank
    for step, spec in enumerate(plan["steps"]):
        if not spec["whole"] and set(read_by.get(step, {})) != set(ledger.keys(step)):
            return LOST, f"step {step}: not every key read by a rank", landed
    return EXACT, "", landed


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _dups(items: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    return [x for x in items if x in seen or seen.add(x)][:4]  # type: ignore[func-returns-value]


# ------------------------------------------------------------------------------ trials


def trial(
    root: str, plan: dict[str, Any], producer_kills: list[Any], reader_kills: list[Any]
) -> dict[str, Any]:
    dest = tempfile.mkdtemp(dir=root)
    logs = [
        os.path.join(root, f"{os.path.basename(dest)}.rank-{r}.log") for r in range(plan["ranks"])
    ]
    supervisors: list[int] = []
    ledger = parts.Ledger(plan)
    points: list[str] = []
    landed = 0
    try:
        for rank, log in enumerate(logs):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - a rank's reader
                _supervise(dest, rank, plan, reader_kills if rank == 0 else [], log)
            supervisors.append(pid)
        try:
            for run, kill in enumerate([*producer_kills, None]):
                kill = parts._at_put(kill, plan, ledger)
                events, killed = parts.run_producer("files", dest, None, plan, kill)
                ledger.take(events, run)
                landed += killed
                if killed:
                    points.append("producer " + parts.kill_point(events))
                elif kill is None and not any(e["e"] == "done" for e in events):
                    raise parts.Verdict(UNTYPED, "the last producer did not end")
        except parts.Verdict as verdict:
            return {"outcome": verdict.outcome, "detail": verdict.detail, "kills": landed}
        deadline = time.monotonic() + TIMEOUT / 2
        for pid in supervisors:
            if reap(pid, max(0.1, deadline - time.monotonic())) is None:
                return {"outcome": HANG, "detail": "a reader did not end", "kills": landed}
        supervisors = []
        outcome, detail, readers = judge(dest, plan, ledger, logs)
        for log in logs:
            for fields in _logged(log):
                if fields[1] == "kill":
                    points.append(f"reader at {fields[2].split(':')[0]} {_what(fields[2])}")
        return {
            "outcome": outcome,
            "detail": detail,
            "kills": landed + readers,
            "points": points,
        }
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc) + traceback.format_exc()[-600:]}
    finally:
        for pid in supervisors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            reap(pid, 5)
        import shutil

        shutil.rmtree(dest, ignore_errors=True)
        for log in logs:
            with contextlib.suppress(OSError):
                os.unlink(log)


def _what(call: str) -> str:
    if "consumed" in call:
        return "a part mark" if ".part." in call else "a consumption mark"
    return "a step's file" if "step-" in call else "another file"


def jobs(root: str, count: int, seed: int) -> Iterator[Job]:
    rng = random.Random(f"readers-{seed}")
    for _ in range(count):
        plan = parts.make_plan(rng, "files")
        plan["finish"] = True
        plan["by_receive"] = rng.random() < 0.25
        plan["retention"] = rng.choice(RETENTION)
        if "storage_options" in plan["retention"]:
            # Steps sent whole after those: from the third on, written into pruned
            # steps' files (recycled) while the killed and restarted reader holds one.
            plan["steps"] += [{"whole": True, "groups": []} for _ in range(rng.randint(2, 4))]
        producer_kills = [parts._kill_plan(rng, "files") for _ in range(rng.choice((0, 1, 1, 2)))]
        total = parts.puts_of(plan) + len(plan["steps"])
        reader_kills = [
            {"after": rng.randint(0, max(1, total // 2)), "at": rng.randint(1, 8)}
            for _ in range(rng.choice((0, 1, 1, 2)))
        ]
        what = (
            f"{parts._describe(plan, producer_kills)}; retention {plan['retention']}; "
            f"{'receive()' if plan['by_receive'] else 'parts()'}; reader kills {reader_kills}"
        )
        yield Job(
            trial,
            (root, plan, producer_kills, reader_kills),
            timeout=TIMEOUT + 30,
            mem_limit=1 << 30,
            tag=(CAMPAIGN, what),
        )
