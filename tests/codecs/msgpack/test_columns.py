"""Lists of samples stored column by column, ragged arrays and Columns in the msgpack
codec: the same values back, far fewer buffers, views over the received memory, and
typed errors for hostile columns."""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import msgspec
import numpy as np
import pytest
from depth import examples
from helpers import assert_batches_equal, make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

import rlwire
from rlwire import Columns, CorruptFrameError, EncodeError, Frame, FrameTooLargeError, Ragged
from rlwire._api.schema import check_object
from rlwire._frame.pieces import Pieces
from rlwire.codecs._msgpack import joined_rows
from rlwire.codecs._msgpack.codec import MsgpackCodec
from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_COLUMNS,
    EXT_INLINE_ARRAY,
    EXT_RAGGED,
    ArrayRef,
)
from rlwire.codecs._msgpack.joined_rows import _JOIN_BYTES

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def stored(frame: Frame) -> Frame:
    """``frame`` as a source returns it: every buffer one contiguous read-only view."""
    buffers = tuple(
        (b.joined() if isinstance(b, Pieces) else b).toreadonly() for b in frame.buffers
    )
    return Frame(frame.header, buffers, frame.sidecar, frame.codec)


def round_trip(obj: Any, tp: Any = Any, codec: MsgpackCodec | None = None, **kw: Any) -> Any:
    codec = codec or MsgpackCodec()
    return codec.decode(stored(codec.encode(obj)), tp, **kw)


def assert_same(got: Any, want: Any) -> None:
    """Equal values, arrays compared by dtype, shape and content."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=True)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


def test_a_batch_is_two_buffers_per_array_field_not_one_per_array() -> None:
    """Rows of 8 kB and more stay where they are (runs of Pieces); the small ones (a
    1 kB mask) are copied back to back, here into one run."""
    batch = make_batch(64, 1024)
    frame = MsgpackCodec(sidecar=("routed_experts",), inline_threshold=0).encode(batch)
    # token_ids, mask, logprobs, temperatures, advantages, routed_experts: values and offsets
    assert len(frame.buffers) == 12
    sizes = {b.nbytes: b for b in frame.buffers}
    ids = sizes[sum(s.token_ids.nbytes for s in batch.samples)]
    assert isinstance(ids, Pieces) and len(ids.runs) == 64
    assert not isinstance(sizes[sum(s.mask.nbytes for s in batch.samples)], Pieces)
    assert_batches_equal(MsgpackCodec().decode(stored(frame), rlwire.TrainingBatch), batch)


ODD_ROWS = {
    "dtype": np.arange(4, dtype=np.int32),
    "byte order": np.arange(4, dtype=">i8"),
    "dimensions": np.arange(4, dtype=np.int64).reshape(2, 2),
    "zero-d": np.array(5, dtype=np.int64),
}


@pytest.mark.parametrize("where", [0, 1, 1500])
@pytest.mark.parametrize("odd", sorted(ODD_ROWS))
def test_a_row_of_another_kind_among_small_rows_keeps_its_kind(odd: str, where: int) -> None:
    """Small rows are copied back to back; a row of another dtype, byte order or
    number of dimensions (the first row, the second or one far on) makes the
    field one value per row instead, never a cast."""
    items = [{"ids": np.arange(4, dtype=np.int64) + i, "n": i} for i in range(2000)]
    if where:
        items[where]["ids"] = ODD_ROWS[odd]
    else:
        items = [{"ids": ODD_ROWS[odd], "n": -1}, *items]
    frame = MsgpackCodec().encode(items)
    assert not any(isinstance(b, Pieces) for b in frame.buffers)
    assert_same(MsgpackCodec().decode(stored(frame)), items)


@pytest.mark.parametrize("where", [0, 1500])
def test_a_strided_row_among_small_rows_is_copied_into_the_one_array(where: int) -> None:
    """Small rows of one kind are joined as bytes; a row that is not C-contiguous (a
    strided view, a transposed 2-D row), in the first group of rows copied or a later
    one, cannot be, and numpy copies them instead: the field is still one array, with
    the rows' values in order; a row of another kind among them still keeps its kind."""
    items = [{"ids": np.arange(256, dtype=np.int64).reshape(64, 4) + i} for i in range(2000)]
    items[where]["ids"] = np.arange(256, dtype=np.int64).reshape(4, 64).T
    items[where + 1]["ids"] = np.arange(512, dtype=np.int64).reshape(128, 4)[::2]
    frame = MsgpackCodec().encode(items)
    assert len(frame.buffers) == 2  # the values and the offsets
    got = MsgpackCodec().decode(stored(frame), as_columns=True)
    assert isinstance(got, Columns) and isinstance(got["ids"], Ragged)
    assert_same(MsgpackCodec().decode(stored(frame)), items)
    items[1900]["ids"] = items[1900]["ids"].astype(np.int32)
    assert_same(round_trip(items), items)


