"""benchmarks/encode_slices.py runs and prints the encode's and the checks' figures.

A smoke test, not a timed one: ``--quick`` (tiny shapes, one round) in a process of its
own, with this checkout's src, as for bench_columns.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "encode_slices.py"


@pytest.mark.parametrize("shape", ["small", "dense"])
def test_quick_run_prints_the_encode_and_the_checks(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks

    monkeypatch.setenv("PYTHONPATH", tasks.bench_path())
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--shape", shape, "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"{shape} encode", f"{shape} checks"]
    assert all("longest slice of CPU" in line for line in lines)
