"""rlwire.Checks over a list of records, a column at a time (rlwire._checks.columns).

The column path must refuse exactly what the per-object walk refuses, with the same
message: every invalid case of test_checks.py, put at index 17 of a list of 41 records,
names the same field and token under ``$.samples[17]``; a property compares both paths on
random lists; and counting shows the column path is the one taken.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import hypothesis.extra.numpy as hnp
import msgspec
import numpy as np
import pytest
from check_types import (
    FRAMEWORK,
    Experts,
    Holder,
    MicroBatch,
    PlainMicroBatch,
    Rollout,
    Scored,
    Text,
    Turns,
)
from depth import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rlwire
import rlwire._checks.columns as columns
import rlwire._checks.walk as walk
from rlwire._checks.plan import ANY
from rlwire._core.slicing import SliceTimer, run_sliced

FAMILIES = [MicroBatch, PlainMicroBatch]


# -- helpers ------------------------------------------------------------------------------


def outcome(cls: type[walk.Walk], checks: rlwire.Checks, obj: Any) -> tuple[Any, ...]:
    """What a walk of class ``cls`` makes of ``obj``: the names it saw, or its error."""
    run = cls(checks._planner, collect=True)
    try:
        run_sliced(run.visit(obj, None, None, ANY))
    except rlwire.RlwireError as exc:
        return (type(exc), str(exc))
    return ("passed", frozenset(run.seen))


def per_object(checks: rlwire.Checks, obj: Any) -> tuple[Any, ...]:
    return outcome(walk.Walk, checks, obj)


def by_columns(checks: rlwire.Checks, obj: Any) -> tuple[Any, ...]:
    return outcome(columns.ColumnWalk, checks, obj)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of the walk's per-object visits (records, dicts, arrays) and of groups of
    rows checked as columns, during the test."""
    counts = dict.fromkeys(("record", "mapping", "array", "rows"), 0)
    for name in counts:
        owner = columns.ColumnWalk if name == "rows" else walk.Walk
        original = getattr(owner, name)

        def counted(self: Any, *args: Any, _name: str = name, _f: Any = original) -> Any:
            counts[_name] += 1
            return _f(self, *args)

        monkeypatch.setattr(owner, name, counted)
    return counts


# -- every invalid case of test_checks.py, at index 17 of 41 records --------------------------

Make = Callable[[bool], Any]


class Local(msgspec.Struct):
    inner: Unknown  # type: ignore[name-defined]  # noqa: F821


def _micro_batch(family: int, edit: Callable[[Any], None]) -> Make:
    def make(bad: bool) -> Any:
        mb = FAMILIES[family](
            input_ids=list(range(40)),
            loss_mask=[i % 2 == 0 for i in range(40)],
            advantages=[0.5 * i for i in range(40)],
            inference_logprobs=[-0.01 * i for i in range(40)],
            position_ids=list(range(40)),
            routed_expert_ids=[[[(i + j) % 256, 7] for j in range(3)] for i in range(40)],
            routed_experts=Experts(bytes(240), [40, 3, 2], "uint8"),
        )
        if bad:
            edit(mb)
        return mb

    return make


def _set(field: str, index: Any, value: Any) -> Callable[[Any], None]:
    def edit(mb: Any) -> None:
        getattr(mb, field)[index] = value

    return edit


def _dict(good: Any, bad: Any, key: str = "x") -> Make:
    return lambda is_bad: {key: bad() if is_bad else good()}


def _array_at_depth(order: str) -> Make:
    def make(bad: bool) -> Any:
        arr = np.zeros((6, 5, 4), np.float32, order="F" if order == "F" else "C")
        if order == "strided":
            arr = np.zeros((12, 5, 4), np.float32)[::2]
        if bad:
            arr[4, 1, 2] = -np.inf
        return {"logprobs": arr}

    return make


def _int_array(dtype: type) -> Make:
    def make(bad: bool) -> Any:
        arr = np.zeros((10, 4, 2), dtype)
        if bad:
            arr[7, 3, 1] = 1 if dtype is np.bool_ else 201
        return {"routed_experts": arr}

    return make


BIG = columns.BUDGET + 5
BIG_GOOD = np.zeros(BIG)
BIG_BAD = np.zeros(BIG)
BIG_BAD[-1] = np.nan

LONG_GOOD = [0.5] * 9000  # longer than one group of the walk (8,192 numbers)
LONG_BAD = [*LONG_GOOD[:-1], math.nan]

FINITE_X = rlwire.Checks(finite=("x",))
IDS_10 = rlwire.Checks(max_value={"ids": 10})
NAN, INF = math.nan, math.inf

