"""Fixtures of the file sink's tests: a directory on tmpfs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import stat_type

SHM = Path("/dev/shm")


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
