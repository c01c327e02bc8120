"""ZeroMQ senders and receivers in real processes, killed with SIGKILL and restarted.

Each trial forks (from the trial's own child, which starts no thread and no event loop) a
real ``zmq+ipc://`` or ``zmq+tcp://127.0.0.1`` sender and one or two real receivers,
``"ranks"`` (one receiver per rank, ``send_ranks``) or ``"shared"`` (consumers sharing
the stream, ``send``). The sender sends :data:`STEPS` steps of :func:`._model.payload`
and then ``finish()``; the receivers take their time over each step, as a trainer would.
At a random moment (seeded) one process gets SIGKILL, and is restarted the way
docs/how-to/destinations.md says a user restarts it:

- a sender with ``start_step=`` the step after the last one its ``send`` returned for
  (*resume*), or from step 0 as a naive user would (*naive*);
- a receiver with ``start_step=`` the step after the last one it returned.

Every process writes what it does and sees, line by line, to a log of its own, so that
what a killed process saw before it died counts too. The trial then judges the logs
(:func:`judge`):

- every step returned is exactly the payload for its step (and rank);
- no step is returned twice as new, and steps go up (by one in the ``ranks`` pattern,
  unless a ``StepGapError`` came just before);
- every exception is the ``RlwireError`` docs/how-to/ names for what happened:
  ``StepGapError`` for messages lost with a killed process, one ``StepOrderError`` per
  receiver for a sender restarted behind it, ``ReceiveTimeout`` while no sender is there,
  ``EndOfStream`` at the end. Expected typed errors are listed in the detail of an exact
  trial;
- ``receive(timeout=T)`` returns within ``T`` + :data:`SLACK` s;
- after the restart, the steps sent (from the restart on) reach every receiver that is
  there, and ``finish()`` ends every receiver's stream with ``EndOfStream``.

Steps lost with a killed process (messages queued at a receiver that died, or sent by a
sender that died) are allowed and named in the detail: in the ``ranks`` pattern each such
loss must be reported by a ``StepGapError``; in the ``shared`` pattern nothing can report
it (a consumer's queue dies with it, and a new sender session starts its sequence again),
so the loss must be confined to the steps the dead process could have held.

Outcomes: *exact* when all of that holds (the detail names the steps lost with the dead
process and the typed errors the scenario is expected to produce); *wrong data* for a
step that is not the payload sent, or returned twice; *half-visible (undetected)* for a
step that is skipped without a ``StepGapError``, a step sent after the restart that never
arrives, or a receiver open before the last sender finished that never sees
``EndOfStream`` ("end never seen": it would wait forever; timed from the receiver's own
"open" event, as its fork may come long before); *typed error* for any other
``RlwireError``; *untyped error* for any other exception; *hang* for a receive over its
timeout by more than :data:`SLACK` s, or a sender that never finishes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

import rlwire

from ._model import EXACT, HALF, HANG, TYPED, UNTYPED, WRONG, describe, payload, same
from ._proc import Job

CAMPAIGN = "ZeroMQ kills"
#: Steps a stream has; tokens per sample of the payloads.
STEPS = 24
N = 256
#: ``receive(timeout=TIMEOUT)``; a receive that takes TIMEOUT + SLACK s is a hang.
TIMEOUT = 1.0
SLACK = 3.0
#: Seconds each receiver "trains" on a step (a range: drawn per trial).
WORK = (0.005, 0.02)
#: Sender options: a send waits at most READY_TIMEOUT s for a missing receiver, and a
#: closing sender at most LINGER s for receivers to read what was sent to them.
READY_TIMEOUT = 4.0
LINGER = 2.0
#: How long any process of a trial may live, and how long after the last sender ended a
#: receiver still connected may take to see EndOfStream.
LIFETIME = 9.0
END_GRACE = 3.0


@dataclass(frozen=True)
class Scenario:
    victim: str  # "sender" or "receiver"
    pattern: str  # "ranks" or "shared"
    receivers: int  # ranks, or consumers
    restart: str  # "resume" (start_step= the next step) or "naive" (from step 0)

    def describe(self) -> str:
        who = "consumers" if self.pattern == "shared" else "ranks"
        if self.victim == "sender":
            how = "restarted at the next step" if self.restart == "resume" else "restarted at 0"
        else:
            how = "restarted at its next step"
        return f"{self.victim} killed, {self.pattern} ({self.receivers} {who}), {how}"


#: Taken in this order first (sender and receiver kills alternate, so that a small sample
#: has both), then at random.
SCENARIOS = (
    Scenario("sender", "ranks", 2, "resume"),
    Scenario("receiver", "ranks", 2, "resume"),
    Scenario("sender", "shared", 2, "resume"),
    Scenario("receiver", "shared", 2, "resume"),
    Scenario("sender", "ranks", 1, "naive"),
    Scenario("receiver", "ranks", 1, "resume"),
    Scenario("sender", "ranks", 1, "resume"),
    Scenario("receiver", "shared", 1, "resume"),
    Scenario("sender", "ranks", 2, "naive"),
    Scenario("sender", "shared", 2, "naive"),
)


# --------------------------------------------------------------------------------------
# The processes: each writes JSON lines to its own log.


class Log:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "t": time.monotonic(), **fields}, default=str)
        os.write(self.fd, line.encode() + b"\n")


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):  # a line cut by the kill
            events.append(json.loads(line))
    return events


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when the trial's process dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def spawn(fn: Callable[..., None], *args: Any) -> int:
    """Fork a process that runs ``fn(*args)`` and exits."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            _die_with_parent(parent)
            fn(*args)
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    return pid


