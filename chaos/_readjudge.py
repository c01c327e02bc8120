"""The judge of the readers campaign (:mod:`chaos.readers`): each rank's log of what its
receivers were handed, against the seals and what the producers said.

A rank's log is JSON lines, each with its receiver's ``run`` (0, 1, ... as kills end
them) and an event ``e``: ``start`` (``step``, ``part``: where the receiver starts;
``how``: ``resume`` or ``start_step``, reopened after a ``StepGapError``; ``t``),
``got`` (``step``, ``key``: the typed key, or with ``receive()`` the list of them;
``gen``: the producer run whose bits it holds, -1 for none; ``index``), ``done`` (the
receiver moved past ``step``: ``parts()`` ended, or ``receive()`` returned it), ``gap``
(a ``StepGapError`` at ``step``: ``msg``, ``t``), ``kill`` (``call``), ``error``
(``text``), ``end`` (``EndOfStream``).

A *pass* is what one receiver, or its resumed successors, handed out of one step since
part 0. Judged per rank: every part bit-exact (else *wrong data*); the parts of a pass
of one run (``gen``: else *wrong data*, parts of two runs as one step), at consecutive
indices, none handed twice (*duplicated*) but the one a killed receiver held; a pass
that ends (``done``) holds exactly its run's seal of the rank, in order (the seal
stored, or as that run's producer reported it; else *lost*, *duplicated*, *wrong
seal*): a pass ending with another run's seal is caught here. A restart begins with the
part after its predecessor's last, or with that one again (it died holding it), or,
once a rewrite began (``overwrite`` and ``truncate`` delete the ranks' marks), at step
0 as a rank with no mark: then an *epoch* begins, and the steps are read again (or,
its part mark deleted before its consumption mark, at part 0 of the step it was in). A
``StepGapError`` must follow a rewrite of its step (else *typed error*). In each epoch
the steps done go up one by one from where it began, the last epoch's to the plan's
last step and ``EndOfStream``; with no rewrite, every key of a step is read by one rank.
"""

from __future__ import annotations

import json
from typing import Any

from ._model import DUPLICATED, EXACT, LOST, TYPED, UNTYPED, WRONG, WRONG_SEAL
from .parts import Ledger, _typed

__all__ = ["History", "judge_ranks"]


class History:
    """What the producers of a trial did, for the judge: per run of the plan (``gen``,
    0 the first; a producer restarted with ``overwrite`` or ``truncate`` makes the
    next), its ledger, the step it began at, when it began (``time.monotonic()``), the
    steps its producers put every key of (it may have sealed them unreported); and the
    seals found stored."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.ledgers: list[Ledger] = []
        self.first: list[int] = []
        self.began: list[float] = []
        self.all_put: list[set[int]] = []
        self.stored: dict[int, list[list[Any]]] = {}

    def new_run(self, ledger: Ledger, first: int, began: float) -> None:
        self.ledgers.append(ledger)
        self.first.append(first)
        self.began.append(began)
        self.all_put.append(set())

    def took(self, gen: int, events: list[dict[str, Any]]) -> None:
        """Note the steps one producer of run ``gen`` put every key of."""
        put: dict[int, set[Any]] = {}
        for e in events:
            if e["e"] == "put":
                put.setdefault(e["step"], set()).add(_typed(e["key"]))
        for step, keys in put.items():
            if keys == self.ledgers[gen].keys(step):
                self.all_put[gen].add(step)

    def final(self, step: int) -> int:
        """The run whose step ``step`` is stored last."""
        return max(g for g, first in enumerate(self.first) if first <= step)

    def rewritten(self, step: int, after: int, before: float) -> bool:
        """Whether a run later than ``after`` began before ``before`` and rewrote ``step``."""
        return any(
            g > after and self.first[g] <= step and self.began[g] <= before
            for g in range(len(self.first))
        )

    def rewrite_before(self, t: float) -> bool:
        return any(g > 0 and self.began[g] <= t for g in range(len(self.first)))

    def seal(self, step: int, gen: int) -> list[list[Any]] | bool | None:
        """The keys by rank of run ``gen``'s seal of ``step``; None if unknown but the
        run may have sealed it; False if it never did."""
        if gen == self.final(step) and step in self.stored:
            return self.stored[step]
        ledger = self.ledgers[gen]
        if step in ledger.sealed:
            return [list(k) for k in ledger.sealed[step]]
        if step in ledger.unreported or step in self.all_put[gen]:
            return None
        return False


class _Bad(Exception):
    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome, self.detail = outcome, detail


def _key(value: Any) -> Any:
    return tuple(_key(v) for v in value) if isinstance(value, list) else value


def judge_ranks(history: History, logs: list[list[dict[str, Any]]]) -> tuple[str, str, int]:
    """The outcome from the ranks' logs; and the kills of receivers that landed."""
    landed = sum(e["e"] == "kill" for log in logs for e in log)
    plan = history.plan
    done_by: dict[tuple[int, int], dict[Any, int]] = {}  # (step, gen): key -> rank
    try:
        for rank, log in enumerate(logs):
            _Rank(history, plan, rank, done_by).judge(log)
        if len(history.first) == 1:
            for step, spec in enumerate(plan["steps"]):
                read = set(done_by.get((step, 0), {}))
                if not spec["whole"] and read != history.ledgers[0].keys(step):
                    raise _Bad(LOST, f"step {step}: not every key read by a rank")
    except _Bad as bad:
        return bad.outcome, bad.detail, landed
    return EXACT, "", landed


