"""rlwire.Ragged and rlwire.Columns as values users build and index."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from depth import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import Columns, Ragged, SchemaError


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=30), st.sampled_from(["<i8", "<f4", "|b1"])
)
def test_from_arrays_rows_are_views_equal_to_the_rows(lengths: list[int], dtype: str) -> None:
    rng = np.random.default_rng(len(lengths))
    rows = [rng.integers(0, 2, (n, 3)).astype(dtype) for n in lengths]
    ragged = Ragged.from_arrays(rows)
    assert len(ragged) == len(rows)
    assert ragged.lengths.tolist() == lengths
    assert ragged.offsets[0] == 0 and ragged.offsets[-1] == sum(lengths)
    for i, row in enumerate(rows):
        assert np.array_equal(ragged[i], row)
        assert np.shares_memory(ragged[i], ragged.values) or row.size == 0
    assert [r.tolist() for r in ragged] == [r.tolist() for r in rows]
    assert np.array_equal(ragged[-1], rows[-1])


def test_slices_are_raggeds_over_the_same_values() -> None:
    ragged = Ragged(np.arange(10), [0, 2, 5, 5, 10])
    part = ragged[1:3]
    assert isinstance(part, Ragged)
    assert part.offsets.tolist() == [0, 3, 3]
    assert part[0].tolist() == [2, 3, 4] and part[1].tolist() == []
    assert np.shares_memory(part.values, ragged.values)
    assert len(ragged[3:1]) == 0
    with pytest.raises(IndexError, match="row 4 out of range for 4 rows"):
        ragged[4]
    with pytest.raises(IndexError, match="step 1"):
        ragged[::2]


@pytest.mark.parametrize(
    ("values", "offsets", "message"),
    [
        (np.arange(4), [1, 4], "must start at 0, got 1"),
        (np.arange(4), [0, 3], r"must end at the number of values \(4\), got 3"),
        (np.arange(4), [0, 3, 2, 4], r"decrease at row 1 \(3 then 2\)"),
        (np.arange(4), [[0, 4]], "1-D integer array"),
        (np.arange(4), [0.0, 4.0], "1-D integer array"),
        (np.int64(3), [0, 1], "at least one dimension"),
        ([1, 2], [0, 2], "values must be a numpy array"),
        # As int64 it would read -2**63: a decrease the message showed as that number.
        (np.arange(5), np.array([0, 2**63, 5], np.uint64), "reach 9223372036854775808, past"),
    ],
)
def test_bad_offsets_are_schema_errors_that_say_what(
    values: object, offsets: object, message: str
) -> None:
    with pytest.raises(SchemaError, match=message):
        Ragged(values, offsets)  # type: ignore[arg-type]


def test_from_arrays_names_the_first_row_that_differs() -> None:
    with pytest.raises(SchemaError, match=r"row 2 has dtype float64"):
        Ragged.from_arrays([np.arange(2), np.arange(3), np.zeros(2)])
    with pytest.raises(SchemaError, match=r"row 1 .* shape \(2, 4\)"):
        Ragged.from_arrays([np.zeros((2, 3)), np.zeros((2, 4))])
    with pytest.raises(SchemaError, match="at least one row"):
        Ragged.from_arrays([])


def test_from_lengths_does_not_copy() -> None:
    values = np.arange(6)
    ragged = Ragged.from_lengths(values, [2, 0, 4])
    assert ragged.values is values
    assert ragged[2].tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize(
    "lengths",
    [[2.5, 3.5], [[2, 4]], "24", np.array([2, 4], np.float32), [[2], [2, 2]]],
    ids=repr,
)
def test_from_lengths_refuses_lengths_that_are_not_integers(lengths: object) -> None:
    # A float length was truncated: [2.5, 3.5] cut 6 values into rows of 2 and 3.
    with pytest.raises(SchemaError, match="lengths must be a 1-D sequence of integers"):
        Ragged.from_lengths(np.arange(6), lengths)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        # np.cumsum wrapped: "offsets decrease at row 1", though no length decreased.
        ([2**63 - 1, 2**63 - 1, 7], rf"the lengths add up to {2**64 - 2} by row 1, past the int64"),
        ([2**62] * 3, rf"the lengths add up to {2**63} by row 1, past the int64"),
        (np.array([2**64 - 1, 7], np.uint64), rf"the lengths add up to {2**64 - 1} by row 0, past"),
        ([2, -1, 5], r"length of row 1 is negative \(-1\)"),
        # numpy took True as 1 beside ints.
        ([True, 5], r"length of row 0 is a bool \(True\); lengths must be integers"),
        ([np.uint64(5), np.False_, 1], r"length of row 1 is a bool \(False\)"),
        (np.array([True, False]), r"lengths must be a 1-D sequence of integers, got dtype bool"),
    ],
    ids=repr,
)
def test_from_lengths_names_what_is_wrong_with_the_lengths(lengths: object, message: str) -> None:
    with pytest.raises(SchemaError, match=rf"^Ragged.from_lengths: {message}"):
        Ragged.from_lengths(np.arange(6), lengths)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        # It compared row 0 with itself: "row 0 has dtype int64 and shape (); row 0 has ...".
        ([np.array(1)], r"row 0 is a 0-d int64 array \(shape \(\)\); a row needs at least one"),
        ([np.arange(2), 3.5], r"row 1 is a 0-d float64 array \(shape \(\)\); a row needs"),
        ("abc", r"rows must be a sequence of arrays, got str"),
    ],
    ids=repr,
)
def test_from_arrays_says_a_row_needs_a_dimension(rows: object, message: str) -> None:
    with pytest.raises(SchemaError, match=rf"^Ragged.from_arrays: {message}"):
        Ragged.from_arrays(rows)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "lengths", [[np.int32(2), np.uint64(4)], [np.int64(2), np.uint64(4)], (2, 4)], ids=repr
)
def test_from_lengths_takes_ints_of_any_kind(lengths: list[int]) -> None:
    # numpy promotes int64 beside uint64 to float64: the ints are taken one by one.
    assert Ragged.from_lengths(np.arange(6), lengths).offsets.tolist() == [0, 2, 6]


@pytest.mark.parametrize("index", ["1", 1.0, None])
def test_a_row_index_that_is_not_an_integer_is_a_type_error(index: object) -> None:
    ragged = Ragged.from_lengths(np.arange(3), [1, 2])
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        ragged[index]  # type: ignore[index]
    assert ragged[np.int64(1)].tolist() == [1, 2]


def test_columns_rows_and_mapping_face() -> None:
    cols = Columns(
        {
            "ids": Ragged.from_arrays([np.arange(3), np.arange(1)]),
            "reward": np.array([0.5, 1.0]),
            "env": ["a", "b"],
        }
    )
    assert len(cols) == 2 and cols.names == ("ids", "reward", "env")
    assert "env" in cols and "other" not in cols
    row = cols.row(-1)
    assert row["ids"].tolist() == [0] and row["reward"] == 1.0 and row["env"] == "b"
    assert [r["env"] for r in cols.rows()] == ["a", "b"]
    assert dict(cols.items()).keys() == {"ids", "reward", "env"}
    assert list(cols) == ["ids", "reward", "env"] == [*cols]  # names, as a dict's keys
    assert repr(cols) == "Columns(2 rows; ids: Ragged, reward: array float64, env: list)"
    with pytest.raises(IndexError):
        cols.row(2)


def _every_kind() -> Columns:
    return Columns(
        {
            "ids": Ragged(np.arange(5), [0, 3, 5, 5]),
            "adv": np.array([0.5, -0.5, 2.0]),
            "pairs": np.arange(6).reshape(3, 2),
            "env": ["a", "b", "c"],
        }
    )


def _same_row(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(
        np.shape(a[k]) == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a
    )


@pytest.mark.parametrize("index", [True, False, np.True_])
def test_a_bool_is_no_row_index(index: object) -> None:
    # row(True) was row 1 of the Ragged and list columns and, numpy reading it as a
    # mask, the whole array with a new axis of the others.
    cols = _every_kind()
    with pytest.raises(TypeError, match=r"Columns: row (True|False) is a bool|bool.*integer"):
        cols.row(index)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Ragged: row (True|False) is a bool|bool.*integer"):
        cols["ids"][index]  # type: ignore[index]


def test_negative_rows_count_from_the_end_in_every_kind_of_column() -> None:
    cols = _every_kind()
    for k in range(1, 4):
        assert _same_row(cols.row(-k), cols.row(3 - k))
        assert _same_row(cols.row(np.int64(-k)), cols.row(3 - k))  # type: ignore[arg-type]
    assert cols.row(-3)["ids"].tolist() == [0, 1, 2] and cols.row(-1)["ids"].tolist() == []
    for index in (3, -4):
        with pytest.raises(IndexError, match=f"Columns: row {index} out of range for 3 rows"):
            cols.row(index)
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        cols.row(1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"a": [1, 2], "b": [1]}, r"Columns\['b'\]: has 1 rows, the columns before it 2"),
        ({"a": (1, 2)}, r"must be a Ragged, a numpy array or a list, got tuple"),
        ({"a": np.float64(1.0)}, "must be a Ragged, a numpy array or a list"),
        ({"a": np.array(1.0)}, "a 0-d array has no rows"),
        ({1: [1]}, "names must be str"),
    ],
)
def test_bad_columns_are_schema_errors(columns: dict[object, object], message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Columns(columns)  # type: ignore[arg-type]


@given(hnp.arrays(np.float32, st.integers(0, 40)), st.data())
def test_ragged_values_are_shared_with_torch_style_consumers(
    values: np.ndarray, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=5)))
    ragged = Ragged(values, [0, *cuts, len(values)])
    assert ragged.values is values  # torch.from_numpy(ragged.values) shares this memory
    assert sum(len(r) for r in ragged) == len(values)
    assert rlwire.Ragged is Ragged and Ragged.__module__ == "rlwire"


def test_chunked_appends_without_copying_and_checks_each_chunk() -> None:
    chunked = rlwire.Chunked()
    assert chunked.shape == (0,) and chunked.dtype is None and len(chunked) == 0
    turns = [np.full((n, 4, 2), n, np.uint8) for n in (3, 0, 5)]
    for turn in turns:
        chunked.append(turn)
    assert all(a is b for a, b in zip(chunked.chunks, turns, strict=True))
    assert chunked.shape == (8, 4, 2) and len(chunked) == 8 and chunked.nbytes == 64
    assert np.array_equal(chunked.to_array(), np.concatenate(turns))
    with pytest.raises(SchemaError, match=r"chunk 3 has dtype uint16 and shape \(1, 4, 2\)"):
        chunked.append(np.zeros((1, 4, 2), np.uint16))
    with pytest.raises(SchemaError, match=r"chunk 3 has dtype uint8 and shape \(1, 4, 3\)"):
        chunked.append(np.zeros((1, 4, 3), np.uint8))
    with pytest.raises(SchemaError, match="chunk 3 must be a numpy array of at least one"):
        chunked.append(np.uint8(1))  # type: ignore[arg-type]
    assert len(chunked.chunks) == 3  # nothing was added by the refused appends


def test_from_arrays_keeps_the_rows_byte_order() -> None:
    rows = [np.arange(3, dtype=">f4"), np.arange(2, dtype=">f4")]
    ragged = Ragged.from_arrays(rows)
    assert ragged.values.dtype == np.dtype(">f4")
    assert ragged[0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "given", [np.zeros(1), np.zeros((1, 1)), np.array([3]), np.arange(5), np.zeros((2, 3)), 5]
)
def test_a_chunked_given_an_array_or_no_list_of_chunks_is_refused_not_left_empty(
    given: object,
) -> None:
    """``Chunked(arr)`` (one array where a list of chunks goes) once made an empty
    Chunked when the array was one zero (its truth value), sent as no data at all, and
    raised numpy's ValueError for a longer one."""
    with pytest.raises(SchemaError, match=r"Chunked: chunks must be a list of arrays"):
        rlwire.Chunked(given)  # type: ignore[arg-type]
    assert rlwire.Chunked(None).chunks == [] and rlwire.Chunked([]).chunks == []
    assert len(rlwire.Chunked((np.arange(2), np.arange(3)))) == 5  # any iterable of chunks


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Columns([("a", [1])]), r"Columns: takes a mapping of names to columns, got list"),
        (lambda: Columns(None), r"Columns: takes a mapping .*, got NoneType"),
        (lambda: Ragged.from_arrays(None), r"Ragged.from_arrays: rows must be .*, got NoneType"),
        (lambda: Ragged.from_arrays([[1, 2], [1, [2]]]), r"Ragged.from_arrays: row 1 is not"),
        (lambda: Ragged(np.arange(3), [0, [1], 3]), r"Ragged: offsets must be a 1-D integer"),
    ],
)
def test_arguments_numpy_cannot_read_are_schema_errors(make: object, message: str) -> None:
    """Not a TypeError, AttributeError or numpy's ValueError: every bad argument of the
    packed types is an rlwire error that says what was given."""
    with pytest.raises(SchemaError, match=message):
        make()  # type: ignore[operator]
