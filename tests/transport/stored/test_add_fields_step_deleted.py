"""A stage's ``add_fields`` whose step is deleted by a producer restarted with
``on_existing="overwrite"`` during the call learns it as a ``ConfigError`` (the step
was deleted, or is not committed), not as damaged data or a failing store: the
deletion is a real producer's, run at a precise moment of the stage's call (while it
reads the step to check the fields, or right before its commit), on real files.
Asyncio and trio."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from anyio import from_thread

import rlwire
from rlwire.transport._stored.appended_tie import TiedStaging

pytestmark = pytest.mark.anyio


async def _send(
    path: Path, first: int, parted: bool, options: dict[str, Any] | None = None
) -> None:
    async with rlwire.open_sender(path, **(options or {})) as sender:
        if not parted:
            await sender.send({"samples": [{"token_ids": np.arange(first, first + 2)}]})
            return
        async with sender.open_step(ranks=1) as writer:
            await writer.put([{"token_ids": np.arange(first, first + 2)}], key="a", rank=0)
            await writer.put([{"token_ids": np.arange(first + 2, first + 5)}], key="b", rank=0)


async def _overwrite(path: Path) -> None:
    """A producer restarted with ``overwrite`` that has sent nothing yet: the old run's
    steps are deleted."""
    async with rlwire.open_sender(path, on_existing="overwrite"):
        pass


def _once(action: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            action()

    return run


@pytest.mark.parametrize("parted", [False, True], ids=["whole", "parted"])
async def test_a_step_deleted_while_add_fields_reads_it_is_a_config_error(
    tmp_path: Path, parted: bool
) -> None:
    path = tmp_path / "run"
    await _send(path, 0, parted)
    rows = 2 if parted else 1
    stage = rlwire.open_sender(path)
    sink: Any = stage._sink  # type: ignore[attr-defined]
    load_head = sink.load_head
    # The last file the check reads: the main file, or the step's second part.
    last = "step-00000000.rank-0000." + ("part-000001.rlw" if parted else "rlw")
    delete = _once(lambda: from_thread.run(_overwrite, path))

    def deleted_first(name: str, size: int) -> Any:
        if name == last:
            delete()
        return load_head(name, size)

    sink.load_head = deleted_first
    try:
        with pytest.raises(rlwire.ConfigError, match="step 0"):
            await stage.add_fields(0, {"score": np.ones(rows)})
    finally:
        await stage.aclose()


def _before_commit(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run ``action`` (a real producer's) right before the stage's commit."""
    commit = TiedStaging.commit

    def action_first(self: TiedStaging) -> None:
        action()
        commit(self)

    monkeypatch.setattr(TiedStaging, "commit", action_first)


async def test_a_step_deleted_right_before_the_stage_commits_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer's overwrite also removes the stage's file in the making (a killed
    writer's leftover, to it): the commit then fails; the stage is told why."""
    path = tmp_path / "run"
    await _send(path, 0, False)
    _before_commit(monkeypatch, _once(lambda: from_thread.run(_overwrite, path)))
    stage = rlwire.open_sender(path)
    try:
        with pytest.raises(rlwire.ConfigError, match="step 0 was deleted"):
            await stage.add_fields(0, {"score": np.ones(1)})
    finally:
        await stage.aclose()
    assert not list(path.glob("*.fields-*"))


async def test_a_stage_attaching_while_a_producer_opens_with_overwrite_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage's first call probes the directory (a file it creates and removes); a
    producer opening with ``overwrite`` meanwhile removes that file with the killed
    writers' leftovers: the stage goes on, and appends to the step sent again."""
    path = tmp_path / "run"
    await _send(path, 0, False)
    unlink = Path.unlink
    restart = _once(lambda: from_thread.run(_send, path, 100, False, {"on_existing": "overwrite"}))

    def producer_first(self: Path, missing_ok: bool = False) -> None:
        if self.name.startswith(".rlwire-probe."):
            restart()
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", producer_first)
    stage = rlwire.open_sender(path)
    try:
        await stage.add_fields(0, {"score": np.ones(1)})
    finally:
        await stage.aclose()
    monkeypatch.undo()
    with rlwire.open_receiver(path, type=dict, record_consumed=False) as receiver:
        got = receiver.receive(timeout=10)["samples"][0]
    assert got["token_ids"].tolist() == [100, 101]
    assert float(got["score"]) == 1.0


async def test_a_producer_resuming_right_before_the_stage_commits_takes_nothing_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer restarted with ``resume`` keeps the step, and removes the stage's file
    in the making as a killed writer's leftover: the stage writes it again."""
    path = tmp_path / "run"
    await _send(path, 0, False)
    resume = _once(lambda: from_thread.run(_send, path, 100, False, {"on_existing": "resume"}))
    _before_commit(monkeypatch, resume)
    stage = rlwire.open_sender(path)
    try:
        await stage.add_fields(0, {"score": np.ones(1)})
    finally:
        await stage.aclose()
    with rlwire.open_receiver(path, type=dict, record_consumed=False) as receiver:
        got = receiver.receive(timeout=10)["samples"][0]
    assert got["token_ids"].tolist() == [0, 1]
    assert float(got["score"]) == 1.0


async def test_a_part_missing_from_a_step_kept_is_still_damage(tmp_path: Path) -> None:
    """Not every missing file is a deletion under way: a part lost from a step that
    stays as it was is a CorruptFrameError naming it."""
    path = tmp_path / "run"
    await _send(path, 0, True)
    (path / "step-00000000.rank-0000.part-000001.rlw").unlink()
    stage = rlwire.open_sender(path)
    try:
        with pytest.raises(rlwire.CorruptFrameError, match=r"part-000001\.rlw: missing"):
            await stage.add_fields(0, {"score": np.ones(2)})
    finally:
        await stage.aclose()
