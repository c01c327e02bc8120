"""Hostile column tables (a columns value whose offsets, values, dtypes or shapes
disagree), stored with valid checksums and read through every entry point: a typed
error that names the column, and the step, never an answer, asyncio and trio."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import store_frame
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

import rlwire

pytestmark = pytest.mark.anyio


def _ref(index: int, dtype: str, shape: list[int], order: str = "C") -> Ext:
    return Ext(1, mp([index, dtype, shape, order]))


def _i8(*values: int) -> memoryview:
    return memoryview(np.array(values, "<i8").tobytes())


def _step(logprobs: Any, *buffers: memoryview) -> rlwire.Frame:
    """Step 0 of 2 samples: a sound ragged ``token_ids`` (buffers 0 and 1) and
    ``logprobs`` as given (its buffers from 2)."""
    ids = Ext(6, mp([_ref(0, "<i8", [3]), _ref(1, "<i8", [3])]))
    samples = Ext(7, mp([2, 0, ["token_ids", "logprobs"], [ids, logprobs]]))
    return rlwire.Frame(mp({"samples": samples}), (_i8(1, 2, 3), _i8(0, 1, 3), *buffers))


def _ragged(values: Ext, offsets: Ext) -> Ext:
    return Ext(6, mp([values, offsets]))


HOSTILE = {
    "offsets from 1": (
        _ragged(_ref(2, "<f4", [3]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(1, 2, 3)),
    ),
    "offsets past the values": (
        _ragged(_ref(2, "<f4", [3]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 9)),
    ),
    "float offsets": (
        _ragged(_ref(2, "<f4", [3]), _ref(3, "<f8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 3)),
    ),
    "values shorter than their shape": (
        _ragged(_ref(2, "<f4", [4]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 3)),
    ),
    "object dtype": (
        _ragged(_ref(2, "|O", [3]), _ref(3, "<i8", [3])),
        (memoryview(bytes(24)), _i8(0, 1, 3)),
    ),
    "huge row shape": (
        _ragged(_ref(2, "<f4", [3, 2**40, 2**40]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 3)),
    ),
    "string dtype": (
        _ragged(_ref(2, "<U1000000000", [3]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 3)),
    ),
    "negative row shape": (
        _ragged(_ref(2, "<f4", [3, -1]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 3)),
    ),
    "order K": (
        _ragged(_ref(2, "<f4", [3, 1], "K"), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1, 3)),
    ),
    "values a ragged array": (
        _ragged(_ragged(_ref(2, "<f4", [3]), _ref(3, "<i8", [2])), _ref(4, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 3), _i8(0, 1, 3)),
    ),
    "buffer of token_ids again": (
        _ragged(_ref(0, "<i8", [3]), _ref(2, "<i8", [3])),
        (_i8(0, 1, 3),),
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize(
    "options",
    [{"type": Any}, {"type": rlwire.TrainingBatch}, {"type": Any, "as_columns": True}],
    ids=["any", "batch", "as-columns"],
)
async def test_a_hostile_ragged_column_is_refused_naming_it(
    tmp_path: Path, case: str, options: dict[str, Any]
) -> None:
    """What is wrong with a ragged column was said of "a ragged array" or "an array
    descriptor", with nothing to tell which of the step's columns it was."""
    logprobs, buffers = HOSTILE[case]
    store_frame(tmp_path, _step(logprobs, *buffers))
    async with rlwire.open_receiver(tmp_path, **options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await receiver.areceive(timeout=5)
    assert "step-00000000.rank-0000.rlw" in str(caught.value)
    assert "column 'logprobs'" in str(caught.value)


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_partial_read_beside_a_hostile_column_gives_its_column_or_names_the_step(
    tmp_path: Path, case: str
) -> None:
    """``fields=`` reads only the columns asked for, so a hostile column beside them may
    go unread; where the look at the step's column table refused it, the error said
    "rank 0" only: neither the step nor the file."""
    logprobs, buffers = HOSTILE[case]
    store_frame(tmp_path, _step(logprobs, *buffers))
    async with rlwire.open_receiver(tmp_path, fields=("token_ids",)) as receiver:
        try:
            got = await receiver.areceive(timeout=5)
        except rlwire.CorruptFrameError as exc:
            assert "step-00000000.rank-0000.rlw" in str(exc)
            assert "column 'logprobs'" in str(exc)
        else:
            assert got.samples["token_ids"].values.tolist() == [1, 2, 3]


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_manifest_of_a_hostile_column_or_a_read_of_its_rows_names_it(
    tmp_path: Path, case: str
) -> None:
    """A manifest listed columns the decode refuses (dtype ``|O``, a row shape of
    ``(-1,)``, order ``K``, the buffer of another column) for other processes to act
    on, and ``read_rows`` then read another column's bytes as the column's rows, or
    refused the column without naming it."""
    logprobs, buffers = HOSTILE[case]
    store_frame(tmp_path, _step(logprobs, *buffers))
    async with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            manifest = await receiver.amanifest(0)
            assert manifest is not None
            await receiver.aread_rows(manifest, "logprobs", 0, 2)
    assert re.search(r"step[- ]0+\b", str(caught.value))
    assert "column 'logprobs'" in str(caught.value)


def _chunked_column(chunk: bytes, count: int) -> tuple[Ext, tuple[memoryview, ...]]:
    """``logprobs`` a list column stored as a chunked array (extension 4) of ``count``
    items: one chunk, ``chunk``, in buffer 2, then an 8-byte buffer 3 for it to use."""
    return Ext(4, mp([2, count, [0, len(chunk)]])), (memoryview(chunk), memoryview(bytes(8)))


CHUNKED = {
    "an item of object dtype": _chunked_column(mp([_ref(3, "|O", [1]), None]), 2),
    "an item over another's buffer": _chunked_column(mp([_ref(0, "<i8", [3]), None]), 2),
    "more items than its count": _chunked_column(mp([1.0, 2.0, 3.0]), 2),
}


@pytest.mark.parametrize("case", list(CHUNKED))
@pytest.mark.parametrize(
    "options",
    [{"type": Any}, {"type": rlwire.TrainingBatch}, {"type": Any, "as_columns": True}],
    ids=["any", "batch", "as-columns"],
)
async def test_a_hostile_chunked_list_column_is_refused_naming_it(
    tmp_path: Path, case: str, options: dict[str, Any]
) -> None:
    """A list column heavy enough to be chunked is filled after the columns value is
    read: what was wrong in its chunks was said with no column named."""
    logprobs, buffers = CHUNKED[case]
    store_frame(tmp_path, _step(logprobs, *buffers))
    async with rlwire.open_receiver(tmp_path, **options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await receiver.areceive(timeout=5)
    assert "step-00000000.rank-0000.rlw" in str(caught.value)
    assert "column 'logprobs'" in str(caught.value)


SHORT = {
    "values shorter than their shape": HOSTILE["values shorter than their shape"],
    "offsets shorter than the rows": (
        _ragged(_ref(2, "<f4", [3]), _ref(3, "<i8", [3])),
        (memoryview(bytes(12)), _i8(0, 1)),
    ),
}


@pytest.mark.parametrize("case", list(SHORT))
async def test_a_manifest_refuses_a_column_whose_buffer_is_not_its_size(
    tmp_path: Path, case: str
) -> None:
    """The manifest was made (for other processes to act on) and only ``read_rows``
    refused the column: a manifest says no more than a receive would take."""
    logprobs, buffers = SHORT[case]
    store_frame(tmp_path, _step(logprobs, *buffers))
    async with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match=r"column 'logprobs': buffer \d"):
            await receiver.amanifest(0)
