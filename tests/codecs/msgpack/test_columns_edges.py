"""Edges of the columnar layout through a real directory sink: a Chunked whose chunks
list was changed directly, columns values docs/format.md calls errors, and a step whose
fields fell back to list columns, validated as it is received as columns."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

import rlwire
from rlwire import Chunked
from rlwire.codecs._msgpack.codec import MsgpackCodec
from rlwire.codecs._msgpack.extensions import EXT_COLUMNS

pytestmark = pytest.mark.anyio


async def send_and_receive(tmp_path: Path, obj: Any, **options: Any) -> Any:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send(obj)
    async with rlwire.open_receiver(tmp_path, type=Any, **options) as receiver:
        return await receiver.areceive(timeout=10)


@pytest.mark.parametrize("rows", [3, 3000], ids=["inline", "out-of-band"])
async def test_a_chunk_added_to_chunks_directly_is_sent_or_refused_never_unreadable(
    tmp_path: Path, rows: int
) -> None:
    """``Chunked.chunks`` is a public list: a chunk added to it directly (not through
    ``append``) was written under the row count ``append`` kept, a step whose array
    descriptor disagrees with its buffer, committed, that no receiver can read
    (CorruptFrameError at every receiver, for ever). It must arrive whole, or be refused
    at send."""
    chunked = Chunked([np.arange(rows)])
    chunked.chunks.append(np.arange(rows, 2 * rows))
    try:
        got = await send_and_receive(tmp_path, {"x": chunked})
    except rlwire.SchemaError:
        assert not any(tmp_path.glob("step-*"))  # refused at send: nothing written
        return
    assert np.array_equal(got["x"], np.arange(2 * rows))


@pytest.mark.parametrize("rows", [3, 3000], ids=["inline", "out-of-band"])
async def test_a_chunk_of_another_dtype_put_in_chunks_is_refused_not_reinterpreted(
    tmp_path: Path, rows: int
) -> None:
    """A chunk of another dtype put in ``chunks`` directly: its bytes were written as the
    first chunk's dtype (0.5 arrived as the int64 4602678819172646912), or cast to it
    (float64 into float32), and received as valid data. ``append`` refuses such a chunk
    with SchemaError; the encoder must too."""
    chunked = Chunked([np.arange(rows, dtype=np.float32), np.arange(rows, dtype=np.float32)])
    chunked.chunks[1] = np.full(rows, 0.1)  # float64: 0.1 has no float32 of its own
    with pytest.raises(rlwire.SchemaError, match=r"\$\.x: chunk 1 "):
        await send_and_receive(tmp_path, {"x": chunked})
    assert not any(tmp_path.glob("step-*"))


def _columns_frame(layout: Any, column: np.ndarray) -> rlwire.Frame:
    """A frame of ``{"samples": <columns value of 2 rows, one column "a">}``, the column
    an array (inline)."""
    header = MsgpackCodec(inline_threshold=1 << 20).encode(column).header
    inline = msgspec.msgpack.decode(header, ext_hook=Ext)
    return rlwire.Frame(mp({"samples": Ext(EXT_COLUMNS, mp([2, layout, ["a"], [inline]]))}), ())


@pytest.mark.parametrize("layout", [True, False])
@pytest.mark.parametrize("options", [{}, {"as_columns": True}])
def test_a_columns_layout_that_is_a_bool_is_corrupt(layout: bool, options: dict[str, Any]) -> None:
    """docs/format.md: ``layout`` is 0 or 1, "any other value is an error"; a msgpack
    ``true`` was read as 1 (rows as arrays) and ``false`` as 0, as ``True in (0, 1)``."""
    frame = _columns_frame(layout, np.arange(2, dtype=np.int64))
    with pytest.raises(rlwire.CorruptFrameError, match="layout"):
        MsgpackCodec().decode(frame, Any, **options)


@pytest.mark.parametrize("dtype", ["<c8", "<c16", "<f16"])
@pytest.mark.parametrize("options", [{}, {"as_columns": True}])
def test_a_1d_array_column_of_numbers_msgpack_cannot_hold_is_corrupt(
    dtype: str, options: dict[str, Any]
) -> None:
    """docs/format.md: a 1-D array column gives each row "a number ... as msgpack would
    hold it: an int, a float or a bool", and writers refuse to store one of complex or
    long double numbers. A reader handed one built rows of Python complex numbers and
    numpy long doubles (which rlwire then cannot send on) instead of refusing it."""
    frame = _columns_frame(0, np.arange(2).astype(dtype))
    with pytest.raises(rlwire.CorruptFrameError, match=r"column 'a'"):
        MsgpackCodec().decode(frame, Any, **options)


def _sample(n: int, *, ids: Any = np.int64, ref: bool = False) -> rlwire.TrainingSample:
    return rlwire.TrainingSample(
        token_ids=np.arange(n, dtype=ids),
        mask=np.ones(n, bool),
        logprobs=np.zeros(n, np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.zeros(n, np.float32),
        env_name="gsm8k",
        ref_logprobs=np.zeros(n, np.float32) if ref else None,
    )


@pytest.mark.parametrize(
    "samples",
    [
        [_sample(3, ref=True), _sample(2, ref=False)],  # ref_logprobs set on some samples
        [_sample(3, ids=np.int32), _sample(2, ids=np.int64)],  # token ids of two widths
    ],
    ids=["ref-logprobs-of-some", "token-ids-of-two-dtypes"],
)
async def test_a_valid_batch_received_as_columns_passes_validation(
    tmp_path: Path, samples: list[rlwire.TrainingSample]
) -> None:
    """A field whose rows differ (None in some, or another dtype) is stored as a column
    of values (docs/format.md: it "falls back alone"), and arrives in a Columns as a list.
    The same step passes ``validate=True`` received as samples, but received
    ``as_columns`` it was refused ("a per-token column must be an rlwire.Ragged, got
    list"): TrainingSample's rules over columns refuse what the sender itself wrote."""
    async with rlwire.open_sender(tmp_path) as sender:  # validated as it is sent
        await sender.send(rlwire.TrainingBatch(samples=samples))
    async with rlwire.open_receiver(tmp_path, validate=True) as receiver:
        assert len((await receiver.areceive(timeout=10)).samples) == 2
    async with rlwire.open_receiver(tmp_path, validate=True, as_columns=True) as receiver:
        got = (await receiver.areceive(timeout=10)).samples
    assert isinstance(got, rlwire.Columns) and len(got) == 2


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([-3, 0, ["a"], [[1, 2]]], "count -3"),
        ([2, 7, ["a"], [[1, 2]]], "layout 7"),
        ([2, True, ["a"], [[1, 2]]], "layout True"),
        ([5, 0, ["a"], [[1, 2]]], "column 'a' of a columns value has 2 rows, not 5"),
        ([5, 0, [], []], "of 5 rows has no column"),
    ],
)
def test_a_manifest_of_a_columns_value_the_decode_refuses_is_refused(
    payload: list[Any], message: str
) -> None:
    """The table a manifest is made of (``describe_columns``) took such a columns value
    for a list of samples of its count (-3 rows, or 5 rows of a column of 2), where
    receiving the message refuses it as corrupt."""
    frame = rlwire.Frame(mp({"samples": Ext(EXT_COLUMNS, mp(payload))}), ())
    with pytest.raises(rlwire.CorruptFrameError):
        MsgpackCodec().decode(frame, Any)
    with pytest.raises(rlwire.CorruptFrameError, match=message):
        MsgpackCodec().describe_columns(frame)