def sender_main(
    log_path: Path,
    url: str,
    pattern: str,
    ranks: int,
    start: int,
    compression: str | None,
    deadline: float,
) -> None:
    log = Log(log_path)
    try:
        anyio.run(_send_all, log, url, pattern, ranks, start, compression, deadline)
    except rlwire.RlwireError as exc:
        log("error", typed=True, type=type(exc).__name__, error=describe(exc))
    except Exception as exc:
        log("error", typed=False, type=type(exc).__name__, error=traceback.format_exc()[-800:])
        raise
    log("exit")


async def _send_all(
    log: Log,
    url: str,
    pattern: str,
    ranks: int,
    start: int,
    compression: str | None,
    deadline: float,
) -> None:
    options: dict[str, Any] = {
        "pattern": pattern,
        "ready_timeout": READY_TIMEOUT,
        "linger": LINGER,
    }
    if pattern == "shared":
        options["consumers"] = ranks
    async with rlwire.open_sender(
        url, start_step=start, compression=compression, storage_options=options
    ) as sender:
        log("open", url=getattr(sender.sink, "url", url), next=sender.next_step)
        while sender.next_step < STEPS:
            if time.monotonic() > deadline:
                log("gave up", next=sender.next_step)
                return
            step = sender.next_step
            log("sending", step=step)
            try:
                if pattern == "shared":
                    got = await sender.send(payload(step, 0, N))
                else:
                    got = await sender.send_ranks([payload(step, r, N) for r in range(ranks)])
            except rlwire.TransportError as exc:
                # A receiver vanished: the step is used up if some rank got it.
                log("send failed", step=step, next=sender.next_step, error=describe(exc))
                continue
            log("sent", step=got)
        await sender.finish()
        log("finished", end=sender.next_step)
    log("closed")