def test_small_rows_are_joined_in_groups_kept_as_aligned_runs_of_one_buffer() -> None:
    """Small rows are joined about :data:`_JOIN_BYTES` at a time and each group is a run
    of the column's buffer (not copied on into one array); each run but the last ends
    at a multiple of 64 bytes (Ray stores such runs as they are), even when the rows'
    lengths are not."""
    lengths = np.random.default_rng(0).integers(1, 1000, 3000)
    items = [{"ids": np.full(n, i % 100, np.int8)} for i, n in enumerate(lengths)]
    frame = MsgpackCodec().encode(items)
    (ids,) = [b for b in frame.buffers if b.nbytes == lengths.sum()]
    assert isinstance(ids, Pieces) and len(ids.runs) == -(-int(lengths.sum()) // _JOIN_BYTES)
    assert [run.nbytes % 64 for run in ids.runs[:-1]] == [0] * (len(ids.runs) - 1)
    assert all(run.nbytes < 2 * _JOIN_BYTES for run in ids.runs)
    assert_same(MsgpackCodec().decode(stored(frame)), items)


def test_rows_of_a_2d_field_with_another_trailing_shape_keep_their_shape() -> None:
    items = [{"x": np.zeros((3, 2), np.float32)} for _ in range(1500)]
    items[1200]["x"] = np.zeros((2, 3), np.float32)
    assert_same(round_trip(items), items)


def test_received_rows_are_views_over_one_buffer_per_field() -> None:
    batch = make_batch(8, 50)
    frame = stored(MsgpackCodec(inline_threshold=0).encode(batch))
    got = MsgpackCodec().decode(frame, rlwire.TrainingBatch)
    first, last = got.samples[0].token_ids, got.samples[-1].token_ids
    assert first.base is not None and np.shares_memory(first.base, last.base)
    assert not first.flags.writeable


@pytest.mark.parametrize(
    "column", [[], np.zeros(0), np.zeros((0, 3))], ids=["list", "array", "2d-array"]
)
def test_columns_of_no_rows_round_trip(column: Any) -> None:
    """No rows, a list or array column beside a Ragged one (an IndexError in the
    encoder before)."""
    sent = {"samples": Columns({"a": Ragged(np.zeros(0, np.float32), [0]), "b": column})}
    got = round_trip(sent, dict, as_columns=True)["samples"]
    assert isinstance(got, Columns) and len(got) == 0 and got.names == ("a", "b")
    assert len(got["a"]) == 0 and len(got["b"]) == 0


def test_a_ragged_or_columns_changed_after_it_was_made_is_refused_at_send() -> None:
    """Their arrays and lists are the caller's: changed since, they are checked again
    as they are encoded (a step no receiver could read was written before)."""
    codec = MsgpackCodec()
    ragged = Ragged(np.arange(12, dtype=np.int32), np.array([0, 7, 12]))
    ragged.offsets[1] = 13  # the caller's int64 array, not copied
    with pytest.raises(rlwire.SchemaError, match=r"\$\.x: the Ragged's offsets decrease at row 1"):
        codec.encode({"x": ragged})
    ragged = Ragged(np.arange(12, dtype=np.int32), np.array([0, 7, 12]))
    ragged.values = np.arange(5, dtype=np.int32)
    with pytest.raises(rlwire.SchemaError, match="must end at the number of values"):
        codec.encode({"x": ragged})
    reward = [1.0, 2.0]
    cols = Columns({"ids": Ragged(np.arange(5), np.array([0, 2, 5])), "reward": reward})
    reward.append(3.0)
    with pytest.raises(rlwire.SchemaError, match=r"samples\.reward: has 3 rows, the Columns 2"):
        codec.encode({"samples": cols})


class _Sent(msgspec.Struct, array_like=True):
    x: np.ndarray
    n: int
    m: int


class _Reordered(msgspec.Struct, array_like=True):  # the same fields, another order
    x: np.ndarray
    m: int
    n: int


def test_rows_of_array_like_structs_are_filled_by_position_as_msgspec_fills_them() -> None:
    """An array_like row is positional: received as another array_like Struct, field k
    takes column k, whatever the names (a fast path matched them by name, so the same
    step came out two ways depending on the receiving type)."""
    sent = {"samples": [_Sent(np.arange(3), n=1, m=2), _Sent(np.arange(2), n=1, m=2)]}
    got = round_trip(sent, msgspec.defstruct("B", [("samples", list[_Reordered])]))
    want = msgspec.msgpack.decode(
        msgspec.msgpack.encode(_Sent(np.arange(1).tolist(), n=1, m=2)),
        type=_Reordered,
        dec_hook=lambda tp, obj: np.asarray(obj),
    )  # msgspec's own answer: by position
    assert (got.samples[0].m, got.samples[0].n) == (want.m, want.n) == (1, 2)
    assert got.samples[1].x.tolist() == [0, 1]


def test_as_columns_gives_ragged_views_and_lists() -> None:
    batch = make_batch(16, 40)
    frame = stored(MsgpackCodec(inline_threshold=0).encode(batch))
    got = MsgpackCodec().decode(frame, rlwire.TrainingBatch, as_columns=True)
    cols = got.samples
    assert isinstance(cols, Columns) and len(cols) == 16
    ids = cols["token_ids"]
    assert isinstance(ids, Ragged)
    assert ids.lengths.tolist() == [s.seq_len for s in batch.samples]
    assert np.array_equal(ids.values, np.concatenate([s.token_ids for s in batch.samples]))
    assert cols["env_name"] == [s.env_name for s in batch.samples]
    for i, sample in enumerate(batch.samples):
        row = cols.row(i)
        assert np.array_equal(row["logprobs"], sample.logprobs)
    plain = MsgpackCodec().decode(frame, as_columns=True)
    assert isinstance(plain["samples"], Columns)


NAMES = st.sampled_from(["a", "b", "token_ids", "x"])
DTYPES = st.sampled_from(["<i8", "<f4", "|b1", ">i4", "<u2", "<c8"])


@st.composite
def rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Lists of dicts: arrays whose dtype, trailing shape or number of dimensions may
    differ between rows, lengths from 0, scalars, strings, None, nested dicts; the
    same keys in every row, or not."""
    n = draw(st.integers(1, 12))
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    same_keys = draw(st.booleans())
    out = []
    for _ in range(n):
        row: dict[str, Any] = {}
        for name in names:
            if not same_keys and draw(st.booleans()):
                continue
            kind = draw(st.sampled_from(["array", "array", "scalar", "str", "none", "nested"]))
            if kind == "array":
                dtype = draw(DTYPES)
                shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
                row[name] = draw(hnp.arrays(dtype, shape))
            elif kind == "scalar":
                row[name] = draw(st.integers(-(2**40), 2**40) | st.floats(allow_nan=False))
            elif kind == "str":
                row[name] = draw(st.text(max_size=5))
            elif kind == "nested":
                row[name] = {"inner": draw(hnp.arrays(draw(DTYPES), draw(st.integers(0, 4))))}
            else:
                row[name] = None
        out.append(row)
    return out


@SETTINGS
@given(rows(), st.sampled_from([0, 4096]))
def test_any_mix_of_fields_round_trips(items: list[dict[str, Any]], threshold: int) -> None:
    got = round_trip(items, codec=MsgpackCodec(inline_threshold=threshold))
    assert_same(got, items)


@SETTINGS
@given(rows(), st.sampled_from([1, 8, 64, 100]), st.sampled_from([0, 4096]))
def test_any_mix_of_fields_round_trips_joined_a_few_bytes_at_a_time(
    items: list[dict[str, Any]], group: int, threshold: int
) -> None:
    """The same, with small rows joined a few bytes at a time (many runs, groups cut
    at aligned ends or not, empty rows among them) as a step's MiB groups are."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(joined_rows, "_JOIN_BYTES", group)
        frame = MsgpackCodec(inline_threshold=threshold).encode(items)
    assert_same(MsgpackCodec().decode(stored(frame)), items)
    got = MsgpackCodec().decode(stored(frame), as_columns=True)
    if isinstance(got, Columns):
        for i, item in enumerate(items):
            assert_same(got.row(i), item)


@SETTINGS
@given(rows())
def test_as_columns_rows_equal_the_sent_rows(items: list[dict[str, Any]]) -> None:
    got = round_trip(items, as_columns=True)
    if isinstance(got, Columns):  # stored as columns: the same rows back
        assert len(got) == len(items)
        for i, item in enumerate(items):
            assert_same(got.row(i), item)
    else:
        assert_same(got, items)


class Turn(msgspec.Struct, array_like=True):
    tokens: np.ndarray
    reward: float


class Camel(msgspec.Struct, rename="camel", omit_defaults=True):
    token_ids: np.ndarray
    old_logprobs: np.ndarray
    group_id: int = 0


class Tagged(msgspec.Struct, tag=True):
    ids: np.ndarray


def test_users_structs_array_like_renamed_and_tagged() -> None:
    turns = [Turn(np.arange(i, dtype=np.int32), float(i)) for i in range(5)]
    back = round_trip(turns, list[Turn])
    assert [t.reward for t in back] == [t.reward for t in turns]
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(back, turns, strict=True))
    assert round_trip(turns)[2][0].tolist() == [0, 1]  # rows as arrays, as msgspec sends
    camels = [Camel(np.arange(i), np.zeros(i, np.float32), i % 2) for i in range(4)]
    got = round_trip(camels, list[Camel])
    assert [c.group_id for c in got] == [0, 1, 0, 1]
    assert all(
        np.array_equal(a.old_logprobs, b.old_logprobs) for a, b in zip(got, camels, strict=True)
    )
    raw = round_trip(camels)
    assert set(raw[0]) == {"tokenIds", "oldLogprobs", "groupId"}  # the encoded names
    tagged = [Tagged(np.arange(3)), Tagged(np.arange(2))]
    codec = MsgpackCodec(inline_threshold=0)
    assert len(codec.encode(tagged).buffers) == 2  # tagged unions stay one array each
    assert [t.ids.tolist() for t in round_trip(tagged, list[Tagged], codec)] == [[0, 1, 2], [0, 1]]


