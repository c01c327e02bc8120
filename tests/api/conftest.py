"""Fixtures of the API tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3_server import FaultProxy


@pytest.fixture(params=["file", "s3"])
def file_or_atomic_s3(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(url, storage_options)``: a new directory, or a new bucket reached through a
    proxy that makes moto's conditional writes atomic, as S3's are."""
    if request.param == "file":
        yield str(tmp_path / "run"), {}
        return
    url = request.getfixturevalue("s3_url")
    with FaultProxy(request.getfixturevalue("s3_endpoint"), atomic_conditions=True) as proxy:
        yield f"{url}/run", proxy.options