CASES: list[tuple[str, rlwire.Checks, Make]] = [
    *(
        (f"struct-{family}-{field}-{bad}", FRAMEWORK, _micro_batch(family, _set(field, 17, bad)))
        for family in (0, 1)
        for field in ("inference_logprobs", "advantages")
        for bad in (NAN, INF, -INF)
    ),
    *(
        (
            f"struct-{family}-same-length",
            FRAMEWORK,
            _micro_batch(family, lambda m: m.loss_mask.pop()),
        )
        for family in (0, 1)
    ),
    *(
        (
            f"struct-{family}-max-nested",
            FRAMEWORK,
            _micro_batch(family, lambda m: m.routed_expert_ids[30][2].__setitem__(0, 256)),
        )
        for family in (0, 1)
    ),
    ("max-scalar", IDS_10, lambda bad: {"ids": 11 if bad else 10}),
    ("max-list", IDS_10, lambda bad: {"ids": [3.5, 2**70 if bad else 2]}),
    ("max-tuple", IDS_10, lambda bad: {"ids": (1, np.int64(12 if bad else 1))}),
    ("max-int8", IDS_10, lambda bad: {"ids": np.array([-3, 11 if bad else 10], np.int8)}),
    ("long-list", FINITE_X, lambda bad: {"x": LONG_BAD if bad else LONG_GOOD}),
    ("finite-mixed", FINITE_X, lambda bad: {"x": [1, "a", None, NAN if bad else 0.5]}),
    ("finite-overflow", FINITE_X, lambda bad: {"x": [1e308, 1e308, INF if bad else 1e308]}),
    ("finite-complex", FINITE_X, lambda bad: {"x": [1j, complex(1, NAN if bad else 0)]}),
    ("finite-np-scalar", FINITE_X, lambda bad: {"x": np.float32(NAN if bad else 1)}),
    ("finite-float", FINITE_X, lambda bad: {"x": NAN if bad else 1e308}),
    ("finite-int-and-float", FINITE_X, lambda bad: {"x": -INF if bad else 3}),
    (
        "nested-dicts",
        rlwire.Checks(finite=("logprobs",)),
        lambda bad: {
            "rollouts": [
                {"turns": [{"logprobs": [-0.1]}, {"logprobs": [-0.3, -INF if bad else 0]}]}
            ]
        },
    ),
    (
        "quoted-keys",
        rlwire.Checks(finite=("logprobs",)),
        lambda bad: {"per env": {"gsm8k": {"logprobs": [0.0, NAN if bad else 1.0]}}},
    ),
    (
        "same-length-dict",
        rlwire.Checks(same_length=(("ids", "mask", "logprobs"),)),
        lambda bad: {"ids": [1, 2], "logprobs": np.zeros(3 if bad else 2)},
    ),
    (
        "same-length-no-length",
        rlwire.Checks(same_length=(("ids", "mask", "logprobs"),)),
        lambda bad: {"ids": 3 if bad else [3], "mask": [1]},
    ),
    (
        "untyped-list-of-dicts",
        rlwire.Checks(finite=("r",)),
        lambda bad: {"extras": [None, {"r": 1.0}, {"r": NAN if bad else 2.0}]},
    ),
    (
        "nested-grid",
        FINITE_X,
        lambda bad: {"x": [[[0.5, 1.0], [2.0, NAN if bad else 3.0]], [[4.0, 5.0]]]},
    ),
    (
        "ragged-nesting",
        FINITE_X,
        lambda bad: {"x": [[1.0], [], [2.0, [3.0, INF if bad else 4.0]], ({"y": 1},)]},
    ),
    *(
        (f"array-{order}", rlwire.Checks(finite=("logprobs",)), _array_at_depth(order))
        for order in ("C", "F", "strided")
    ),
    *(
        (
            f"int-array-{dtype.__name__}",
            rlwire.Checks(max_value={"routed_experts": 0 if dtype is np.bool_ else 200}),
            _int_array(dtype),
        )
        for dtype in (np.uint8, np.uint16, np.int64, np.bool_)
    ),
    ("big-array", rlwire.Checks(finite=("a",)), lambda bad: {"a": BIG_BAD if bad else BIG_GOOD}),
    (
        "inside-a-named-field",
        rlwire.Checks(finite=("stats",), max_value={"ids": 9}),
        lambda bad: {"stats": {"by_env": [Experts(b"", [1], "f"), {"mean": NAN if bad else 0.0}]}},
    ),
    (
        "tighter-inner-maximum",
        rlwire.Checks(max_value={"outer": 100, "ids": 9}),
        lambda bad: {"outer": {"ids": [10 if bad else 9]}},
    ),
    (
        "outer-maximum",
        rlwire.Checks(max_value={"outer": 100, "ids": 9}),
        lambda bad: {"outer": {"x": [101 if bad else 100]}},
    ),
    (
        "dataclass-in-struct",
        rlwire.Checks(finite=("reward", "logprobs")),
        lambda bad: Holder(list(range(10)), 0, {"a": Rollout(1.0, [0.0, NAN if bad else 1.0])}),
    ),
    (
        "any-field",
        rlwire.Checks(finite=("reward", "logprobs")),
        lambda bad: Holder([], 0, {}, extra=[{"reward": INF if bad else 1.0}]),
    ),
    (
        "dataclass-rows",
        rlwire.Checks(finite=("reward", "logprobs")),
        lambda bad: Rollout(NAN if bad else 0.5, [0.0, 1.0]),
    ),
    (
        "union-of-records",
        rlwire.Checks(finite=("score",)),
        lambda bad: Turns([Text("a"), Scored("b", 1.0), Scored("c", NAN if bad else 2.0)], {}),
    ),
    (
        "unresolvable-annotation",
        FINITE_X,
        lambda bad: Local({"x": [NAN if bad else 0.0]}),
    ),
]