def receiver_main(
    log_path: Path,
    url: str,
    pattern: str,
    rank: int,
    start: int,
    work: float,
    deadline: float,
) -> None:
    log = Log(log_path)
    log("start", start=start)
    try:
        opened = rlwire.open_receiver(
            url, rank=rank, start_step=start, storage_options={"pattern": pattern}
        )
    except Exception as exc:
        typed = isinstance(exc, rlwire.RlwireError)
        log("error", typed=typed, type=type(exc).__name__, error=describe(exc))
        return
    with opened as receiver:
        # Its socket exists, and its ``ready`` is queued, from here on: the judge times
        # its presence from this, not from the fork, which a loaded machine runs late.
        log("open")
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                batch = receiver.receive(timeout=TIMEOUT)
            except rlwire.ReceiveTimeout:
                log("timeout", took=time.monotonic() - began)
                continue
            except rlwire.EndOfStream as exc:
                log("end", took=time.monotonic() - began, error=describe(exc))
                return
            except rlwire.RlwireError as exc:
                log(
                    "error",
                    typed=True,
                    type=type(exc).__name__,
                    error=describe(exc),
                    took=time.monotonic() - began,
                    next=receiver.next_step,
                )
                continue
            except Exception as exc:
                log("error", typed=False, type=type(exc).__name__, error=describe(exc))
                return
            took = time.monotonic() - began
            step = receiver.last_step
            assert step is not None
            ok = same(batch, payload(step, 0 if pattern == "shared" else rank, N))
            del batch
            log("got", step=step, ok=ok, took=took)
            time.sleep(work)  # training on it
        log("deadline")


# --------------------------------------------------------------------------------------
# A trial.


@dataclass
class Life:
    """One process of a trial: which role, which life (0 first, 1 restarted)."""

    role: str  # "sender" or "receiver"
    index: int  # the receiver's rank (or consumer number); 0 for the sender
    life: int
    start: int
    pid: int
    log: Path
    killed: bool = False
    started: float = 0.0
    ended: float | None = None
    reaped: bool = False

    def wait(self, until: float) -> bool:
        """Reap the process if it ends before ``until``; whether it did."""
        while not self.reaped and time.monotonic() < until:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            self.reaped = bool(done)
            if not done:
                time.sleep(0.005)
        return self.reaped

    def kill(self) -> None:
        """SIGKILL the process and reap it, unless it was reaped (its pid may be reused)."""
        if not self.reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.reaped = True

    def events(self) -> list[dict[str, Any]]:
        return read_log(self.log)


def _wait_for(path: Path, event: str, until: float) -> dict[str, Any] | None:
    while time.monotonic() < until:
        for e in read_log(path):
            if e["e"] == event:
                return e
            if e["e"] in ("error", "exit"):
                return None
        time.sleep(0.005)
    return None


def _wait_count(path: Path, event: str, count: int, until: float) -> bool:
    """Wait until ``path`` logs ``event`` ``count`` times (``True``), or the process
    exits or ``until`` passes first (``False``)."""
    while time.monotonic() < until:
        events = read_log(path)
        if sum(e["e"] == event for e in events) >= count:
            return True
        if any(e["e"] in ("exit", "end", "deadline") for e in events):
            return False
        time.sleep(0.001)
    return False