def test_ragged_and_columns_sent_as_values() -> None:
    ragged = Ragged.from_arrays([np.arange(3), np.arange(0), np.arange(2)])
    got = round_trip({"r": ragged})
    assert isinstance(got["r"], Ragged) and got["r"].offsets.tolist() == [0, 3, 3, 5]
    cols = Columns({"ids": ragged, "reward": np.array([1.0, 2.0, 3.0]), "env": ["a", "b", "c"]})
    rows_back = round_trip(cols)
    assert [r["env"] for r in rows_back] == ["a", "b", "c"]
    assert rows_back[0]["reward"] == 1.0 and rows_back[1]["ids"].tolist() == []
    again = round_trip(cols, as_columns=True)
    assert isinstance(again, Columns) and again["ids"].offsets.tolist() == [0, 3, 3, 5]
    packed = rlwire.TrainingBatch(
        samples=Columns(  # type: ignore[arg-type]
            {
                "token_ids": ragged,
                "mask": Ragged(np.ones(5, bool), ragged.offsets),
                "logprobs": Ragged(np.zeros(5, np.float32), ragged.offsets),
                "temperatures": Ragged(np.ones(5, np.float32), ragged.offsets),
                "advantages": Ragged(np.zeros(5, np.float32), ragged.offsets),
                "env_name": ["a", "b", "c"],
            }
        )
    )
    batch = round_trip(packed, rlwire.TrainingBatch)
    assert [s.seq_len for s in batch.samples] == [3, 0, 2]
    batch.validate()


