"""rlwire.Checks: validation for any type, by field name at any depth, in time slices."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import numpy as np
import pytest
from check_types import (
    FRAMEWORK,
    Experts,
    Holder,
    MicroBatch,
    PlainMicroBatch,
    PlainStep,
    Rollout,
    Scored,
    Step,
    Text,
    Turns,
)
from depth import examples
from helpers import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire
import rlwire._checks.checks
import rlwire._checks.columns
import rlwire._checks.plan
import rlwire._checks.walk
from rlwire.aio import run_sliced

FAMILIES = [(Step, MicroBatch), (PlainStep, PlainMicroBatch)]


def make_step(family: tuple[type, type], count: int = 4, n: int = 40) -> Any:
    step_cls, mb_cls = family
    return step_cls(
        [
            mb_cls(
                input_ids=list(range(n)),
                loss_mask=[i % 2 == 0 for i in range(n)],
                advantages=[0.5 * i for i in range(n)],
                inference_logprobs=[-0.01 * i for i in range(n)],
                position_ids=list(range(n)),
                routed_expert_ids=[[[(i + j) % 256, 7] for j in range(3)] for i in range(n)],
                routed_experts=Experts(bytes(n * 6), [n, 3, 2], "uint8"),
            )
            for _ in range(count)
        ]
    )


def schema_error(checks: rlwire.Checks, obj: Any) -> str:
    with pytest.raises(rlwire.SchemaError) as info:
        checks.validate(obj)
    return str(info.value)


# -- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_value": {"ids": 2.5}}, r"maximum of 'ids' must be an int, got 2\.5"),
        ({"max_value": {"ids": "255"}}, "must be an int"),
        ({"max_value": {"ids": True}}, "must be an int"),
        ({"max_value": {3: 255}}, "names must be strings"),
        ({"max_value": [("ids", 255)]}, "takes a mapping"),
        ({"same_length": (("input_ids",),)}, "at least two names"),
        ({"same_length": (("a", "a"),)}, "at least two names"),
        ({"same_length": ("input_ids", "loss_mask")}, r"did you mean same_length=\(\('input_ids'"),
        ({"same_length": "ab"}, "groups of names"),
        ({"same_length": ((1, 2),)}, "names must be strings"),
        ({"finite": (1,)}, "names must be strings"),
        ({"finite": 3}, "expected field names"),
        ({"check": 3}, "must be a callable"),
    ],
)
def test_wrong_arguments_are_config_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(rlwire.ConfigError, match=match):
        rlwire.Checks(**kwargs)


def test_arguments_are_normalised_and_immutable() -> None:
    checks = rlwire.Checks(
        finite="advantages", same_length=[["a", "b"]], max_value={"x": np.uint8(7)}
    )
    assert checks.finite == ("advantages",)
    assert checks.same_length == (("a", "b"),)
    assert checks.max_value == {"x": 7} and type(checks.max_value["x"]) is int
    assert checks.names == {"advantages", "a", "b", "x"}
    with pytest.raises(TypeError):
        checks.max_value["x"] = 9  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        checks.finite = ()  # type: ignore[misc]
    assert checks == rlwire.Checks(
        finite=("advantages",), same_length=(("a", "b"),), max_value={"x": 7}
    )
    assert hash(checks) == hash(rlwire.Checks("advantages", [["a", "b"]], {"x": 7}))
    assert repr(checks) == (
        "Checks(finite=('advantages',), same_length=(('a', 'b'),), max_value={'x': 7})"
    )


# -- each rule on Structs of both families ---------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_a_valid_step_passes(family: tuple[type, type]) -> None:
    FRAMEWORK.validate(make_step(family))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["inference_logprobs", "advantages"])
def test_non_finite_floats_in_struct_lists(
    family: tuple[type, type], bad: float, field: str
) -> None:
    step = make_step(family)
    getattr(step.micro_batches[3], field)[17] = bad
    message = schema_error(FRAMEWORK, step)
    assert message.startswith(f"$.micro_batches[3].{field}[17]: {bad!r} is not finite")
    assert repr(field) in message


@pytest.mark.parametrize("family", FAMILIES)
def test_same_length_mismatch_names_the_group_and_lengths(family: tuple[type, type]) -> None:
    step = make_step(family)
    step.micro_batches[2].loss_mask.pop()
    assert schema_error(FRAMEWORK, step) == (
        "$.micro_batches[2]: same_length group ('input_ids', 'loss_mask', "
        "'inference_logprobs', 'routed_expert_ids') disagrees: input_ids has 40, "
        "loss_mask has 39, inference_logprobs has 40, routed_expert_ids has 40"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_same_length_leaves_out_none(family: tuple[type, type]) -> None:
    step = make_step(family)
    step.micro_batches[0].routed_expert_ids = None
    FRAMEWORK.validate(step)


@pytest.mark.parametrize("family", FAMILIES)
def test_max_value_in_nested_lists(family: tuple[type, type]) -> None:
    step = make_step(family)
    step.micro_batches[1].routed_expert_ids[30][2][0] = 256
    assert schema_error(FRAMEWORK, step) == (
        "$.micro_batches[1].routed_expert_ids[30][2][0]: 256 is above 255, "
        "the max_value of 'routed_expert_ids'"
    )


def test_max_value_refuses_only_values_above_the_maximum() -> None:
    checks = rlwire.Checks(max_value={"ids": 10})
    checks.validate({"ids": [-(2**70), -5, 0, 10, 3.5e9, True]})  # negatives, floats pass
    checks.validate({"ids": np.array([-3, 10], np.int8)})
    checks.validate({"ids": np.array([1e9])})  # a float array is not compared
    assert schema_error(checks, {"ids": 11}) == "$.ids: 11 is above 10, the max_value of 'ids'"
    assert schema_error(checks, {"ids": [3.5, 2**70]}).startswith(
        "$.ids[1]: 1180591620717411303424 "
    )
    assert schema_error(checks, {"ids": (1, np.int64(12))}).startswith("$.ids[1]: 12 is above")


def test_finite_leaves_ints_and_strings_alone() -> None:
    checks = rlwire.Checks(finite=("x",))
    checks.validate({"x": [1, 2**80, "nan", None, True]})
    checks.validate({"x": [1e308, 1e308, -1e308]})  # the sum overflows: the exact check clears it
    assert schema_error(checks, {"x": [1, "a", None, math.nan]}) == (
        "$.x[3]: nan is not finite ('x' is checked finite)"
    )
    assert schema_error(checks, {"x": [1e308, 1e308, math.inf]}).startswith("$.x[2]: inf ")
    assert schema_error(checks, {"x": [1j, complex(1, math.nan)]}).startswith("$.x[1]: (1+nanj) ")
    assert schema_error(checks, {"x": np.float32("nan")}) == (
        "$.x: nan is not finite ('x' is checked finite)"
    )


class Priced(msgspec.Struct):
    x: list[Decimal]


def test_finite_refuses_a_decimal_nan_or_infinity(tmp_path: Path) -> None:
    """A Decimal NaN passed `finite`: msgspec sends it as the string "NaN", and a receiver
    typed Decimal gets Decimal('NaN'). max_value compares no Decimal, as it compares no
    float."""
    rlwire.Checks(max_value={"ids": 10}).validate({"ids": [Decimal(100)]})
    checks = rlwire.Checks(finite=("x",))
    checks.validate({"x": [Decimal("1.5"), Decimal("-0")]})
    assert schema_error(checks, {"x": [Decimal(1), Decimal("NaN")]}) == (
        "$.x[1]: Decimal('NaN') is not finite ('x' is checked finite)"
    )
    for bad in Decimal("sNaN"), Decimal("-Infinity"):
        assert schema_error(checks, {"x": bad}) == (
            f"$.x: {bad!r} is not finite ('x' is checked finite)"
        )
    rows = [Priced([Decimal(i)]) for i in range(5)] + [Priced([Decimal("Infinity")])]
    assert schema_error(checks, {"rows": rows}).startswith("$.rows[5].x[0]: Decimal('Infinity')")
    with rlwire.open_sync_sender(tmp_path, validate=checks) as sender:
        with pytest.raises(rlwire.SchemaError, match=re.escape("$.x[0]: Decimal('NaN')")):
            sender.send({"x": [Decimal("NaN")]})
        assert sender.next_step == 0


# -- dicts, nested lists, arrays ------------------------------------------------------------


def test_names_are_found_in_dicts_and_lists_of_dicts() -> None:
    obj = {"rollouts": [{"turns": [{"logprobs": [-0.1, -0.2]}, {"logprobs": [-0.3]}]}]}
    checks = rlwire.Checks(finite=("logprobs",))
    checks.validate(obj)
    obj["rollouts"][0]["turns"][1]["logprobs"].append(-math.inf)
    assert schema_error(checks, obj).startswith("$.rollouts[0].turns[1].logprobs[1]: -inf")


def test_dict_keys_that_are_not_identifiers_are_quoted() -> None:
    checks = rlwire.Checks(finite=("logprobs",))
    obj = {"per env": {"gsm8k": {"logprobs": [0.0, math.nan]}}}
    assert schema_error(checks, obj).startswith("$['per env'].gsm8k.logprobs[1]: nan")


def test_same_length_in_dicts() -> None:
    checks = rlwire.Checks(same_length=(("ids", "mask", "logprobs"),))
    checks.validate([{"ids": [1, 2], "mask": np.ones(2, bool)}, {"logprobs": [1.0]}, {"x": 1}])
    assert schema_error(checks, [{"x": 1}, {"ids": [1, 2], "logprobs": np.zeros(3)}]) == (
        "$[1]: same_length group ('ids', 'mask', 'logprobs') disagrees: ids has 2, logprobs has 3"
    )
    assert schema_error(checks, {"ids": 3, "mask": [1]}) == (
        "$.ids: has no length (int), but same_length group ('ids', 'mask', 'logprobs') compares it"
    )


def test_a_list_of_dicts_in_an_untyped_list_is_searched() -> None:
    checks = rlwire.Checks(finite=("r",))
    obj = {"extras": [None, {"r": 1.0}, {"r": math.nan}]}
    assert schema_error(checks, obj).startswith("$.extras[2].r: nan")


def test_nested_lists_are_flattened_and_the_offender_located() -> None:
    checks = rlwire.Checks(finite=("x",))
    grid = [[[float(i + j + k) for k in range(4)] for j in range(3)] for i in range(5000)]
    checks.validate({"x": grid})
    grid[4321][2][3] = math.nan
    assert schema_error(checks, {"x": grid}).startswith("$.x[4321][2][3]: nan")
    ragged = [[1.0], [], [2.0, [3.0, math.inf]], ({"y": 1},)]
    assert schema_error(checks, {"x": ragged}).startswith("$.x[2][1][1]: inf")


@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_arrays_at_depth(order: str) -> None:
    arr = np.zeros((6, 5, 4), np.float32, order="F" if order == "F" else "C")
    if order == "strided":
        arr = np.zeros((12, 5, 4), np.float32)[::2]
    arr[4, 1, 2] = -np.inf
    obj = {"samples": [{"logprobs": np.zeros(3)}, {"logprobs": arr}]}
    message = schema_error(rlwire.Checks(finite=("logprobs",)), obj)
    assert message == (
        "$.samples[1].logprobs[4][1][2]: -inf is not finite ('logprobs' is checked finite)"
    )


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int64, np.bool_])
def test_max_value_on_integer_arrays(dtype: type) -> None:
    checks = rlwire.Checks(max_value={"routed_experts": 0 if dtype is np.bool_ else 200})
    arr = np.zeros((10, 4, 2), dtype)
    checks.validate({"routed_experts": arr})
    arr[7, 3, 1] = 1 if dtype is np.bool_ else 201
    message = schema_error(checks, {"routed_experts": arr})
    assert message.startswith("$.routed_experts[7][3][1]: ")
    assert "is above" in message


def test_a_big_array_is_checked_in_chunks() -> None:
    arr = np.zeros(3 * (1 << 18) + 5)
    arr[-1] = np.nan
    assert schema_error(rlwire.Checks(finite=("a",)), {"a": arr}).startswith(
        f"$.a[{len(arr) - 1}]: nan"
    )


def test_rules_apply_inside_a_named_field_at_any_depth() -> None:
    checks = rlwire.Checks(finite=("stats",), max_value={"ids": 9})
    obj = {"stats": {"by_env": [Experts(b"", [1], "f"), {"mean": math.nan}]}}
    assert schema_error(checks, obj).startswith("$.stats.by_env[1].mean: nan")
    # nested names: both rules apply, the tighter maximum wins
    tight = rlwire.Checks(max_value={"outer": 100, "ids": 9})
    assert "the max_value of 'ids'" in schema_error(tight, {"outer": {"ids": [10]}})
    assert "the max_value of 'outer'" in schema_error(tight, {"outer": {"x": [101]}})


# -- Struct type information ------------------------------------------------------------------


def test_struct_annotations_prune_and_dataclasses_are_records() -> None:
    checks = rlwire.Checks(finite=("reward", "logprobs"))
    holder = Holder(list(range(10)), 0, {"a": Rollout(1.0, [0.0])})
    checks.validate(holder)
    holder.rollouts["a"].logprobs.append(math.nan)
    assert schema_error(checks, holder).startswith("$.rollouts.a.logprobs[1]: nan")
    # annotations are trusted: a value that contradicts ``meta: int`` is not searched
    lying = Holder([], 0, {})
    msgspec.structs.force_setattr(lying, "meta", {"reward": math.nan})
    checks.validate(lying)
    # ... but an ``Any`` field is searched
    assert schema_error(checks, Holder([], 0, {}, extra=[{"reward": math.inf}])).startswith(
        "$.extra[0].reward: inf"
    )


def test_unions_of_record_types_are_searched() -> None:
    checks = rlwire.Checks(finite=("score",))
    obj = Turns([Text("a"), Scored("b", 1.0), Scored("c", math.nan)], {"r": math.nan})
    assert schema_error(checks, obj).startswith("$.turns[2].score: nan")
    checks.validate(Turns((Scored("b", 1.0),), [[math.nan]]))  # rewards are not named


def test_an_unresolvable_annotation_is_searched_in_full() -> None:
    class Local(msgspec.Struct):
        inner: Unknown  # type: ignore[name-defined]  # noqa: F821

    checks = rlwire.Checks(finite=("x",))
    assert schema_error(checks, Local({"x": [math.nan]})).startswith("$.inner.x[0]: nan")


def test_recursive_types_and_self_containing_objects() -> None:
    checks = rlwire.Checks(finite=("x",))
    loop: list[Any] = [{"x": 1.0}]
    loop.append(loop)
    with pytest.raises(rlwire.SchemaError, match="nests too deeply"):
        checks.validate({"x": loop})


# -- the callable -------------------------------------------------------------------------------


def test_the_callable_sees_the_whole_object_after_the_rules() -> None:
    seen: list[Any] = []
    step = make_step(FAMILIES[0])
    rlwire.Checks(finite=("advantages",), check=seen.append).validate(step)
    assert seen == [step]

    def no_empty_batches(obj: Any) -> None:
        if not obj.micro_batches:
            raise ValueError("a step needs micro-batches")

    checks = rlwire.Checks(check=no_empty_batches)
    with pytest.raises(rlwire.SchemaError) as info:
        checks.validate(Step([]))
    assert str(info.value) == (
        "$: Checks(check=test_the_callable_sees_the_whole_object_after_the_rules.<locals>"
        ".no_empty_batches) refused the object: ValueError: a step needs micro-batches"
    )
    assert isinstance(info.value.__cause__, ValueError)


def test_an_rlwire_error_from_the_callable_passes_unchanged() -> None:
    def refuse(obj: Any) -> None:
        raise rlwire.SchemaError("$.x: mine")

    with pytest.raises(rlwire.SchemaError, match=r"^\$\.x: mine$"):
        rlwire.Checks(check=refuse).validate({})


# -- unknown names ------------------------------------------------------------------------------


def test_unknown_names_are_config_errors_with_a_suggestion() -> None:
    checks = rlwire.Checks(finite=("advantage", "inference_logprobs"), max_value={"zzz": 1})
    with pytest.raises(rlwire.ConfigError) as info:
        checks.validate(make_step(FAMILIES[0]))
    assert str(info.value) == (
        "Checks names 'advantage' (did you mean 'advantages'?), 'zzz' match no field of the "
        "first object (Step); a misspelt name would disable its check"
    )
    run_sliced(checks.validate_sliced(make_step(FAMILIES[0]), check_names=False))


def test_names_declared_by_types_count_even_when_no_value_holds_them() -> None:
    FRAMEWORK.validate(Step([]))  # MicroBatch declares every name, no micro-batch yet
    with pytest.raises(rlwire.ConfigError, match="'inference_logprobs'"):
        FRAMEWORK.validate({"micro_batches": []})  # a dict declares nothing


# -- slicing and speed -------------------------------------------------------------------------


CHECKS_FILES = {
    rlwire._checks.checks.__file__,
    rlwire._checks.columns.__file__,
    rlwire._checks.walk.__file__,
    rlwire._checks.plan.__file__,
}


def test_a_million_floats_are_checked_in_slices_without_a_python_loop() -> None:
    values = [i * 0.5 for i in range(1_000_000)]
    lines = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if frame.f_code.co_filename not in CHECKS_FILES:
            return None
        if event == "line":
            lines += 1
        return tracer

    run = rlwire.Checks(finite=("values",)).validate_sliced({"values": values})
    yields = 0
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for _ in run:
            yields += 1
    finally:
        sys.settrace(previous)
    assert yields >= 1
    assert 0 < lines < 20_000, lines  # a loop over the items would run millions of lines


# -- property tests --------------------------------------------------------------------------

finite_floats = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=examples(60), deadline=None)
@given(
    values=st.lists(finite_floats, min_size=1, max_size=64),
    repeat=st.integers(1, 400),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    data=st.data(),
)
def test_property_a_non_finite_float_is_caught_where_it_is(
    values: list[float], repeat: int, bad: float, data: st.DataObject
) -> None:
    lst = values * repeat  # long enough to cross chunk boundaries
    checks = rlwire.Checks(finite=("inference_logprobs",))
    checks.validate(Step([MicroBatch([], [], [], lst, [])]))
    index = data.draw(st.integers(0, len(lst) - 1), label="index")
    lst[index] = bad
    message = schema_error(checks, Step([MicroBatch([], [], [], lst, [])]))
    assert message.startswith(f"$.micro_batches[0].inference_logprobs[{index}]: {bad!r} ")


@settings(max_examples=examples(40), deadline=None)
@given(
    values=st.lists(st.integers(-(2**40), 255), min_size=1, max_size=64),
    repeat=st.integers(1, 300),
    data=st.data(),
)
def test_property_a_value_above_the_maximum_is_caught_where_it_is(
    values: list[int], repeat: int, data: st.DataObject
) -> None:
    lst = values * repeat
    checks = rlwire.Checks(max_value={"ids": 255})
    checks.validate({"ids": lst})
    index = data.draw(st.integers(0, len(lst) - 1), label="index")
    lst[index] = data.draw(st.integers(256, 2**70), label="value")
    assert schema_error(checks, {"ids": lst}).startswith(f"$.ids[{index}]: {lst[index]} ")


# -- through a real sender ---------------------------------------------------------------------


def step_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@pytest.mark.anyio
async def test_sender_refuses_before_writing_and_names_step_and_rank(tmp_path: Path) -> None:
    good, bad = make_step(FAMILIES[0]), make_step(FAMILIES[0])
    bad.micro_batches[3].inference_logprobs[17] = math.nan
    async with rlwire.open_sender(tmp_path, validate=FRAMEWORK) as sender:
        with pytest.raises(rlwire.SchemaError) as info:
            await sender.send_ranks([good, bad])
        assert (info.value.step, info.value.rank) == (0, 1)
        assert str(info.value) == (
            "step 0, rank 1: $.micro_batches[3].inference_logprobs[17]: nan is not finite "
            "('inference_logprobs' is checked finite)"
        )
        assert step_files(tmp_path) == []
        assert await sender.send_ranks([good, good]) == 0  # the failed step was not used up
    with rlwire.open_receiver(tmp_path, type=Step) as receiver:
        assert receiver.receive(timeout=5) == good


@pytest.mark.anyio
async def test_sender_unknown_name_on_the_first_object_only(tmp_path: Path) -> None:
    checks = rlwire.Checks(finite=("advantages",), max_value={"routed_expert_id": 255})
    async with rlwire.open_sender(tmp_path, validate=checks) as sender:
        with pytest.raises(rlwire.ConfigError, match=r"'routed_expert_id' \(did you") as info:
            await sender.send(make_step(FAMILIES[0]))
        assert info.value.step == 0
        assert step_files(tmp_path) == []
    ok = rlwire.Checks(finite=("advantages",))
    async with rlwire.open_sender(tmp_path, validate=ok) as sender:
        await sender.send(make_step(FAMILIES[0]))
        await sender.send({"no": "advantages here"})  # later objects: names not re-checked
        bad = make_step(FAMILIES[0])
        bad.micro_batches[0].advantages[0] = math.inf
        with pytest.raises(rlwire.SchemaError, match=r"step 2.*advantages\[0\]: inf"):
            await sender.send(bad)
    assert len(step_files(tmp_path)) == 2


@pytest.mark.anyio
async def test_sender_keeps_rlwire_own_rules_with_checks(tmp_path: Path) -> None:
    batch = make_batch(3)
    batch.samples[2].logprobs[4] = np.nan
    checks = rlwire.Checks(finite=("advantages",))
    async with rlwire.open_sender(tmp_path, validate=checks) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"samples\[2\]\.logprobs: 1 non-finite"):
            await sender.send(batch)
        assert step_files(tmp_path) == []


def test_sender_validate_takes_only_bools_and_checks(tmp_path: Path) -> None:
    with pytest.raises(rlwire.ConfigError, match=re.escape("got 'yes'")):
        rlwire.open_sender(tmp_path, validate="yes")  # type: ignore[arg-type]
