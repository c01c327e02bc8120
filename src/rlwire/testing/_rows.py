"""Values for the contract's columns property: lists of Structs and dicts holding arrays,
a Ragged and a Chunked, drawn by hypothesis as a small :class:`Spec` and built from it.

A spec is drawn, not the arrays themselves: hypothesis then shrinks a failure to a few
numbers that print in a line, and the arrays (up to tens of kB a row, so that large rows
are sent where they are, as the runs of a Pieces) cost nothing to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import msgspec
import numpy as np
from hypothesis import strategies as st

from rlwire._core.chunked import Chunked
from rlwire._core.columns import Columns
from rlwire._core.ragged import Ragged

__all__ = [
    "Case",
    "Row",
    "Spec",
    "assert_as_columns",
    "assert_same",
    "assert_typed",
    "build",
    "specs",
]

#: Dtypes of the arrays: integers, floats and bools of every width.
DTYPES = ("|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<i8", "<u8", "<f2", "<f4", "<f8")

#: How one row breaks the others' pattern, so that its field falls back to one value per
#: row: none, another dtype, another trailing shape, or another number of dimensions.
MIXES = ("none", "dtype", "shape", "ndim")


class Row(msgspec.Struct):
    """A sample: a 1-D and a 2-D array, per-sample numbers and a string, an optional array."""

    tokens: np.ndarray
    grid: np.ndarray
    reward: float
    done: bool
    env: str
    extra: np.ndarray | None = None


class Case(msgspec.Struct):
    """What one step of the property carries."""

    rows: list[Row]
    dicts: list[dict[str, Any]]
    ragged: Ragged
    chunked: np.ndarray  # sent as a Chunked, which arrives as one array


@dataclass(frozen=True)
class Spec:
    """The few numbers a :class:`Case` is built from (see :func:`build`)."""

    seed: int
    lengths: tuple[int, ...]  # rows' token counts; 0 rows is an empty list
    dtype: str  # tokens' dtype
    width: int  # grid's trailing dimension
    mix: str  # one of MIXES, applied to the last row
    extra: tuple[bool, ...]  # which rows hold the optional array
    views: bool  # tokens are adjacent views of one block
    envs: tuple[str, ...]
    dict_rows: tuple[tuple[int, bool], ...]  # per dict: ids length, has the "opt" key
    ragged: tuple[int, ...]  # row lengths of the Ragged
    chunks: tuple[int, ...]  # first-axis lengths of the Chunked's chunks


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    """Specs of any mix: lengths from 0, rows of a few bytes to tens of kB (the large
    ones go out as Pieces), 0 to 5 rows, mixed rows and missing fields."""
    scale = draw(st.sampled_from([1, 97, 700]))
    lengths = draw(st.lists(st.integers(0, 8).map(lambda k: k * scale), max_size=5))
    n = len(lengths)
    small = st.integers(0, 6).map(lambda k: k * scale)
    return Spec(
        seed=draw(st.integers(0, 2**32 - 1)),
        lengths=tuple(lengths),
        dtype=draw(st.sampled_from(DTYPES)),
        width=draw(st.integers(1, 4)),
        mix=draw(st.sampled_from(MIXES)),
        extra=tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
        views=draw(st.booleans()),
        envs=tuple(draw(st.lists(st.text(max_size=4), min_size=n, max_size=n))),
        dict_rows=tuple(draw(st.lists(st.tuples(small, st.booleans()), max_size=4))),
        ragged=tuple(draw(st.lists(small, max_size=4))),
        chunks=tuple(draw(st.lists(small, max_size=4))),
    )


def _values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random values of ``dtype``: every bit pattern of integers, normal floats."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return rng.standard_normal(shape).astype(dt)


def _tokens(rng: np.random.Generator, spec: Spec) -> list[np.ndarray]:
    """The rows' token arrays: separate arrays, or adjacent views of one block."""
    if not spec.views:
        return [_values(rng, spec.dtype, (n,)) for n in spec.lengths]
    block = _values(rng, spec.dtype, (sum(spec.lengths),))
    return list(np.split(block, np.cumsum(spec.lengths)[:-1])) if spec.lengths else []


