"""Outcomes, the table of counts, the payloads sent, and how a received message is judged."""

from __future__ import annotations

import collections
import os
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import rlwire
from rlwire.testing import assert_batches_equal, make_batch

EXACT = "exact"
TYPED = "typed error"
PARTLY = "partly visible (detected by resume)"
HALF = "half-visible (undetected)"
WRONG = "wrong data"
UNTYPED = "untyped error"
CRASH = "crash"
HANG = "hang"
MEMORY = "memory over limit"
#: Steps filled part by part (``parts.py``): a key no rank reads, a key read twice, a
#: seal that disagrees with the parts (or is unreadable).
LOST = "lost"
DUPLICATED = "duplicated"
WRONG_SEAL = "wrong seal"

OUTCOMES = [EXACT, TYPED, PARTLY, HALF, WRONG, UNTYPED, CRASH, HANG, MEMORY]
#: What must never happen, whatever the campaign.
BAD = frozenset({HALF, WRONG, UNTYPED, CRASH, HANG, MEMORY, LOST, DUPLICATED, WRONG_SEAL})
#: Outcomes only some campaigns can have: a column of the table once a campaign
#: :meth:`Table.show` them, or once one is counted.
EXTRA_OUTCOMES = [LOST, DUPLICATED, WRONG_SEAL]
COMPRESSIONS = (None, "lz4", "zstd")


def payload(step: int, rank: int, n: int = 600, count: int = 2) -> rlwire.TrainingBatch:
    """The batch sent for ``step`` and ``rank``: the same arguments give the same bits, and
    compressible ``routed_experts`` (so lz4 and zstd really compress them)."""
    batch = make_batch(count, n=n, seed=10_007 * step + 101 * rank)
    for sample in batch.samples:
        assert sample.routed_experts is not None
        sample.routed_experts[:] %= 4
    return batch


#: Values compared by ``==`` and their type alone.
_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})


def same(a: Any, b: Any) -> bool:
    """Whether two received values are equal, arrays by dtype, shape and bytes."""
    if isinstance(a, rlwire.TrainingBatch) and isinstance(b, rlwire.TrainingBatch):
        try:
            assert_batches_equal(a, b)
        except AssertionError:
            return False
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return False
        if _PLAIN.issuperset(map(type, a)) and _PLAIN.issuperset(map(type, b)):
            # At C speed (a hostile header holds millions of items: compared one by one,
            # under a loaded machine, they passed the job's timeout as a "hang").
            return list(map(type, a)) == list(map(type, b)) and list(a) == list(b)
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def receive_one(
    directory: Path | str,
    step: int,
    rank: int,
    expected: Any,
    *,
    type: Any = rlwire.TrainingBatch,
    timeout: float = 2.0,
    max_decompressed_bytes: int | None = None,
) -> dict[str, Any]:
    """Receive ``step`` for ``rank`` and judge it against ``expected`` (``None``: no value
    is right, only a typed error is)."""
    options: dict[str, Any] = {}
    if max_decompressed_bytes is not None:
        options["max_decompressed_bytes"] = max_decompressed_bytes
    try:
        with rlwire.open_receiver(
            directory, type=type, rank=rank, start_step=step, record_consumed=False, **options
        ) as receiver:
            got = receiver.receive(timeout=timeout)
            ok = expected is not None and same(got, expected)
            del got
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": describe(exc)}
    except MemoryError:
        return {"outcome": MEMORY, "detail": "MemoryError"}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc) + "\n" + traceback.format_exc()[-600:]}
    if ok:
        return {"outcome": EXACT, "detail": ""}
    return {"outcome": WRONG, "detail": "decoded to a value other than the one sent"}


ANY = typing.Any


