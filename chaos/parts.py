"""kill -9 of a producer filling steps part by part, then resumed: every key exactly once.

Each trial has a plan, drawn from the seed: 1 to 3 ranks, 2 to 4 steps, each filled part
by part (sometimes one sent whole), 3 to 12 groups per step of 1 to 4 samples of random
length (8 to 3,000 tokens), each group under a key (strings, integers, sometimes ``7``
beside ``"7"``), sometimes forced to a rank (``rank=``), else placed by
``balance="cost"`` (or ``"count"``, with a group count the ranks divide); compression
none, lz4 or zstd; sometimes the ``routed_experts`` sidecar; on files sometimes
``fsync``; ``finish()`` at the end, half the time. A group's samples are a function of
its step and key, so any process can rebuild them.

The producer runs in a process forked from the trial's child and opens its sender with
``on_existing="resume"``; for each step of the plan from ``sender.next_step`` on, it
opens the step, puts every group of it (a ``put`` that returns True was committed by an
earlier run) and leaves the block (the seal). It reports each event (a step opened and
the keys it resumed, a put and whether it was skipped, a seal and its assignment) on a
pipe, one JSON line each. One or two producers are killed with SIGKILL:

- **after a delay**: the trial's child kills the producer a random delay (0-20 ms on
  files, 0-150 ms on S3) after it reported its k-th put (k random; 0: from the fork);
- **at a store call**: after its k-th put the producer hooks its store calls (the ``os``
  calls of :func:`chaos.kills.install_hooks` on files; every S3 request of
  :func:`chaos.s3chaos.install_hooks`, before or after it) and kills itself at the m-th
  (m from 1 to 12, or 1 to 5 on S3): inside a part's commit, the seal's, the end mark's,
  or the resume's own clean-up.

A last producer, not killed, finishes the plan. Then the trial is judged:

- **what the producers said**: every key a killed producer's ``put`` returned for must
  be among the keys the next producer resumed for that step (else *lost*); a resumed
  key must be one of the step's (else *wrong data*); a resumed producer must skip
  exactly the resumed keys, start at the step after the last seal, and not fail (a
  typed error is one, here);
- **what the store holds**: for each step, a seal for the plan's ranks whose keys
  are every key of the step once (*lost*, *duplicated*, else *wrong seal*), with each
  key's cost (its tokens) and each forced key on its rank (*wrong seal*), the seal the
  last producer reported; a main file for exactly the parts the seal lists, no sidecar
  without its main file, no temporary file (*half-visible*);
- **what receivers read**: for every rank, ``parts()`` must yield the seal's keys of
  that rank in its order, with that rank and index, each bit-exact (a key twice is
  *duplicated*, one missing *lost*, a typed error reading one *half-visible*, other
  bits *wrong data*, other keys than the seal's *wrong seal*); ``receive()`` must
  return the rank's samples of all its parts in the seal's order; with ``finish()``, a
  receiver after the last step must get ``EndOfStream``.

On S3 (the moto server of :func:`chaos.s3chaos.server`) every trial writes under a fresh
prefix, deleted once judged.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import select
import shutil
import signal
import tempfile
import time
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

import rlwire
from rlwire.testing import make_sample
from rlwire.transport._stored.names import LEFTOVER_RE, SEAL_RE, STEP_PART_RE, TEMP_RE
from rlwire.transport._stored.parts import parse_seal, seal_bytes

from . import kills, s3chaos
from ._model import (
    DUPLICATED,
    EXACT,
    HALF,
    HANG,
    LOST,
    TYPED,
    UNTYPED,
    WRONG,
    WRONG_SEAL,
    describe,
    same,
)
from ._proc import Job, reap

__all__ = ["CAMPAIGN", "Ledger", "Store", "Verdict", "jobs", "parse_seal", "seal_bytes", "trial"]

CAMPAIGN = {"files": "parts kill -9 (files)", "s3": "parts kill -9 (S3)"}
#: The longest a trial may take (its producers, the judging, the S3 clean-up).
TIMEOUT = {"files": 90.0, "s3": 180.0}
#: The longest delay after a reported put before a kill, by store.
DELAY = {"files": 0.020, "s3": 0.150}
#: The most store calls after a reported put before a kill at a call, by store.
CALLS = {"files": 12, "s3": 5}


class Verdict(Exception):
    """A bad outcome found while judging: ``outcome`` and what was seen."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


