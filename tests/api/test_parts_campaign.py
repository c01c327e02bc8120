"""Defects found by the adversarial campaign against steps filled part by part and
appended fields: a resumed producer that finished the stream at a step left open, a
seal written over another producer's part, and two stages appending to one step at
once (on files). Every async test runs under asyncio and trio."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import append_at_once, send_a_part_of_two_rows

import rlwire
from rlwire.transport import FileSink

pytestmark = pytest.mark.anyio


class Crash(Exception):
    """What kills a producer mid-step here: its block ends with an error, and the step
    stays open on disk as after a kill -9."""


def group(n: int) -> list[dict[str, np.ndarray]]:
    return [{"token_ids": np.arange(n, dtype=np.int64)}]


async def leave_open(path: Path, keys: list[str]) -> None:
    """A producer that puts ``keys`` into step 0 and dies before sealing it."""
    async with rlwire.open_sender(path, validate=False) as sender:
        with pytest.raises(Crash):
            async with sender.open_step() as writer:
                for key in keys:
                    await writer.put(group(3), key=key)
                raise Crash


async def test_a_resumed_producer_cannot_finish_at_a_step_left_open(
    tmp_path: Path, anyio_backend: str
) -> None:
    await leave_open(tmp_path, ["a"])
    async with rlwire.open_sender(tmp_path, on_existing="resume", validate=False) as sender:
        with pytest.raises(rlwire.StepOrderError, match=r"step 0 is open part by part.*open_step"):
            await sender.finish()
        assert not (tmp_path / "end.rlw").exists()
        async with sender.open_step() as writer:  # the repair: fill and seal it, then finish
            assert await writer.put(group(3), key="a")
            await writer.put(group(2), key="b")
        await sender.finish()
    with rlwire.open_receiver(tmp_path, type=list, record_consumed=False) as receiver:
        assert [part.key for part in receiver.parts(timeout=1)] == ["a", "b"]
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=1)


async def test_a_seal_never_leaves_out_a_part_another_producer_put(
    tmp_path: Path, anyio_backend: str
) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as first:
        writer = first.open_step(ranks=2)
        await writer.__aenter__()
        await writer.put(group(3), key="k0")  # rank 0
        async with rlwire.open_sender(tmp_path, on_existing="resume", validate=False) as second:
            other = second.open_step(ranks=2)
            await other.__aenter__()
            assert not await other.put(group(1), key="k1")  # rank 1, unknown to the first
            # The first is fenced off (the second opened after it): it seals nothing
            with pytest.raises(rlwire.ClosedError, match="cannot seal step 0: another sender"):
                await writer.__aexit__(None, None, None)
            await other.__aexit__(None, None, None)  # the one that knows every part wins
    for rank, keys in enumerate((["k0"], ["k1"])):
        with rlwire.open_receiver(tmp_path, type=list, rank=rank, record_consumed=False) as r:
            assert [part.key for part in r.parts(timeout=1)] == keys
        with rlwire.open_receiver(tmp_path, type=list, rank=rank, record_consumed=False) as r:
            assert len(r.receive(timeout=1)) == 1


async def test_two_stages_append_to_one_step_at_once(
    tmp_path: Path, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await send_a_part_of_two_rows(str(tmp_path))
    # Both stages list the step's files before either commits: both pick fields-000.
    both_staged, first_tries = threading.Barrier(2, timeout=5), [0]
    stage_fields = FileSink.stage_fields

    def staged_together(self: Any, step: int, rank: int, frame: Any, **names: Any) -> Any:
        staged = yield from stage_fields(self, step, rank, frame, **names)
        first_tries[0] += 1
        if first_tries[0] <= 2:
            both_staged.wait()
        return staged

    monkeypatch.setattr(FileSink, "stage_fields", staged_together)

    await append_at_once(str(tmp_path), ("ref_logprobs", "values"))
    with rlwire.open_receiver(
        tmp_path, type=list, as_columns=True, record_consumed=False
    ) as receiver:
        assert set(receiver.receive(timeout=1).names) == {"token_ids", "ref_logprobs", "values"}