def _rows(rng: np.random.Generator, spec: Spec) -> list[Row]:
    tokens = _tokens(rng, spec)
    grids = [_values(rng, "<f4", (n, spec.width)) for n in spec.lengths]
    if tokens and spec.mix == "dtype":
        tokens[-1] = tokens[-1].astype("<f8" if spec.dtype != "<f8" else "<i8")
    elif tokens and spec.mix == "shape":
        grids[-1] = _values(rng, "<f4", (spec.lengths[-1], spec.width + 1))
    elif tokens and spec.mix == "ndim":
        tokens[-1] = tokens[-1].reshape(-1, 1)
    return [
        Row(
            tokens=ids,
            grid=grid,
            reward=float(rng.standard_normal()),
            done=bool(rng.integers(0, 2)),
            env=env,
            extra=_values(rng, "<i4", (n // 2, 3)) if has_extra else None,
        )
        for ids, grid, env, n, has_extra in zip(
            tokens, grids, spec.envs, spec.lengths, spec.extra, strict=True
        )
    ]


def _dicts(rng: np.random.Generator, spec: Spec) -> list[dict[str, Any]]:
    """Dicts with the same keys (stored as columns) or, if any lacks "opt", rows whose
    keys differ (left a list)."""
    out = []
    for n, has_opt in spec.dict_rows:
        row: dict[str, Any] = {"ids": _values(rng, "<i4", (n,)), "score": float(n) / 3}
        if has_opt:
            row["opt"] = _values(rng, "<f8", (n, 2))
        out.append(row)
    return out


def build(spec: Spec) -> Case:
    """The value ``spec`` stands for (the same every time)."""
    rng = np.random.default_rng(spec.seed)
    parts = [_values(rng, "<i8", (n, 2)) for n in spec.ragged]
    ragged = Ragged.from_arrays(parts) if parts else Ragged(np.zeros((0, 2), "<i8"), [0])
    chunked = Chunked([_values(rng, "|u1", (n, 3, 2)) for n in spec.chunks])
    return Case(
        rows=_rows(rng, spec),
        dicts=_dicts(rng, spec),
        ragged=ragged,
        chunked=cast(np.ndarray, chunked),
    )


# -- what must come back ------------------------------------------------------------------


def assert_same(got: Any, want: Any, where: str) -> None:
    """``got`` equals ``want``, named ``where`` in failures: arrays of the same dtype,
    shape and bytes (a Chunked as its chunks joined), Raggeds of equal values and
    offsets, dicts of the same keys in order, other values equal."""
    if isinstance(want, Chunked):
        want = want.to_array()
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: got {type(got).__name__}, not an array"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, sent {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {got.shape}, sent {want.shape}"
        assert got.tobytes() == want.tobytes(), f"{where}: values differ"
    elif isinstance(want, Ragged):
        assert isinstance(got, Ragged), f"{where}: got {type(got).__name__}, not a Ragged"
        assert_same(got.values, want.values, f"{where}.values")
        assert_same(got.offsets, want.offsets, f"{where}.offsets")
    elif isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: got {type(got).__name__}, not a dict"
        assert list(got) == list(want), f"{where}: keys {list(got)}, sent {list(want)}"
        for key, value in want.items():
            assert_same(got[key], value, f"{where}.{key}")
    else:
        assert got == want, f"{where}: {got!r}, sent {want!r}"


def assert_typed(got: object, sent: Case) -> None:
    """``got``, received as a :class:`Case`, is ``sent``: same types, same arrays."""
    assert type(got) is Case, f"received a {type(got).__name__}"
    assert len(got.rows) == len(sent.rows)
    for i, (back, row) in enumerate(zip(got.rows, sent.rows, strict=True)):
        assert type(back) is Row, f"rows[{i}]: a {type(back).__name__}"
        for name in Row.__struct_fields__:
            want = getattr(row, name)
            have = getattr(back, name)
            if not isinstance(want, np.ndarray):
                assert type(have) is type(want), f"rows[{i}].{name}: a {type(have).__name__}"
            assert_same(have, want, f"rows[{i}].{name}")
    assert len(got.dicts) == len(sent.dicts)
    for i, (back_dict, row_dict) in enumerate(zip(got.dicts, sent.dicts, strict=True)):
        assert_same(back_dict, row_dict, f"dicts[{i}]")
    assert_same(got.ragged, sent.ragged, "ragged")
    assert_same(got.chunked, sent.chunked, "chunked")


def _rows_of(got: Any, where: str, stored_as_columns: bool) -> list[Any]:
    """The rows of a list received with ``as_columns``: a Columns' rows, or the list."""
    if stored_as_columns:
        assert isinstance(got, Columns), f"{where}: a {type(got).__name__}, not Columns"
        return [got.row(i) for i in range(len(got))]
    assert isinstance(got, list), f"{where}: a {type(got).__name__}, not a list"
    return got


def assert_as_columns(got: object, sent: Case) -> None:
    """``got``, received untyped with ``as_columns=True``, holds ``sent``'s rows: the
    lists stored as columns come back as :class:`~rlwire.Columns` whose rows equal the
    rows sent, the others as lists."""
    assert isinstance(got, dict), f"received a {type(got).__name__}"
    rows = _rows_of(got["rows"], "rows", bool(sent.rows))
    assert len(rows) == len(sent.rows)
    for i, (back, row) in enumerate(zip(rows, sent.rows, strict=True)):
        assert_same(back, msgspec.structs.asdict(row), f"rows[{i}]")
    same_keys = len({tuple(d) for d in sent.dicts}) == 1
    dicts = _rows_of(got["dicts"], "dicts", same_keys)
    assert len(dicts) == len(sent.dicts)
    for i, (back_dict, row_dict) in enumerate(zip(dicts, sent.dicts, strict=True)):
        assert_same(back_dict, row_dict, f"dicts[{i}]")
    assert_same(got["ragged"], sent.ragged, "ragged")
    assert_same(got["chunked"], sent.chunked, "chunked")