def test_validation_still_names_the_sample() -> None:
    batch = make_batch(5, 10)
    batch.samples[3].logprobs[2] = np.nan
    with pytest.raises(rlwire.SchemaError, match=r"samples\[3\]\.logprobs"):
        MsgpackCodec(check=check_object).encode(batch)


def test_encode_errors_name_the_row() -> None:
    items = [{"a": np.arange(2)}, {"a": np.array(["x"])}]
    with pytest.raises(EncodeError, match=r"^\$\[1\]\.a: numpy arrays of dtype <U1"):
        MsgpackCodec().encode(items)
    masked = [{"a": np.arange(2)}, {"a": np.ma.masked_array([1, 2], [0, 1])}]
    with pytest.raises(EncodeError, match=r"^\$\[1\]\.a: numpy masked arrays"):
        MsgpackCodec().encode(masked)


def test_sidecar_fields_go_to_the_sidecar_with_their_offsets_in_the_main_file() -> None:
    batch = make_batch(4, 30)
    frame = MsgpackCodec(sidecar=("routed_experts",), inline_threshold=0).encode(batch)
    side = [frame.buffers[i] for i in frame.sidecar]
    assert len(side) == 1
    expected = sum(s.routed_experts.nbytes for s in batch.samples)
    assert side[0].nbytes == expected