class Table:
    """Counts by campaign and outcome, with an example detail of each bad outcome."""

    def __init__(self) -> None:
        self.counts: dict[str, collections.Counter[str]] = {}
        self.examples: dict[tuple[str, str], list[str]] = {}
        self.trials: list[tuple[str, str, str]] = []  # (campaign, what, outcome)
        self.skipped: dict[str, str] = {}  # campaign -> why
        self.shown: set[str] = set()  # extra outcomes with a column
        self.kills: dict[str, int] = {}  # campaign -> kills that landed, where counted
        self.points: dict[str, dict[str, int]] = {}  # campaign -> where they landed -> count

    def show(self, *outcomes: str) -> None:
        """Give ``outcomes`` (of :data:`EXTRA_OUTCOMES`) a column, counted or not."""
        self.shown.update(outcomes)

    def add(self, campaign: str, outcome: str, detail: str = "", what: str = "") -> None:
        self.trials.append((campaign, what, outcome))
        self.counts.setdefault(campaign, collections.Counter())[outcome] += 1
        if detail and (outcome != EXACT):
            seen = self.examples.setdefault((campaign, outcome), [])
            if len(seen) < 3 and detail not in seen:
                seen.append(detail)

    def bad(self) -> dict[str, dict[str, int]]:
        return {
            c: {o: n for o, n in counter.items() if o in BAD and n}
            for c, counter in self.counts.items()
            if any(o in BAD and n for o, n in counter.items())
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "counts": {c: dict(counter) for c, counter in self.counts.items()},
            "examples": [
                {"campaign": c, "outcome": o, "details": d} for (c, o), d in self.examples.items()
            ],
            "trials": self.trials,
            "skipped": self.skipped,
            "kills": self.kills,
            "kill_points": self.points,
        }

    def render(self, markdown: bool = True) -> str:
        short = {PARTLY: "partly visible (resume detects)", HALF: "half-visible (undetected)"}
        counted = {o for counter in self.counts.values() for o, n in counter.items() if n}
        columns = [*OUTCOMES, *[o for o in EXTRA_OUTCOMES if o in self.shown | counted]]
        heads = ["campaign", *[short.get(o, o) for o in columns], "total"]
        rows = []
        for campaign, counter in self.counts.items():
            rows.append(
                [campaign, *[str(counter.get(o, 0)) for o in columns], str(sum(counter.values()))]
            )
        if markdown:
            lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            return "\n".join(lines)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
        fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
        return "\n".join(fmt.format(*r) for r in [heads, *rows])


#: ``(step, rank) -> outcome dict``: receive that step of that rank and compare it.
Receive = Callable[[int, int], dict[str, Any]]


def check_visible(mains: dict[int, set[int]], receive: Receive) -> dict[str, Any] | None:
    """Every visible step of every rank must come back exact: a typed error on one is a
    half-visible step. None if all did, else the outcome."""
    for step in sorted(mains):
        for rank in sorted(mains[step]):
            got = receive(step, rank)
            if got["outcome"] == TYPED:
                return {"outcome": HALF, "detail": f"step {step} rank {rank} visible: {got}"}
            if got["outcome"] != EXACT:
                return got
    return None


def check_end_and_resume(
    destination: Path | str,
    ranks: int,
    nxt: int,
    *,
    has_end: bool,
    receive: Receive,
    send_next: Callable[[], None],
    **receiver_options: Any,
) -> dict[str, Any] | None:
    """After a consistent prefix ending before ``nxt``: an end mark must stop receivers
    at ``nxt``, and a resumed sender must then send ``nxt`` (``send_next``), which every
    rank must receive exact. None if so, else the outcome."""
    if has_end:
        for rank in range(ranks):
            try:
                with rlwire.open_receiver(
                    destination,
                    rank=rank,
                    start_step=nxt,
                    record_consumed=False,
                    **receiver_options,
                ) as receiver:
                    receiver.receive(timeout=1)
            except rlwire.EndOfStream:
                continue
            except Exception as exc:
                return {"outcome": UNTYPED, "detail": f"after the end mark: {describe(exc)}"}
            return {"outcome": WRONG, "detail": f"rank {rank} got step {nxt} after the end"}
    try:
        send_next()
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": f"resume failed: {describe(exc)}"}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": f"resume failed: {describe(exc)}"}
    for rank in range(ranks):
        got = receive(nxt, rank)
        if got["outcome"] != EXACT:
            got["detail"] = f"step sent after resuming: {got['detail']}"
            return got
    return None


def fresh_dir(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=False)
    return path


def listing(directory: Path | str) -> list[str]:
    return sorted(os.listdir(directory))


Reporter = Callable[[str, str, str], None]
