"""Partial reads by field and ``add_fields`` against steps that are empty, damaged or
hostile, and appended values that do not fit the receiver's type: what a receiver or
a sender gets (a typed error naming what is wrong, or the step), asyncio and trio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import rlwire
from rlwire._frame.frame import Frame
from rlwire.codecs import MsgpackCodec

pytestmark = pytest.mark.anyio


class _RawCodec(MsgpackCodec):
    """Encodes whatever it is given as one hand-made frame (a hostile writer's)."""

    def __init__(self, header: bytes, buffers: tuple[bytes, ...] = ()) -> None:
        super().__init__()
        self.raw = Frame(header, tuple(memoryview(b) for b in buffers))

    def encode_sliced(self, obj: Any) -> Any:
        yield
        return self.raw


def _store_raw(url: str, header: bytes, buffers: tuple[bytes, ...] = ()) -> None:
    """Store ``header`` and ``buffers`` as step 0 of ``url``."""
    codec = _RawCodec(header, buffers)
    with rlwire.open_sync_sender(url, codec=codec, validate=False) as sender:
        sender.send({})


def _packed(rows: int) -> rlwire.TrainingBatch:
    ids = rlwire.Ragged.from_lengths(np.arange(3 * rows), [3] * rows)
    return rlwire.TrainingBatch(
        samples=rlwire.Columns(
            {
                "token_ids": ids,
                "mask": rlwire.Ragged(np.ones(3 * rows, bool), ids.offsets),
                "logprobs": rlwire.Ragged(np.zeros(3 * rows, np.float32), ids.offsets),
                "temperatures": rlwire.Ragged(np.ones(3 * rows, np.float32), ids.offsets),
                "advantages": rlwire.Ragged(np.zeros(3 * rows, np.float32), ids.offsets),
                "env_name": ["gsm8k"] * rows,
            }
        )
    )


async def test_fields_of_a_step_of_no_rows_are_columns_of_no_rows(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send(_packed(2))
        await sender.send(_packed(0))  # a rank with no samples this step
    async with rlwire.open_receiver(url, fields=("token_ids", "env_name")) as receiver:
        with anyio.fail_after(20):
            assert len((await receiver.areceive()).samples) == 2
            got = (await receiver.areceive(timeout=5)).samples
    assert isinstance(got, rlwire.Columns)
    assert (len(got), set(got.names)) == (0, {"token_ids", "env_name"})
    assert got["env_name"] == []
    assert len(got["token_ids"].values) == 0


async def test_a_field_appended_to_a_step_of_no_rows_comes_with_it(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send(_packed(0))
        await sender.add_fields(0, {"score": []})
    async with rlwire.open_receiver(url, fields=("env_name", "score")) as receiver:
        with anyio.fail_after(20):
            got = (await receiver.areceive(timeout=5)).samples
    assert (len(got), set(got.names)) == (0, {"env_name", "score"})