# -- hostile columns -------------------------------------------------------------------


def ragged_ext(values: int, offsets: int, rows: int, total: int) -> Ext:
    v = Ext(EXT_ARRAY, mp(ArrayRef(values, "<i8", [total], "C")))
    o = Ext(EXT_ARRAY, mp(ArrayRef(offsets, "<i8", [rows + 1], "C")))
    return Ext(EXT_RAGGED, mp([v, o]))


def hostile(columns: list[Any], offsets: list[int], total: int, **kw: Any) -> Frame:
    rows = len(offsets) - 1
    payload = [kw.get("count", rows), kw.get("layout", 0), kw.get("names", ["a"]), columns]
    header = mp({"x": Ext(EXT_COLUMNS, mp(payload))})
    buffers = (
        memoryview(np.arange(total, dtype="<i8").tobytes()),
        memoryview(np.array(offsets, "<i8").tobytes()),
    )
    return Frame(header, buffers)


@pytest.mark.parametrize(
    ("offsets", "kw", "message"),
    [
        ([0, 3, 2, 4], {}, r"offsets decrease at row 1"),
        ([1, 4], {}, "offsets must start at 0"),
        ([0, 2], {}, r"must end at the number of values \(4\)"),
        ([0, 2, 4], {"count": 3}, r"column 'a' of a columns value has 2 rows, not 3"),
        ([0, 2, 4], {"names": ["a", "a"]}, "one column per distinct name"),
        ([0, 2, 4], {"layout": 9}, "layout 9"),
    ],
)
def test_hostile_columns_are_corrupt(offsets: list[int], kw: dict[str, Any], message: str) -> None:
    frame = hostile([ragged_ext(0, 1, len(offsets) - 1, 4)], offsets, 4, **kw)
    if kw.get("names") == ["a", "a"]:
        frame = hostile([ragged_ext(0, 1, 2, 4), [1, 2]], offsets, 4, **kw)
    for tp in (Any, dict[str, list[dict[str, Any]]]):
        with pytest.raises(CorruptFrameError, match=message):
            MsgpackCodec().decode(frame, tp)