# ------------------------------------------------------------------------------ plans


def make_plan(rng: random.Random, store: str) -> dict[str, Any]:
    """A random trial plan (JSON-able)."""
    ranks = rng.choice((1, 2, 2, 3))
    n_steps = rng.randint(2, 4)
    balance = "count" if ranks > 1 and rng.random() < 0.25 else "cost"
    whole = rng.randrange(n_steps) if rng.random() < 0.2 else -1
    steps = draw_steps(rng, ranks, balance, n_steps, whole)
    return {
        "ranks": ranks,
        "balance": balance,
        "compression": rng.choice((None, "lz4", "zstd")),
        "sidecar": rng.random() < 0.5,
        "fsync": store == "files" and rng.random() < 0.3,
        "finish": rng.random() < 0.5,
        "steps": steps,
    }


def draw_steps(
    rng: random.Random, ranks: int, balance: str, n_steps: int, whole: int
) -> list[dict[str, Any]]:
    """The steps of a plan (step ``whole`` sent whole; -1: none)."""
    steps = []
    for step in range(n_steps):
        if step == whole:
            steps.append({"whole": True, "groups": []})
            continue
        count = rng.randint(3, 12)
        if balance == "count":
            count = max(ranks, count - count % ranks)
        keys: list[str | int] = []
        kind = rng.choice(("str", "int", "mixed"))
        for i in range(count):
            if kind == "str" or (kind == "mixed" and i % 2):
                keys.append(f"rollout-{step}-{rng.randrange(10**6)}-{i}")
            else:
                keys.append(rng.randrange(-(2**40), 2**40) if i else 7)
        if kind == "mixed" and count > 1:
            keys[1] = "7"  # beside the integer 7: another key
        groups = []
        for key in keys:
            sizes = [
                int(math.exp(rng.uniform(math.log(8), math.log(3000))))
                for _ in range(rng.randint(1, 4))
            ]
            forced = rng.randrange(ranks) if balance == "cost" and rng.random() < 0.2 else None
            groups.append([key, sizes, forced])
        steps.append({"whole": False, "groups": groups})
    return steps


def puts_of(plan: dict[str, Any]) -> int:
    return sum(len(s["groups"]) for s in plan["steps"])


def samples(step: int, key: Any, sizes: list[int], run: int = 0) -> list[rlwire.TrainingSample]:
    """The samples of the group ``key`` of ``step``: the same arguments, the same bits
    (``run``: a producer restarted with ``overwrite`` or ``truncate`` sends other bits)."""
    seed = zlib.crc32(f"{step}:{type(key).__name__}:{key}{f':{run}' if run else ''}".encode())
    return [make_sample(n, seed=seed + i) for i, n in enumerate(sizes)]


def whole_batch(step: int, rank: int, run: int = 0) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=samples(step, f"whole-{rank}", [40, 300], run))


def _typed(key: Any) -> tuple[str, Any]:
    return (type(key).__name__, key)


def _show(keys: Any) -> str:
    return ", ".join(repr(k) for k in list(keys)[:6]) + (" ..." if len(list(keys)) > 6 else "")


# --------------------------------------------------------------------------- producing


def _sender_options(store: str, plan: dict[str, Any], endpoint: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"compression": plan["compression"]}
    # The readers campaign's rewrites: a producer restarted with overwrite or truncate.
    options["on_existing"] = plan.get("on_existing", "resume")
    if plan.get("start_step") is not None:
        options["start_step"] = plan["start_step"]
    if plan["sidecar"]:
        options["sidecar"] = ("routed_experts",)
    options.update(plan.get("retention", {}))  # the readers campaign's
    if store == "files":
        options["fsync"] = plan["fsync"]
    else:
        options["storage_options"] = endpoint
    return options


async def _produce(
    dest: str, options: dict[str, Any], plan: dict[str, Any], emit: Any, after_put: Any
) -> None:
    """Fill the plan's steps from where the store stands (``on_existing="resume"``)."""
    ranks, run = plan["ranks"], plan.get("run", 0)
    async with rlwire.open_sender(dest, **options) as sender:
        emit({"e": "start", "next": sender.next_step})
        for step, spec in enumerate(plan["steps"]):
            if step < sender.next_step:
                continue
            if spec["whole"]:
                got = await sender.send_ranks([whole_batch(step, r, run) for r in range(ranks)])
                emit({"e": "sent", "step": got})
                continue
            async with sender.open_step(ranks=ranks, balance=plan["balance"]) as writer:
                emit(
                    {"e": "open", "step": writer.step, "resumed": sorted(writer.resumed, key=repr)}
                )
                for key, sizes, forced in spec["groups"]:
                    skipped = await writer.put(samples(step, key, sizes, run), key=key, rank=forced)
                    emit({"e": "put", "step": step, "key": key, "skipped": skipped})
                    after_put()
            emit({"e": "sealed", "step": writer.step, "keys": writer.assignment})
        if plan["finish"]:
            await sender.finish()
    emit({"e": "done"})


