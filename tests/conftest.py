"""Shared fixtures: every async test runs under asyncio and under trio."""

from __future__ import annotations

import os

import pytest
from depth import examples
from hypothesis import HealthCheck, settings
from ray_cluster import ray_cluster as ray_cluster  # a local Ray cluster, on demand
from ray_cluster import ray_producer as ray_producer
from ray_cluster import ray_trainers as ray_trainers
from ray_cluster import ray_url as ray_url
from s3_server import file_or_s3 as file_or_s3  # moto S3 fixtures for every module
from s3_server import s3_endpoint as s3_endpoint
from s3_server import s3_url as s3_url

# ray.init() without an address joins the cluster a `ray start` or a multi-node test
# (ray.cluster_utils) last recorded on this machine, if any: each test process, and each
# example or script it runs, starts its own local cluster instead.
os.environ.setdefault("RAY_ADDRESS", "local")

# Property tests that ask for no count draw hypothesis's 100 at full depth (depth.py).
# No deadline and no too-slow check: on a loaded 2-core machine one example took 259 ms
# against the default 200 ms and failed its test; speed is the benchmarks' to judge.
settings.register_profile(
    "rlwire",
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("rlwire")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the Ray cluster run in one pytest-xdist worker (``--dist loadgroup``), so
    that the suite starts one cluster, not one per worker."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
