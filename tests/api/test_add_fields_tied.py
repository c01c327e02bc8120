"""Appended fields are tied to the step's message they were checked against (format
1.5, the envelope's ``of``): a file of fields whose commit landed after its step was
deleted and written again under the same number (what a stage racing a producer
restarted with ``on_existing="overwrite"`` leaves; forced here by putting the old file
back) is taken by no reader and refused by no stage, for a step sent whole and one
filled part by part, on real files. Asyncio and trio."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio


def _columns(first: int) -> rlwire.Columns:
    return rlwire.Columns(
        {"token_ids": rlwire.Ragged.from_lengths(np.arange(first, first + 5), [2, 3])}
    )


async def _send(path: Path, first: int, parted: bool, **options: object) -> None:
    async with rlwire.open_sender(path, **options) as sender:  # type: ignore[arg-type]
        if not parted:
            await sender.send({"samples": _columns(first)})
            return
        async with sender.open_step(ranks=2) as writer:
            await writer.put([{"token_ids": np.arange(first, first + 2)}], key="a", rank=0)
            await writer.put([{"token_ids": np.arange(first + 2, first + 5)}], key="b", rank=0)
        # rank 1 has no part: its fields (0 rows) are tied to no message


async def _add(path: Path, fields: dict[str, object], rank: int = 0) -> None:
    stage = rlwire.open_sender(path)  # a stage: opens nothing, deletes nothing
    try:
        await stage.add_fields(0, fields, rank=rank)  # type: ignore[arg-type]
    finally:
        await stage.aclose()


def _score(path: Path, timeout: float = 10, **options: object) -> list[float] | None:
    """Rank 0's ``score`` of step 0, a value per sample, or None if it has none (a step
    sent whole read as columns, one in parts as its list of samples)."""
    parted = (path / "step-00000000.seal.rlw").exists()
    with rlwire.open_receiver(
        path,
        type=list if parted else dict,
        as_columns=not parted,
        record_consumed=False,
        **options,  # type: ignore[arg-type]
    ) as receiver:
        got = receiver.receive(timeout=timeout)
    if parted and not isinstance(got, rlwire.Columns):  # (fields= gives its columns)
        assert len(got) == 2
        scores = [row.get("score") for row in got]
        return None if scores == [None, None] else [float(x) for x in scores]
    got = got if parted else got["samples"]
    assert len(got) == 2
    return None if "score" not in got.names else got["score"].tolist()


@pytest.mark.parametrize("parted", [False, True], ids=["whole", "parted"])
async def test_fields_of_a_step_written_again_are_taken_by_no_reader(
    tmp_path: Path, parted: bool
) -> None:
    path = tmp_path / "run"
    await _send(path, 0, parted)
    await _add(path, {"score": [1.0, 2.0]})
    if parted:
        await _add(path, {"score": np.zeros(0)}, rank=1)
    assert _score(path) == [1.0, 2.0]
    kept = tmp_path / "kept"
    kept.mkdir()
    for old in path.glob("*.fields-*"):
        shutil.copy(old, kept)
    await _send(path, 100, parted, on_existing="overwrite")
    assert not list(path.glob("*.fields-*"))  # the overwrite deleted them with the step
    for old in kept.iterdir():  # the stage's commit, landed after the deletion
        shutil.copy(old, path)

    assert _score(path) is None
    with pytest.raises(rlwire.ReceiveTimeout):  # waits for a score of its own step
        _score(path, 0.5, fields=("score",))
    # A stage appends to the new step: not refused as appended already, the next file.
    await _add(path, {"score": [7.0, 8.0]})
    assert (path / "step-00000000.rank-0000.fields-001.rlw").exists()
    assert _score(path) == [7.0, 8.0]
    assert _score(path, fields=("score",)) == [7.0, 8.0]
    if parted:  # rank 1 had no part before and has none now: its 0 rows are taken
        with rlwire.open_receiver(path, rank=1, type=list, record_consumed=False) as receiver:
            assert receiver.receive(timeout=10) == []


async def test_a_step_written_again_while_a_receiver_reads_it_comes_without_the_old_fields(
    tmp_path: Path,
) -> None:
    """The step is written again between the receiver's read of its appended fields and
    its read of the step (forced: the rewrite runs right after the first read, an
    ``os.replace`` of the main file, as a producer's overwrite then send leaves it): the
    receiver reads both again, and the old step's fields stay away from the new one."""
    path, other = tmp_path / "run", tmp_path / "other"
    await _send(path, 0, False)
    await _add(path, {"score": [1.0, 2.0]})
    await _send(other, 100, False)
    with rlwire.open_receiver(path, type=dict, as_columns=True, record_consumed=False) as receiver:
        source = receiver._source  # type: ignore[attr-defined]
        read_appended = source.read_appended
        rewrites = []

        def then_rewrite(step: int) -> list[rlwire.Frame]:
            got = read_appended(step)
            if not rewrites:
                rewrites.append(step)
                name = "step-00000000.rank-0000.rlw"
                os.replace(other / name, path / name)
            return got

        source.read_appended = then_rewrite
        got = receiver.receive(timeout=10)["samples"]
    assert rewrites == [0]
    assert got["token_ids"].values.tolist() == list(range(100, 105))
    assert "score" not in got.names, got["score"]


async def test_a_retry_after_another_stage_took_the_index_keeps_the_first_tie(
    tmp_path: Path,
) -> None:
    """Between a stage's check of step 0 and its commit, the producer is restarted with
    ``overwrite`` (the step deleted and written again) and a fast stage appends to the
    new step, taking ``fields-000``: the commit finds its index taken and tries again,
    and must not check its fields (computed for the old step) against the new one and
    tie them to it. It raises ConfigError; the new step keeps the fast stage's fields
    alone."""
    path, other = tmp_path / "run", tmp_path / "other"
    await _send(path, 0, False)
    await _send(other, 100, False)
    await _add(other, {"ref": [5.0, 6.0]})
    stage = rlwire.open_sender(path)
    sink = stage._sink  # type: ignore[attr-defined]
    stage_fields = sink.stage_fields
    raced: list[int] = []

    def then_race(step: int, rank: int, frame: rlwire.Frame, **names: Any) -> Any:
        staged = yield from stage_fields(step, rank, frame, **names)
        if not raced:
            raced.append(step)
            for name in os.listdir(path):
                if not name.startswith("."):  # (the stage's own temporary file stays)
                    os.unlink(path / name)
            for name in os.listdir(other):
                shutil.copy(other / name, path)
        return staged

    sink.stage_fields = then_race
    try:
        with pytest.raises(rlwire.ConfigError, match="step 0 was deleted and sent again"):
            await stage.add_fields(0, {"score": [1.0, 2.0]})
    finally:
        await stage.aclose()
    assert raced == [0]
    assert sorted(p.name for p in path.glob("*.fields-*")) == [
        "step-00000000.rank-0000.fields-000.rlw"
    ]
    with rlwire.open_receiver(path, type=dict, as_columns=True, record_consumed=False) as rx:
        got = rx.receive(timeout=10)["samples"]
    assert got["token_ids"].values.tolist() == list(range(100, 105))
    assert got.names == ("token_ids", "ref")


async def test_a_file_left_beyond_a_gap_does_not_hide_the_new_steps_fields(
    tmp_path: Path,
) -> None:
    """An overwrite deletes a step's fields in name order: the second stage's
    ``fields-001``, committed late, can stay without a ``fields-000``. The next stage
    takes the free ``fields-000`` (readers stop at the first missing index), and is
    read; the old file is passed over."""
    path = tmp_path / "run"
    await _send(path, 0, False)
    await _add(path, {"ref": [5.0, 6.0]})
    await _add(path, {"score": [1.0, 2.0]})
    late = (path / "step-00000000.rank-0000.fields-001.rlw").read_bytes()
    await _send(path, 100, False, on_existing="overwrite")
    (path / "step-00000000.rank-0000.fields-001.rlw").write_bytes(late)
    await _add(path, {"score": [7.0, 8.0]})
    assert (path / "step-00000000.rank-0000.fields-000.rlw").exists()
    assert _score(path) == [7.0, 8.0]
    await _add(path, {"ref": [3.0, 4.0]})  # the next free index: 002
    assert (path / "step-00000000.rank-0000.fields-002.rlw").exists()
    with rlwire.open_receiver(path, type=dict, as_columns=True, record_consumed=False) as rx:
        got = rx.receive(timeout=10)["samples"]
    assert got.names == ("token_ids", "score", "ref")
    assert got["ref"].tolist() == [3.0, 4.0]