def _producer(
    store: str, dest: str, endpoint: Any, plan: dict[str, Any], kill: dict[str, Any] | None, w: int
) -> None:
    """The body of a forked producer: report events on ``w``; kill itself at a store call
    if ``kill`` says so."""
    puts = [0]
    write = os.write  # not the hooked one: reports are not store calls

    def emit(event: dict[str, Any]) -> None:
        write(w, (json.dumps(event) + "\n").encode())

    def said(call: str) -> None:
        emit({"e": "kill", "call": call})

    def hook() -> None:
        assert kill is not None
        if store == "files":
            kills.install_hooks(kill["at"], said)
        else:
            s3chaos.install_hooks(kill["at"], kill["after_call"], said)

    def after_put() -> None:
        puts[0] += 1
        if kill is not None and kill["how"] == "call" and puts[0] == kill["after"]:
            hook()

    code = 0
    try:
        if kill is not None and kill["how"] == "call" and kill["after"] == 0:
            hook()
        options = _sender_options(store, plan, endpoint)
        anyio.run(_produce, dest, options, plan, emit, after_put)
    except BaseException as exc:
        code = 3 if isinstance(exc, rlwire.RlwireError) else 4
        with contextlib.suppress(OSError):
            emit({"e": "error", "detail": describe(exc) + "\n" + traceback.format_exc()[-800:]})
    finally:
        os._exit(code)


def run_producer(
    store: str, dest: str, endpoint: Any, plan: dict[str, Any], kill: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], bool]:
    """Run one producer in a forked process, killed as ``kill`` says (None: not killed);
    its events, and whether a SIGKILL ended it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the producer
        os.close(r)
        _producer(store, dest, endpoint, plan, kill, w)
    os.close(w)
    buffer = b""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + TIMEOUT[store] / 3
    kill_at: float | None = None
    if kill is not None and kill["how"] == "delay" and kill["after"] == 0:
        kill_at = time.monotonic() + kill["delay"]
    try:
        while True:
            now = time.monotonic()
            if kill_at is not None and now >= kill_at:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                kill_at = math.inf
            if now > deadline:
                raise Verdict(HANG, f"a producer did not end in {TIMEOUT[store] / 3:.0f} s")
            wait = min(0.05, max(0.0, (kill_at or now + 0.05) - now))
            ready, _, _ = select.select([r], [], [], wait)
            if not ready:
                continue
            data = os.read(r, 65536)
            if not data:
                break
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line)
                events.append(event)
                if (
                    kill is not None
                    and kill["how"] == "delay"
                    and kill_at is None
                    and event["e"] == "put"
                    and sum(e["e"] == "put" for e in events) == kill["after"]
                ):
                    kill_at = time.monotonic() + kill["delay"]
    finally:
        os.close(r)
        status = reap(pid, 30)
    if status is None:
        raise Verdict(HANG, "a producer did not exit")
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    failed = [e for e in events if e["e"] == "error"]
    if failed:
        outcome = TYPED if os.WEXITSTATUS(status) == 3 else UNTYPED
        raise Verdict(outcome, f"a producer failed: {failed[0]['detail']}")
    if not killed and not any(e["e"] == "done" for e in events):
        raise Verdict(UNTYPED, f"a producer ended with status {status} before its end")
    return events, killed


# -------------------------------------------------------------------------- the ledger


class Ledger:
    """What the producers said, checked run after run."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.committed: dict[int, set[tuple[str, Any]]] = {}  # reported put, not sealed
        self.sealed: dict[int, list[list[Any]]] = {}
        self.sent: set[int] = set()
        self.unreported: set[int] = set()  # done by a killed run that never said so

    def keys(self, step: int) -> set[tuple[str, Any]]:
        return {_typed(g[0]) for g in self.plan["steps"][step]["groups"]}

    def take(self, events: list[dict[str, Any]], run: int) -> None:
        done_steps = set(self.sealed) | self.sent | self.unreported
        first_open = min(
            (s for s in range(len(self.plan["steps"])) if s not in done_steps), default=None
        )
        resumed: set[tuple[str, Any]] = set()
        for event in events:
            kind = event["e"]
            if kind == "start":
                # A producer killed between a seal (or a whole send) and its report of
                # it left one step more done than it said.
                expected = len(self.plan["steps"]) if first_open is None else first_open
                if event["next"] not in (expected, expected + 1):
                    raise Verdict(
                        WRONG, f"run {run} resumed at step {event['next']}, not {expected}"
                    )
                if first_open is not None and event["next"] == expected + 1:
                    # That step is done: later runs must not be expected to resume at it.
                    self.unreported.add(expected)
                    self.committed.pop(expected, None)
            elif kind == "open":
                step = event["step"]
                resumed = {_typed(k) for k in event["resumed"]}
                if not resumed <= self.keys(step):
                    raise Verdict(
                        WRONG,
                        f"run {run} resumed keys {_show(k for _, k in resumed - self.keys(step))} "
                        f"that step {step} does not have",
                    )
                missing = self.committed.get(step, set()) - resumed
                if missing:
                    raise Verdict(
                        LOST,
                        f"run {run}: keys {_show(k for _, k in missing)} of step {step} "
                        "were put by a killed run, but not found on resuming",
                    )
            elif kind == "put":
                step, key = event["step"], _typed(event["key"])
                if event["skipped"] != (key in resumed):
                    raise Verdict(
                        DUPLICATED if not event["skipped"] else LOST,
                        f"run {run}: put of {event['key']!r} (step {step}) returned "
                        f"{event['skipped']}, but the key was {'' if key in resumed else 'not '}"
                        "resumed",
                    )
                if not event["skipped"]:
                    self.committed.setdefault(step, set()).add(key)
            elif kind == "sealed":
                self.sealed[event["step"]] = event["keys"]
                self.committed.pop(event["step"], None)
            elif kind == "sent":
                self.sent.add(event["step"])


