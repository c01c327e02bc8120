"""Fixtures of the file sink's tests: a directory on tmpfs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SHM = Path("/dev/shm")


def stat_type(path: Path) -> str:
    """The filesystem type of ``path`` by coreutils' ``stat -f`` ("" if unknown): an
    oracle beside the sink's own reading of mountinfo."""
    run = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else ""


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A fresh directory under /dev/shm (tmpfs), removed afterwards; skips elsewhere."""
    if not SHM.is_dir() or stat_type(SHM) != "tmpfs":
        pytest.skip("needs /dev/shm on tmpfs")
    root = SHM / f"rlwire-test-{os.getpid()}-{os.urandom(4).hex()}"
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
