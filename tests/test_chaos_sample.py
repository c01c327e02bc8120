"""A small sample of every chaos campaign (docs/reliability.md), for CI.

The campaigns run in a subprocess (``python -m chaos.run``), which forks one child per
trial; this file checks that none of the bad outcomes happened. ``CHAOS_SEED`` picks
another sample.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from chaos import cancel, fulldisk, hostile, oddfiles, parts
from chaos._model import BAD, DUPLICATED, EXACT, HALF, LOST, PARTLY, TYPED, WRONG_SEAL
from rlwire.abc import Seal

# A campaign runs in a process of its own, with S3 trials on the shared test server: on
# this 2-core machine, loaded, the parts campaigns took 41 and 67 s alone and more than
# 110 s (the old limit) in a full run. A hang stays a verdict of the campaign's own.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("CHAOS_SEED", "0"))


def campaign(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run ``python -m chaos.run`` with ``args``; its JSON report."""
    report = tmp_path / "report.json"
    # This checkout's src first: else the campaign ran whichever rlwire was installed.
    paths = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--seed", str(SEED), "--json", str(report), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert report.exists(), f"the chaos run failed:\n{proc.stdout}\n{proc.stderr}"
    result: dict[str, Any] = json.loads(report.read_text())
    result["output"] = proc.stdout
    return result


def assert_no_bad(result: dict[str, Any], allowed: set[str] | None = None) -> None:
    bad = [
        (c, w, o)
        for c, w, o in result["trials"]
        if o in BAD or (allowed is not None and o not in allowed)
    ]
    assert not bad, f"{len(bad)} bad outcomes, e.g. {bad[:5]}\n{result['output'][-3000:]}"


def test_kill_9_at_filesystem_calls_and_random_times(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "kills", "--kills", "6")
    # A kill leaves whole steps, or a step visible for the first ranks only, which resume
    # refuses; never a typed error on a visible step (that is "half-visible").
    assert_no_bad(result, allowed={EXACT, PARTLY})
    assert len(result["trials"]) == 6


def test_corruption(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "corruption", "--corruptions", "40")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 40


