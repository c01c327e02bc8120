"""A generic fsspec store (every filesystem but S3) whose moves fail at commit: the
step's state is then known (visible or not), or the sender is told it is unknown.

The filesystem is fsspec's real memory filesystem under a protocol of its own, with
faults injected into ``mv`` (a move that fails, or one whose reply is lost after it
happened) and ``exists`` (the store cannot be asked).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import rlwire
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.transport.fsspec import FsspecSink

CODEC = MsgpackCodec(sidecar=["routed_experts"])


class FaultyMemory(MemoryFileSystem):
    """fsspec's memory filesystem, whose moves and existence checks can be made to fail."""

    protocol = "faultymemory"
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    #: Names of moves to fail: "before" fails without moving, "after" moves then fails.
    mv_faults: ClassVar[dict[str, str]] = {}
    #: Names whose existence cannot be asked about.
    exists_fails: ClassVar[set[str]] = set()

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        fault = self.mv_faults.get(path2.rpartition("/")[2])
        if fault == "before":
            raise ConnectionResetError("connection reset by peer")
        super().mv(path1, path2, **kwargs)
        if fault == "after":
            raise TimeoutError("the reply was lost")

    def exists(self, path: str, **kwargs: Any) -> bool:
        if path.rpartition("/")[2] in self.exists_fails:
            raise ConnectionRefusedError("the store is out of reach")
        return bool(super().exists(path, **kwargs))


@pytest.fixture
def url() -> Iterator[str]:
    fsspec.register_implementation("faultymemory", FaultyMemory, clobber=True)
    FaultyMemory.mv_faults, FaultyMemory.exists_fails = {}, set()
    yield f"faultymemory://run-{uuid.uuid4().hex}"
    FaultyMemory.mv_faults, FaultyMemory.exists_fails = {}, set()


def frames(ranks: int) -> list[rlwire.Frame]:
    return [
        CODEC.encode({"rank": r, "routed_experts": np.full(1000, r, np.uint8)})
        for r in range(ranks)
    ]


def names(url: str) -> list[str]:
    fs = FaultyMemory()
    return sorted(p.rpartition("/")[2] for p in fs.find(fs._strip_protocol(url)))


def staged(url: str, ranks: int) -> Any:
    sink = FsspecSink(url)
    sink.open("error")
    return run_sliced(sink.stage(0, frames(ranks)))


def test_a_lost_reply_of_a_move_that_happened_is_a_commit(url: str) -> None:
    FaultyMemory.mv_faults = {"step-00000000.rank-0000.rlw": "after"}
    step = staged(url, 2)
    step.commit()
    assert step.visible is True
    assert [n for n in names(url) if not n.startswith(".")] == [
        "step-00000000.rank-0000.rlw",
        "step-00000000.rank-0000.sidecar.rlw",
        "step-00000000.rank-0001.rlw",
        "step-00000000.rank-0001.sidecar.rlw",
    ]


def test_a_failed_move_that_did_not_happen_leaves_nothing(url: str) -> None:
    FaultyMemory.mv_faults = {"step-00000000.rank-0000.rlw": "before"}
    step = staged(url, 2)
    with pytest.raises(rlwire.TransportError, match="nothing was made visible"):
        step.commit()
    assert step.visible is False
    assert names(url) == []


def test_a_failed_move_after_rank_0_reports_the_ranks_visible(url: str) -> None:
    FaultyMemory.mv_faults = {"step-00000000.rank-0001.rlw": "before"}
    step = staged(url, 2)
    with pytest.raises(rlwire.TransportError, match=r"visible for ranks \[0\] only"):
        step.commit()
    assert step.visible is True


def test_a_failed_move_the_store_cannot_be_asked_about_is_unknown(url: str) -> None:
    FaultyMemory.mv_faults = {"step-00000000.rank-0000.rlw": "after"}
    step = staged(url, 1)
    FaultyMemory.exists_fails = {"step-00000000.rank-0000.rlw"}
    with pytest.raises(rlwire.TransportError, match=r"unknown.*on_existing='resume'"):
        step.commit()
    assert step.visible is None
    FaultyMemory.exists_fails = set()
    # The step did land: nothing of it was deleted, and resume goes on after it.
    assert "step-00000000.rank-0000.sidecar.rlw" in names(url)
    sink = FsspecSink(url)
    assert sink.open("resume") == 1
