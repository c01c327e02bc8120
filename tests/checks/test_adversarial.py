"""rlwire.Checks against values made to slip past it (session 24's adversarial review).

Each test here failed before its fix: a number of a subclass of int or float (an
IntEnum, a float Enum) passed every rule and was sent; a Ragged, Chunked or Columns
changed since it was made was named at rows that do not exist (or raised an untyped
error), where the encoder refuses it with a SchemaError saying what changed.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from depth import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import Checks, Chunked, Columns, Ragged
from rlwire._core.slicing import run_sliced

CHECKS = Checks(finite=("x",), max_value={"ids": 100})


class Expert(enum.IntEnum):
    LOW = 1
    HIGH = 300


class Temperature(float, enum.Enum):
    COLD = 0.5
    BROKEN = math.nan


class Big(int):
    pass


def refused(obj: Any) -> str:
    with pytest.raises(rlwire.SchemaError) as info:
        CHECKS.validate(obj)
    return str(info.value)


# -- numbers of a subclass of int or float ----------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "where"),
    [
        ({"x": 0.5, "ids": Expert.HIGH}, "$.ids: <Expert.HIGH: 300> is above 100"),
        ({"x": 0.5, "ids": [Expert.LOW, Expert.HIGH]}, "$.ids[1]: <Expert.HIGH: 300> is above"),
        ({"x": 0.5, "ids": [1, 2, Big(101)]}, "$.ids[2]: 101 is above 100"),
        ({"x": [0.5, Temperature.BROKEN], "ids": 1}, "$.x[1]: <Temperature.BROKEN: nan> is not"),
        ({"x": Temperature.BROKEN, "ids": 1}, "$.x: <Temperature.BROKEN: nan> is not finite"),
        # A list of records of one type: checked a column at a time.
        ([{"x": 0.5, "ids": Expert.LOW}] * 5 + [{"x": 0.5, "ids": Expert.HIGH}], "$[5].ids: <"),
    ],
)
def test_numbers_of_a_subclass_of_int_or_float_are_checked(obj: Any, where: str) -> None:
    assert refused(obj).startswith(where)


@pytest.mark.anyio
async def test_a_sender_refuses_an_int_enum_above_the_maximum(tmp_path: Path) -> None:
    """msgspec encodes an IntEnum as its int: 300 went out past max_value 100."""
    async with rlwire.open_sender(tmp_path, validate=CHECKS) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"\$\.ids\[1\]: <Expert\.HIGH: 300>"):
            await sender.send({"x": 0.5, "ids": [Expert.LOW, Expert.HIGH]})
        assert list(tmp_path.iterdir()) == []
        assert await sender.send({"x": 0.5, "ids": [Expert.LOW]}) == 0


# -- packed values changed since they were made ---------------------------------------------


def ragged_moved_on() -> Ragged:
    """A Ragged made a view of values[1:] by setting its offsets: the encoder refuses it;
    the NaN at values[0] lies outside every row."""
    ragged = Ragged(np.array([np.nan, 1.0, 2.0]), [0, 1, 3])
    ragged.offsets = np.array([1, 3])
    return ragged


def ragged_cut_short() -> Ragged:
    ragged = Ragged(np.array([1.0, 2.0, 3.0, np.nan]), [0, 1, 4])
    ragged.offsets = np.array([0, 1, 3])
    return ragged


def ragged_of_a_list() -> Ragged:
    ragged = Ragged(np.zeros(2), [0, 2])
    ragged.values = [0.5, math.nan]  # type: ignore[assignment]  # what the test is about
    return ragged


def chunked_with_a_list() -> Chunked:
    chunked = Chunked([np.zeros(3)])
    chunked.chunks.append([1.0, math.nan])  # type: ignore[arg-type]  # as above
    return chunked


def columns_grown() -> Columns:
    columns = Columns({"x": [0.5, 1.0], "ids": np.zeros(2, np.int64)})
    columns["x"].append(math.nan)  # type: ignore[union-attr]  # a list column
    return columns


CHANGED = [
    (ragged_moved_on, "$.x: the Ragged's offsets must start at 0, got 1"),
    (ragged_cut_short, "$.x: the Ragged's offsets must end at the number of values (4), got 3"),
    (ragged_of_a_list, "$.x: the Ragged's values must be a numpy array of at least one dimens"),
    (chunked_with_a_list, "$.x: chunk 1 must be a numpy array of at least one dimension, got li"),
    (columns_grown, "$.x.x: has 3 rows, the Columns 2"),
]


@pytest.mark.parametrize(("make", "message"), CHANGED)
def test_a_packed_value_changed_since_it_was_made_is_refused_as_the_encoder_refuses_it(
    make: Any, message: str
) -> None:
    """Not scanned: its rows are not what it holds (a NaN was named at row -1, token -3;
    a chunk that is a list raised AttributeError)."""
    assert refused({"x": make(), "ids": 1}).startswith(message)


@pytest.mark.anyio
@pytest.mark.parametrize("validate", [CHECKS, True, False])
@pytest.mark.parametrize(("make", "message"), CHANGED)
async def test_a_sender_refuses_a_changed_packed_value_with_one_schema_error(
    tmp_path: Path, make: Any, message: str, validate: Any
) -> None:
    """With or without the checks (the encoder raised AttributeError for a Ragged whose
    values became a list), the same typed error, and nothing written."""
    async with rlwire.open_sender(tmp_path, validate=validate) as sender:
        with pytest.raises(rlwire.SchemaError) as info:
            await sender.send({"x": make(), "ids": 1})
        assert str(info.value).startswith(f"step 0, rank 0: {message}")
        assert list(tmp_path.iterdir()) == []


# -- one bad value, planted anywhere: named exactly where it is --------------------------------

RULES = Checks(finite=("lp",), max_value={"ids": 100})
_DTYPES = {"lp": ["f2", "f4", "f8", "c8", "c16"], "ids": ["i1", "u1", "u8", "i8"]}


class Holder(msgspec.Struct):
    lp: Any = None
    ids: Any = None
    note: str = ""


@dataclasses.dataclass
class DataHolder:
    lp: Any = None
    ids: Any = None
    note: str = ""


#: Where a bad value can go inside one value: its index path there, a setter.
Spot = tuple[tuple[int, ...], Callable[[Any], None]]


def field_value(rng: random.Random, name: str, n: int) -> tuple[Any, list[Spot]]:
    """A value of one of many kinds for field ``name``, ``n`` items long, holding good
    values, and the places a bad value can go (an index path under it, a setter)."""
    kind = rng.choice(["array", "strided", "2d", "fortran", "list", "nested", "ragged", "chunked"])
    zero = 0.0 if name == "lp" else 0
    if kind in ("array", "strided"):
        arr = np.zeros(2 * n if kind == "strided" else n, rng.choice(_DTYPES[name]))
        arr = arr[::2] if kind == "strided" else arr
        return arr, [((i,), partial(arr.__setitem__, i)) for i in range(n)]
    if kind in ("2d", "fortran"):
        arr = np.zeros((n, 3), rng.choice(_DTYPES[name]), order="F" if kind == "fortran" else "C")
        return arr, [((i, j), partial(arr.__setitem__, (i, j))) for i in range(n) for j in range(3)]
    if kind == "list":
        items = [zero] * n
        return items, [((i,), partial(items.__setitem__, i)) for i in range(n)]
    if kind == "nested":
        rows = [[zero, zero] for _ in range(n)]
        return rows, [((i, j), partial(rows[i].__setitem__, j)) for i in range(n) for j in (0, 1)]
    if kind == "ragged":
        lengths = [rng.randrange(4) for _ in range(n)]
        values = np.zeros(sum(lengths), rng.choice(_DTYPES[name]))
        ragged = Ragged.from_lengths(values, lengths)
        starts = ragged.offsets.tolist()
        return ragged, [
            ((row, t), partial(values.__setitem__, starts[row] + t))
            for row in range(n)
            for t in range(lengths[row])
        ]
    chunks = [np.zeros(rng.randrange(4), rng.choice(_DTYPES[name]))]
    chunks += [np.zeros(rng.randrange(4), chunks[0].dtype) for _ in range(rng.randrange(3))]
    spots: list[Spot] = []
    for chunk in chunks:  # named as the one array the chunks are sent as
        start = len(spots)
        spots += [((start + t,), partial(chunk.__setitem__, t)) for t in range(len(chunk))]
    return Chunked(chunks), spots


#: Where a bad value can go: its field's name, its path under ``$.rows``, a setter.
Place = tuple[str, tuple[Any, ...], Callable[[Any], None]]


def planted(rng: random.Random) -> tuple[Any, list[Place]]:
    """``{"meta": ..., "rows": rows}`` (records, dataclasses, dicts or Columns), and every
    place a bad value can go."""
    count = rng.choice([1, 3, 4, 5, 17, 40, 600])  # either side of the column walk's bounds
    shape = rng.choice(["struct", "dataclass", "dict", "columns"])
    places: list[Place] = []
    if shape == "columns":
        lengths = [rng.randrange(4) for _ in range(count)]
        values = np.zeros(sum(lengths), np.float32)
        ids = np.zeros((count, 2), np.int64)
        rows: Any = Columns({"lp": Ragged.from_lengths(values, lengths), "ids": ids})
        starts = rows["lp"].offsets.tolist()
        for i in range(count):
            for t in range(lengths[i]):
                places.append(("lp", (i, "lp", t), partial(values.__setitem__, starts[i] + t)))
            for j in (0, 1):
                places.append(("ids", (i, "ids", j), partial(ids.__setitem__, (i, j))))
        return {"meta": {"lp": 0.5}, "rows": rows}, places
    rows = []
    for i in range(count):
        n = rng.choice([0, 1, 2, 5])
        fields = {}
        for name in ("lp", "ids"):
            fields[name], spots = field_value(rng, name, n)
            places += [(name, (i, name, *at), put) for at, put in spots]
        made = {"struct": Holder, "dataclass": DataHolder, "dict": dict}[shape]
        rows.append(made(**fields, note="x"))
    return {"meta": {"lp": 0.5, "ids": 1}, "rows": rows}, places


@settings(max_examples=examples(200), deadline=None)
@given(rng=st.randoms(use_true_random=False))
def test_property_one_bad_value_is_named_exactly_where_it_was_planted(rng: random.Random) -> None:
    """An independent oracle for the column walk and the packed scans: the path a
    per-value scan names, built beside the object, not read back from the checks."""
    obj, places = planted(rng)
    run_sliced(RULES.validate_sliced(obj, check_names=False))
    if not places:
        return
    name, path, put = rng.choice(places)
    if name == "lp":
        put(rng.choice([math.nan, math.inf, -math.inf]))
    else:
        put(rng.choice([101, 127]))
    where = "$.rows" + "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in path)
    with pytest.raises(rlwire.SchemaError) as info:
        run_sliced(RULES.validate_sliced(obj, check_names=False))
    assert str(info.value).split(": ")[0] == where
