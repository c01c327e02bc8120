"""Names of earlier versions keep working, with a DeprecationWarning: a plugin that
implements or reads Sink.consumed() and Source.consumes, and the layout helpers that
left rlwire.transport.layout."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import rlwire.transport.layout as layout
from rlwire.abc import PendingFrame, Sink, Sliced, Source, Staged
from rlwire.transport._stored.names import MAIN_RE
from rlwire.transport.layout import StoredSink, StoredSource


class _Sink(Sink):
    def open(self, on_existing: object, start_step: int | None = None) -> int:
        return 0

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        raise NotImplementedError
        yield


def test_a_plugin_that_implements_consumed_is_read_through_read_consumption() -> None:
    with pytest.warns(DeprecationWarning, match=r"consumed\(\) is deprecated"):

        class Old(_Sink):
            def consumed(self, ranks: int, sent: int) -> list[int | None]:
                return [sent] * ranks

    assert Old().read_consumption(2, 5) == [5, 5]
    assert Old().consumed(1, 3) == [3]  # its own method: no warning


def test_reading_the_old_names_warns() -> None:
    class New(_Sink):
        def read_consumption(self, ranks: int, sent: int) -> list[int | None]:
            return [None] * ranks

    with pytest.warns(DeprecationWarning, match="read_consumption"):
        assert New().consumed(1, 0) == [None]

    with pytest.warns(DeprecationWarning, match="consumes is deprecated"):

        class Socket(Source):
            consumes = True

            def read(self, step: int) -> None:
                return None

    assert Socket.reads_once is True
    assert Source.reads_once is False


def test_layout_helpers_that_left_the_face_still_import() -> None:
    assert {"StoredSink", "StoredSource", "StoredStaging"} <= set(layout.__all__)
    assert StoredSink.__module__ == StoredSource.__module__ == "rlwire.transport.layout"
    with pytest.warns(DeprecationWarning, match="MAIN_RE is deprecated"):
        assert layout.MAIN_RE is MAIN_RE