class _Rank:
    def __init__(
        self,
        history: History,
        plan: dict[str, Any],
        rank: int,
        done_by: dict[tuple[int, int], dict[Any, int]],
    ) -> None:
        self.h, self.plan, self.rank, self.done_by = history, plan, rank, done_by
        self.by_receive = plan["by_receive"]
        self.seen: set[tuple[int, int, Any]] = set()  # (step, gen, key) in this epoch
        self.epoch_steps: list[int] = []  # steps done in this epoch
        self.epoch_start = 0
        self.open: dict[str, Any] | None = None  # the pass: step, gen, keys
        self.last_done: tuple[int, int] | None = None  # (step, parts) of the last pass done
        self.ended = False

    def bad(self, outcome: str, detail: str) -> _Bad:
        return _Bad(outcome, f"rank {self.rank}: {detail}")

    def judge(self, log: list[dict[str, Any]]) -> None:
        for e in log:
            what = e["e"]
            if what == "error":
                outcome = TYPED if e.get("typed") else UNTYPED
                raise self.bad(outcome, f"run {e['run']}: {e['text'][:500]}")
            if what == "start":
                self.start(e)
            elif what == "got":
                self.got(e)
            elif what == "done":
                self.done(e["step"])
            elif what == "gap":
                self.gap(e)
            elif what == "end":
                if self.open is not None:
                    raise self.bad(LOST, f"the end of the stream within step {self.open['step']}")
                self.ended = True
        if not self.ended:
            raise self.bad(LOST, "no receiver read to the end")
        self.close_epoch(final=True)

    def start(self, e: dict[str, Any]) -> None:
        at = (e["step"], e["part"])
        if e["how"] == "start_step":  # reopened after a StepGapError: the pass is over
            self.open = None
            return
        if e["run"] == 0:
            if at != (0, 0):
                raise self.bad(LOST, f"the first receiver started at {at}")
            return
        allowed = []
        if self.open is not None:
            step, n = self.open["step"], len(self.open["keys"])
            allowed += [(step, n), (step, max(0, n - 1))]
            if self.complete(self.open):
                allowed.append((step + 1, 0))
        elif self.last_done is not None:
            step, n = self.last_done
            allowed.append((step + 1, 0))
            if self.by_receive or self.plan["steps"][step]["whole"]:
                allowed.append((step, 0))  # held: its move past it not written yet
        else:
            allowed.append(self.resumed_empty())
        rewrite = self.h.rewrite_before(e["t"])
        if at in allowed:
            self.resume_at(at)
        elif rewrite and self.open is not None and at == (self.open["step"], 0):
            # The rewrite deleted the rank's part mark and not yet its consumption mark
            # (part marks go first): the step from its part 0 again, as at (0, 0) below.
            self.resume_at(at)
        elif at == (0, 0) and rewrite:
            self.open = None  # the rewrite deleted the rank's marks: a new epoch
            self.close_epoch(final=False)
        else:
            want = " or ".join(map(str, allowed))
            outcome = LOST if at > max(allowed) else DUPLICATED
            raise self.bad(outcome, f"run {e['run']} started at {at}, not {want}")

    def resumed_empty(self) -> tuple[int, int]:
        return (self.epoch_start, 0)

    def resume_at(self, at: tuple[int, int]) -> None:
        step, part = at
        if self.open is not None and self.open["step"] == step:
            for key in self.open["keys"][part:]:  # held when it died: handed again
                self.seen.discard((step, self.open["gen"], key))
            self.open["keys"] = self.open["keys"][:part]
            if not part:
                self.open = None  # from its part 0 again: any run's
        elif self.open is not None:  # it moved past the step before it died
            self.done(self.open["step"])
        if self.last_done is not None and self.last_done[0] == step:  # a held whole step
            self.epoch_steps.pop()
            self.last_done = None
            for key in list(self.seen):
                if key[0] == step:
                    self.seen.discard(key)

    def complete(self, p: dict[str, Any]) -> bool:
        seal = self.expected(p["step"], p["gen"])
        return seal is None or (seal is not False and len(p["keys"]) == len(seal))

    def expected(self, step: int, gen: int) -> list[Any] | bool | None:
        """What a pass of run ``gen`` of ``step`` holds whole, as logged; None unknown,
        False if that run never sealed the step (no pass of it may end)."""
        if self.plan["runs"][gen][step]["whole"]:
            return [None]
        seal = self.h.seal(step, gen)
        if seal is False or seal is None:
            return seal
        keys = [_key(list(_typed(k))) for k in seal[self.rank]] if self.rank < len(seal) else []
        return [tuple(keys)] if self.by_receive else keys

    def got(self, e: dict[str, Any]) -> None:
        step, gen, key = e["step"], e["gen"], _key(e["key"])
        if gen < 0:
            raise self.bad(WRONG, f"run {e['run']}: step {step} {key} holds other bits")
        if self.open is None:
            if e["index"] != 0:
                raise self.bad(LOST, f"run {e['run']}: step {step} began at part {e['index']}")
            if self.epoch_steps and step != self.epoch_steps[-1] + 1:
                raise self.bad(LOST, f"step {step} read after step {self.epoch_steps[-1]}")
            self.open = {"step": step, "gen": gen, "keys": []}
        p = self.open
        if p["step"] != step:
            raise self.bad(LOST, f"step {step} read before step {p['step']} was done")
        if p["gen"] != gen:
            raise self.bad(
                WRONG,
                f"run {e['run']}: step {step} part {e['index']} of producer run {gen} after "
                f"{len(p['keys'])} of run {p['gen']}: parts of two runs as one step",
            )
        if e["index"] != len(p["keys"]):
            outcome = LOST if e["index"] > len(p["keys"]) else DUPLICATED
            raise self.bad(outcome, f"step {step}: part {e['index']} after {len(p['keys'])}")
        if (step, gen, key) in self.seen:
            raise self.bad(DUPLICATED, f"step {step} (run {gen}) {key} handed twice")
        self.seen.add((step, gen, key))
        p["keys"].append(key)

    def done(self, step: int) -> None:
        p = self.open
        if p is None:  # no part for the rank: of a run whose seal gives it none
            gens = range(len(self.plan["runs"]))
            if all(self.expected(step, g) not in ([], None) for g in gens):
                raise self.bad(LOST, f"moved past step {step} without reading it")
            p = {"step": step, "gen": -1, "keys": []}
        if p["step"] != step:
            raise self.bad(LOST, f"moved past step {step} while reading step {p['step']}")
        want = None if p["gen"] < 0 else self.expected(step, p["gen"])
        if want is False:
            raise self.bad(
                WRONG,
                f"step {step} done after {len(p['keys'])} parts of producer run {p['gen']}, "
                "which never sealed it: another run's seal taken as their end",
            )
        if isinstance(want, list) and p["keys"] != want:
            missing = [k for k in want if k not in p["keys"]]
            extra = [k for k in p["keys"] if k not in want]
            outcome = LOST if missing else DUPLICATED if extra else WRONG_SEAL
            raise self.bad(
                outcome,
                f"step {step} (producer run {p['gen']}) done after {len(p['keys'])} parts, "
                f"its seal lists {len(want)}: missing {missing[:4]}, extra {extra[:4]}",
            )
        if self.epoch_steps and step != self.epoch_steps[-1] + 1:
            raise self.bad(LOST, f"step {step} done after step {self.epoch_steps[-1]}")
        if not self.epoch_steps and step != self.epoch_start:
            raise self.bad(LOST, f"step {step} done first, not {self.epoch_start}")
        self.epoch_steps.append(step)
        by = self.done_by.setdefault((step, p["gen"]), {})
        for key in p["keys"]:
            for one in key if self.by_receive and key is not None else (key,):
                if one is not None and by.setdefault(one, self.rank) != self.rank:
                    raise self.bad(DUPLICATED, f"step {step} key {one} read by two ranks")
        self.last_done = (step, len(p["keys"]))
        self.open = None

    def gap(self, e: dict[str, Any]) -> None:
        step = e["step"]
        gen = self.open["gen"] if self.open is not None and self.open["step"] == step else -1
        if not self.h.rewritten(step, gen if gen >= 0 else 0, e["t"]):
            raise self.bad(TYPED, f"StepGapError at step {step} with no rewrite: {e['msg']}")
        self.open = None

    def close_epoch(self, final: bool) -> None:
        if final and (not self.epoch_steps or self.epoch_steps[-1] != len(self.plan["steps"]) - 1):
            last = self.epoch_steps[-1] if self.epoch_steps else None
            raise self.bad(LOST, f"the last receivers' steps end at {last}")
        self.seen, self.epoch_steps, self.epoch_start = set(), [], 0
        self.last_done = None


def parse_log(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