@pytest.mark.parametrize(("checks", "make"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_invalid_record_at_17_of_41_is_named_as_on_its_own(
    checks: rlwire.Checks, make: Make, calls: dict[str, int]
) -> None:
    with pytest.raises(rlwire.SchemaError) as alone:
        run_sliced(checks.validate_sliced(make(True), check_names=False))
    message = str(alone.value)
    assert message.startswith("$")
    samples = [make(False) for _ in range(41)]
    run_sliced(checks.validate_sliced({"samples": samples}, check_names=False))
    samples[17] = make(True)
    with pytest.raises(rlwire.SchemaError) as in_list:
        run_sliced(checks.validate_sliced({"samples": samples}, check_names=False))
    assert str(in_list.value) == "$.samples[17]" + message[1:]
    assert by_columns(checks, samples) == per_object(checks, samples)
    assert calls["rows"] > 0  # the list was checked as columns


# -- the property -------------------------------------------------------------------------------

RANDOM = rlwire.Checks(
    finite=("a", "c"),
    same_length=(("a", "b", "d"),),
    max_value={"b": 100, "c": 50},
)


class Row(msgspec.Struct):
    a: Any = None
    b: Any = None
    c: Any = None
    d: Any = None
    e: float = 0.0


@dataclasses.dataclass
class DataRow:
    a: Any = None
    b: Any = None
    c: Any = None
    d: Any = None


KINDS = ["f32", "f64", "f16", "c64", "i8", "u8", "i64", "bool", "2d", "none", "float", "int",
         "floats", "object", "dict", "str", "unset"]  # fmt: skip
BAD = [math.nan, math.inf, -math.inf, 101, 51, 1e300]


def value(kind: str, n: int, rng: np.random.Generator) -> Any:
    """A value of ``kind``, ``n`` long where it has a length, holding small values."""
    arrays = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "c64": np.complex64,
              "i8": np.int8, "u8": np.uint8, "i64": np.int64, "bool": np.bool_}  # fmt: skip
    if kind in arrays:
        return (rng.random(n) * 40).astype(arrays[kind])
    return {
        "2d": lambda: np.ones((n, 2)),
        "none": lambda: None,
        "float": lambda: float(n) / 3,
        "int": lambda: n,
        "floats": lambda: [0.25] * n,
        "object": lambda: np.array([1.5] * n + [None], dtype=object)[:n],
        "dict": lambda: {"c": np.ones(n), "z": [1]},
        "str": lambda: "x" * n,
        "unset": lambda: msgspec.UNSET,
    }[kind]()


def spoil(row: dict[str, Any], field: str, where: int, bad: Any) -> None:
    """Put ``bad`` into ``row[field]`` wherever it can go (for a value without items,
    the value itself is replaced)."""
    current = row[field]
    if isinstance(current, dict):
        current = current["c"]
    if isinstance(current, np.ndarray) and current.size:
        flat = current.reshape(-1)
        if current.dtype.kind in "fcO" or (isinstance(bad, int) and bad < 128):
            with np.errstate(over="ignore"):  # 1e300 becomes inf in a float32
                flat[where % flat.size] = bad
        return
    if isinstance(current, list) and current:
        current[where % len(current)] = bad
        return
    row[field] = bad


@st.composite
def random_rows(draw: st.DrawFn) -> tuple[str, list[Any]]:
    shape = draw(st.sampled_from(["struct", "dataclass", "dict"]))
    n = draw(st.integers(0, 45))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kinds = {f: draw(st.sampled_from(KINDS)) for f in "abcd"}
    mixed = draw(st.booleans())  # a few rows of another kind of value
    lengths = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    longer = draw(st.sampled_from([0.0, 0.01, 0.1]))  # how often a value is one longer
    raw = []
    for i in range(n):
        row = {}
        for f, kind in kinds.items():
            if mixed and rng.random() < 0.1:
                kind = KINDS[int(rng.integers(len(KINDS)))]
            row[f] = value(kind, lengths[i] + (rng.random() < longer), rng)
        raw.append(row)
    for _ in range(draw(st.integers(0, 3)) if n else 0):
        where = draw(st.integers(0, n - 1))
        spoil(raw[where], draw(st.sampled_from("abcd")), draw(st.integers(0, 20)),
              draw(st.sampled_from(BAD)))  # fmt: skip
    if shape == "struct":
        return shape, [Row(**row) for row in raw]
    if shape == "dataclass":
        return shape, [DataRow(**row) for row in raw]
    return shape, raw


CHECKS = [
    RANDOM,
    rlwire.Checks(finite=("a", "c"), max_value={"b": 100, "c": 50}),  # no group: values decide
    rlwire.Checks(finite=("rows",), max_value={"rows": 60}),  # rules on every value of a row
]


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=random_rows(), checks=st.sampled_from(CHECKS))
def test_property_columns_and_the_per_object_walk_agree(
    case: tuple[str, list[Any]], checks: rlwire.Checks
) -> None:
    _, rows = case
    obj = {"rows": rows}
    assert by_columns(checks, obj) == per_object(checks, obj)


