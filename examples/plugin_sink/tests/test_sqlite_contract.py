"""rlwire's contract for every sink, run against the SQLite sink.

Subclassing ``rlwire.testing.SinkContract`` and giving it a ``sink_url`` fixture that
returns a fresh URL is all it takes: pytest then runs rlwire's whole suite (round trips,
per-rank payloads, sidecars, late receivers, cancelled sends, on_existing, ...) through
the public ``open_sender`` / ``open_receiver``, which find this sink by its URL scheme.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rlwire.testing import SinkContract

from rlwire_sqlite_sink import sqlite_url


class TestSqliteSink(SinkContract):
    @pytest.fixture
    def sink_url(self, tmp_path: Path) -> str:
        return sqlite_url(tmp_path / "run.db")


class TestSqliteSinkOwnTable(SinkContract):
    """The same contract with the sink's storage options set, so they are exercised too."""

    @pytest.fixture
    def sink_url(self, tmp_path: Path) -> str:
        return sqlite_url(tmp_path / "shared.db")

    @pytest.fixture
    def sender_options(self) -> Mapping[str, Any]:
        return {"table": "run_7", "timeout": 1.0}

    @pytest.fixture
    def receiver_options(self) -> Mapping[str, Any]:
        return {"table": "run_7"}