# ------------------------------------------------------------------------------ stores


class Store:
    """A trial's destination: a directory, or a fresh prefix of the S3 bucket."""

    def __init__(self, kind: str, root: str, endpoint: Any) -> None:
        self.kind = kind
        self.endpoint = endpoint
        if kind == "files":
            self.dest = tempfile.mkdtemp(dir=root)
        else:
            self.dest = s3chaos._prepare(endpoint)

    def names(self) -> list[str]:
        if self.kind == "files":
            return sorted(os.listdir(self.dest))
        return sorted(s3chaos._names(s3chaos._client(self.endpoint), self.dest))

    def read(self, name: str) -> bytes:
        if self.kind == "files":
            return (Path(self.dest) / name).read_bytes()
        key = s3chaos._prefix(self.dest) + name
        got = s3chaos._client(self.endpoint).get_object(Bucket=s3chaos.BUCKET, Key=key)
        return bytes(got["Body"].read())

    def receiver_options(self) -> dict[str, Any]:
        return {} if self.kind == "files" else {"storage_options": self.endpoint}

    def clean(self) -> None:
        if self.kind == "files":
            shutil.rmtree(self.dest, ignore_errors=True)
        else:
            s3chaos._clean(self.endpoint, self.dest)


# ----------------------------------------------------------------------------- judging


