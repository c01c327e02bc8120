"""rlwire.Checks over values held packed: Ragged, Chunked and Columns (rlwire._checks.walk).

A packed value must be refused exactly where the same data held a row at a time is, with
the same message: a Ragged as the list of its rows, a Chunked as the one array it is sent
as, a Columns as the list of its rows (each a dict of views). They were skipped: a NaN in
a Ragged passed, and names found only in a Columns were a ConfigError.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from depth import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import Checks, Chunked, Columns, Ragged
from rlwire._checks.columns import ColumnWalk
from rlwire._checks.plan import ANY
from rlwire._core.slicing import run_sliced

CHECKS = Checks(
    finite=("logprobs", "reward", "x", "score"),
    max_value={"ids": 100},
    same_length=(("ids", "logprobs"),),
)


def outcome(checks: Checks, obj: Any) -> tuple[Any, ...]:
    """What the checks make of ``obj``: the names they saw, or their error."""
    walk = ColumnWalk(checks._planner, collect=True)
    try:
        run_sliced(walk.visit(obj, None, None, ANY))
    except rlwire.RlwireError as exc:
        return (type(exc), str(exc))
    return ("passed", frozenset(walk.seen))


@st.composite
def columns_with_one_flaw(draw: st.DrawFn) -> Columns:
    """Columns of a few kinds (Ragged, 1-D and 2-D arrays, lists of strings and of
    floats), with at most one bad value planted."""
    lengths = draw(st.lists(st.integers(0, 6), min_size=1, max_size=12))
    n, total = len(lengths), sum(lengths)
    cols: dict[str, Any] = {
        "ids": Ragged.from_lengths(np.arange(total, dtype=np.int64) % 90, lengths),
        "logprobs": Ragged.from_lengths(np.full(total, -0.5, np.float32), lengths),
        "reward": np.linspace(0, 1, n),
        "x": np.zeros((n, 3)),
        "env": [f"env{i}" for i in range(n)],
        "score": [float(i) for i in range(n)],  # a list column of numbers
    }
    flaw = draw(st.sampled_from(["none", "ids", "logprobs", "reward", "x", "score"]))
    if flaw in ("ids", "logprobs") and total:
        at = draw(st.integers(0, total - 1))
        cols[flaw].values[at] = 1000 if flaw == "ids" else np.nan
    elif flaw == "reward":
        cols["reward"][draw(st.integers(0, n - 1))] = np.inf
    elif flaw == "score":
        cols["score"][draw(st.integers(0, n - 1))] = draw(st.sampled_from([np.nan, -np.inf]))
    elif flaw == "x":
        cols["x"][draw(st.integers(0, n - 1)), draw(st.integers(0, 2))] = -np.inf
    return Columns(cols)


@settings(max_examples=examples(200), deadline=None)
@given(cols=columns_with_one_flaw())
def test_property_columns_are_checked_as_the_list_of_their_rows(cols: Columns) -> None:
    held = {"samples": cols}
    rows = {"samples": list(cols.rows())}
    assert outcome(CHECKS, held) == outcome(CHECKS, rows)


@settings(max_examples=examples(100), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=10),
    bad=st.integers(0, 1_000),
    value=st.sampled_from([np.nan, np.inf, -np.inf]),
)
def test_property_a_ragged_is_checked_as_the_list_of_its_rows(
    lengths: list[int], bad: int, value: float
) -> None:
    values = np.zeros((sum(lengths), 2), np.float32)
    if values.size:
        values.reshape(-1)[bad % values.size] = value
    ragged = Ragged.from_lengths(values, lengths)
    expected = outcome(CHECKS, {"logprobs": list(ragged)})
    assert outcome(CHECKS, {"logprobs": ragged}) == expected
    assert (expected[0] == "passed") == (values.size == 0)


def test_a_nan_in_a_ragged_is_named_by_its_row_and_token() -> None:
    ragged = Ragged.from_lengths(np.array([0.1, 0.2, np.nan], np.float32), [1, 0, 2])
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.logprobs\[2\]\[1\]: nan is not finite"):
        CHECKS.validate({"logprobs": ragged})


@pytest.mark.parametrize("bad", [0, 3, 5, 6])
def test_a_chunked_is_checked_as_the_array_it_is_sent_as(bad: int) -> None:
    chunked = Chunked([np.zeros((3, 2)), np.zeros((0, 2)), np.zeros((2, 2)), np.zeros((2, 2))])
    whole = chunked.to_array()
    for array in [*chunked.chunks, whole]:
        array.flags.writeable = True
    row = bad
    for chunk in chunked.chunks:  # plant in the chunk that holds row ``bad``
        if row < len(chunk):
            chunk[row, 1] = np.nan
            break
        row -= len(chunk)
    whole[bad, 1] = np.nan
    got = outcome(CHECKS, {"x": chunked})
    assert got == outcome(CHECKS, {"x": whole})
    assert got[1].startswith(f"$.x[{bad}][1]: nan is not finite")


def test_max_value_reaches_a_ragged_column() -> None:
    cols = Columns({"ids": Ragged.from_lengths(np.array([1, 2, 300]), [2, 1])})
    with pytest.raises(rlwire.SchemaError, match=r"^\$\[1\]\.ids\[0\]: 300 is above 100"):
        CHECKS.validate(cols)


@pytest.mark.parametrize(
    "logprobs",
    [
        Ragged.from_lengths(np.zeros(5), [2, 3, 0]),  # compared in numpy
        [np.zeros(2), np.zeros(3), None],  # compared row by row
    ],
    ids=["ragged", "list"],
)
def test_same_length_over_columns_names_the_first_row_that_disagrees(logprobs: Any) -> None:
    cols = Columns({"ids": Ragged.from_lengths(np.arange(5), [2, 2, 1]), "logprobs": logprobs})
    rows = list(cols.rows())
    expected = outcome(CHECKS, rows)
    assert outcome(CHECKS, cols) == expected
    if isinstance(logprobs, Ragged):
        assert expected[1].startswith("$[1]: same_length group ('ids', 'logprobs') disagrees")
    else:  # the None of row 2 is left out, as in a record
        assert expected[1].startswith("$[1]: same_length")


def test_same_length_over_2d_columns_compares_two_widths_not_a_length_a_row() -> None:
    """Every row of a 2-D column is as long as its width: two such columns of a million
    rows are compared as two numbers (a length a row took 8 bytes each; 2**40 rows of
    width 0, which a message of 75 bytes can declare, ran out of memory)."""
    checks = Checks(same_length=(("x", "y"),))
    rows = 1_000_000
    cols = Columns({"x": np.ones((rows, 1), np.uint8), "y": np.ones((rows, 1))})
    tracemalloc.start()
    try:
        checks.validate(cols)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    empty = np.zeros((2**40, 0), np.float32)  # no bytes
    checks.validate(Columns({"x": empty, "y": empty[:, :0]}))
    with pytest.raises(rlwire.SchemaError, match=r"^\$\[0\]: same_length group \('x', 'y'\)"):
        checks.validate(Columns({"x": np.zeros((3, 2)), "y": np.zeros((3, 5))}))
    ragged = Ragged.from_lengths(np.zeros(11), [2, 2, 2, 3, 2])
    mixed = Columns({"x": np.zeros((5, 2)), "y": ragged})
    assert outcome(checks, mixed) == outcome(checks, list(mixed.rows()))
    assert outcome(checks, mixed)[1].startswith("$[3]: same_length")


def test_names_found_in_columns_alone_are_known() -> None:
    cols = Columns({"ids": Ragged.from_lengths(np.arange(3), [1, 2]), "env": ["a", "b"]})
    assert outcome(Checks(max_value={"ids": 5}), {"samples": cols}) == (
        "passed",
        frozenset({"samples", "ids", "env"}),
    )


def test_an_object_column_is_walked_row_by_row() -> None:
    extras = np.array([{"reward": 1.0}, {"reward": float("nan")}], dtype=object)
    cols = Columns({"extras": extras})
    assert outcome(CHECKS, cols) == outcome(CHECKS, list(cols.rows()))
    with pytest.raises(rlwire.SchemaError, match=r"^\$\[1\]\.extras\.reward: nan"):
        CHECKS.validate(cols)


@pytest.mark.parametrize("bad", [None, 0, 4999])
def test_an_object_column_of_numbers_is_checked_as_a_list_of_them(bad: int | None) -> None:
    score = np.empty(5000, dtype=object)
    score[:] = [float(i) for i in range(5000)]
    if bad is not None:
        score[bad] = float("inf")
    cols = Columns({"score": score})
    assert outcome(CHECKS, cols) == outcome(CHECKS, list(cols.rows()))
    assert outcome(CHECKS, cols)[0] == ("passed" if bad is None else rlwire.SchemaError)


def test_a_bool_column_over_its_max_value_is_named_as_its_rows_name_it() -> None:
    cols = Columns({"done": np.array([False, True])})
    checks = Checks(max_value={"done": 0})
    assert outcome(checks, cols) == outcome(checks, list(cols.rows()))
    with pytest.raises(rlwire.SchemaError, match=r"^\$\[1\]\.done: True is above 0"):
        checks.validate(cols)


def test_a_bool_held_in_a_byte_other_than_1_is_true_not_above_1() -> None:
    done = np.frombuffer(b"\x02\x01\x00", np.bool_)  # as a received |b1 buffer may hold
    Checks(max_value={"done": 1}).validate({"done": done})
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.done\[0\]: True is above 0"):
        Checks(max_value={"done": 0}).validate({"done": done})


@pytest.mark.parametrize("dtype", [np.longdouble, np.clongdouble])
def test_long_doubles_are_checked_finite(dtype: type) -> None:
    # .item() of a long double is a long double: the check of one called itself forever.
    cols = Columns({"x": np.array([1.0, np.inf], dtype)})
    assert outcome(CHECKS, cols) == outcome(CHECKS, list(cols.rows()))
    with pytest.raises(rlwire.SchemaError, match=r"^\$\[1\]\.x: .*inf.* is not finite"):
        CHECKS.validate(cols)


def test_a_failing_scan_finds_its_value_in_the_block_not_in_a_list_of_every_bad_index() -> None:
    # Every value is above the maximum: listing their indices took 16 bytes an element.
    values = np.full((1_000_000, 4), 300, np.uint16)  # 8 MB
    ragged = Ragged.from_lengths(values, [1_000_000])
    tracemalloc.start()
    try:
        with pytest.raises(rlwire.SchemaError, match=r"^\$\.ids\[0\]\[0\]\[0\]: 300"):
            CHECKS.validate({"ids": ragged})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_fortran_order_column_names_its_first_bad_value_in_row_order() -> None:
    x = np.asfortranarray(np.zeros((4, 3)))
    x[3, 0] = x[1, 2] = np.nan  # in row order, [1][2] comes first
    cols = Columns({"x": x})
    assert outcome(CHECKS, cols)[1].startswith("$[1].x[2]: nan")
    assert outcome(CHECKS, cols) == outcome(CHECKS, list(cols.rows()))


def test_an_object_chunked_is_checked_as_its_array() -> None:
    # (Object arrays are never sent: this is Checks.validate on its own.)
    chunked = Chunked([np.array([1, {"reward": np.nan}, 2], object)])
    for checks in (CHECKS, Checks(finite=["reward"])):  # under a rule, and with none
        assert outcome(checks, {"x": chunked}) == outcome(checks, {"x": chunked.to_array()})


# -- through a sender and a receiver ----------------------------------------------------------


def packed_step(nan: bool) -> dict[str, Any]:
    logprobs = np.full(5, -0.5, np.float32)
    if nan:
        logprobs[4] = np.nan
    return {
        "samples": Columns(
            {
                "ids": Ragged.from_lengths(np.arange(5), [2, 3]),
                "logprobs": Ragged.from_lengths(logprobs, [2, 3]),
            }
        )
    }


@pytest.mark.anyio
async def test_a_sender_refuses_a_nan_in_columns_and_leaves_nothing(tmp_path: Path) -> None:
    checks = Checks(finite=["logprobs"])
    async with rlwire.open_sender(tmp_path, validate=checks) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"\$\.samples\[1\]\.logprobs\[2\]: nan"):
            await sender.send(packed_step(nan=True))
        assert list(tmp_path.iterdir()) == []
        assert await sender.send(packed_step(nan=False)) == 0


@pytest.mark.anyio
async def test_a_receiver_checks_the_columns_it_returns(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send(packed_step(nan=False))
        await sender.send(packed_step(nan=True))
    checks = Checks(finite=["logprobs"])
    async with rlwire.open_receiver(
        tmp_path, type=dict[str, Any], as_columns=True, validate=checks
    ) as receiver:
        first = await receiver.areceive(timeout=10)
        assert first["samples"]["logprobs"].values.tolist() == [-0.5] * 5
        with pytest.raises(rlwire.SchemaError, match=r"samples\[1\]\.logprobs\[2\]: nan"):
            await receiver.areceive(timeout=10)