@pytest.mark.parametrize("count", [5, 2**62])
def test_rows_with_no_columns_are_corrupt(count: int) -> None:
    """A columns value of rows but no columns (no writer makes one) is refused at once,
    whatever is asked of it: 2**62 empty rows once kept a receiver busy for ever."""
    header = mp({"samples": Ext(EXT_COLUMNS, mp([count, 0, [], []]))})
    for options in ({}, {"as_columns": True}):
        for tp in (Any, dict[str, list[dict[str, Any]]]):
            with pytest.raises(CorruptFrameError, match=f"of {count} rows has no column"):
                MsgpackCodec().decode(Frame(header, ()), tp, **options)
    empty = mp({"samples": Ext(EXT_COLUMNS, mp([0, 0, [], []]))})
    assert MsgpackCodec().decode(Frame(empty, ())) == {"samples": []}


def test_millions_of_empty_rows_from_a_small_message_are_refused() -> None:
    """Rows cost objects: 5 million empty rows from offsets that zstd would store in
    kilobytes must be charged, not built (here the frame is held as 40 MB, so its
    allowance would be 256 MiB + 16 x 40 MB; stored_size says the few kB it took)."""
    rows = 5_000_000
    offsets = np.zeros(rows + 1, "<i8")
    header = mp({"x": Ext(EXT_COLUMNS, mp([rows, 0, ["a"], [ragged_ext(0, 1, rows, 0)]]))})
    frame = Frame(header, (memoryview(b""), memoryview(offsets.data.cast("B"))), stored_size=4096)
    with pytest.raises(FrameTooLargeError, match="rows from columns"):
        MsgpackCodec().decode(frame)
    got = MsgpackCodec().decode(frame, as_columns=True)  # no row is built: accepted
    assert len(got["x"]) == rows


@pytest.mark.parametrize("threshold", [0, 1 << 30])
def test_a_chunked_array_arrives_as_one_array(threshold: int) -> None:
    turns = [np.random.default_rng(n).integers(0, 255, (n, 6, 4), np.uint8) for n in range(40)]
    chunked = rlwire.Chunked(turns)
    codec = MsgpackCodec(inline_threshold=threshold)
    frame = codec.encode({"routed_experts": chunked})
    if threshold == 0:
        (buffer,) = frame.buffers
        assert isinstance(buffer, Pieces) and len(buffer.runs) == 39  # no copy; one empty
    got = codec.decode(stored(frame))["routed_experts"]
    assert type(got) is np.ndarray and got.flags.c_contiguous
    assert_same(got, np.concatenate(turns))
    assert_same(round_trip({"x": rlwire.Chunked()})["x"], np.zeros(0))


