"""Every built-in sink against the contract in rlwire.testing."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rlwire.testing import SinkContract


class TestFileSink(SinkContract):
    @pytest.fixture
    def sink_url(self, tmp_path: Path) -> str:
        return str(tmp_path / "run")


class TestFileURL(SinkContract):
    @pytest.fixture
    def sink_url(self, tmp_path: Path) -> str:
        return (tmp_path / "run").as_uri()


class TestMemory(SinkContract):
    @pytest.fixture
    def sink_url(self) -> str:
        return f"memory://contract-{uuid.uuid4().hex}"


class TestS3(SinkContract):
    """Through s3fs against a moto server on loopback (tests/s3_server.py)."""

    @pytest.fixture
    def sink_url(self, s3_url: str) -> str:
        return f"{s3_url}/run"

    @pytest.fixture
    def sender_options(self, s3_endpoint: Mapping[str, Any]) -> Mapping[str, Any]:
        return s3_endpoint

    @pytest.fixture
    def receiver_options(self, s3_endpoint: Mapping[str, Any]) -> Mapping[str, Any]:
        return s3_endpoint


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TestZmqTcp(SinkContract):
    persistent = False

    @pytest.fixture
    def sink_url(self) -> str:
        return f"zmq+tcp://127.0.0.1:{_free_port()}"


class TestZmqIpc(SinkContract):
    persistent = False

    @pytest.fixture
    def sink_url(self, tmp_path: Path) -> str:
        return f"zmq+ipc://{tmp_path}/run.sock"


class TestRay(SinkContract):
    """Against a real local Ray cluster (tests/ray_cluster.py); the sender and receivers
    run in the driver, so the steps are the driver's objects (tests/transport/ray tests
    producers in actors)."""

    @pytest.fixture
    def sink_url(self, ray_url: str) -> str:
        return ray_url