def run_trial(
    root: str,
    scenario: Scenario,
    tcp: bool,
    compression: str | None,
    at: int,
    seed: int,
) -> dict[str, Any]:
    """One trial: kill the victim just after its ``at``-th step (the sender: as it
    starts sending step ``at``, or after ``finish()`` when ``at == STEPS``; a receiver:
    once it returned ``at + 1`` steps), after a further random delay."""
    rng = random.Random(seed)
    work = rng.uniform(*WORK)
    directory = Path(tempfile.mkdtemp(dir=root))
    deadline = time.monotonic() + LIFETIME
    url = "zmq+tcp://127.0.0.1:0" if tcp else f"zmq+ipc://{directory}/s.sock"
    lives: list[Life] = []
    shared = scenario.pattern == "shared"
    notes: list[str] = []

    def start_sender(start: int, life: int) -> Life:
        path = directory / f"sender.{life}.log"
        pid = spawn(
            sender_main,
            *(path, url, scenario.pattern, scenario.receivers, start, compression, deadline),
        )
        got = Life("sender", 0, life, start, pid, path, started=time.monotonic())
        lives.append(got)
        return got

    def start_receiver(index: int, start: int, life: int) -> Life:
        path = directory / f"receiver{index}.{life}.log"
        rank = 0 if shared else index
        pid = spawn(receiver_main, path, url, scenario.pattern, rank, start, work, deadline)
        got = Life("receiver", index, life, start, pid, path, started=time.monotonic())
        lives.append(got)
        return got

    try:
        sender = start_sender(0, 0)
        opened = _wait_for(sender.log, "open", time.monotonic() + 3)
        if opened is None:
            return {"outcome": TYPED, "detail": f"the sender did not open: {sender.events()}"}
        url = opened["url"]
        receivers = [start_receiver(i, 0, 0) for i in range(scenario.receivers)]
        victim = sender if scenario.victim == "sender" else rng.choice(receivers)
        if victim.role == "sender":
            event, count = ("finished", 1) if at >= STEPS else ("sending", at + 1)
        else:
            event, count = "got", at + 1
        if not _wait_count(victim.log, event, count, time.monotonic() + 4):
            notes.append(f"the victim ended (or stalled) before its {event} #{count}")
        delay = rng.uniform(0, work)
        time.sleep(delay)
        victim.killed = True
        victim.kill()
        victim.ended = time.monotonic()
        pause = rng.uniform(0, 0.3)
        time.sleep(pause)
        before = victim.events()
        if victim.role == "sender":
            sent = [e["step"] for e in before if e["e"] == "sent"]
            start = 0 if scenario.restart == "naive" else (max(sent) + 1 if sent else 0)
            if any(e["e"] == "finished" for e in before):
                # Nobody restarts a finished stream from 0; it is reopened to end it.
                notes.append("the kill came after finish(): restarted to finish again")
                start = STEPS
            final = start_sender(start, 1)
        else:
            got = [e["step"] for e in before if e["e"] == "got"]
            start = max(got) + 1 if got else 0
            if any(e["e"] == "end" for e in before):
                notes.append("the kill came after the receiver's EndOfStream: not restarted")
            else:
                start_receiver(victim.index, start, 1)
            final = sender
        notes.insert(
            0,
            f"{'tcp' if tcp else 'ipc'}, compression {compression}, work {work * 1000:.0f} ms; "
            f"killed {victim.role} {victim.index} {delay * 1000:.0f} ms after its {event} "
            f"#{count}, restarted {pause * 1000:.0f} ms later at step {start}",
        )
        # The last sender ends on its own (finish, then its linger); then receivers
        # still connected must see the end soon.
        if not final.wait(deadline + 1):
            final.kill()
            notes.append("the last sender had not ended by the trial's deadline")
        final.ended = time.monotonic()
        for life in lives:
            if life.role == "receiver" and life.ended is None:
                if not life.wait(final.ended + END_GRACE):
                    life.kill()
                life.ended = time.monotonic()
        return judge(scenario, lives, notes)
    finally:
        for life in lives:
            life.kill()
        shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------------------
# The judgement.


class Verdict(Exception):
    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


#: Which problem a trial reports when it saw several: the worst.
SEVERITY = (UNTYPED, WRONG, HANG, HALF, TYPED)


def judge(scenario: Scenario, lives: list[Life], notes: list[str]) -> dict[str, Any]:
    problems: list[Verdict] = []
    expected = _judge(scenario, lives, notes, problems)
    if problems:
        problems.sort(key=lambda v: SEVERITY.index(v.outcome))
        details = " | ".join(f"{v.outcome}: {v.detail}" for v in problems[1:])
        also = f" (also {details})" if details else ""
        detail = f"{problems[0].detail}{also} [{'; '.join(notes)}]"
        return {"outcome": problems[0].outcome, "detail": detail}
    detail = "; ".join(notes)
    if expected:
        detail += "; expected typed errors: " + ", ".join(expected)
    return {"outcome": EXACT, "detail": detail}