def test_a_sample_may_hold_chunked_routed_experts() -> None:
    batch = make_batch(6, 20)
    for sample in batch.samples:
        whole = sample.routed_experts
        sample.routed_experts = rlwire.Chunked([whole[:7], whole[7:]])  # type: ignore[assignment]
    codec = MsgpackCodec(sidecar=("routed_experts",), check=check_object, inline_threshold=0)
    got = codec.decode(stored(codec.encode(batch)), rlwire.TrainingBatch)
    for sample, back in zip(batch.samples, got.samples, strict=True):
        assert np.array_equal(back.routed_experts, sample.routed_experts.to_array())  # type: ignore[union-attr]
    batch.samples[2].routed_experts.append(np.zeros((1, 4, 2), np.uint8))  # type: ignore[union-attr]
    with pytest.raises(rlwire.SchemaError, match=r"samples\[2\]\.routed_experts: has \d+ rows but"):
        codec.encode(batch)


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([3, -1, 7], np.array([3, -1, 7], np.int64)),
        ([0.5, 1.0, -2.0], np.array([0.5, 1.0, -2.0])),
        ([True, False, True], np.array([True, False, True])),
        ([1, 2.5, 3], [1, 2.5, 3]),  # two kinds: as sent
        ([1, 2**63, 3], [1, 2**63, 3]),  # does not fit int64
        ([True, 1, 0], [True, 1, 0]),  # bool is its own kind
        (["a", "b", "c"], ["a", "b", "c"]),
        ([None, None, None], [None, None, None]),
    ],
)
def test_as_columns_gives_per_row_numbers_of_one_kind_as_an_array(
    values: list[Any], want: Any
) -> None:
    rows = [{"ids": np.arange(i + 1), "n": v} for i, v in enumerate(values)]
    got = round_trip(rows, as_columns=True)
    assert isinstance(got, Columns) and isinstance(got["n"], type(want))
    if isinstance(want, np.ndarray):
        assert got["n"].dtype == want.dtype and np.array_equal(got["n"], want)
    else:
        assert got["n"] == want and [type(v) for v in got["n"]] == [type(v) for v in values]


def test_an_int_msgpack_cannot_hold_names_its_row() -> None:
    rows = [{"ids": np.arange(3), "n": n} for n in (1, 2, 2**70)]
    with pytest.raises(EncodeError, match=r"\$\[2\]\.n: cannot encode"):
        MsgpackCodec().encode(rows)
    packed = {"c": Columns({"ids": Ragged.from_lengths(np.arange(2), [1, 1]), "n": [1, -(2**64)]})}
    with pytest.raises(EncodeError, match=r"\$\.c\.n\[1\]: cannot encode"):
        MsgpackCodec().encode(packed)


