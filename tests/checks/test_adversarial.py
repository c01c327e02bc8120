"""rlwire.Checks against values made to slip past it (session 24's adversarial review).

Each test here failed before its fix: a number of a subclass of int or float (an
IntEnum, a float Enum) passed every rule and was sent; a Ragged, Chunked or Columns
changed since it was made was named at rows that do not exist (or raised an untyped
error), where the encoder refuses it with a SchemaError saying what changed.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlwire
from rlwire import Checks, Chunked, Columns, Ragged

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