def check_store(store: Store, plan: dict[str, Any], ledger: Ledger) -> dict[int, Any]:
    """The listing and the seals; the seal of each step filled part by part."""
    names = store.names()
    left = [n for n in names if TEMP_RE.fullmatch(n) or LEFTOVER_RE.fullmatch(n)]
    if left:
        raise Verdict(HALF, f"temporary files left after the last producer closed: {left[:4]}")
    mains: dict[int, set[tuple[int, int]]] = {}
    sidecars: dict[int, set[tuple[int, int]]] = {}
    for name in names:
        m = STEP_PART_RE.fullmatch(name)
        if m:
            into = sidecars if m.group(4) else mains
            into.setdefault(int(m.group(1)), set()).add((int(m.group(2)), int(m.group(3))))
    seals = {}
    for step, spec in enumerate(plan["steps"]):
        if spec["whole"]:
            if step in mains or step in sidecars or f"step-{step:08d}.seal.rlw" in names:
                raise Verdict(HALF, f"step {step}, sent whole, has parts or a seal")
            continue
        name = f"step-{step:08d}.seal.rlw"
        if name not in names:
            raise Verdict(LOST, f"step {step} has no seal after the last producer")
        try:
            seal = parse_seal(store.read(name), step=step, where=name)
        except rlwire.RlwireError as exc:
            raise Verdict(WRONG_SEAL, f"step {step}'s seal: {describe(exc)}") from exc
        reported = ledger.sealed.get(step)
        if reported is not None and [list(k) for k in seal.keys] != [list(k) for k in reported]:
            raise Verdict(
                WRONG_SEAL,
                f"step {step}'s seal lists {seal.keys}, its producer sealed "
                f"{ledger.sealed.get(step)}",
            )
        if seal.ranks != plan["ranks"]:
            raise Verdict(WRONG_SEAL, f"step {step}'s seal has {seal.ranks} ranks")
        listed = [_typed(k) for keys in seal.keys for k in keys]
        want = ledger.keys(step)
        if len(set(listed)) != len(listed) or not set(listed) <= want:
            raise Verdict(
                DUPLICATED, f"step {step}'s seal lists keys twice or unknown: {seal.keys}"
            )
        if set(listed) != want:
            raise Verdict(
                LOST, f"step {step}'s seal lacks {_show(k for _, k in want - set(listed))}"
            )
        groups = {_typed(g[0]): g for g in spec["groups"]}
        for rank, (keys, costs) in enumerate(zip(seal.keys, seal.costs, strict=True)):
            for key, cost in zip(keys, costs, strict=True):
                _, sizes, forced = groups[_typed(key)]
                if cost != float(sum(sizes)):
                    raise Verdict(
                        WRONG_SEAL, f"step {step} key {key!r}: cost {cost}, not {sum(sizes)}"
                    )
                if forced is not None and forced != rank:
                    raise Verdict(
                        WRONG_SEAL, f"step {step} key {key!r} forced to {forced}, on {rank}"
                    )
        places = {(r, i) for r, keys in enumerate(seal.keys) for i in range(len(keys))}
        if mains.get(step, set()) != places:
            extra = sorted(mains.get(step, set()) - places)
            if extra:
                raise Verdict(HALF, f"step {step}: part files {extra} beyond its seal")
            raise Verdict(
                LOST, f"step {step}: parts {sorted(places - mains.get(step, set()))} gone"
            )
        orphans = sidecars.get(step, set()) - mains.get(step, set())
        if orphans:
            raise Verdict(HALF, f"step {step}: sidecars {sorted(orphans)} without a main file")
        seals[step] = seal
    extra_steps = sorted(
        {int(m.group(1)) for n in names if (m := STEP_PART_RE.fullmatch(n) or SEAL_RE.fullmatch(n))}
        - set(range(len(plan["steps"])))
    )
    if extra_steps:
        raise Verdict(WRONG, f"steps {extra_steps} beyond the plan are stored")
    return seals


def check_reads(store: Store, plan: dict[str, Any], seals: dict[int, Any]) -> None:
    """Every rank reads every step with ``parts()`` and with ``receive()``."""
    options = store.receiver_options()
    n_steps = len(plan["steps"])
    for rank in range(plan["ranks"]):
        with (
            rlwire.open_receiver(
                store.dest, rank=rank, start_step=0, record_consumed=False, **options
            ) as by_parts,
            rlwire.open_receiver(
                store.dest, rank=rank, start_step=0, record_consumed=False, **options
            ) as whole,
        ):
            for step, spec in enumerate(plan["steps"]):
                _check_parts(by_parts, step, rank, spec, seals.get(step))
                _check_receive(whole, step, rank, spec, seals.get(step))
            if plan["finish"]:
                for receiver in (by_parts, whole):
                    try:
                        receiver.receive(timeout=1)
                    except rlwire.EndOfStream:
                        continue
                    except rlwire.RlwireError as exc:
                        raise Verdict(WRONG, f"rank {rank} after the end: {describe(exc)}") from exc
                    raise Verdict(WRONG, f"rank {rank} got step {n_steps} after the end")