def test_the_looks_over_a_long_list_run_a_group_of_rows_a_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The looks over each column of 8,000 rows (their values, types, lengths, dtypes)
    run a group of rows a slice: over all 8,000 at once they held the GIL 1-2 ms."""
    from rlwire._core import slicing
    from rlwire.codecs._msgpack.sent_columns import _LOOK_ROWS

    n = 8000
    rows = [{"ids": np.arange(i % 5), "mask": np.ones(i % 5, bool)} for i in range(n)]
    monkeypatch.setattr(slicing, "SLICE_SECONDS", 0.0)  # every look says "yield"
    encoding = MsgpackCodec().encode_sliced(rows)
    slices = 0
    try:
        while True:
            next(encoding)
            slices += 1
    except StopIteration as stop:
        frame = stop.value
    # Per column, at least a slice for each group's values and one for its looks.
    assert slices >= 2 * 2 * (n // _LOOK_ROWS)
    got = MsgpackCodec().decode(frame)
    assert [len(row["ids"]) for row in got] == [i % 5 for i in range(n)]
    assert all(np.array_equal(a["mask"], b["mask"]) for a, b in zip(got, rows, strict=True))


def test_rows_are_made_a_group_at_a_time_between_slices() -> None:
    """Making 2,000 Structs is most of a receive's work: it must happen between slices,
    a group of rows at a time, not in one slice that holds the GIL for milliseconds."""
    from rlwire._core.slicing import SliceTimer
    from rlwire.codecs._msgpack.received_columns import _ROWS_AT_ONCE, ColumnsFound, structs_of

    n = 2000
    made: list[int] = []

    class Row(msgspec.Struct):
        ids: np.ndarray
        name: str

        def __post_init__(self) -> None:
            made.append(1)

    ids = Ragged.from_lengths(np.arange(3 * n), [3] * n)
    found = ColumnsFound(n, 0, ["ids", "name"], [ids, [f"r{i}" for i in range(n)]])
    building = structs_of(found, list[Row], SliceTimer(0.0))  # every look says "yield"
    made_by_slice = []
    try:
        while True:
            next(building)
            made_by_slice.append(len(made))
    except StopIteration as stop:
        rows = stop.value
    assert len(rows) == n and rows[-1].name == "r1999"
    assert len(made_by_slice) >= n // _ROWS_AT_ONCE
    assert made_by_slice[0] <= _ROWS_AT_ONCE  # the first slice made one group only
    assert made_by_slice == sorted(made_by_slice) and made_by_slice[-1] >= n - _ROWS_AT_ONCE


# -- array columns: one value a row, with its dtype and shape -----------------------------


class ScoredRow(msgspec.Struct):
    reward: float
    turns: int
    hidden: np.ndarray


@pytest.mark.parametrize("threshold", [0, 1 << 20], ids=["out-of-band", "inline"])
def test_an_array_column_arrives_as_sent_and_fills_typed_rows(threshold: int) -> None:
    cols = Columns(
        {
            "reward": np.array([0.25, -1.5, 3.0], np.float32),
            "turns": np.array([1, 2, 200], np.uint8),
            "hidden": np.arange(6, dtype=np.float16).reshape(3, 2),
        }
    )
    codec = MsgpackCodec(inline_threshold=threshold)
    frame = codec.encode({"rows": cols})
    # Each column is one array of the message (type 1 or 2), not a value a row.
    kinds: list[Any] = []

    def hook(code: int, data: memoryview) -> None:
        if code == EXT_COLUMNS:
            columns = msgspec.msgpack.decode(data, ext_hook=Ext)[3]
            kinds.extend(c.code if isinstance(c, Ext) else type(c) for c in columns)

    msgspec.msgpack.decode(frame.header, ext_hook=hook)
    assert kinds == [EXT_ARRAY if threshold == 0 else EXT_INLINE_ARRAY] * 3
    got = codec.decode(stored(frame), Any, as_columns=True)["rows"]
    for name in cols.names:
        assert_same(got[name], cols[name])
    typed = codec.decode(stored(frame), dict[str, list[ScoredRow]])["rows"]
    assert [(r.reward, r.turns) for r in typed] == [(0.25, 1), (-1.5, 2), (3.0, 200)]
    assert_same(typed[2].hidden, np.array([4, 5], np.float16))
    rows = codec.decode(stored(frame), Any)["rows"]
    assert type(rows[0]["reward"]) is float and type(rows[0]["turns"]) is int


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (np.arange(3), r"column 'a' of a columns value has 3 rows, not 4"),
        (np.array(7), r"column 'a' of a columns value has None rows, not 4"),
    ],
    ids=["too-short", "0-d"],
)
def test_a_hostile_array_column_is_corrupt(column: np.ndarray, message: str) -> None:
    codec = MsgpackCodec(inline_threshold=1 << 20)
    inline = codec.encode(column).header  # the array's extension value, inline
    payload = [4, 0, ["a"], [msgspec.msgpack.decode(inline, ext_hook=Ext)]]
    frame = Frame(mp({"x": Ext(EXT_COLUMNS, mp(payload))}), ())
    for tp in (Any, dict[str, list[dict[str, Any]]]):
        with pytest.raises(CorruptFrameError, match=message):
            MsgpackCodec().decode(frame, tp)


@pytest.mark.parametrize("dtype", [np.complex64, np.longdouble])
def test_a_1d_column_of_numbers_msgpack_cannot_hold_is_refused_as_its_rows_are(
    dtype: type,
) -> None:
    """Rows of a 1-D column hold Python numbers: one a msgpack number cannot be (a
    complex, a long double) is refused at send, as it was a value a row, rather than
    stored as an array whose rows could not be sent on."""
    with pytest.raises(EncodeError):
        MsgpackCodec().encode({"rows": Columns({"x": np.zeros(2, dtype)})})
    two_d = round_trip({"rows": Columns({"x": np.zeros((2, 3), dtype)})}, as_columns=True)
    assert_same(two_d["rows"]["x"], np.zeros((2, 3), dtype))  # rows are views: kept whole