def test_a_chunk_appended_while_the_chunked_is_encoded_is_in_the_bytes_and_shape_or_in_neither(
    tmp_path: Path,
) -> None:
    """Another thread may append to a Chunked while a send encodes it. A chunk appended
    between the encoder's read of the bytes and its read of the shape made the shape
    larger than the bytes: the step was committed, and every receiver refused it
    (``CorruptFrameError``). Here a chunk is appended each time the send reads the
    Chunked's ``shape``, as such a thread could (a profile hook, in every thread)."""
    chunked = Chunked([np.zeros((1, 4096), np.uint8)])  # out of band, not inline
    reads = 0

    def append(frame: Any, event: str, _: Any) -> None:
        nonlocal reads
        reading = event == "call" and frame.f_code.co_name == "shape"
        if reading and frame.f_locals.get("self") is chunked:
            reads += 1
            chunked.append(np.full((1, 4096), reads, np.uint8))

    sys.setprofile(append)
    threading.setprofile(append)  # the sender's threads, started from here on
    try:
        with rlwire.open_sync_sender(tmp_path, validate=False) as sender:
            sender.send({"x": chunked})
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    with rlwire.open_receiver(tmp_path, type=dict) as receiver:
        received = receiver.receive(timeout=10)["x"]
    whole = chunked.to_array()
    assert 1 <= len(received) <= len(whole)
    np.testing.assert_array_equal(received, whole[: len(received)])