def _check_parts(receiver: Any, step: int, rank: int, spec: dict[str, Any], seal: Any) -> None:
    groups = {_typed(g[0]): g for g in spec["groups"]}
    got: list[Any] = []
    try:
        for part in receiver.parts(timeout=10):
            where = f"step {step} rank {rank} part {len(got)}"
            if part.step != step or part.rank != rank or part.index != len(got):
                raise Verdict(
                    WRONG, f"{where}: says step {part.step} rank {part.rank} index {part.index}"
                )
            if spec["whole"]:
                expected = whole_batch(step, rank)
                if part.key is not None or not same(part.value, expected):
                    raise Verdict(WRONG, f"{where}: not the step sent whole (key {part.key!r})")
            else:
                typed = _typed(part.key)
                if typed in {_typed(k) for k in got}:
                    raise Verdict(DUPLICATED, f"{where}: key {part.key!r} read twice")
                if typed not in groups:
                    raise Verdict(WRONG, f"{where}: key {part.key!r} is not one of the step's")
                expected = rlwire.TrainingBatch(samples=samples(step, *groups[typed][:2]))
                if not same(part.value, expected):
                    raise Verdict(WRONG, f"{where}: key {part.key!r} holds other bits")
            got.append(part.key)
    except rlwire.ReceiveTimeout as exc:
        raise Verdict(LOST, f"step {step} rank {rank}: parts() waited after {got}") from exc
    except rlwire.RlwireError as exc:
        raise Verdict(HALF, f"step {step} rank {rank} after parts {got}: {describe(exc)}") from exc
    if spec["whole"]:
        if len(got) != 1:
            raise Verdict(WRONG, f"step {step} rank {rank}: {len(got)} parts of a whole step")
        return
    if [_typed(k) for k in got] != [_typed(k) for k in seal.keys[rank]]:
        raise Verdict(
            WRONG_SEAL, f"step {step} rank {rank} read {got}, the seal says {seal.keys[rank]}"
        )


def _check_receive(receiver: Any, step: int, rank: int, spec: dict[str, Any], seal: Any) -> None:
    try:
        got = receiver.receive(timeout=10)
    except rlwire.ReceiveTimeout as exc:
        raise Verdict(LOST, f"step {step} rank {rank}: receive() timed out") from exc
    except rlwire.RlwireError as exc:
        raise Verdict(HALF, f"step {step} rank {rank}: receive(): {describe(exc)}") from exc
    if spec["whole"]:
        expected = whole_batch(step, rank)
    else:
        groups = {_typed(g[0]): g for g in spec["groups"]}
        expected = rlwire.TrainingBatch(
            samples=[s for key in seal.keys[rank] for s in samples(step, *groups[_typed(key)][:2])]
        )
    if not same(got, expected):
        raise Verdict(WRONG, f"step {step} rank {rank}: receive() gave other samples")


# ------------------------------------------------------------------------------ a trial


def _where(events: list[dict[str, Any]], puts: int) -> str:
    """Where a producer was when it was killed, from what it said last."""
    said = [e for e in events if e["e"] != "kill"]
    last = said[-1] if said else {"e": "nothing"}
    text = " ".join(f"{k}={v}" for k, v in last.items() if k not in ("resumed", "keys"))
    call = [e["call"] for e in events if e["e"] == "kill"]
    return f"after {puts} puts (last said: {text})" + (f" at {call[0]}" if call else "")


def kill_point(events: list[dict[str, Any]]) -> str:
    """Where a killed producer died, as a class: the store call (by the file or object
    it was about), or, for a kill after a delay, what it had reported last."""
    calls = [e["call"] for e in events if e["e"] == "kill"]
    if calls:
        call = calls[0]
        if "seal" in call:
            what = "the seal"
        elif "part-" in call:
            what = "a part's sidecar" if "sidecar" in call else "a part's main file"
        elif "end.rlw" in call:
            what = "the end mark"
        elif "rank-" in call:
            what = "a whole step"
        else:
            what = f"other ({call.split()[0 if call.split()[0] not in ('before', 'after') else 1]})"
        return f"call: {what}"
    said = [e["e"] for e in events if e["e"] != "kill"]
    return f"delay: after {said[-1] if said else 'nothing'}"


