"""Partial reads by field and ``add_fields`` against steps that are empty, damaged or
hostile, and appended values that do not fit the receiver's type: what a receiver or
a sender gets (a typed error naming what is wrong, or the step), asyncio and trio."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import msgspec
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
        samples=rlwire.Columns(  # type: ignore[arg-type]
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
    assert isinstance(got, rlwire.Columns)
    assert (len(got), set(got.names)) == (0, {"env_name", "score"})


def _ref(index: int, dtype: str, shape: list[int]) -> Any:
    return msgspec.msgpack.Ext(1, msgspec.msgpack.encode([index, dtype, shape, "C"]))


@pytest.mark.parametrize(
    ("offsets", "words"),
    [
        (b"\0" * 12, "needs 16 bytes but its buffer has 12"),
        (np.array([1, 1], "<i8").tobytes(), "must start at 0, got 1"),
        (np.array([0, 5], "<i8").tobytes(), "must end at the number of values (1), got 5"),
    ],
    ids=["short", "start", "end"],
)
async def test_add_fields_to_a_step_of_damaged_offsets_is_a_corrupt_frame(
    tmp_path: Path, offsets: bytes, words: str
) -> None:
    url = str(tmp_path / "run")
    ragged = msgspec.msgpack.Ext(
        6, msgspec.msgpack.encode([_ref(0, "<i8", [1]), _ref(1, "<i8", [2])])
    )
    columns = msgspec.msgpack.Ext(7, msgspec.msgpack.encode([1, 0, ["token_ids"], [ragged]]))
    _store_raw(url, msgspec.msgpack.encode({"samples": columns}), (b"\0" * 8, offsets))
    sender = rlwire.open_sender(url)
    try:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await sender.add_fields(0, {"score": [1.0]})
    finally:
        await sender.aclose()
    assert "step 0, rank 0" in str(caught.value)
    assert "offsets of 'token_ids'" in str(caught.value)
    assert words in str(caught.value)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself
async def test_add_fields_takes_a_matrix_as_an_array_of_its_rows(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send({"samples": [{"token_ids": np.arange(k + 1)} for k in range(3)]})
        await sender.add_fields(0, {"vec": np.matrix(np.arange(6.0).reshape(3, 2))})
    async with rlwire.open_receiver(url, type=dict) as receiver:
        with anyio.fail_after(20):
            got = await receiver.areceive(timeout=5)
    assert [s["vec"].tolist() for s in got["samples"]] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


async def test_add_fields_takes_numpy_integers_as_step_and_rank(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send({"samples": [{"token_ids": np.arange(2)}]})
        await sender.add_fields(np.int64(0), {"score": [0.5]}, rank=np.int32(0))  # type: ignore[arg-type]
    async with rlwire.open_receiver(url, type=dict) as receiver:
        with anyio.fail_after(20):
            assert (await receiver.areceive(timeout=5))["samples"][0]["score"] == 0.5


@pytest.mark.parametrize(
    ("step", "rank", "words"),
    [
        ("0", 0, "add_fields: step must be an int from 0"),
        (True, 0, "add_fields: step must be an int from 0"),
        (-1, 0, "add_fields: step must be an int from 0"),
        (0, 0.0, "add_fields: rank must be an int of at least 0"),
    ],
)
async def test_add_fields_refuses_a_step_or_rank_not_an_int(
    tmp_path: Path, step: Any, rank: Any, words: str
) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send({"samples": [{"token_ids": np.arange(2)}]})
        with pytest.raises(rlwire.ConfigError, match=words):
            await sender.add_fields(step, {"score": [0.5]}, rank=rank)
    assert not [n for n in os.listdir(url) if "fields" in n]


_BOMB = 8_000_000  # empty arrays: 8 MB stored, over 500 MB of lists decoded


def _bomb_header(inside: bool) -> bytes:
    """A header of a small columns value and 8M empty msgpack arrays: beside it
    (``samples`` and a ``junk`` field), or as a column of values inside it."""
    array = msgspec.msgpack.encode(["<f8", [2], "C", b"\0" * 16])
    names, columns = ["x"], [msgspec.msgpack.Ext(2, array)]
    bomb = b"\xdd" + _BOMB.to_bytes(4, "big") + b"\x90" * _BOMB
    if inside:
        names.append("y")
        columns.append(msgspec.msgpack.Ext(0, b""))  # replaced by the bomb below
    payload = msgspec.msgpack.encode([2, 0, names, columns])
    if inside:  # the last column (an empty fixext placeholder: d4 00) becomes the bomb
        payload = payload[: -len(b"\xd4\x00\x00")] + bomb
        ext = b"\xc9" + len(payload).to_bytes(4, "big") + b"\x07" + payload
        return b"\x81" + msgspec.msgpack.encode("samples") + ext
    ext = msgspec.msgpack.encode(msgspec.msgpack.Ext(7, payload))
    return b"\x82" + msgspec.msgpack.encode("samples") + ext + msgspec.msgpack.encode("junk") + bomb


@pytest.mark.parametrize("inside", [False, True], ids=["beside", "inside"])
async def test_fields_refuses_a_header_of_tiny_values_before_building_it(
    tmp_path: Path, inside: bool
) -> None:
    url = str(tmp_path / "run")
    _store_raw(url, _bomb_header(inside))
    tracemalloc.start()
    try:
        async with rlwire.open_receiver(url, type=dict, fields=("x",)) as receiver:
            with pytest.raises(rlwire.FrameTooLargeError, match="stored size"):
                await receiver.areceive(timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20  # refused before the lists are built (over 500 MB)


@pytest.mark.parametrize("inside", [False, True], ids=["beside", "inside"])
async def test_add_fields_refuses_a_header_of_tiny_values_before_building_it(
    tmp_path: Path, inside: bool
) -> None:
    url = str(tmp_path / "run")
    _store_raw(url, _bomb_header(inside))
    sender = rlwire.open_sender(url)
    try:
        with anyio.fail_after(20), pytest.raises(rlwire.FrameTooLargeError, match="stored size"):
            await sender.add_fields(0, {"score": [1.0, 2.0]})
    finally:
        await sender.aclose()


class _Row(msgspec.Struct):
    token_ids: np.ndarray
    score: float | None = None
    ref: np.ndarray | None = None


class _FrozenRow(msgspec.Struct, frozen=True):
    token_ids: np.ndarray
    score: float | None = None


class _Batch(msgspec.Struct):
    samples: list[_Row]


class _FrozenBatch(msgspec.Struct):
    samples: list[_FrozenRow]


async def _appended(url: str, batch: Any, fields: dict[str, Any], type_: Any) -> Any:
    async with rlwire.open_sender(url) as sender:
        await sender.send(batch)
        await sender.add_fields(0, fields)
    async with rlwire.open_receiver(url, type=type_) as receiver:
        with anyio.fail_after(20):
            return await receiver.areceive(timeout=5)


@pytest.mark.parametrize(
    ("score", "row", "got"),
    [
        (np.arange(6, dtype=np.float32).reshape(3, 2), 0, "numpy.ndarray"),
        (["high", "low", "mid"], 0, "str"),
        ([0.5, None, "mid"], 2, "str"),
    ],
    ids=["2-d", "strings", "one-string"],
)
async def test_an_appended_value_not_of_the_fields_type_is_a_decode_error(
    tmp_path: Path, score: Any, row: int, got: str
) -> None:
    batch = _Batch(samples=[_Row(np.arange(k + 1)) for k in range(3)])
    with pytest.raises(rlwire.DecodeError) as caught:
        await _appended(str(tmp_path / "run"), batch, {"score": score}, _Batch)
    assert f"appended field 'score' row {row} does not match _Row.score" in str(caught.value)
    assert f"got `{got}`" in str(caught.value)


async def test_appended_values_are_converted_to_the_fields_type(tmp_path: Path) -> None:
    batch = _Batch(samples=[_Row(np.arange(k + 1)) for k in range(3)])
    ref = rlwire.Ragged.from_arrays([np.full(k + 1, k, np.float32) for k in range(3)])
    fields = {"score": np.array([1, 2, 3], np.int16), "ref": ref}
    got = await _appended(str(tmp_path / "run"), batch, fields, _Batch)
    assert [type(s.score) for s in got.samples] == [float] * 3
    assert [s.score for s in got.samples] == [1.0, 2.0, 3.0]
    assert [s.ref.tolist() for s in got.samples] == [[0.0], [1.0, 1.0], [2.0, 2.0, 2.0]]


async def test_appended_fields_fill_a_frozen_struct(tmp_path: Path) -> None:
    batch = _FrozenBatch(samples=[_FrozenRow(np.arange(k + 1)) for k in range(3)])
    fields = {"score": np.array([0.5, 1.5, 2.5])}
    got = await _appended(str(tmp_path / "run"), batch, fields, _FrozenBatch)
    assert [s.score for s in got.samples] == [0.5, 1.5, 2.5]


class _TaggedA(msgspec.Struct, tag=True):
    token_ids: np.ndarray
    score: float | None = None


class _TaggedB(msgspec.Struct, tag=True):
    token_ids: np.ndarray
    score: int | None = None


class _MixedBatch(msgspec.Struct):
    samples: list[_TaggedA | _TaggedB]


async def test_appended_values_take_each_struct_types_annotation(tmp_path: Path) -> None:
    def batch() -> _MixedBatch:
        rows: list[_TaggedA | _TaggedB] = [
            _TaggedA(np.arange(1)),
            _TaggedB(np.arange(2)),
            _TaggedA(np.arange(3)),
        ]
        return _MixedBatch(samples=rows)

    got = await _appended(str(tmp_path / "a"), batch(), {"score": [1, 2, 3]}, _MixedBatch)
    assert [(type(s.score), s.score) for s in got.samples] == [(float, 1.0), (int, 2), (float, 3.0)]
    with pytest.raises(rlwire.DecodeError, match=r"'score' row 1 does not match _TaggedB\.score"):
        await _appended(str(tmp_path / "b"), batch(), {"score": [1, 2.5, 3]}, _MixedBatch)
