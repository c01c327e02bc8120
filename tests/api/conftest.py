"""Fixtures of the API tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(params=["file", "s3"])
def file_or_s3(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` of a store that keeps steps: a new directory, then a
    new bucket on the test session's S3 server (``run`` under each)."""
    if request.param == "file":
        return str(tmp_path / "run"), {}
    return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")