# -- the column path is the one taken ----------------------------------------------------------


class Sample(msgspec.Struct, gc=False):
    token_ids: Any
    mask: Any
    logprobs: Any
    temperatures: Any
    advantages: Any
    reward: float = 0.0


DENSE = rlwire.Checks(
    finite=("logprobs", "temperatures", "advantages", "reward"),
    same_length=(("token_ids", "mask", "logprobs", "temperatures", "advantages"),),
    max_value={"token_ids": 1000, "mask": 1},
)


def dense(rows: int, tokens: int) -> list[Sample]:
    return [
        Sample(
            np.arange(tokens, dtype=np.int32),
            np.ones(tokens, bool),
            np.full(tokens, -0.5, np.float32),
            np.ones(tokens, np.float32),
            np.zeros(tokens, np.float32),
            reward=float(i),
        )
        for i in range(rows)
    ]


def test_a_valid_list_visits_no_record_and_no_array(calls: dict[str, int]) -> None:
    DENSE.validate({"samples": dense(41, 64)})
    assert calls["rows"] == 1
    assert (calls["record"], calls["array"]) == (0, 0)
    assert calls["mapping"] == 1  # the outer dict only


def test_a_bad_value_visits_only_the_rows_of_its_run(calls: dict[str, int]) -> None:
    samples = dense(41, 64)
    samples[17].logprobs[3] = np.nan
    with pytest.raises(rlwire.SchemaError) as info:
        DENSE.validate({"samples": samples})
    assert str(info.value) == (
        "$.samples[17].logprobs[3]: nan is not finite ('logprobs' is checked finite)"
    )
    assert calls["record"] == 0
    assert 1 <= calls["array"] <= 18  # rows 0..17 of the one run that failed, at most


def test_rows_of_mixed_types_are_walked_object_by_object(calls: dict[str, int]) -> None:
    samples: list[Any] = dense(41, 8)
    samples[5] = dataclasses.replace(DataRow(), a=np.zeros(8))
    run_sliced(DENSE.validate_sliced({"samples": samples}, check_names=False))
    assert calls["rows"] == 0
    assert calls["record"] == 41


def test_same_length_and_scalars_are_settled_as_columns(calls: dict[str, int]) -> None:
    samples = dense(41, 16)
    samples[30].mask = np.ones(15, bool)
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[30\]: same_length group"):
        DENSE.validate({"samples": samples})
    samples[30].mask = np.ones(16, bool)
    samples[33].reward = math.inf
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[33\]\.reward: inf is not"):
        DENSE.validate({"samples": samples})
    assert (calls["record"], calls["array"]) == (0, 0)


