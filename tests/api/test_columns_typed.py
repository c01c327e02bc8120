"""A receiver of a type refuses a step received as columns (``as_columns=True``) whose
columns hold what the type's fields refuse, as it refuses the same step received as
samples: a ``DecodeError`` naming the field, its type and what the column holds.
Before, only a missing required field was refused: a ``score: float | None`` column of
strings, an ``n: int`` column of floats or ``TrainingSample.env_name`` as ints came
back as they were sent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlwire
from rlwire.codecs import MsgpackCodec
from rlwire.testing import make_batch

pytestmark = pytest.mark.anyio


class S(msgspec.Struct):
    token_ids: np.ndarray
    score: float | None = None
    n: int = 0


class Batch(msgspec.Struct):
    samples: list[S]


class Good(msgspec.Struct):
    """A field of each kind checked, and of kinds left unchecked."""

    token_ids: np.ndarray
    i: int
    f: float
    b: bool
    s: str
    of: float | None
    os: str | None
    oarr: np.ndarray | None
    grid: np.ndarray
    big: Annotated[int, msgspec.Meta(ge=0)]
    meta: dict[str, int]
    anything: Any


class GoodBatch(msgspec.Struct):
    samples: list[Good]


def _bad_rows() -> list[dict[str, Any]]:
    return [
        {"token_ids": np.arange(3), "score": "bad", "n": 1.5},
        {"token_ids": np.arange(2), "score": "worse", "n": 2.5},
    ]


async def _send(path: Path, obj: Any) -> None:
    async with rlwire.open_sender(path, validate=False) as sender:
        await sender.send(obj)


async def _receive(path: Path, **options: Any) -> Any:
    with rlwire.open_receiver(path, record_consumed=False, **options) as receiver:
        return await receiver.areceive(timeout=5)


async def test_a_users_struct_is_refused_as_columns_as_it_is_as_rows(tmp_path: Path) -> None:
    await _send(tmp_path, {"samples": _bad_rows()})
    file = re.escape(str(tmp_path / "step-00000000.rank-0000.rlw"))
    does_not_match = rf"^{file}: received data does not match list\[S\]: "
    with pytest.raises(
        rlwire.DecodeError, match=does_not_match + r".* - at `\$\.samples\[0\]\.score`"
    ):
        await _receive(tmp_path, type=Batch)
    as_columns = (
        r"Expected `float \| None`, got `str` in a column of str - at `\$\.samples\[0\]\.score`$"
    )
    for validate in (False, True):
        with pytest.raises(rlwire.DecodeError, match=does_not_match + as_columns) as caught:
            await _receive(tmp_path, type=Batch, as_columns=True, validate=validate)
        assert caught.value.step == 0


async def test_an_int_field_refuses_a_column_of_floats(tmp_path: Path) -> None:
    rows = [{**row, "score": 0.5} for row in _bad_rows()]
    await _send(tmp_path, {"samples": rows})
    with pytest.raises(
        rlwire.DecodeError, match=r"Expected `int`, got `float` - at `\$\.samples\[0\]\.n`"
    ):
        await _receive(tmp_path, type=Batch)
    match = r"Expected `int`, got a column of float64 - at `\$\.samples\[0\]\.n`$"
    with pytest.raises(rlwire.DecodeError, match=match):
        await _receive(tmp_path, type=Batch, as_columns=True)
    with pytest.raises(rlwire.DecodeError, match=match):  # a partial read: columns too
        await _receive(tmp_path, type=Batch, fields=("n",))
    got = (await _receive(tmp_path, type=Batch, fields=("score",))).samples
    assert got["score"].tolist() == [0.5, 0.5]  # the column asked for is right


async def test_a_training_batch_refuses_env_names_that_are_not_str(tmp_path: Path) -> None:
    rows = []
    for sample in make_batch(2, 8, seed=1).samples:
        rows.append({**msgspec.structs.asdict(sample), "env_name": 7})
    await _send(tmp_path, {"samples": rows})
    with pytest.raises(rlwire.DecodeError, match=r"got `int` - at `\$\.samples\[0\]\.env_name`"):
        await _receive(tmp_path)
    match = (
        r"does not match list\[TrainingSample\]: Expected `str`, got a column of int64 - at "
        r"`\$\.samples\[0\]\.env_name`$"
    )
    for validate in (False, True):
        with pytest.raises(rlwire.DecodeError, match=match):
            await _receive(tmp_path, as_columns=True, validate=validate)


async def test_a_step_sent_in_parts_is_refused_as_columns(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        async with sender.open_step() as writer:
            await writer.put([{"token_ids": np.arange(2), "score": 1.0}], key="a")
            await writer.put(_bad_rows(), key="b")
    match = r"Expected `float \| None`, got `str` in a column of str - at `\$\[0\]\.score`"
    with rlwire.open_receiver(
        tmp_path, type=Batch, as_columns=True, record_consumed=False
    ) as receiver:
        with pytest.raises(rlwire.DecodeError, match=r"part-000001\.rlw: .*" + match):
            async for _ in receiver.aparts(timeout=5):
                pass
    with pytest.raises(rlwire.DecodeError, match=match):
        await _receive(tmp_path, type=Batch, as_columns=True)


async def test_a_field_appended_beside_columns_is_checked_as_the_steps_own(
    tmp_path: Path,
) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send({"samples": [{"token_ids": np.arange(3)}, {"token_ids": np.arange(2)}]})
        await sender.add_fields(0, {"n": np.array([1.5, 2.5]), "score": np.array([1, 2])})
    with pytest.raises(rlwire.DecodeError, match=r"appended field 'n' row 0 does not match"):
        await _receive(tmp_path, type=Batch)
    match = r"Expected `int`, got a column of float64 - at `\$\.samples\[0\]\.n`$"
    with pytest.raises(rlwire.DecodeError, match=match):
        await _receive(tmp_path, type=Batch, as_columns=True)
    got = (await _receive(tmp_path, type=dict, as_columns=True))["samples"]
    assert got["n"].tolist() == [1.5, 2.5]  # no type, nothing to refuse


def _good_rows() -> list[dict[str, Any]]:
    """Three rows a Good takes, whose columns are of every kind a column of a checked
    field may be: an int array for ``f`` (msgspec takes ints for a float), lists with
    ``None`` for the optional fields, a Ragged and a 2-D array."""
    arrays = [np.arange(3), np.arange(5), np.arange(1)]
    return [
        {
            "token_ids": arrays[k],
            "i": k,
            "f": k,
            "b": k == 1,
            "s": f"s{k}",
            "of": [0.5, None, 2][k],
            "os": [None, "x", "y"][k],
            "oarr": [None, arrays[k], None][k],  # None first, then an array
            "grid": np.full((2, 3), k, np.uint8),
            "big": 2**40 + k,
            "meta": {"k": k},
            "anything": ["x", 1, None][k],
        }
        for k in range(3)
    ]


async def test_good_columns_of_every_kind_are_received(tmp_path: Path) -> None:
    sent = _good_rows()
    await _send(tmp_path, {"samples": sent})
    rows = (await _receive(tmp_path, type=GoodBatch)).samples
    assert [r.of for r in rows] == [0.5, None, 2.0]
    got = (await _receive(tmp_path, type=GoodBatch, as_columns=True)).samples
    assert isinstance(got, rlwire.Columns) and got.names == tuple(sent[0])
    assert isinstance(got["token_ids"], rlwire.Ragged)
    assert got["f"].dtype == np.int64 and got["b"].dtype == np.bool_
    assert got["of"] == [0.5, None, 2] and got["os"] == [None, "x", "y"]
    assert isinstance(got["grid"], rlwire.Ragged) and got["s"] == ["s0", "s1", "s2"]
    assert got["oarr"][0] is None and got["oarr"][1].tolist() == [0, 1, 2, 3, 4]
    plain = (await _receive(tmp_path, type=dict, as_columns=True))["samples"]
    assert plain.names == got.names


async def test_packed_columns_of_a_row_each_along_an_arrays_first_axis_are_received(
    tmp_path: Path,
) -> None:
    columns = {
        "token_ids": np.arange(6).reshape(3, 2),
        "score": np.array([0.5, 1.0, 2.0], np.float32),
        "n": np.array([1, 2, 3], np.uint16),
    }
    await _send(tmp_path, {"samples": rlwire.Columns(columns)})
    got = (await _receive(tmp_path, type=Batch, as_columns=True)).samples
    assert got["token_ids"].shape == (3, 2) and got["n"].dtype == np.uint16
    rows = (await _receive(tmp_path, type=Batch)).samples
    assert [(r.score, r.n) for r in rows] == [(0.5, 1), (1.0, 2), (2.0, 3)]


async def test_columns_of_no_rows_are_received_whatever_their_kinds(tmp_path: Path) -> None:
    """No row to refuse: as a step of no samples is received."""
    empty = rlwire.Ragged(np.zeros(0, np.int64), [0])
    columns = {"token_ids": empty, "score": [], "n": np.zeros(0, np.float64)}
    await _send(tmp_path, {"samples": rlwire.Columns(columns)})
    got = (await _receive(tmp_path, type=Batch, as_columns=True)).samples
    assert isinstance(got, rlwire.Columns) and len(got) == 0
    assert (await _receive(tmp_path, type=Batch)).samples == []


CODEC = MsgpackCodec()


def _refusal(rows: list[dict[str, Any]], tp: Any, **options: Any) -> str | None:
    """How decoding ``rows`` as samples of a Struct whose ``x`` is ``tp`` fails."""
    item = msgspec.defstruct("Item", [("token_ids", np.ndarray), ("x", tp)])
    batch = msgspec.defstruct("Items", [("samples", list[item])])  # type: ignore[valid-type]
    try:
        CODEC.decode(CODEC.encode({"samples": rows}), batch, **options)
    except rlwire.DecodeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("tp", "values", "held"),
    [
        (int, [True, False], "a column of bool"),
        (int, [1, None], "`None` in a column of None, int"),
        (float, [True, False], "a column of bool"),
        (float | None, [1.5, None, "a"], "`str` in a column of None, float, str"),
        (bool, [0, 1], "a column of int64"),
        (str, ["a", None], "`None` in a column of None, str"),
        (str, [np.arange(2), np.arange(3)], "a column of int64 arrays (a Ragged)"),
        (np.ndarray, [1, 2], "a column of int64"),
        (np.ndarray, [np.arange(2), None], "`None` in a column of None, ndarray"),
        (np.ndarray | None, [np.arange(2), "a"], "`str` in a column of ndarray, str"),
    ],
)
def test_each_checked_kind_refuses_what_msgspec_refuses(
    tp: Any, values: list[Any], held: str
) -> None:
    rows = [{"token_ids": np.arange(2), "x": v} for v in values]
    assert _refusal(rows, tp) is not None
    refused = _refusal(rows, tp, as_columns=True)
    assert refused is not None and f"got {held} - at `$.samples[" in refused


KINDS = {
    "int": st.integers(-(2**62), 2**62),
    "float": st.floats(),
    "bool": st.booleans(),
    "str": st.text(max_size=3),
    "none": st.none(),
    "array": st.integers(0, 3).map(np.arange),
}
TYPES = [
    int,
    float,
    bool,
    str,
    int | None,
    float | None,
    bool | None,
    str | None,
    np.ndarray,
    np.ndarray | None,
    Annotated[float, msgspec.Meta(description="checked as a float")],
]


@st.composite
def columns(draw: st.DrawFn) -> list[Any]:
    """The values of one column: rows of one or two kinds."""
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=2))
    rows = draw(st.integers(1, 6))
    return [draw(st.sampled_from(kinds).flatmap(KINDS.__getitem__)) for _ in range(rows)]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=columns(), tp=st.sampled_from(TYPES))
def test_a_column_is_refused_exactly_when_its_rows_are(values: list[Any], tp: Any) -> None:
    rows = [{"token_ids": np.arange(2), "x": v} for v in values]
    as_rows = _refusal(rows, tp)
    as_columns = _refusal(rows, tp, as_columns=True)
    assert (as_rows is None) == (as_columns is None), (as_rows, as_columns)
    if as_columns is not None:
        assert re.search(r"Expected `[^`]+`, got .* - at `\$\.samples\[\d+\]\.x`$", as_columns)


class Packed(msgspec.Struct, array_like=True):
    t: np.ndarray
    a: int
    b: str
    c: float = 0.5


class PackedBatch(msgspec.Struct):
    samples: list[Packed]


@pytest.mark.parametrize("fields", [["b"], ["c"], ["t", "c"], ["a", "b"]])
@pytest.mark.parametrize("as_columns", [False, True])
async def test_a_selection_of_an_array_like_structs_fields_is_checked_by_name(
    tmp_path: Path, fields: list[str], as_columns: bool
) -> None:
    """An array_like Struct's columns are named by its fields: a selection of some of
    them is checked against those fields, not the first ones (it refused `b`'s strings
    as field `t`'s arrays)."""
    sent = PackedBatch([Packed(np.arange(i + 1), i, f"x{i}", 1.5) for i in range(3)])
    await _send(tmp_path, sent)
    got = await _receive(tmp_path, type=PackedBatch, fields=fields, as_columns=as_columns)
    assert got.samples.names == tuple(fields)
    assert list(got.samples["b"] if "b" in fields else ["x0", "x1", "x2"]) == ["x0", "x1", "x2"]


class Numbered(msgspec.Struct, array_like=True):
    t: np.ndarray
    a: int
    b: int  # where Packed has a str
    c: float = 0.5


async def test_a_selected_column_of_an_array_like_struct_is_still_refused(tmp_path: Path) -> None:
    await _send(tmp_path, {"samples": [Numbered(np.arange(i + 1), i, 7 + i) for i in range(2)]})
    with pytest.raises(rlwire.DecodeError, match=r"Expected `str`.* - at `\$\.samples\[0\]\.b`"):
        await _receive(tmp_path, type=PackedBatch, fields=["b"], as_columns=True)
