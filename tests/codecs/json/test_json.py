"""Tests of rlwire.codecs._json.codec: JsonCodec round trips, the NaN/Inf rule, typed errors and
encoding in slices. JSON lines are tested in test_jsonl.py."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import json
import math
import re
import time
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import hypothesis.extra.numpy as hnp
import msgspec
import numpy as np
import numpy.typing as npt
import orjson
import pytest
from depth import examples
from helpers import make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import CorruptFrameError, DecodeError, EncodeError, Frame
from rlwire._api.schema import check_object
from rlwire.codecs import make_codec
from rlwire.codecs._json.codec import JsonCodec
from rlwire.codecs.jsonl import dump_jsonl
from rlwire.errors import ConfigError, SchemaError

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FEW = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

codec = JsonCodec()


# -- helpers --------------------------------------------------------------------------


def header(obj: Any) -> bytes:
    return bytes(codec.encode(obj).header)


def leaf_equal(got: Any, value: Any, dtype: np.dtype[Any] | None) -> bool:
    """Does the decoded JSON leaf ``got`` stand for ``value`` (of numpy ``dtype``)?"""
    if isinstance(value, float) and not math.isfinite(value):
        return got is None  # the NaN/Inf rule
    if dtype is not None and dtype.kind == "f":
        # float16/32 values are written in their own shortest form: exact once cast back.
        return type(got) in (int, float) and dtype.type(got) == dtype.type(value)
    if isinstance(value, bool):
        return got is value
    return type(got) is type(value) and got == value


def assert_json_equal(got: Any, original: Any) -> None:
    """``got`` (decoded without a type) is the JSON value of ``original`` by the codec's
    value rules: arrays as nested lists, tuples as lists, non-finite floats as null."""
    if isinstance(original, np.ndarray | np.generic):
        dtype = original.dtype
        expected = original.tolist()

        def walk(g: Any, e: Any) -> None:
            if isinstance(e, list):
                assert isinstance(g, list) and len(g) == len(e), (g, e)
                for a, b in zip(g, e, strict=True):
                    walk(a, b)
            else:
                assert leaf_equal(g, e, dtype), (g, e, dtype)

        walk(got, expected)
    elif isinstance(original, dict):
        assert isinstance(got, dict) and got.keys() == original.keys()
        for key in original:
            assert_json_equal(got[key], original[key])
    elif isinstance(original, list | tuple):
        assert isinstance(got, list) and len(got) == len(original)
        for a, b in zip(got, original, strict=True):
            assert_json_equal(a, b)
    else:
        assert leaf_equal(got, original, None), (got, original)


NUMERIC_DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
)


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    """Numeric arrays (NaN and Inf included) in C, F and strided layouts, any byte order."""
    dtype = draw(NUMERIC_DTYPES)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    arr = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["C", "F", "step", "reverse"]))
    if layout == "F":
        arr = np.asfortranarray(arr)
    elif layout == "step" and arr.ndim:
        arr = arr[::2]
    elif layout == "reverse" and arr.ndim:
        arr = arr[::-1]
    return arr


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),  # NaN and +-Inf included
    st.text(max_size=8),
)
TREES = st.recursive(
    st.one_of(SCALARS, arrays()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
    ),
    max_leaves=12,
)


# -- round trips ----------------------------------------------------------------------


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


@SETTINGS
@given(tree=TREES)
def test_generated_trees_round_trip_by_value(tree: Any) -> None:
    frame = codec.encode(tree)
    assert frame.buffers == ()
    assert frame.codec == "json"
    assert frame.sidecar == frozenset()
    raw = bytes(frame.header)
    json.loads(raw, parse_constant=_no_constants)  # strict JSON: any reader parses it
    assert_json_equal(codec.decode(Frame(raw, codec="json")), tree)


@SETTINGS
@given(arr=arrays())
def test_typed_arrays_round_trip_by_value_with_inferred_dtypes(arr: np.ndarray) -> None:
    finite = arr.dtype.kind != "f" or bool(np.isfinite(arr).all())
    frame = codec.encode({"x": arr})
    if not finite:
        with pytest.raises(DecodeError, match="JSON has no NaN or Inf"):
            codec.decode(frame, type=dict[str, np.ndarray])
        return
    out = codec.decode(frame, type=dict[str, np.ndarray])["x"]
    assert isinstance(out, np.ndarray)
    assert out.flags.writeable
    if arr.size == 0:  # an empty dimension keeps no shape beyond it
        assert out.size == 0
        return
    assert out.shape == arr.shape
    # JSON keeps no dtype: numpy infers bool, int64 (uint64 above int64) or float64.
    assert out.dtype.kind in {"b": "b", "i": "i", "u": "iu", "f": "f"}[arr.dtype.kind]
    assert out.dtype.itemsize == (1 if arr.dtype.kind == "b" else 8)
    assert np.array_equal(out.astype(arr.dtype), arr)


def test_training_batch_round_trips_by_value_not_by_dtype() -> None:
    batch = make_batch(count=3, n=20)
    batch.samples[1].extras["values"] = np.linspace(0, 1, 20, dtype=np.float32)
    frame = JsonCodec(check=check_object).encode(batch)
    out = codec.decode(frame, type=rlwire.TrainingBatch)
    assert isinstance(out, rlwire.TrainingBatch)
    for got, sent in zip(out.samples, batch.samples, strict=True):
        assert got.env_name == sent.env_name
        assert got.ref_logprobs is None
        assert got.token_ids.dtype == np.int64  # sent as int64: same dtype
        assert got.mask.dtype == np.bool_
        for name in ("logprobs", "temperatures", "advantages"):
            sent_arr, got_arr = getattr(sent, name), getattr(got, name)
            assert sent_arr.dtype == np.float32
            assert got_arr.dtype == np.float64  # float32 comes back float64 ...
            assert got_arr.astype(np.float32).tobytes() == sent_arr.tobytes()  # ... exact once cast
        assert sent.routed_experts is not None and got.routed_experts is not None
        assert sent.routed_experts.dtype == np.uint8
        assert got.routed_experts.dtype == np.int64
        assert got.routed_experts.shape == sent.routed_experts.shape
        assert np.array_equal(got.routed_experts, sent.routed_experts)
        assert np.array_equal(got.token_ids, sent.token_ids)
        assert np.array_equal(got.mask, sent.mask)
        assert got.extras.keys() == sent.extras.keys()
    # By value, not by dtype: the float64 read back is the float32's shortest decimal
    # form, not the float32 widened (e.g. 0.1 rather than 0.10000000149011612).
    lp_sent, lp_got = batch.samples[0].logprobs, out.samples[0].logprobs
    assert not np.array_equal(lp_got, lp_sent.astype(np.float64))
    assert np.array_equal(lp_got, [float(str(v)) for v in lp_sent])
    assert out.samples[1].extras["values"].astype(np.float32).tobytes() == (
        batch.samples[1].extras["values"].tobytes()
    )
    # Re-validating the decoded batch fails only on the dtype JSON lost.
    with pytest.raises(SchemaError, match="routed_experts: must be uint8 or uint16"):
        out.validate()


class Annotated(msgspec.Struct):
    logprobs: npt.NDArray[np.float32]
    experts: npt.NDArray[np.uint8]
    mask: npt.NDArray[np.bool_]
    plain: np.ndarray


def test_ndarray_annotations_with_a_dtype_restore_it() -> None:
    obj = Annotated(
        np.array([0.1, -1 / 3, 1e-30], np.float32),
        np.arange(250, 256, dtype=np.uint8),
        np.array([True, False]),
        np.arange(3, dtype=np.int8),
    )
    out = codec.decode(codec.encode(obj), type=Annotated)
    assert out.logprobs.dtype == np.float32
    assert out.logprobs.tobytes() == obj.logprobs.tobytes()
    assert out.experts.dtype == np.uint8
    assert np.array_equal(out.experts, obj.experts)
    assert out.mask.dtype == np.bool_
    assert out.plain.dtype == np.int64
    bad = {"logprobs": [1.0], "experts": [256], "mask": [True], "plain": [1]}
    with pytest.raises(DecodeError, match=r"out of range for uint8.*\$\.experts"):
        codec.decode(codec.encode(bad), type=Annotated)
    bad = {"logprobs": [1e300], "experts": [1], "mask": [True], "plain": [1]}
    with pytest.raises(DecodeError, match=r"out of range for float32.*\$\.logprobs"):
        codec.decode(codec.encode(bad), type=Annotated)
    bad = {"logprobs": [1.0], "experts": [1.5], "mask": [1], "plain": [1]}
    with pytest.raises(DecodeError, match=r"\$\.experts"):
        codec.decode(codec.encode(bad), type=Annotated)


@pytest.mark.parametrize(
    "arr",
    [
        np.asfortranarray(np.arange(24, dtype=np.int32).reshape(2, 3, 4)),
        np.arange(60, dtype=np.float32).reshape(3, 4, 5).transpose(2, 0, 1),
        np.arange(20, dtype=np.float64)[::3],
        np.arange(20, dtype=np.int16)[::-2],
        np.arange(12, dtype=">i4").reshape(3, 4),
        np.arange(12, dtype=">f8").reshape(3, 4)[:, ::2],
        np.array(3.5),
        np.array(7, dtype=">u8"),
        np.array(True),
        np.zeros((3, 0), dtype=np.float16),
        np.arange(100_000, dtype=">i2")[::2],  # large: encoded a block of rows at a time
    ],
    ids=lambda a: f"{a.dtype.str}{list(a.shape)}{'C' if a.flags.c_contiguous else 'strided'}",
)
def test_any_layout_and_byte_order_encodes(arr: np.ndarray) -> None:
    out = codec.decode(codec.encode({"a": arr}))["a"]
    assert_json_equal(out, arr)
    typed = codec.decode(codec.encode([arr]), type=list[np.ndarray])[0]
    assert typed.shape == arr.shape
    assert np.array_equal(typed, arr)


def test_encode_output_is_what_one_orjson_call_gives() -> None:
    batch = make_batch(count=40, n=3000)
    batch.samples[0].extras["big"] = np.arange(200_000, dtype=np.int32).reshape(4, -1)

    def default(obj: Any) -> Any:
        return msgspec.structs.asdict(obj)

    expected = orjson.dumps(batch, default=default, option=orjson.OPT_SERIALIZE_NUMPY)
    assert bytes(codec.encode(batch).header) == expected
    items = [{"i": i, "x": np.arange(i % 9)} for i in range(5000)]
    assert header(items) == orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY)
    assert header(tuple(items)) == orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY)


def test_encode_works_in_short_slices() -> None:
    batch = make_batch(count=64, n=4096)
    # Up to three encodes: a slice's CPU time also counts what the kernel did for it (a
    # page fault that waited on compaction took 36 ms of a 117 ms encode in a parallel
    # run, where alone the longest slice takes 1-4 ms). An encode that is not sliced
    # fails all three.
    runs = [_slice_times(JsonCodec(check=check_object).encode_sliced(batch)) for _ in range(3)]
    for frame, times in runs:
        assert isinstance(frame, Frame)
        assert frame.header.readonly
        assert len(times) > 10
        # The work is spread: no slice holds a quarter of it (~1 ms of ~90 ms here). A
        # bound in seconds failed on a slow day (21 ms against 20, under a load of 7).
        if max(times) < sum(times) / 4:
            return
    raise AssertionError([(max(times), sum(times), len(times)) for _, times in runs])


def _slice_times(sliced: Any) -> tuple[Any, list[float]]:
    """What a sliced encode returns, and each slice's CPU time in this thread: what it
    holds the GIL for, whatever else the machine runs (its wall time grows with the load;
    a bound on it failed at 36 ms under a load of 5)."""
    times = []
    # A full collection of the objects earlier tests left in this process would count
    # as a slice's CPU time (one took 45 ms in a parallel run): none is due after this.
    gc.collect()
    while True:
        start = time.thread_time()
        try:
            next(sliced)
        except StopIteration as stop:
            return stop.value, times
        times.append(time.thread_time() - start)


def test_numpy_scalars_become_numbers() -> None:
    cases = [
        (np.float32(1.5), 1.5),
        (np.float16(-2.0), -2.0),
        (np.int8(-7), -7),
        (np.uint64(2**64 - 1), 2**64 - 1),
        (np.bool_(True), True),
    ]
    for scalar, expected in cases:
        out = codec.decode(codec.encode({"v": scalar, "l": [scalar]}))
        assert out == {"v": expected, "l": [expected]}
        assert type(out["v"]) is type(expected)


# -- the NaN/Inf rule -----------------------------------------------------------------

NON_FINITE = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
@pytest.mark.parametrize(
    "kind", ["python", "float16", "float32", "float64", "array", "strided-array", "0d-array"]
)
def test_nan_and_inf_are_written_as_null(value: float, kind: str) -> None:
    obj: Any
    if kind == "python":
        obj = value
    elif kind.startswith("float"):
        obj = np.dtype(kind).type(value)
    elif kind == "array":
        obj = np.array([1.0, value, 2.0], np.float32)
    elif kind == "strided-array":
        obj = np.array([1.0, 9.0, value, 9.0], np.float64)[::2]
    else:
        obj = np.array(value, np.float16)
    expected = {
        "array": b"[1.0,null,2.0]",
        "strided-array": b"[1.0,null]",
    }.get(kind, b"null")
    assert header(obj) == expected
    assert header({"k": [obj]}) == b'{"k":[' + expected + b"]}"
    untyped = codec.decode(codec.encode(obj))
    assert untyped == orjson.loads(expected)
    if kind.endswith("array") and kind != "0d-array":
        with pytest.raises(DecodeError, match="null inside an array: JSON has no NaN or Inf"):
            codec.decode(codec.encode({"x": obj}), type=dict[str, np.ndarray])
    with pytest.raises(DecodeError):
        codec.decode(codec.encode([obj]), type=list[float])


@FEW
@given(arr=hnp.arrays(hnp.floating_dtypes(sizes=(16, 32, 64)), hnp.array_shapes(max_dims=2)))
def test_nan_rule_for_generated_float_arrays(arr: np.ndarray) -> None:
    out = codec.decode(codec.encode(arr))
    flat_out = np.array(out, dtype=object).ravel() if arr.ndim else [out]
    for got, value in zip(flat_out, arr.ravel(), strict=True):
        assert (got is None) == (not np.isfinite(value))


# -- Structs, dataclasses, other values -----------------------------------------------


class Camel(msgspec.Struct, rename="camel", tag=True, omit_defaults=True):
    token_ids: np.ndarray
    is_truncated: bool = False
    extra_ids: list[int] = msgspec.field(default_factory=list)


class Packed(msgspec.Struct, array_like=True):
    a: int
    b: np.ndarray


class Inner(msgspec.Struct):
    data: np.ndarray


class Outer(msgspec.Struct, frozen=True):
    inner: Inner
    many: list[Inner]


@dataclasses.dataclass
class DC:
    x: int
    arr: np.ndarray
    label: str = "d"


def test_struct_config_is_honoured_like_msgspec_json() -> None:
    objs = [Camel(np.arange(2)), Camel(np.arange(1), True, [3])]
    as_lists = [Camel(o.token_ids.tolist(), o.is_truncated, o.extra_ids) for o in objs]  # type: ignore[arg-type]
    assert header(objs) == msgspec.json.encode(as_lists)
    out = codec.decode(codec.encode(objs), type=list[Camel])
    assert [o.is_truncated for o in out] == [False, True]
    assert out[1].extra_ids == [3]
    assert np.array_equal(out[0].token_ids, [0, 1])
    assert header(Packed(1, np.arange(3))) == b"[1,[0,1,2]]"
    packed = codec.decode(codec.encode(Packed(1, np.arange(3))), type=Packed)
    assert packed.a == 1 and np.array_equal(packed.b, [0, 1, 2])


def test_nested_structs_and_dataclasses_with_arrays() -> None:
    obj = Outer(Inner(np.arange(3)), [Inner(np.ones((2, 2))), Inner(np.arange(2)[::-1])])
    out = codec.decode(codec.encode(obj), type=Outer)
    assert np.array_equal(out.inner.data, [0, 1, 2])
    assert np.array_equal(out.many[0].data, np.ones((2, 2)))
    assert np.array_equal(out.many[1].data, [1, 0])
    dc = DC(3, np.arange(4, dtype=np.float32) / 4)
    assert header(dc) == b'{"x":3,"arr":[0.0,0.25,0.5,0.75],"label":"d"}'
    back = codec.decode(codec.encode(dc), type=DC)
    assert isinstance(back, DC) and back.x == 3 and np.array_equal(back.arr, dc.arr)


class Pair(NamedTuple):
    x: int
    y: np.ndarray


def test_bytes_become_base64_and_tuples_lists() -> None:
    pairs = [Pair(1, np.arange(2)), Pair(2, np.arange(1))]
    assert header(pairs) == header({"p": pairs})[5:-1] == b"[[1,[0,1]],[2,[0]]]"
    assert header(pairs[0]) == b"[1,[0,1]]"

    class B(msgspec.Struct):
        raw: bytes
        pair: tuple[int, str]

    frame = codec.encode({"raw": b"\x00\xffab", "pair": (1, "x")})
    assert codec.decode(frame) == {"raw": "AP9hYg==", "pair": [1, "x"]}
    assert codec.decode(frame, type=B) == B(b"\x00\xffab", (1, "x"))


def test_check_callback_sees_every_struct_with_its_path() -> None:
    seen: list[tuple[str, str]] = []

    def check(struct: Any, path: str) -> None:
        seen.append((type(struct).__name__, path))

    JsonCodec(check=check).encode(
        {"a": [Inner(np.arange(1)), {"b": Outer(Inner(np.arange(1)), [])}]}
    )
    assert ("Inner", "$.a[0]") in seen
    assert ("Outer", "$.a[1].b") in seen
    assert ("Inner", "$.a[1].b.inner") in seen


def test_check_rejects_a_bad_sample_before_encoding() -> None:
    batch = make_batch(count=3)
    batch.samples[2].logprobs[5] = np.nan
    with pytest.raises(SchemaError, match=re.escape("$.samples[2].logprobs")):
        JsonCodec(check=check_object).encode(batch)
    codec.encode(batch)  # without check, NaN is written as null


def test_codec_is_registered_by_name() -> None:
    made = make_codec("json", check=check_object)
    assert isinstance(made, JsonCodec)
    assert made.check is check_object
    with pytest.raises(ConfigError):
        make_codec("json", sidecar=("x",))


def test_send_and_receive_through_the_sender(tmp_path: Path) -> None:
    batch = make_batch(count=2)

    async def send() -> None:
        async with rlwire.open_sender(tmp_path, codec="json") as sender:
            await sender.send(batch)
            await sender.send({"step": 1, "loss": math.nan, "r": np.arange(2)})

    anyio.run(send)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        got = receiver.receive(timeout=5)
    assert np.array_equal(got.samples[1].token_ids, batch.samples[1].token_ids)
    assert got.samples[1].logprobs.astype(np.float32).tobytes() == (
        batch.samples[1].logprobs.tobytes()
    )
    with rlwire.open_receiver(tmp_path, type=Any, start_step=1) as receiver:
        assert receiver.receive(timeout=5) == {"step": 1, "loss": None, "r": [0, 1]}


# -- encode errors --------------------------------------------------------------------


class Leaf(msgspec.Struct):
    b: Any


class Root(msgspec.Struct):
    a: list[Any]


class Key(enum.StrEnum):
    A = "a"


class Text(str):
    pass


# A str subclass is no key for orjson ("Dict key must be str"): it named the path `$`
# (the walk asked only isinstance(key, str), so no key was found to blame).
BAD_VALUES = {
    "strenum-key": (lambda: {"z": 1, Key.A: 2}, f"dict keys must be str, got {__name__}.Key key"),
    "str-subclass-key": (lambda: {Text("t"): [1]}, f"keys must be str, got {__name__}.Text key"),
    "object-dtype": (lambda: np.array([None, 1], dtype=object), "dtype object"),
    "unicode-dtype": (lambda: np.array(["x", "yz"]), "dtype <U2"),
    "bytes-dtype": (lambda: np.array([b"x"]), "dtype |S1"),
    "structured": (lambda: np.zeros(3, dtype=[("a", "<i4")]), "dtype [('a', '<i4')]"),
    "complex-dtype": (lambda: np.ones(2, np.complex64), "dtype complex64"),
    "longdouble-dtype": (lambda: np.ones(2, np.longdouble), "are not supported"),
    "timedelta64": (lambda: np.array([1], dtype="m8[s]"), "timedelta64"),
    "datetime64[ns]": (lambda: np.array([1, 2], "M8[ns]"), "numpy datetime64[ns] values"),
    "datetime64[ns]-scalar": (lambda: np.datetime64(1, "ns"), "numpy datetime64[ns] values"),
    "datetime64[ns]-0d": (lambda: np.array(1, "M8[ns]"), "numpy datetime64[ns] values"),
    "datetime64[ps]": (lambda: np.array([1], "M8[ps]"), "microseconds at most"),
    "NaT[ns]-scalar": (lambda: np.datetime64("NaT", "ns"), "numpy datetime64[ns] values"),
    "object": (object, "type object"),
    "function": (lambda: lambda: None, "type function"),
    "complex": (lambda: 1 + 2j, "type complex"),
    "complex64-scalar": (lambda: np.complex64(1), "complex64"),
    "int>u64": (lambda: 2**64, "64-bit"),
    "int<i64": (lambda: -(2**63) - 1, "64-bit"),
    "int-key": (lambda: {1: "a"}, "dict keys must be str, got int key 1"),
    "set-of-objects": (lambda: {object()}, "type object"),
}


def _nestings(bad: Any) -> list[tuple[Any, str]]:
    return [
        ({"a": [0, {"b": bad}]}, "$.a[1].b"),
        (Root([0, Leaf(bad)]), "$.a[1].b"),
        ([{"x": (1, 2, [bad])}], "$[0].x[2][0]"),
        ({"a b": {"c": bad}}, "$['a b'].c"),
        (DC(1, np.arange(1), label=[bad]), "$.label[0]"),  # type: ignore[arg-type]
        ({"xs": [*range(300), {"deep": [bad]}]}, "$.xs[300].deep[0]"),
        (bad, "$"),
    ]


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_encode_errors_name_the_path_and_the_type(name: str) -> None:
    make, what = BAD_VALUES[name]
    for obj, path in _nestings(make()):
        with pytest.raises(EncodeError) as info:
            codec.encode(obj)
        message = str(info.value)
        assert message.startswith(f"{path}: "), (path, message)
        assert what in message, message


def test_a_str_subclass_key_is_refused_at_the_path_of_its_dict() -> None:
    for obj, path in [
        ({"x": [{Key.A: 1}]}, "$.x[0]"),
        ([0, {"y": {Text("t"): np.zeros(3)}}], "$[1].y"),
        (Root([Leaf({"ok": 1, Key.A: "v"})]), "$.a[0].b"),
    ]:
        with pytest.raises(EncodeError) as info:
            codec.encode(obj)
        message = str(info.value)
        assert message.startswith(f"{path}: dict keys must be str, got {__name__}."), message
        assert message.endswith("; send str(key)"), message


def test_datetime64_finer_than_microseconds_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """orjson writes a datetime64 to the microsecond: a datetime64[ns] arrived cut to
    microseconds, without a word. Coarser units are written, exactly."""
    ns = np.datetime64("2020-01-01T00:00:00.123456789", "ns")
    big = np.full(100_000, ns)  # written a block of rows at a time
    for obj, path in [({"t": [ns]}, "$.t[0]"), ({"a": [1, {"t": big}]}, "$.a[1].t")]:
        with pytest.raises(EncodeError, match=re.escape(f"{path}: numpy datetime64[ns]")):
            codec.encode(obj)
        with pytest.raises(EncodeError, match=re.escape(f"record 0: {path}: numpy")):
            dump_jsonl([obj], tmp_path / "r.jsonl")
        with rlwire.open_sync_sender(tmp_path / "s", codec="json") as sender:
            with pytest.raises(EncodeError, match=re.escape("astype('datetime64[us]')")):
                sender.send(obj)
            assert sender.next_step == 0
    assert not (tmp_path / "r.jsonl").exists()
    assert sorted(p.name for p in (tmp_path / "s").iterdir() if p.name.startswith("step")) == []
    us = ns.astype("datetime64[us]")
    assert json.loads(header({"t": us, "a": np.array([us])})) == {
        "t": "2020-01-01T00:00:00.123456",
        "a": ["2020-01-01T00:00:00.123456"],
    }


def test_self_containing_object_is_an_encode_error() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(EncodeError, match="levels deep"):
        codec.encode(loop)
    with pytest.raises(EncodeError, match="contains itself"):
        JsonCodec(check=check_object).encode(loop)


def test_a_value_holding_itself_twice_is_refused_at_once() -> None:
    """A list holding itself twice (or one list twice at every level) made the refusal's
    walk take time exponential in orjson's depth limit, 254: it never ended."""
    loop: list[Any] = []
    loop += [loop, loop]
    shared: Any = [np.arange(3, dtype=">i4")]  # a non-native array: the slow path is taken
    for _ in range(300):
        shared = [shared, shared]
    for obj in ({"x": loop}, {"x": shared}):
        started = time.monotonic()
        with pytest.raises(EncodeError, match="levels deep"):
            codec.encode(obj)
        assert time.monotonic() - started < 5


