"""rlwire.Checks against values made to slip past it (session 24's adversarial review).

Each test here failed before its fix: a number of a subclass of int or float (an
IntEnum, a float Enum) passed every rule and was sent.
"""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire import Checks

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