def trial(
    store_kind: str,
    root: str,
    endpoint: Any,
    plan: dict[str, Any],
    plan_kills: list[dict[str, Any]],
) -> dict[str, Any]:
    """Run the plan's producers (each of ``plan_kills`` killed, then one to the end) and
    judge the store."""
    store = Store(store_kind, root, endpoint)
    ledger = Ledger(plan)
    landed = 0
    what: list[str] = []
    points: list[str] = []
    try:
        try:
            for run, kill in enumerate([*plan_kills, None]):
                kill = _at_put(kill, plan, ledger)
                events, killed = run_producer(store_kind, store.dest, endpoint, plan, kill)
                ledger.take(events, run)
                landed += killed
                if killed:
                    points.append(kill_point(events))
                if kill is not None:
                    puts = sum(e["e"] == "put" for e in events)
                    last = events[-1] if events else {"e": "nothing"}
                    said = " ".join(
                        f"{k}={v}" for k, v in last.items() if k not in ("resumed", "keys")
                    )
                    state = "killed" if killed else "not killed"
                    what.append(f"{state} after {puts} puts (last said: {said})")
                elif killed:
                    raise Verdict(UNTYPED, "the last producer was killed")
            seals = check_store(store, plan, ledger)
            check_reads(store, plan, seals)
        except Verdict as verdict:
            return {
                "outcome": verdict.outcome,
                "detail": f"{'; '.join(what)}: {verdict.detail}",
                "kills": landed,
                "points": points,
            }
        except rlwire.RlwireError as exc:
            return {"outcome": TYPED, "detail": describe(exc), "kills": landed, "points": points}
        except Exception as exc:
            return {
                "outcome": UNTYPED,
                "detail": describe(exc) + "\n" + traceback.format_exc()[-800:],
                "kills": landed,
                "points": points,
            }
        keys = puts_of(plan)
        return {
            "outcome": EXACT,
            "detail": f"{'; '.join(what)}; {keys} keys once",
            "kills": landed,
            "points": points,
        }
    finally:
        store.clean()


def _kill_plan(rng: random.Random, store: str) -> dict[str, Any]:
    """A kill: after the put at ``share`` of the producer's puts (0: from its start),
    then after a delay or at a store call."""
    share = 0.0 if rng.random() < 0.08 else rng.random()
    if rng.random() < 0.5:
        return {"how": "delay", "share": share, "delay": rng.uniform(0, DELAY[store])}
    return {
        "how": "call",
        "share": share,
        "at": rng.randint(1, CALLS[store]),
        "after_call": store == "s3" and rng.random() < 0.5,
    }


def _at_put(kill: dict[str, Any] | None, plan: dict[str, Any], ledger: Ledger) -> Any:
    """``kill`` with the put it follows (``after``) counted among the puts a producer
    started now makes: those of the steps from the first one not done."""
    if kill is None:
        return None
    done = set(ledger.sealed) | ledger.sent
    left = sum(len(spec["groups"]) for step, spec in enumerate(plan["steps"]) if step not in done)
    return {**kill, "after": math.floor(kill["share"] * left)}


def _describe(plan: dict[str, Any], plan_kills: list[dict[str, Any]]) -> str:
    steps = "/".join("whole" if s["whole"] else str(len(s["groups"])) for s in plan["steps"])
    how = []
    for k in plan_kills:
        if k["how"] == "delay":
            how.append(f"kill {k['delay'] * 1000:.1f} ms after {k['share']:.0%} of the puts")
        else:
            when = "after" if k.get("after_call") else "at"
            how.append(f"kill {when} call {k['at']} after {k['share']:.0%} of the puts")
    return (
        f"{plan['ranks']} rank(s) {plan['balance']} {plan['compression']} "
        f"sidecar={plan['sidecar']} fsync={plan['fsync']} finish={plan['finish']} "
        f"groups {steps}; {', '.join(how)}"
    )


def jobs(root: str, store: str, kills_total: int, seed: int, endpoint: Any = None) -> Iterator[Job]:
    """Trials on ``store`` ("files" or "s3") until ``kills_total`` kills are planned: one
    kill per trial, or two (the resumed producer killed too) in a third of them."""
    rng = random.Random(f"parts-{store}-{seed}")
    planned = 0
    while planned < kills_total:
        plan = make_plan(rng, store)
        count = min(kills_total - planned, 2 if rng.random() < 0.33 else 1)
        plan_kills = [_kill_plan(rng, store) for _ in range(count)]
        planned += count
        yield Job(
            trial,
            (store, root, endpoint, plan, plan_kills),
            timeout=TIMEOUT[store],
            mem_limit=1 << 30,
            tag=(CAMPAIGN[store], _describe(plan, plan_kills)),
        )