def _judge(
    scenario: Scenario, lives: list[Life], notes: list[str], problems: list[Verdict]
) -> list[str]:
    """Add a :class:`Verdict` to ``problems`` for everything wrong; return the documented
    typed errors seen."""
    senders = [life for life in lives if life.role == "sender"]
    receivers = [life for life in lives if life.role == "receiver"]
    log = {id(life): life.events() for life in lives}
    expected: list[str] = []

    # The senders: only TransportError for a receiver that vanished is documented.
    for life in senders:
        for e in log[id(life)]:
            if e["e"] == "error":
                outcome = TYPED if e["typed"] else UNTYPED
                problems.append(Verdict(outcome, f"sender life {life.life}: {e['error']}"))
            elif e["e"] == "gave up":
                problems.append(
                    Verdict(HANG, f"sender life {life.life} gave up at step {e['next']}")
                )
            elif e["e"] == "send failed":
                if scenario.victim != "receiver":
                    problems.append(Verdict(TYPED, f"sender life {life.life}: {e['error']}"))
                expected.append(f"sender: TransportError at step {e['step']}")
    last = senders[-1]
    last_events = log[id(last)]
    finished = next((e for e in last_events if e["e"] == "finished"), None)
    if finished is None:
        problems.append(Verdict(HANG, f"the last sender did not finish: {last_events[-3:]}"))
        return expected
    old_sender = senders[0]
    old_tried = max((e["step"] for e in log[id(old_sender)] if e["e"] == "sending"), default=-1)
    restart = last.start
    # Steps a killed sender could have sent before it died (whatever its log says).
    died_with = range(restart, old_tried + 1) if scenario.victim == "sender" else range(0)
    # What the last sender sent after the restart (to every rank, or shared out).
    resent = sum(e["e"] == "sent" for e in last_events) if scenario.victim == "sender" else None

    returned: dict[int, list[tuple[int, int]]] = {}  # step -> [(receiver, life)]
    per_receiver: dict[int, list[int]] = {}
    for life in receivers:
        steps = per_receiver.setdefault(life.index, [])
        try:
            _judge_receiver(
                scenario,
                life,
                log[id(life)],
                steps,
                returned,
                expected,
                notes,
                finished["t"],
                resent,
            )
        except Verdict as v:
            problems.append(v)
    try:
        if scenario.pattern == "shared":
            _judge_shared(
                scenario, returned, per_receiver, died_with, finished["end"], notes, lives, log
            )
        else:
            _judge_ranks(
                scenario, per_receiver, died_with, restart, finished["end"], notes, lives, log
            )
    except Verdict as v:
        problems.append(v)
    return expected