# -- decode errors --------------------------------------------------------------------


class InnerInt(msgspec.Struct):
    b: int


class OuterInts(msgspec.Struct):
    a: list[InnerInt]


def test_type_mismatch_is_a_decode_error_naming_the_path() -> None:
    frame = codec.encode({"a": [{"b": 1}, {"b": "not an int"}]})
    with pytest.raises(DecodeError) as info:
        codec.decode(frame, type=OuterInts)
    assert not isinstance(info.value, CorruptFrameError)
    assert "$.a[1].b" in str(info.value)
    with pytest.raises(DecodeError, match=re.escape("$.data")):
        codec.decode(codec.encode({"data": "text"}), type=Inner)
    with pytest.raises(DecodeError, match=re.escape("$.data")):
        codec.decode(codec.encode({"data": [[1], [2, 3]]}), type=Inner)
    with pytest.raises(DecodeError, match=re.escape("$.data")):
        codec.decode(codec.encode({"data": ["a", "b"]}), type=Inner)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"a": 1',
        b"[1, 2",
        b"nul",
        b'{"a": NaN}',
        b"\xff\xfe",
        b'"\xed\xa0\x80"',
        b"[" * 2000,
        b"{} {}",
    ],
    ids=repr,
)
def test_malformed_headers_are_corrupt_frame_errors(raw: bytes) -> None:
    with pytest.raises(CorruptFrameError, match="header: malformed JSON"):
        codec.decode(Frame(raw, codec="json"))


def test_frames_with_buffers_are_corrupt() -> None:
    with pytest.raises(CorruptFrameError, match="out-of-band buffers"):
        codec.decode(Frame(b"{}", (memoryview(b"x"),), codec="json"))


@SETTINGS
@given(data=st.data())
def test_damaged_headers_never_raise_anything_else(data: st.DataObject) -> None:
    raw = bytearray(header({"a": [1, 2.5, None, "s"], "b": {"c": True}}))
    cut = data.draw(st.integers(0, len(raw) - 1))
    damaged = bytes(raw[:cut])
    with pytest.raises(CorruptFrameError):  # every strict prefix of an object is invalid
        codec.decode(Frame(damaged, codec="json"))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CorruptFrameError, DecodeError):
        codec.decode(Frame(bytes(raw), codec="json"), type=dict[str, Any])
