"""A small sample of every chaos campaign (docs/reliability.md), for CI.

The campaigns run in a subprocess (``python -m chaos.run``), which forks one child per
trial; this file checks that none of the bad outcomes happened. ``CHAOS_SEED`` picks
another sample.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos import cancel, fulldisk, hostile, oddfiles
from chaos._model import BAD, EXACT, PARTLY, TYPED

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("CHAOS_SEED", "0"))


def campaign(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run ``python -m chaos.run`` with ``args``; its JSON report."""
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--seed", str(SEED), "--json", str(report), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
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
    result = campaign(tmp_path, "--campaign", "kills", "--kills", "24")
    # A kill leaves whole steps, or a step visible for the first ranks only, which resume
    # refuses; never a typed error on a visible step (that is "half-visible").
    assert_no_bad(result, allowed={EXACT, PARTLY})
    assert len(result["trials"]) == 24


def test_corruption(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "corruption", "--corruptions", "150")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 150


@pytest.fixture(scope="module")
def hostile_and_odd(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The outcome of every hostile-message and odd-file case, by its name."""
    tmp = tmp_path_factory.mktemp("chaos")
    result = campaign(tmp, "--campaign", "hostile", "--campaign", "oddfiles")
    return {what: outcome for _, what, outcome in result["trials"]}


HOSTILE = [f"{name} (type={t})" for name in hostile.CASES for t in ("Any", "TrainingBatch")]
ODD = [oddfiles.name(where, kind) for where in ("main part", "sidecar") for kind in oddfiles.KINDS]


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_message(hostile_and_odd: dict[str, str], case: str) -> None:
    assert hostile_and_odd[case] in (EXACT, TYPED)


@pytest.mark.parametrize("case", ODD)
def test_odd_file_type(hostile_and_odd: dict[str, str], case: str) -> None:
    assert hostile_and_odd[case] == TYPED


@pytest.mark.parametrize("ranks", [1, 2])
async def test_cancelled_sends(tmp_path: Path, ranks: int) -> None:
    """In this process, under asyncio and trio: sends cancelled at random deadlines leave
    whole steps only, and the same sender goes on."""
    rng = random.Random(SEED * 7 + ranks)
    for i in range(6):
        compression = (None, "lz4", "zstd")[i % 3]
        result = await cancel.trial(tmp_path / str(i), ranks, compression, rng.uniform(0, 1.3))
        assert result["outcome"] == EXACT, result


def test_forged_zeromq_messages(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "zmq", "--forgeries", "20")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 20


def test_full_disk(tmp_path: Path) -> None:
    why = fulldisk.available()
    if why:
        pytest.skip(why)
    result = campaign(tmp_path, "--campaign", "fulldisk", "--full-disks", "6")
    assert_no_bad(result)
    assert len(result["trials"]) == 6


def test_zeromq_kills(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "zmqkill", "--zmq-kills", "4")
    assert_no_bad(result, allowed={EXACT})
    assert len(result["trials"]) == 4


def test_s3_kills_and_faults(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "s3", "--s3-trials", "6")
    assert_no_bad(result, allowed={EXACT, PARTLY})
    assert len(result["trials"]) == 6


def test_aliased_segments_and_compound_bounds(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "aliased", "--aliased", "15")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 15


def test_forked_children(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "fork", "--forks", "8")
    assert_no_bad(result, allowed={EXACT})
    assert len(result["trials"]) == 8


def test_two_producers_rewrites_and_read_only_receivers(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "producers", "--producers", "10")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 10


def test_zeromq_blips_shared_ranks_and_cancelled_receives(tmp_path: Path) -> None:
    result = campaign(tmp_path, "--campaign", "zmqblips", "--zmq-blips", "6")
    assert_no_bad(result, allowed={EXACT, TYPED})
    assert len(result["trials"]) == 6
