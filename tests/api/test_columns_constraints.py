"""A receiver of a type whose Struct fields carry constraints
(``Annotated[int, msgspec.Meta(ge=5)]``) refuses a value out of range in a list
received as columns, as msgspec refuses it in the same rows received as a plain list:
a ``DecodeError`` naming the sample and field. Before, the rows made from columns took
the annotation without ``Annotated`` and built each row by calling the Struct, which
checks no constraint: the value was delivered."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio


class Sample(msgspec.Struct):
    x: np.ndarray
    n: Annotated[int, msgspec.Meta(ge=5)]
    tag: Annotated[str, msgspec.Meta(max_length=2)] = "ok"
    scores: list[Annotated[float, msgspec.Meta(gt=0)]] = []
    doc: Annotated[np.ndarray, msgspec.Meta(description="a described array")] | None = None


class Batch(msgspec.Struct):
    samples: list[Sample]


async def _received(path: Path, samples: list[dict[str, Any]]) -> Any:
    async with rlwire.open_sender(path, validate=False) as sender:
        await sender.send({"samples": samples})
    with rlwire.open_receiver(path, type=Batch, record_consumed=False) as receiver:
        return await receiver.areceive(timeout=5)


def _rows(**second: Any) -> list[dict[str, Any]]:
    """Two rows stored as columns (the same keys), the second with ``second`` set."""
    first = {"x": np.arange(3), "n": 7, "tag": "a", "scores": [1.0], "doc": np.arange(2)}
    return [first, {**first, "x": np.arange(2), **second}]


@pytest.mark.parametrize(
    ("bad", "where", "expected"),
    [
        ({"n": 1}, "n", "Expected `int` >= 5"),
        ({"tag": "abc"}, "tag", "Expected `str` of length <= 2"),
        ({"scores": [1.0, -1.0]}, "scores[1]", "Expected `float` > 0.0"),
    ],
)
async def test_a_value_out_of_its_fields_constraint_is_refused_as_columns_as_as_rows(
    tmp_path: Path, bad: dict[str, Any], where: str, expected: str
) -> None:
    path = f"`$.samples[1].{where}`"
    as_columns = _rows(**bad)
    with pytest.raises(rlwire.DecodeError) as caught:
        await _received(tmp_path / "columns", as_columns)
    assert expected in str(caught.value)
    assert str(caught.value).endswith(f" - at {path}")
    # the same rows, kept a plain list by a key of the first row only
    as_list = [{**as_columns[0], "extra": 0}, as_columns[1]]
    with pytest.raises(rlwire.DecodeError) as by_rows:
        await _received(tmp_path / "list", as_list)
    assert str(by_rows.value).endswith(f"{expected} - at {path}")


async def test_values_within_the_constraints_are_received_as_sent(tmp_path: Path) -> None:
    got = await _received(tmp_path, _rows(n=5, tag="zz", scores=[0.5, 2.0]))
    first, second = got.samples
    assert (first.n, first.tag, first.scores) == (7, "a", [1.0])
    assert (second.n, second.tag, second.scores) == (5, "zz", [0.5, 2.0])
    assert second.x.tolist() == [0, 1] and second.doc.tolist() == [0, 1]