def _judge_receiver(
    scenario: Scenario,
    life: Life,
    events: list[dict[str, Any]],
    steps: list[int],
    returned: dict[int, list[tuple[int, int]]],
    expected: list[str],
    notes: list[str],
    finished_at: float,
    resent: int | None,
) -> None:
    """Judge what one receiver life saw; ``steps`` holds what the receiver's earlier life
    returned, and gets this life's."""
    shared = scenario.pattern == "shared"
    who = f"receiver {life.index} life {life.life}"
    nxt = life.start  # the step the receiver expects next
    gap = False  # a StepGapError came just before
    behind = 0  # StepOrderErrors for a new session behind
    ended = False
    for e in events:
        took = e.get("took", 0.0)
        if took > TIMEOUT + SLACK:
            raise Verdict(HANG, f"{who}: receive(timeout={TIMEOUT}) took {took:.1f} s")
        kind = e["e"]
        if kind == "got":
            step = e["step"]
            if not e["ok"]:
                raise Verdict(WRONG, f"{who}: step {step} is not the payload sent")
            if steps and step <= steps[-1]:
                raise Verdict(WRONG, f"{who}: step {step} returned after step {steps[-1]}")
            if step < nxt:
                raise Verdict(WRONG, f"{who}: step {step} returned, expecting {nxt}")
            if step > nxt and not shared and not gap:
                raise Verdict(HALF, f"{who}: step {step} after {nxt - 1}, no StepGapError")
            returned.setdefault(step, []).append((life.index, life.life))
            steps.append(step)
            nxt, gap = step + 1, False
        elif kind == "error":
            if not e["typed"]:
                raise Verdict(UNTYPED, f"{who}: {e['error']}")
            name, text = e["type"], e["error"]
            if name == "StepGapError" and not shared:
                gap = True
                expected.append(f"{who}: {text[:160]}")
            elif name == "StepOrderError" and "new sender session" in text:
                # One, for a sender restarted behind this receiver.
                behind += 1
                if scenario.victim != "sender" or behind > 1:
                    raise Verdict(TYPED, f"{who}: StepOrderError #{behind}: {text}")
                expected.append(f"{who}: {text[:160]}")
            else:
                # In the shared pattern a StepGapError is a sequence number skipped within
                # a session: a message lost while both ends lived.
                raise Verdict(TYPED, f"{who}: {text}")
        elif kind == "end":
            ended = True
    if life.killed or ended:
        return
    # (A receiver whose open failed logged the error, judged above.)
    opened = next((e["t"] for e in events if e["e"] == "open"), float("inf"))
    # A receiver announces itself on connecting and every second without news; one whose
    # receiver opened after the last sender finished (give or take its connection) and
    # got nothing from it may have had nobody to hear the end from. Timed from its own
    # open, not from its fork: a forked process opens its first receiver 0.1-0.5 s after
    # the fork on a loaded machine (its imports), and a receiver restarted before the
    # sender finished may open after the sender closed and find nobody there.
    if opened > finished_at - 0.05 and not any(e["e"] == "got" for e in events):
        late = "never" if opened == float("inf") else f"{opened - finished_at:+.2f} s"
        notes.append(f"{who} opened {late} from the sender's finish(): no end to hear")
        return
    after = "" if resent is None else f"; the restarted sender sent {resent} step(s) before"
    raise Verdict(
        HALF,
        f"end never seen: {who}, open {finished_at - opened:.2f} s before the last "
        f"sender's finish(), saw no EndOfStream within {END_GRACE:.0f} s of its close (it "
        f"would wait forever); its last step {steps[-1] if steps else None}, last events "
        f"{[ev['e'] for ev in events[-3:]]}{after}",
    )


def _judge_ranks(
    scenario: Scenario,
    per_receiver: dict[int, list[int]],
    died_with: range,
    restart: int,
    end: int,
    notes: list[str],
    lives: list[Life],
    log: dict[int, list[dict[str, Any]]],
) -> None:
    """Every rank must have the last steps: after the restart, nothing is lost."""
    for index, steps in per_receiver.items():
        missing = sorted(set(range(end)) - set(steps))
        if not missing:
            continue
        if scenario.victim == "sender":
            # Lost with the killed sender: what it had sent (its send returned, but
            # ZeroMQ had not written everything), below the step the new one starts at.
            bad = [s for s in missing if s >= restart]
            if bad:
                raise Verdict(HALF, f"rank {index} never got steps {bad} (restart at {restart})")
            notes.append(f"rank {index} lost steps {missing} with the killed sender")
        else:
            # Lost with the killed receiver: steps sent to it before its new life
            # announced itself. Its new life must then have every later step.
            mine = [life for life in lives if life.role == "receiver" and life.index == index]
            new = mine[-1]
            got = [e["step"] for e in log[id(new)] if e["e"] == "got"]
            if len(mine) == 1:
                raise Verdict(HALF, f"rank {index} (not killed) never got steps {missing}")
            first = got[0] if got else end
            bad = [s for s in missing if s >= first]
            if bad:
                raise Verdict(HALF, f"rank {index} never got steps {bad}")
            notes.append(f"rank {index} lost steps {missing} with its killed receiver")


