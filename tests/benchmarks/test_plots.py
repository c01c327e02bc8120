"""benchmarks/plots.py draws rlwire beside its baselines, from a real run's samples.

A tiny ``bench_send.py`` run (its own process, as the suite starts it) gives the samples
of every row; the charts' lines must carry the floor's and the hand-written encodes'
stalls and memory, not only rlwire's, and the time target as the time it allows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    import tasks

    out = tmp_path_factory.mktemp("plots") / "send.json"
    script = ROOT / "benchmarks" / "bench_send.py"
    small = ["--samples", "4", "--tokens", "256", "--repeats", "1", "--warmup", "0"]
    result = subprocess.run(
        [sys.executable, str(script), *small, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": tasks.bench_path(), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return {
        "sink": "file",
        "backend": "asyncio",
        "size_gb": 0.001,
        "result": json.loads(out.read_text()),
    }


def test_lines_carry_the_baselines_and_the_alternatives(run: dict[str, object]) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plots import series
    from suite import Job, ratios

    job = Job("file", "asyncio", 0.001, [], result=run["result"])  # type: ignore[arg-type]
    rows = ratios(job)
    drawn = series(rows, {"runs": [run]})
    for measure in ("ms", "stall", "peak"):
        lines = {s.label: s for s in drawn[measure][("file", "send")]}
        assert set(lines) == {
            "rlwire",
            "floor: os.write of the same bytes",
            "msgspec encode + write on the loop",
            "msgspec encode + write in a thread",
        }, measure
        for s in lines.values():
            [(size, value)] = s.points["asyncio"]
            assert size == 0.001 and value >= 0
    # The figures are the run's own: the worst of the row's samples, as for rlwire.
    samples = run["result"]["rows"]  # type: ignore[index]
    for label, row in (
        ("floor: os.write of the same bytes", "floor (c)"),
        ("msgspec encode + write in a thread", "baseline (b)"),
    ):
        [line] = [s for s in drawn["stall"][("file", "send")] if s.label == label]
        assert line.points["asyncio"] == [(0.001, max(samples[row]["stall_max"]) * 1e3)]
        [line] = [s for s in drawn["peak"][("file", "send")] if s.label == label]
        assert line.points["asyncio"] == [(0.001, max(samples[row]["peak"]) / 1e6)]
    receive = {s.label for s in drawn["ms"][("file", "receive (verified)")]}
    assert receive == {"rlwire", "floor: read the same bytes once"}


def test_charts_are_drawn_from_the_run(run: dict[str, object], tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plots import plot_all
    from suite import Job, ratios

    rows = ratios(Job("file", "asyncio", 0.001, [], result=run["result"]))  # type: ignore[arg-type]
    results = {"runs": [run], "idle_loop_ms": {"median": 1.0, "max": 3.0, "windows": 2}}
    written = plot_all(rows, tmp_path, "python3 tasks.py bench --sizes 0.001", results)
    assert [p.name for p in written] == ["time.png", "stall.png", "memory.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
