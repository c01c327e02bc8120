"""The fence of a directory and of an S3 prefix (moto): once another sender opened the
destination, every call of the sender before that would make something visible or
delete something is refused with ClosedError, and nothing of it becomes visible (no
file, no temporary file); a sender that never opened it (appending fields) is not
fenced (docs/reliability.md, "The producer before, alive after a restart")."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlwire
from rlwire.testing import make_batch
from rlwire.transport import FileSink
from rlwire.transport.fsspec import FsspecSink
from rlwire.transport.layout import consumed_mark, consumed_name

FENCED = "another sender opened the destination .on_existing='resume'. after this one did"


def _listing(url: str, options: dict[str, Any]) -> list[str]:
    """Every name at the destination, temporary ones included."""
    if "://" not in url:
        return sorted(os.listdir(url))
    sink = FsspecSink(url, storage_options=options)
    return sorted(sink.names())


def _fields() -> dict[str, Any]:
    return {"score": np.arange(2, dtype=np.float32)}


@contextlib.contextmanager
def _fenced_off(url: str, options: dict[str, Any], parts: bool = False) -> Iterator[Any]:
    """A sender that sent steps 0-2 (and opened step 3 part by part, one part put, if
    ``parts``), then another opened the destination with ``resume``: the first."""
    with rlwire.open_sync_sender(url, storage_options=options) as before:
        for _ in range(3):
            before.send(make_batch(2, n=8))
        if parts:
            with contextlib.suppress(rlwire.ClosedError), before.open_step(ranks=2) as writer:
                writer.put(make_batch(1, n=4).samples, key="a")
                with rlwire.open_sync_sender(url, on_existing="resume", storage_options=options):
                    yield before, writer
                # leaving the step seals it: refused again
            return
        with rlwire.open_sync_sender(url, on_existing="resume", storage_options=options):
            yield before, None


CALLS: dict[str, Callable[[Any], None]] = {
    "send": lambda before: before.send(make_batch(2, n=8)),
    "send_ranks": lambda before: before.send_ranks([make_batch(1, n=4)] * 3),
    "finish": lambda before: before.finish(),
    "add_fields": lambda before: before.add_fields(1, _fields()),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_each_call_of_a_fenced_off_sender_is_refused_and_leaves_nothing(
    file_or_s3: tuple[str, dict[str, Any]], call: str
) -> None:
    url, options = file_or_s3
    with _fenced_off(url, options) as (before, _):
        listed = _listing(url, options)
        with pytest.raises(rlwire.ClosedError, match=FENCED):
            CALLS[call](before)
        assert _listing(url, options) == listed
        with pytest.raises(rlwire.ClosedError):  # and the next call too
            before.finish()
        assert _listing(url, options) == listed


@pytest.mark.parametrize("call", ["put", "seal"])
def test_a_fenced_off_part_and_seal_are_refused_and_leave_nothing(
    file_or_s3: tuple[str, dict[str, Any]], call: str
) -> None:
    url, options = file_or_s3
    with _fenced_off(url, options, parts=True) as (_, writer):
        listed = _listing(url, options)
        with pytest.raises(rlwire.ClosedError, match=FENCED):
            if call == "put":
                writer.put(make_batch(1, n=4).samples, key="b", rank=1)
            writer.seal()
        assert _listing(url, options) == listed
    assert not any("seal" in name for name in _listing(url, options))


@pytest.mark.anyio
async def test_a_sender_that_never_opened_is_not_fenced(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """As on ray://: a stage appending fields opens nothing, and appends beside the
    producer that opened last."""
    url, options = file_or_s3
    with _fenced_off(url, options):
        stage = rlwire.open_sender(url, storage_options=options)  # never opened
        try:
            await stage.add_fields(1, _fields())
        finally:
            await stage.aclose()
    assert any("fields" in name for name in _listing(url, options))


def _sink(url: str, options: dict[str, Any]) -> FileSink | FsspecSink:
    return FileSink(url) if "://" not in url else FsspecSink(url, storage_options=options)


def test_a_fenced_off_prune_deletes_nothing(file_or_s3: tuple[str, dict[str, Any]]) -> None:
    """keep_last's prune, which runs after a commit (refused first), refused on its own."""
    url, options = file_or_s3
    with _fenced_off(url, options):
        pass
    sink = _sink(url, options)
    sink.open("resume")
    for rank in range(2):  # both ranks' trainers moved past step 2
        sink.save(consumed_name(rank), consumed_mark(3))
    listed = _listing(url, options)
    with rlwire.open_sync_sender(url, on_existing="resume", storage_options=options):
        with pytest.raises(rlwire.ClosedError, match="cannot delete the steps before step 2"):
            sink.prune(2)
    assert [n for n in _listing(url, options) if n != "fence.rlw"] == [
        n for n in listed if n != "fence.rlw"
    ]


def test_a_missing_fence_is_refused(file_or_s3: tuple[str, dict[str, Any]]) -> None:
    """The fence is gone: something else than a sender of this rlwire rewrote the
    destination (an rlwire before fences, a manual deletion); the sender stops."""
    url, options = file_or_s3
    with rlwire.open_sync_sender(url, on_existing="overwrite", storage_options=options) as sender:
        sender.send(make_batch(2, n=8))
        assert "fence.rlw" in _listing(url, options)
        _sink(url, options).remove(["fence.rlw"])
        listed = _listing(url, options)
        with pytest.raises(rlwire.ClosedError, match=r"fence.rlw\) is gone"):
            sender.send(make_batch(2, n=8))
        assert _listing(url, options) == listed
    with rlwire.open_sync_sender(url, on_existing="resume", storage_options=options) as again:
        assert again.send(make_batch(2, n=8)) == 1


class _Overtaken(FileSink):
    """A directory sink that another sender overtakes while it opens: right after this
    one's fence, before its deletions (a real second open, in between two listings)."""

    listings = 0

    def names(self) -> list[str]:
        self.listings += 1
        if self.listings == 2:
            FileSink(self.root).open("resume")
        return super().names()


def test_an_open_overtaken_by_another_deletes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url) as sender:
        for _ in range(3):
            sender.send(make_batch(2, n=8))
        sender.finish()
    listed = [n for n in _listing(url, {}) if n.startswith("step-")]
    with pytest.raises(rlwire.ClosedError, match="cannot delete earlier steps"):
        _Overtaken(url).open("overwrite")
    # the other open (resume) deleted the end mark, and nothing else went
    assert [n for n in _listing(url, {}) if n.startswith("step-")] == listed
    assert "rewrite.rlw" not in _listing(url, {})


@pytest.mark.anyio
async def test_a_fenced_off_async_send_is_refused(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as before:
        await before.send(make_batch(2, n=8))
        async with rlwire.open_sender(url, on_existing="overwrite", storage_options=options):
            listed = _listing(url, options)
            with pytest.raises(rlwire.ClosedError, match="on_existing='overwrite'"):
                await before.send(make_batch(2, n=8))
            assert _listing(url, options) == listed