def _judge_shared(
    scenario: Scenario,
    returned: dict[int, list[tuple[int, int]]],
    per_receiver: dict[int, list[int]],
    died_with: range,
    end: int,
    notes: list[str],
    lives: list[Life],
    log: dict[int, list[dict[str, Any]]],
) -> None:
    """Each step once across the consumers, but for the steps both sender lives sent; the
    steps lost only those a dead process could have held."""
    for step, where in sorted(returned.items()):
        if len(where) > 1:
            if step not in died_with:
                raise Verdict(WRONG, f"step {step} returned by {where}")
            notes.append(f"step {step} returned by {where}, sent by both sender lives")
    missing = sorted(set(range(end)) - set(returned))
    if not missing:
        return
    if scenario.victim == "sender":
        # Sent by the killed sender, then lost with it; the new one (a new session,
        # whose sequence starts again) sends what each consumer has not passed.
        # Resumed, it sends every step from its start to consumers all below it; from 0,
        # the steps some consumer passed may land on it and be discarded.
        limit = died_with.stop if scenario.restart == "naive" else died_with.start
        bad = [s for s in missing if s >= limit]
        if bad:
            raise Verdict(HALF, f"steps {bad} returned by no consumer (restart at {died_with})")
        notes.append(f"steps {missing} lost with the killed sender")
        return
    victim = next(life for life in lives if life.killed)
    restarted = next(
        life
        for life in lives
        if life.role == "receiver" and life.index == victim.index and life.life == 1
    )
    # A killed consumer takes the steps queued for it: sent before it died. The sender
    # logs a step once ZeroMQ let go of it, so a step lost that way was logged as sent
    # before the new life began (give or take the sender noticing the death).
    sender = next(life for life in lives if life.role == "sender")
    sent_at = {e["step"]: e["t"] for e in log[id(sender)] if e["e"] == "sent"}
    bad = [s for s in missing if sent_at.get(s, float("inf")) > restarted.started]
    if bad:
        raise Verdict(
            HALF,
            f"steps {bad} returned by no consumer, sent after the killed consumer's new life "
            f"began (all missing: {missing})",
        )
    notes.append(f"steps {missing} lost with the killed consumer's queue")


# --------------------------------------------------------------------------------------


def jobs(root: str, total: int, seed: int) -> Iterator[Job]:
    """``total`` trials: the scenarios in turn, each with a seeded kill moment, restart
    pause, transport and compression."""
    rng = random.Random(seed)
    for i in range(total):
        if i < 2 * len(SCENARIOS):
            scenario = SCENARIOS[i % len(SCENARIOS)]
        else:
            scenario = rng.choice(SCENARIOS)
        tcp = rng.random() < 0.3
        compression = rng.choice((None, None, "lz4"))
        trial_seed = rng.randrange(1 << 30) ^ (seed * 1_000_003 + i)
        if scenario.victim == "sender":
            # Now and then after finish(): the stream ended, the close still lingering.
            at = STEPS if rng.random() < 0.1 else rng.randrange(STEPS)
            when = "after finish()" if at == STEPS else f"sending step {at}"
        else:
            at = rng.randrange(
                STEPS // scenario.receivers if scenario.pattern == "shared" else STEPS
            )
            when = f"after receiving {at + 1} step(s)"
        what = f"{scenario.describe()}, {when}, {'tcp' if tcp else 'ipc'}, trial {i}"
        yield Job(
            run_trial,
            (root, scenario, tcp, compression, at, trial_seed),
            timeout=LIFETIME + END_GRACE + 8,
            tag=(CAMPAIGN, what),
        )