# Session-wide: a worker of pytest-xdist that runs another module's tests between these
# would tear a module-wide fixture down and run the campaign again (it ran three times).
@pytest.fixture(scope="session")
def hostile_and_odd(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The outcome of every hostile-message and odd-file case, by its name."""
    tmp = tmp_path_factory.mktemp("chaos")
    result = campaign(tmp, "--campaign", "hostile", "--campaign", "oddfiles")
    return {what: outcome for _, what, outcome in result["trials"]}


HOSTILE = [f"{name} (type={t})" for name in hostile.CASES for t in ("Any", "TrainingBatch")]
ODD = [oddfiles.name(where, kind) for where in ("main part", "sidecar") for kind in oddfiles.KINDS]


@pytest.mark.parametrize("case", HOSTILE)
@pytest.mark.xdist_group("hostile")  # one worker runs the campaign, once
def test_hostile_message(hostile_and_odd: dict[str, str], case: str) -> None:
    assert hostile_and_odd[case] in (EXACT, TYPED)


@pytest.mark.parametrize("case", ODD)
@pytest.mark.xdist_group("hostile")  # one worker runs the campaign, once
def test_odd_file_type(hostile_and_odd: dict[str, str], case: str) -> None:
    assert hostile_and_odd[case] == TYPED


@pytest.mark.parametrize("ranks", [1, 2])
async def test_cancelled_sends(tmp_path: Path, ranks: int, anyio_backend_name: str) -> None:
    """In this process, under asyncio and trio: sends cancelled at random deadlines leave
    whole steps only, and the same sender goes on. Under asyncio, every other send is
    cancelled by asyncio itself (``asyncio.timeout``)."""
    rng = random.Random(SEED * 7 + ranks)
    on_asyncio = anyio_backend_name == "asyncio"
    for i in range(6):
        compression = (None, "lz4", "zstd")[i % 3]
        native = on_asyncio and i % 2 == 1
        deadline = rng.uniform(0, 1.3)
        result = await cancel.trial(tmp_path / str(i), ranks, compression, deadline, native)
        assert result["outcome"] == EXACT, result


def test_forged_zeromq_messages(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "zmq", "--forgeries", "10")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 10


def test_full_disk(tmp_path: Path) -> None:
    why = fulldisk.available()
    if why:
        pytest.skip(why)
    result = campaign(tmp_path, "--campaign", "fulldisk", "--full-disks", "3")
    assert_no_bad(result)
    assert len(result["trials"]) == 3


def test_zeromq_kills(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "zmqkill", "--zmq-kills", "2")
    assert_no_bad(result, allowed={EXACT})
    assert len(result["trials"]) == 2


def test_s3_kills_and_faults(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "s3", "--s3-trials", "2")
    assert_no_bad(result, allowed={EXACT, PARTLY})
    assert len(result["trials"]) == 2


def test_aliased_segments_and_compound_bounds(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "aliased", "--aliased", "3")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 3


def test_forked_children(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "fork", "--forks", "3")
    assert_no_bad(result, allowed={EXACT})
    assert len(result["trials"]) == 3


def test_two_producers_rewrites_and_read_only_receivers(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "producers", "--producers", "3")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 3


def test_zeromq_blips_shared_ranks_and_cancelled_receives(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "zmqblips", "--zmq-blips", "3")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 3


def test_producers_killed_while_filling_steps_part_by_part(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "parts", "--parts-kills", "4")
    # Every key once, bit-exact, after every kill and resume: nothing else is allowed.
    assert_no_bad(result, allowed={EXACT})
    assert sum(result["kills"].values()) >= 3  # the kills land (a late one may miss)
    assert {c for c, _, _ in result["trials"]} == set(parts.CAMPAIGN.values())


def test_parts_read_live_while_producers_and_receivers_are_killed(tmp_path: Path) -> None:
    result = campaign(
        tmp_path, "--campaign", "readers", "--reader-trials", "5", "--reader-s3-trials", "1"
    )
    # Every part handed once per rank, in its seal's order, bit-exact, never parts of
    # two runs as one step; no mark's temporary file left: nothing else is allowed.
    assert_no_bad(result, allowed={EXACT})
    assert len(result["trials"]) == 6


def _filled(tmp_path: Path) -> tuple[parts.Store, dict[str, Any], parts.Ledger]:
    """A directory the parts campaign's producer filled (2 ranks, 2 steps, not killed),
    and what the producer said."""
    plan: dict[str, Any] = {
        "ranks": 2,
        "balance": "cost",
        "compression": "zstd",
        "sidecar": True,
        "fsync": False,
        "finish": True,
        "steps": [
            {"whole": False, "groups": [[k, [30 + i, 9], None] for i, k in enumerate("abcde")]},
            {"whole": False, "groups": [[7, [12], 1], ["7", [40], None], [8, [5, 5], None]]},
        ],
    }
    store = parts.Store("files", str(tmp_path), None)
    events: list[dict[str, Any]] = []
    options = parts._sender_options("files", plan, None)
    anyio.run(parts._produce, store.dest, options, plan, events.append, lambda: None)
    ledger = parts.Ledger(plan)
    ledger.take(events, 0)
    return store, plan, ledger


def _judge(store: parts.Store, plan: dict[str, Any], ledger: parts.Ledger) -> str:
    try:
        parts.check_reads(store, plan, parts.check_store(store, plan, ledger))
    except parts.Verdict as verdict:
        return verdict.outcome
    return EXACT


def test_the_parts_judge_sees_lost_duplicated_half_visible_and_wrong_seals(
    tmp_path: Path,
) -> None:
    """The campaign's judge is not blind: each damage done to a filled directory (or to
    what a producer said) is its bad outcome."""
    store, plan, ledger = _filled(tmp_path)
    assert _judge(store, plan, ledger) == EXACT
    directory = Path(store.dest)
    seal_file = directory / "step-00000000.seal.rlw"
    seal = parts.parse_seal(seal_file.read_bytes(), step=0, where="test")
    last = len(seal.keys[0]) - 1
    main = directory / f"step-00000000.rank-0000.part-{last:06d}.rlw"
    sidecar = directory / f"step-00000000.rank-0000.part-{last:06d}.sidecar.rlw"
    beyond = directory / f"step-00000000.rank-0000.part-{last + 1:06d}.rlw"

    shutil.copy(main, beyond)  # a part the seal does not list
    assert _judge(store, plan, ledger) == HALF
    beyond.unlink()
    kept = main.read_bytes()
    main.unlink()  # a listed part gone
    assert _judge(store, plan, ledger) == LOST
    main.write_bytes(kept)
    sidecar.rename(beyond.with_suffix(".sidecar.rlw"))  # a sidecar without its main file
    assert _judge(store, plan, ledger) == HALF
    beyond.with_suffix(".sidecar.rlw").rename(sidecar)
    assert _judge(store, plan, ledger) == EXACT

    swapped = Seal(step=0, keys=seal.keys[::-1], costs=seal.costs[::-1])
    seal_file.write_bytes(parts.seal_bytes(swapped))  # the ranks' keys exchanged
    assert _judge(store, plan, ledger) == WRONG_SEAL
    ledger.sealed.pop(0)  # the producer was killed before it reported the seal
    assert _judge(store, plan, ledger) in (HALF, WRONG_SEAL)
    seal_file.write_bytes(parts.seal_bytes(seal))

    # A put a killed producer reported, which the next one did not find on resuming.
    killed = [{"e": "start", "next": 0}, {"e": "open", "step": 0, "resumed": []}]
    killed.append({"e": "put", "step": 0, "key": "a", "skipped": False})
    later = parts.Ledger(plan)
    later.take(killed, 0)
    with pytest.raises(parts.Verdict) as lost:
        later.take([{"e": "start", "next": 0}, {"e": "open", "step": 0, "resumed": ["b"]}], 1)
    assert lost.value.outcome == LOST
    # A producer killed after its seal landed but before it said so: the next run
    # starts one step later, and the run after it after the last step.
    unsaid = [{"e": "start", "next": 0}, {"e": "open", "step": 0, "resumed": []}]
    unsaid += [{"e": "put", "step": 0, "key": k, "skipped": False} for k in "abcde"]
    resumed = parts.Ledger(plan)
    resumed.take(unsaid, 0)
    second = [{"e": "start", "next": 1}, {"e": "open", "step": 1, "resumed": []}]
    second.append({"e": "sealed", "step": 1, "keys": [[7], ["7", 8]]})
    resumed.take(second, 1)
    resumed.take([{"e": "start", "next": 2}], 2)
    with pytest.raises(parts.Verdict) as early:
        resumed.take([{"e": "start", "next": 0}], 3)
    assert early.value.outcome == parts.WRONG
    # A resumed key the producer wrote again.
    again = [{"e": "start", "next": 0}, {"e": "open", "step": 0, "resumed": ["a"]}]
    again.append({"e": "put", "step": 0, "key": "a", "skipped": False})
    with pytest.raises(parts.Verdict) as twice:
        parts.Ledger(plan).take(again, 1)
    assert twice.value.outcome == DUPLICATED


def test_the_ray_judge_sees_lost_duplicated_wrong_and_stopped_ranks() -> None:
    from chaos import raykills

    want = [[(s, f"p{s}") for s in range(raykills.TOTAL)]]
    every = [{"got": list(want[0]), "error": None, "typed": True}]
    assert raykills.judge(every, want) == (EXACT, "")
    twice = [{"got": [*want[0][:3], want[0][2], *want[0][3:]], "error": None, "typed": True}]
    assert raykills.judge(twice, want)[0] == DUPLICATED
    changed = [{"got": [(0, "x"), *want[0][1:]], "error": None, "typed": True}]
    assert raykills.judge(changed, want)[0] == "wrong data"
    short = [{"got": want[0][:5], "error": None, "typed": True}]
    assert raykills.judge(short, want)[0] == LOST
    stopped = [{"got": want[0][:5], "error": "TransportError: gone", "typed": True}]
    assert raykills.judge(stopped, want)[0] == LOST  # a typed error does not excuse it
    raw = [{"got": want[0][:5], "error": "KeyError: 'x'", "typed": False}]
    assert raykills.judge(raw, want)[0] == "untyped error"


def test_the_ray_trainer_judge_sees_a_restart_that_skips_repeats_or_stops() -> None:
    from chaos import raykills

    total = raykills.TOTAL
    want = [(s, f"p{s}") for s in range(total)]

    def log(steps: range, marks: list[int]) -> list[list[object]]:
        return [["step", s, f"p{s}"] for s in steps] + [["mark", m] for m in marks]

    def restart(first: int, last: int = total, error: str | None = None) -> dict[str, object]:
        return {"got": want[first:last], "error": error, "typed": True}

    # Killed holding step 2 (moved past step 1): the restart begins at 2 or at 3.
    assert raykills.judge_resumed(log(range(3), [1, 2]), restart(2), want) == (EXACT, "")
    assert raykills.judge_resumed(log(range(3), [1, 2]), restart(3), want) == (EXACT, "")
    assert raykills.judge_resumed(log(range(0), []), restart(0), want) == (EXACT, "")
    assert raykills.judge_resumed(log(range(total), [total]), restart(total), want)[0] == EXACT
    # Begins before the last mark the board recorded: a step the rank moved past again.
    assert raykills.judge_resumed(log(range(3), [1, 2]), restart(1), want)[0] == DUPLICATED
    # Begins past the step after the last one the killed trainer got: one skipped.
    assert raykills.judge_resumed(log(range(3), [1, 2]), restart(4), want)[0] == LOST
    # Stops short of the end, with a typed error or without one.
    stopped = restart(3, total - 1, "StepGapError: step 7 is no longer stored")
    assert raykills.judge_resumed(log(range(3), [1, 2]), stopped, want)[0] == LOST
    # What either incarnation got must be each step once, in order, bit-exact.
    twice = [["step", 0, "p0"], ["step", 0, "p0"]]
    assert raykills.judge_resumed(twice, restart(1), want)[0] == DUPLICATED
    changed = {"got": [(3, "x"), *want[4:]], "error": None, "typed": True}
    assert raykills.judge_resumed(log(range(3), [1, 2]), changed, want)[0] == "wrong data"
    assert raykills.judge_resumed(log(range(1, 3), []), restart(3), want)[0] == LOST


def test_the_readers_judge_sees_two_runs_as_one_step_a_wrong_end_and_needless_gaps() -> None:
    """The live readers' judge, on logs of one rank over a step filled part by part that
    a producer restarted with ``overwrite`` sent again (run 1 of keys x, y)."""
    from chaos._readjudge import History, judge_ranks
    from chaos.parts import Ledger

    def group(key: str) -> list[object]:
        return [key, [8], None]

    runs = [
        [{"whole": False, "groups": [group(k) for k in "abc"]}],
        [{"whole": False, "groups": [group(k) for k in "xy"]}],
    ]
    plan = {"ranks": 1, "steps": runs[0], "runs": runs, "by_receive": False}
    history = History(plan)
    for gen, began in ((0, 0.0), (1, 10.0)):
        ledger = Ledger({**plan, "steps": runs[gen]})
        if gen:
            ledger.sealed[0] = [["x", "y"]]
        history.new_run(ledger, 0, began)
    history.stored[0] = [["x", "y"]]

    def got(index: int, key: str, gen: int, run: int = 0) -> dict[str, object]:
        return {"run": run, "e": "got", "step": 0, "index": index, "key": ["str", key], "gen": gen}

    start = {"run": 0, "e": "start", "step": 0, "part": 0, "how": "resume", "t": 0.0}
    reopened = {**start, "how": "start_step", "t": 11.0}
    end = [{"run": 0, "e": "done", "step": 0}, {"run": 0, "e": "end"}]
    gap = {"run": 0, "e": "gap", "step": 0, "msg": "sent again", "t": 11.0}
    # Two parts of run 0, the StepGapError, then run 1's step whole: exact.
    fine = [start, got(0, "a", 0), got(1, "b", 0), gap, reopened, got(0, "x", 1), got(1, "y", 1)]
    assert judge_ranks(history, [[*fine, *end]])[0] == EXACT
    # Run 1's part handed after run 0's, as one step: wrong data.
    mixed = [start, got(0, "a", 0), got(1, "y", 1)]
    assert judge_ranks(history, [[*mixed, *end]])[0] == "wrong data"
    # Run 0's parts ended by run 1's seal (run 0 never sealed the step): wrong data.
    ended = [start, got(0, "a", 0), got(1, "b", 0)]
    assert judge_ranks(history, [[*ended, *end]])[0] == "wrong data"
    # A StepGapError before the rewrite began (t 5 < 10): a needless error.
    early = [start, got(0, "a", 0), {**gap, "t": 5.0}, reopened, got(0, "x", 1), got(1, "y", 1)]
    assert judge_ranks(history, [[*early, *end]])[0] == TYPED
    # Run 1's step with a part skipped: lost.
    skipped = [start, got(0, "a", 0), gap, reopened, got(0, "x", 1)]
    assert judge_ranks(history, [[*skipped, *end]])[0] == LOST


def test_the_readers_judge_takes_a_restart_at_part_0_of_its_step_once_a_rewrite_began() -> None:
    """A receiver resumed as a rewrite deletes the rank's marks (its part mark first)
    finds its consumption mark only: it reads its step again from part 0, as a rank
    with no mark reads from step 0; before the rewrite began, that is a repeat."""
    from chaos._readjudge import History, judge_ranks
    from chaos.parts import Ledger

    def group(key: str) -> list[object]:
        return [key, [8], None]

    runs = [
        [
            {"whole": False, "groups": [group("a")]},
            {"whole": False, "groups": [group("b"), group("c")]},
        ],
        [{"whole": False, "groups": [group("w")]}, {"whole": False, "groups": [group("x")]}],
    ]
    plan = {"ranks": 1, "steps": runs[0], "runs": runs, "by_receive": False}
    history = History(plan)
    for gen, began in ((0, 0.0), (1, 10.0)):
        ledger = Ledger({**plan, "steps": runs[gen]})
        ledger.sealed[0] = [["w" if gen else "a"]]
        if gen:
            ledger.sealed[1] = [["x"]]
        history.new_run(ledger, 0, began)
    history.stored = {0: [["w"]], 1: [["x"]]}

    def got(step: int, index: int, key: str, gen: int, run: int) -> dict[str, object]:
        e = {"e": "got", "step": step, "index": index, "key": ["str", key], "gen": gen}
        return {"run": run, **e}

    start = {"run": 0, "e": "start", "step": 0, "part": 0, "how": "resume", "t": 0.0}
    again = {"run": 1, "e": "start", "step": 1, "part": 0, "how": "resume", "t": 11.0}
    log = [start, got(0, 0, "a", 0, 0), {"run": 0, "e": "done", "step": 0}]
    log += [got(1, 0, "b", 0, 0), got(1, 1, "c", 0, 0), again, got(1, 0, "x", 1, 1)]
    log += [{"run": 1, "e": "done", "step": 1}, {"run": 1, "e": "end"}]
    assert judge_ranks(history, [log])[0] == EXACT
    log[5] = {**again, "t": 5.0}
    assert judge_ranks(history, [log])[0] == DUPLICATED


def test_the_zeromq_kills_judge_times_a_restarted_consumer_from_its_open(tmp_path: Path) -> None:
    """The ZeroMQ kills judge, on logs of a shared-pattern trial (seed 31, trial 62):
    consumer 1 killed after steps 0 and 2 (4 and 6 were queued for it), restarted 0.2 s
    before the sender's ``finish()`` by the clock of its fork, but its receiver open
    only 0.1 s after it (a forked process's first open imports ZeroMQ: 0.1-0.5 s on a
    loaded machine): the sender had closed, and nobody could tell it the end. A receiver
    open well before ``finish()`` that never hears the end is still a bad outcome."""
    from chaos import zmqkill

    finished = 100.0

    def life(name: str, n: int, started: float, events: list[Any], killed: bool = False) -> Any:
        path = tmp_path / f"{name}.log"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        role, index = ("sender", 0) if name.startswith("sender") else ("receiver", int(name[8]))
        return zmqkill.Life(role, index, n, 0, 0, path, killed, started, reaped=True)

    def got(t: float, steps: Any) -> list[dict[str, Any]]:
        return [{"e": "got", "t": t, "step": s, "ok": True, "took": 0.0} for s in steps]

    def trial(opened: float) -> dict[str, Any]:
        sent = [{"e": "sent", "t": 98.0 + s / 100, "step": s} for s in range(zmqkill.STEPS)]
        sender = [{"e": "open", "t": 97.0}, *sent, {"e": "finished", "t": finished, "end": 24}]
        first = [{"e": "start", "t": 97.1, "start": 0}, {"e": "open", "t": 97.5}]
        end = {"e": "end", "t": finished + 0.1, "took": 0.0}
        wait = [{"e": "timeout", "t": opened + k, "took": 1.0} for k in (1, 2)]
        again = [{"e": "start", "t": 99.9, "start": 3}, {"e": "open", "t": opened}, *wait]
        lives = [
            life("sender.0", 0, 96.9, sender),
            life("receiver0.0", 0, 97.0, [*first, *got(98.5, [1, 3, 5, *range(7, 24)]), end]),
            life("receiver1.0", 0, 97.0, [*first, *got(98.1, [0, 2])], killed=True),
            life("receiver1.1", 1, finished - 0.2, again),
        ]
        scenario = zmqkill.Scenario("receiver", "shared", 2, "resume")
        return zmqkill.judge(scenario, lives, [])

    late = trial(opened=finished + 0.1)
    assert late["outcome"] == EXACT, late
    assert "receiver 1 life 1 opened +0.10 s from the sender's finish()" in late["detail"]
    early = trial(opened=finished - 0.5)
    assert early["outcome"] == HALF, early
    assert "end never seen: receiver 1 life 1, open 0.50 s before" in early["detail"]