def test_the_first_bad_row_wins_across_fields_and_groups_of_rows() -> None:
    rows = columns.ROWS
    samples = dense(2 * rows + 100, 4)
    samples[rows + 100].advantages[2] = np.inf
    samples[rows + 76].token_ids[1] = 5000  # an earlier row, in a field visited earlier
    samples[2 * rows + 20].logprobs[0] = np.nan  # a later group of rows
    with pytest.raises(rlwire.SchemaError) as info:
        DENSE.validate({"samples": samples})
    assert str(info.value).startswith(f"$.samples[{rows + 76}].token_ids[1]: 5000 is above 1000")
    samples[rows + 50].advantages[0] = -np.inf  # an earlier row, in a field visited later
    with pytest.raises(rlwire.SchemaError) as info:
        DENSE.validate({"samples": samples})
    assert str(info.value).startswith(f"$.samples[{rows + 50}].advantages[0]: -inf is not")


def test_a_column_of_empty_dicts_is_settled_without_a_visit(calls: dict[str, int]) -> None:
    """A sample's ``extras={}``, in every row, is settled as a column: no dict visited."""
    samples = [
        rlwire.TrainingSample(
            token_ids=np.arange(8),
            mask=np.ones(8, bool),
            logprobs=np.zeros(8, np.float32),
            temperatures=np.ones(8, np.float32),
            advantages=np.zeros(8, np.float32),
            env_name="e",
        )
        for _ in range(41)
    ]
    finite = rlwire.Checks(finite=("logprobs",))
    finite.validate({"samples": samples})
    assert calls["mapping"] == 1  # the outer dict only
    samples[40].extras = {"logprobs": np.array([0.0, np.inf])}  # a named field in it
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[40\]\.extras.*logprobs"):
        finite.validate({"samples": samples})


def test_strided_arrays_of_a_column_are_scanned_too() -> None:
    """Arrays are joined as bytes for a scan; a strided one cannot be, and numpy joins
    the run instead: a bad value in it is still found and named."""
    samples = dense(41, 8)
    for s in samples:
        s.logprobs = np.full(16, -0.5, np.float32)[::2]
    DENSE.validate({"samples": samples})
    samples[17].logprobs = np.full(16, -0.5, np.float32)
    samples[17].logprobs[6] = np.nan
    samples[17].logprobs = samples[17].logprobs[::2]
    with pytest.raises(rlwire.SchemaError) as info:
        DENSE.validate({"samples": samples})
    assert str(info.value).startswith("$.samples[17].logprobs[3]: nan is not finite")


def test_a_float_column_whose_sum_overflows_is_cleared_row_by_row() -> None:
    samples = dense(41, 4)
    for s in samples:
        s.advantages = np.full(4, 3e38, np.float32)  # finite, but the sum is not
    DENSE.validate({"samples": samples})


# -- slices --------------------------------------------------------------------------------------


def slices(run: Iterator[None]) -> int:
    return sum(1 for _ in run)


def test_columns_yield_between_runs_of_at_most_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a slice always due, the walk yields after every run of joined arrays: the
    work between two yields is bounded by the budget, however many rows there are."""
    monkeypatch.setattr(columns, "BUDGET", 1000)
    samples = dense(200, 100)  # 20,000 elements a field: 20 runs of 1,000
    run = columns.ColumnWalk(DENSE._planner, collect=False)
    run.slicer = SliceTimer(0.0)
    count = slices(run.visit(samples, None, None, ANY))
    assert count >= 5 * 20  # five array fields, twenty runs each


def test_a_long_list_of_records_is_checked_in_slices() -> None:
    run = DENSE.validate_sliced({"samples": dense(2048, 64)})
    assert slices(run) >= 2


@settings(max_examples=examples(300), deadline=None)
@example(np.array([-np.inf, 1.0], np.float32))
@example(np.array([1.0, np.nan, 2.0], np.float16))
@example(np.full(4, 3e38, np.float32))
@given(
    hnp.arrays(
        st.sampled_from(["<f2", "<f4", ">f8", "<c8", "<c16"]),
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6),
        elements={"allow_nan": True, "allow_infinity": True},
    )
)
def test_all_finite_says_what_isfinite_says(values: np.ndarray) -> None:
    """Real floats are judged by their least and greatest value, complex ones by their
    sum: never true with a NaN or an infinity anywhere (either sign, any dtype or
    shape), and for real floats true however large the finite values are."""
    want = bool(np.isfinite(values).all())
    got = columns.all_finite(values)
    if values.dtype.kind == "f":
        assert got == want
    else:  # a finite complex sum may overflow: false then, and the caller looks again
        assert not got or want
