"""benchmarks/bench_columns.py (issue 25's shapes) runs and prints every row.

A smoke test, not a timed one: ``--quick`` (tiny shapes, one round, both loops) in a
process of its own, as ``python3 tasks.py bench`` starts it, with this checkout's src.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_columns.py"
SHAPES = ("dense", "ragged", "small", "multiturn")
BATCH_ROWS = (
    "send",
    "receive",
    "receive as_columns",
    "next areceive, holding a step",
    "release a step (del batch)",
)
TURN_ROWS = ("concatenate every turn", "concatenate once + send", "Chunked appends + send")
# Rows that today's code measures (the others say n/a until issue 25 adds them).
MEASURED = {"send", "receive", "next areceive, holding a step", "concatenate once + send"}


def test_quick_run_prints_every_row_for_every_shape_and_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks

    monkeypatch.setenv("PYTHONPATH", tasks.bench_path())
    out = tmp_path / "columns.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for loop in ("asyncio", "trio"):
        for shape in SHAPES:
            for op in TURN_ROWS if shape == "multiturn" else BATCH_ROWS:
                row = [line for line in lines if line.startswith(f"| {shape} | {loop} | {op} |")]
                assert row, f"no row for {shape} {loop} {op}"
                rlwire_ms = row[0].split(" | ")[3]
                if op in MEASURED:
                    assert float(rlwire_ms.split()[0]) > 0, row[0]
                    # each measured rlwire row has its stall beside the idle loop's gap
                    stall, idle, diff = row[0].split(" | ")[7:10]
                    assert stall != "—" and idle != "—" and diff != "—", row[0]
    saved = json.loads(out.read_text())
    assert set(saved["loops"]) == {"asyncio", "trio"}
    for loop in saved["loops"].values():
        assert set(loop) == set(SHAPES)
        dense = loop["dense"]["rows"]
        # the baselines ran in the same round as the rlwire rows
        assert len(dense["send"]["seconds"]) == len(dense["floor"]["seconds"]) == 1
        assert len(dense["receive"]["seconds"]) == len(dense["read once"]["seconds"]) == 1
        assert len(dense["idle (send)"]["stall_max"]) == 1
