"""Shared fixtures: every async test runs under asyncio and under trio."""

from __future__ import annotations

import pytest
from ray_cluster import ray_cluster as ray_cluster  # a local Ray cluster, on demand
from ray_cluster import ray_url as ray_url
from s3_server import s3_endpoint as s3_endpoint  # moto S3 fixtures for every module
from s3_server import s3_url as s3_url


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
