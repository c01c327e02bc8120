"""A list of Structs with a field left ``msgspec.UNSET`` (which msgspec encodes by
leaving the field out of the row) is sent, and received with ``UNSET`` back for those
rows. Before, rlwire stored the list as columns, the field's column held ``UNSET``, and
the send failed: ``EncodeError`` "cannot encode value of type msgspec.UnsetType"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from msgspec import UNSET, UnsetType

import rlwire
from rlwire.codecs import MsgpackCodec

pytestmark = pytest.mark.anyio


class Sample(msgspec.Struct):
    x: np.ndarray
    reward: float | UnsetType = UNSET
    n: int = 0


class Batch(msgspec.Struct):
    samples: list[Sample]


class Positional(msgspec.Struct, array_like=True):
    x: np.ndarray
    reward: float | UnsetType = UNSET


async def _sent(path: Path, batch: Batch) -> None:
    async with rlwire.open_sender(path, validate=False) as sender:
        await sender.send(batch)


async def _received(path: Path, tp: Any, **options: Any) -> Any:
    with rlwire.open_receiver(path, type=tp, record_consumed=False, **options) as receiver:
        return await receiver.areceive(timeout=5)


async def test_a_field_unset_in_some_rows_keeps_the_list_a_list_of_rows(tmp_path: Path) -> None:
    sent = Batch([Sample(np.arange(3), 1.0, 1), Sample(np.arange(2), n=2), Sample(np.arange(1))])
    await _sent(tmp_path, sent)
    got = await _received(tmp_path, Batch)
    assert [s.reward for s in got.samples] == [1.0, UNSET, UNSET]
    assert [s.n for s in got.samples] == [1, 2, 0]
    assert [s.x.tolist() for s in got.samples] == [[0, 1, 2], [0, 1], [0]]
    # not stored as columns: as_columns gives the rows, the unset field left out of them
    rows = (await _received(tmp_path, Any, as_columns=True))["samples"]
    assert isinstance(rows, list)
    assert [sorted(row) for row in rows] == [["n", "reward", "x"], ["n", "x"], ["n", "x"]]
    typed = await _received(tmp_path, Batch, as_columns=True)
    assert [s.reward for s in typed.samples] == [1.0, UNSET, UNSET]


async def test_a_field_unset_in_every_row_is_left_out_of_the_columns(tmp_path: Path) -> None:
    await _sent(tmp_path, Batch([Sample(np.arange(3), n=1), Sample(np.arange(2), n=2)]))
    got = await _received(tmp_path, Batch)
    assert [(s.reward, s.n, s.x.tolist()) for s in got.samples] == [
        (UNSET, 1, [0, 1, 2]),
        (UNSET, 2, [0, 1]),
    ]
    columns = (await _received(tmp_path, Any, as_columns=True))["samples"]
    assert isinstance(columns, rlwire.Columns) and columns.names == ("x", "n")
    assert isinstance(columns["x"], rlwire.Ragged)


def test_an_array_like_struct_with_an_unset_field_is_refused_as_msgspec_refuses_it() -> None:
    """A row given by position cannot leave a field out: msgspec refuses it, so does
    rlwire, naming the row (not stored otherwise, which would shift the fields). As
    before the fix: a guard that a positional row never has a field dropped."""
    rows = [Positional(np.arange(2), 1.0), Positional(np.arange(1))]
    with pytest.raises(TypeError, match="UnsetType"):
        msgspec.msgpack.encode(Positional([0], UNSET))  # type: ignore[arg-type]
    with pytest.raises(rlwire.EncodeError, match=r"\$\[1\]\.reward: .*UnsetType"):
        MsgpackCodec().encode(rows)
