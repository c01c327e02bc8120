"""Every built-in sink against the contract in rlwire.testing."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire import TrainingBatch, TrainingBatchReceiver, TrainingBatchSender
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

    # Each example is a dozen requests to the server: fewer of them on this slowest sink
    # (the mixes themselves are covered by the twenty on every other sink).
    columns_examples = 8

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


@dataclasses.dataclass(frozen=True)
class _KeepingEndpoint:
    """The contract's endpoint (the same fields and methods), whose senders keep
    ``keep_last`` steps unless a test says otherwise: recycling needs ``keep_last``."""

    url: str
    sender_options: Mapping[str, Any]
    receiver_options: Mapping[str, Any]
    keep_last: int = 1

    def open_sender(self, **options: Any) -> TrainingBatchSender:
        retention = options.get("retention")
        if retention is None and "keep_last" not in options:
            options["keep_last"] = self.keep_last
        elif retention is not None and retention.keep_last is None:
            options["retention"] = dataclasses.replace(retention, keep_last=self.keep_last)
        return rlwire.open_sender(self.url, storage_options=self.sender_options, **options)

    def open_receiver(self, **options: Any) -> TrainingBatchReceiver[TrainingBatch]:
        return rlwire.open_receiver(self.url, storage_options=self.receiver_options, **options)


class TestFileRecycle(SinkContract):
    """Files with the storage option ``recycle``: each sender keeps the newest
    ``KEEP_LAST`` steps unless the test sets ``keep_last`` itself, so the tests whose
    receivers move on (the retention tests among them) write steps into the files of
    pruned ones."""

    KEEP_LAST = 1

    @pytest.fixture
    def sink_url(self, tmp_path: Path) -> str:
        return str(tmp_path / "run")

    @pytest.fixture
    def sender_options(self) -> Mapping[str, Any]:
        return {"recycle": True}

    @pytest.fixture
    def endpoint(
        self,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receiver_options: Mapping[str, Any],
    ) -> _KeepingEndpoint:
        return _KeepingEndpoint(sink_url, sender_options, receiver_options, self.KEEP_LAST)


class TestRay(SinkContract):
    """Against a real local Ray cluster (tests/ray_cluster.py); the sender and receivers
    run in the driver, so the steps are the driver's objects (tests/transport/ray tests
    producers in actors)."""

    # Each example is several calls on the board (twenty took 1.1 s a loop alone, eight
    # 0.5 s; ten times that under the test command): fewer of them, as on S3.
    columns_examples = 8

    @pytest.fixture
    def sink_url(self, ray_url: str) -> str:
        return ray_url
