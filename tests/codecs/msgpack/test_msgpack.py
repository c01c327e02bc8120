"""Tests of rlwire.codecs._msgpack.codec.MsgpackCodec: round trips, zero copy, sidecar
selection, typed errors and hostile headers."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any

import hypothesis.extra.numpy as hnp
import msgspec
import numpy as np
import pytest
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

import rlwire
from rlwire import CorruptFrameError, DecodeError, EncodeError, Frame, RlwireError
from rlwire.codecs._msgpack.codec import DEFAULT_INLINE_THRESHOLD, MsgpackCodec

SETTINGS = settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

ALL_OOB = 0  # inline_threshold that sends every array and bytes value out-of-band
ALL_INLINE = 1 << 62  # inline_threshold that keeps everything in the header
THRESHOLDS = [ALL_OOB, DEFAULT_INLINE_THRESHOLD, ALL_INLINE]

NUMERIC_DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64, 128)),
    hnp.complex_number_dtypes(endianness="?", sizes=(64, 128, 256)),
)
LAYOUTS = ["C", "F", "step", "reverse", "transpose"]


# -- helpers --------------------------------------------------------------------------


def raw(arr: np.ndarray) -> bytes:
    """The logical bytes of ``arr`` in C order (bit-exact, NaN payloads included)."""
    return np.ascontiguousarray(arr).tobytes()


def assert_same_array(out: Any, arr: np.ndarray) -> None:
    assert isinstance(out, np.ndarray)
    assert out.dtype == arr.dtype
    assert out.dtype.str == arr.dtype.str  # byte order included
    assert out.shape == arr.shape
    assert raw(out) == raw(arr)


def received(frame: Frame) -> Frame:
    """``frame`` as a receiver would see it: read-only buffers holding copied bytes."""
    return Frame(
        bytes(frame.header),
        tuple(memoryview(bytes(b)) for b in frame.views()),
        frame.sidecar,
    )


def writable_copy(frame: Frame) -> Frame:
    return Frame(
        bytes(frame.header), tuple(memoryview(bytearray(b)) for b in frame.views()), frame.sidecar
    )


def base(buf: memoryview) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8)


@st.composite
def laid_out_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays of every numeric dtype in C, F and non-contiguous (strided) layouts."""
    layout = draw(st.sampled_from(LAYOUTS))
    dtype = draw(NUMERIC_DTYPES)
    if layout == "transpose":
        shape = draw(hnp.array_shapes(min_dims=3, max_dims=3, min_side=0, max_side=5))
    elif layout in ("step", "reverse"):
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=7))
    else:
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    arr = draw(hnp.arrays(dtype, shape))
    if layout == "F":
        arr = np.asfortranarray(arr)
    elif layout == "step":
        axis = draw(st.integers(0, arr.ndim - 1))
        step = draw(st.integers(2, 3))
        index = [slice(None)] * arr.ndim
        index[axis] = slice(None, None, step)
        arr = arr[tuple(index)]
    elif layout == "reverse":
        arr = arr[::-1]
    elif layout == "transpose":
        axes = draw(st.permutations([0, 1, 2]))
        arr = np.transpose(arr, axes)
    return arr


@st.composite
def raw_bit_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays filled with arbitrary bit patterns (every NaN payload, signaling NaNs...)."""
    dtype = draw(NUMERIC_DTYPES.filter(lambda d: d.kind != "b"))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    count = int(np.prod(shape))
    data = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    arr = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    if draw(st.booleans()) and arr.ndim >= 2:
        arr = np.asfortranarray(arr)
    return arr


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("threshold", THRESHOLDS)
@SETTINGS
@given(arr=laid_out_arrays())
def test_array_round_trip_is_bit_exact(threshold: int, arr: np.ndarray) -> None:
    codec = MsgpackCodec(inline_threshold=threshold)
    frame = codec.encode({"x": arr})
    if threshold == ALL_OOB:
        assert len(frame.buffers) == 1
        assert frame.buffers[0].nbytes == arr.nbytes
    elif threshold == ALL_INLINE:
        assert frame.buffers == ()
    assert frame.sidecar == frozenset()
    for f in (frame, received(frame), writable_copy(frame)):
        out = codec.decode(f)["x"]
        assert_same_array(out, arr)
        if arr.flags.f_contiguous and not arr.flags.c_contiguous:
            assert out.flags.f_contiguous  # F order survives without a copy
    typed = codec.decode(received(frame), type=dict[str, np.ndarray])["x"]
    assert_same_array(typed, arr)


@pytest.mark.parametrize("threshold", [ALL_OOB, ALL_INLINE])
@SETTINGS
@given(arr=raw_bit_arrays())
def test_arbitrary_bit_patterns_round_trip(threshold: int, arr: np.ndarray) -> None:
    codec = MsgpackCodec(inline_threshold=threshold)
    out = codec.decode(received(codec.encode([arr])))[0]
    assert_same_array(out, arr)
    if arr.dtype.kind in "fc":
        assert np.array_equal(out, arr, equal_nan=True)


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8", ">f8", "<f2", ">c16", "<c8"])
def test_nan_payloads_survive(dtype: str) -> None:
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 256, size=64 * dt.itemsize, dtype=np.uint8)
    arr = bits.view(dt)
    # Force a handful of distinct NaN payloads in.
    nans = np.array([np.nan, -np.nan], dtype=dt)
    arr[:2] = nans
    for threshold in (ALL_OOB, ALL_INLINE):
        codec = MsgpackCodec(inline_threshold=threshold)
        out = codec.decode(received(codec.encode({"a": arr})))["a"]
        assert out.view(np.uint8).tobytes() == arr.view(np.uint8).tobytes()
        assert out.dtype.str == dt.str


@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize(
    "arr",
    [
        np.array(3.5),
        np.array(True),
        np.array(7, dtype=">u8"),
        np.zeros((0,), dtype="<i4"),
        np.zeros((3, 0, 2), dtype=">f8"),
        np.zeros((0, 0), dtype="?"),
        np.asfortranarray(np.arange(24, dtype=">i2").reshape(2, 3, 4)),
        np.arange(60, dtype=np.complex64).reshape(3, 4, 5).transpose(2, 0, 1),
        np.arange(20, dtype=np.float64)[::3],
        np.arange(20, dtype=np.longdouble)[::-2],
    ],
    ids=lambda a: f"{a.dtype.str}{list(a.shape)}",
)
def test_edge_arrays_round_trip(threshold: int, arr: np.ndarray) -> None:
    codec = MsgpackCodec(inline_threshold=threshold)
    for f in (codec.encode(arr), received(codec.encode(arr))):
        assert_same_array(codec.decode(f), arr)


# -- zero copy ------------------------------------------------------------------------


def test_encode_does_not_copy_c_contiguous_arrays() -> None:
    arr = np.arange(100_000, dtype=np.float64)
    frame = MsgpackCodec().encode({"x": arr})
    (buf,) = frame.buffers
    assert np.shares_memory(base(buf), arr)
    assert base(buf).ctypes.data == arr.ctypes.data
    assert buf.nbytes == arr.nbytes


def test_encode_does_not_copy_f_contiguous_arrays() -> None:
    arr = np.asfortranarray(np.arange(100_000, dtype=">i4").reshape(100, 1000))
    frame = MsgpackCodec().encode({"x": arr})
    (buf,) = frame.buffers
    assert base(buf).ctypes.data == arr.ctypes.data
    out = MsgpackCodec().decode(frame)["x"]
    assert out.flags.f_contiguous
    assert np.shares_memory(out, arr)
    assert_same_array(out, arr)


def test_encode_does_not_copy_large_bytes() -> None:
    data = bytearray(b"x" * 10_000)
    frame = MsgpackCodec().encode({"b": data})
    (buf,) = frame.buffers
    assert base(buf).ctypes.data == np.frombuffer(data, np.uint8).ctypes.data


def test_strided_arrays_are_copied_once_and_round_trip() -> None:
    source = np.arange(200_000, dtype=np.int64)
    arr = source[::2]
    frame = MsgpackCodec().encode({"x": arr})
    (buf,) = frame.buffers
    assert not np.shares_memory(base(buf), source)
    assert_same_array(MsgpackCodec().decode(received(frame))["x"], arr)


def test_decoded_array_is_a_view_over_the_frame_buffer() -> None:
    codec = MsgpackCodec()
    frame = received(codec.encode({"x": np.arange(10_000, dtype="<f4").reshape(100, 100)}))
    out = codec.decode(frame)["x"]
    (buf,) = frame.buffers
    assert np.shares_memory(out, base(buf))
    assert out.ctypes.data == base(buf).ctypes.data
    assert not out.flags.writeable  # buffers are read-only, so is the view


def test_writable_true_copies_read_only_buffers() -> None:
    codec = MsgpackCodec()
    arr = np.arange(10_000, dtype=">i8")
    frame = received(codec.encode({"x": arr, "b": b"y" * 5000}))
    out = codec.decode(frame, writable=True)
    assert out["x"].flags.writeable
    assert not np.shares_memory(out["x"], base(frame.buffers[0]))
    assert_same_array(out["x"], arr)
    out["x"][0] = 42  # does not raise, does not touch the received buffer
    assert bytes(frame.buffers[0][:8]) == arr[:1].tobytes()
    assert isinstance(out["b"], bytearray)
    assert out["b"] == b"y" * 5000


def test_writable_buffers_are_not_copied() -> None:
    codec = MsgpackCodec()
    arr = np.arange(10_000, dtype="<u2")
    frame = writable_copy(codec.encode({"x": arr}))
    for kwargs in ({}, {"writable": True}):
        out = codec.decode(frame, **kwargs)["x"]
        assert out.flags.writeable
        assert np.shares_memory(out, base(frame.buffers[0]))


def test_read_only_inline_arrays_and_writable_copies() -> None:
    codec = MsgpackCodec(inline_threshold=ALL_INLINE)
    frame = codec.encode({"x": np.arange(5)})
    assert not codec.decode(frame)["x"].flags.writeable
    out = codec.decode(frame, writable=True)["x"]
    assert out.flags.writeable
    out[0] = 9


def test_out_of_band_bytes_decode_as_views() -> None:
    codec = MsgpackCodec()
    frame = received(codec.encode({"b": b"z" * 8192}))
    out = codec.decode(frame)["b"]
    assert isinstance(out, memoryview)
    assert out.readonly
    assert bytes(out) == b"z" * 8192
    assert np.shares_memory(np.frombuffer(out, np.uint8), base(frame.buffers[0]))


def test_encode_leaves_the_source_struct_alone() -> None:
    class S(msgspec.Struct):
        x: np.ndarray
        y: int = 0

    arr = np.arange(10_000)
    s = S(arr)
    MsgpackCodec().encode(s)
    assert s.x is arr


# -- inline threshold -----------------------------------------------------------------


def test_threshold_boundary_for_arrays() -> None:
    codec = MsgpackCodec(inline_threshold=64)
    at = np.zeros(8, dtype=np.float64)  # 64 bytes
    below = np.zeros(63, dtype=np.uint8)
    frame = codec.encode({"at": at, "below": below})
    assert len(frame.buffers) == 1
    assert frame.buffers[0].nbytes == 64
    assert below.tobytes() in bytes(frame.header)
    out = codec.decode(frame)
    assert_same_array(out["at"], at)
    assert_same_array(out["below"], below)


def test_threshold_boundary_for_bytes() -> None:
    codec = MsgpackCodec(inline_threshold=100)
    at, below = b"a" * 100, b"b" * 99
    frame = codec.encode({"at": at, "below": below, "mv": memoryview(b"c" * 150)})
    assert sorted(b.nbytes for b in frame.buffers) == [100, 150]
    assert b"b" * 99 in bytes(frame.header)
    assert b"a" * 100 not in bytes(frame.header)
    out = codec.decode(frame)
    assert bytes(out["at"]) == at
    assert out["below"] == below
    assert isinstance(out["below"], bytes)
    assert bytes(out["mv"]) == b"c" * 150


def test_header_stays_small_for_large_arrays() -> None:
    arrays = {f"a{i}": np.ones((256, 1024), dtype=np.float32) for i in range(4)}
    frame = MsgpackCodec().encode(arrays)
    assert len(frame.buffers) == 4
    assert len(frame.header) < 200
    assert sum(b.nbytes for b in frame.buffers) == 4 * 256 * 1024 * 4
    assert frame.nbytes == len(frame.header) + 4 * 256 * 1024 * 4


def test_default_threshold() -> None:
    codec = MsgpackCodec()
    assert codec.inline_threshold == DEFAULT_INLINE_THRESHOLD
    small = codec.encode({"x": np.zeros(DEFAULT_INLINE_THRESHOLD - 1, np.uint8)})
    large = codec.encode({"x": np.zeros(DEFAULT_INLINE_THRESHOLD, np.uint8)})
    assert small.buffers == ()
    assert len(large.buffers) == 1


# -- sidecar selection ----------------------------------------------------------------


class RE(msgspec.Struct):
    data: bytes
    shape: tuple[int, ...]


class MySample(msgspec.Struct):
    routed_experts: RE
    ids: np.ndarray


def test_sidecar_user_struct_with_bytes_field() -> None:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    ids = np.arange(10_000, dtype=np.int32)  # above the threshold, not in the sidecar
    sample = MySample(RE(b"\x01\x02\x03", (1, 3)), ids)
    frame = codec.encode(sample)
    assert len(frame.buffers) == 2
    assert len(frame.sidecar) == 1
    (side,) = frame.sidecar
    assert bytes(frame.buffers[side]) == b"\x01\x02\x03"  # small, yet in the sidecar
    (other,) = set(range(2)) - frame.sidecar
    assert frame.buffers[other].nbytes == ids.nbytes
    for f in (frame, received(frame)):
        out = codec.decode(f, type=MySample)
        assert type(out) is MySample
        assert type(out.routed_experts) is RE
        assert type(out.routed_experts.data) is bytes
        assert out.routed_experts == RE(b"\x01\x02\x03", (1, 3))
        assert_same_array(out.ids, ids)


def test_sidecar_small_ids_stay_inline() -> None:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    frame = codec.encode(MySample(RE(b"", ()), np.arange(3)))
    assert len(frame.buffers) == 1  # the empty bytes value, in the sidecar
    assert frame.sidecar == {0}
    assert frame.buffers[0].nbytes == 0
    out = codec.decode(frame, type=MySample)
    assert out.routed_experts.data == b""
    assert_same_array(out.ids, np.arange(3))


def test_sidecar_at_any_depth_in_dicts_and_lists() -> None:
    codec = MsgpackCodec(sidecar="routed_experts")  # a single name is accepted too
    re_arrays = [np.arange(4, dtype=np.uint8), np.ones((2, 2), ">f8")]
    obj = {
        "samples": [
            {"routed_experts": {"deep": [re_arrays[0], {"x": re_arrays[1]}], "b": b"ab"}},
            {"other": np.zeros(3), "big": np.zeros(10_000, np.uint8)},
        ],
        "routed_experts": "a string stays in the header",
        "tokens": [1, 2, 3],
    }
    frame = codec.encode(obj)
    side = sorted(frame.sidecar)
    assert len(side) == 3
    side_bytes = sorted(bytes(frame.buffers[i]) for i in side)
    expected = sorted([re_arrays[0].tobytes(), re_arrays[1].tobytes(), b"ab"])
    assert side_bytes == expected
    non_side = [i for i in range(len(frame.buffers)) if i not in frame.sidecar]
    assert [frame.buffers[i].nbytes for i in non_side] == [10_000]
    out = codec.decode(received(frame))
    deep = out["samples"][0]["routed_experts"]["deep"]
    assert_same_array(deep[0], re_arrays[0])
    assert_same_array(deep[1]["x"], re_arrays[1])
    assert bytes(out["samples"][0]["routed_experts"]["b"]) == b"ab"
    assert_same_array(out["samples"][1]["other"], np.zeros(3))
    assert out["routed_experts"] == "a string stays in the header"


@dataclasses.dataclass
class Holder:
    routed_experts: list[np.ndarray]
    plain: np.ndarray


class Inner(msgspec.Struct):
    data: np.ndarray


class Outer(msgspec.Struct):
    routed_experts: Inner
    holder: Holder


def test_sidecar_inside_nested_structs_and_dataclasses() -> None:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    obj = Outer(Inner(np.arange(2)), Holder([np.arange(3), np.arange(4)], np.arange(5)))
    frame = codec.encode(obj)
    assert len(frame.buffers) == 3
    assert sorted(frame.buffers[i].nbytes for i in frame.sidecar) == [16, 24, 32]
    out = codec.decode(received(frame), type=Outer)
    assert_same_array(out.routed_experts.data, np.arange(2))
    assert_same_array(out.holder.routed_experts[1], np.arange(4))
    assert_same_array(out.holder.plain, np.arange(5))


def test_no_sidecar_by_default() -> None:
    frame = MsgpackCodec(inline_threshold=ALL_OOB).encode(
        {"routed_experts": np.arange(3), "b": b"x"}
    )
    assert len(frame.buffers) == 2
    assert frame.sidecar == frozenset()


def test_codec_options_are_checked() -> None:
    with pytest.raises(rlwire.ConfigError, match="sidecar names must be strings"):
        MsgpackCodec(sidecar=(1,))  # type: ignore[arg-type]
    with pytest.raises(rlwire.ConfigError, match="inline_threshold must be an int"):
        MsgpackCodec(inline_threshold="x")  # type: ignore[arg-type]


def test_long_sequences_round_trip_through_chunked_encoding() -> None:
    codec = MsgpackCodec(inline_threshold=10**9)
    for n in (64, 65, 200, 70_000):
        obj = {"xs": [{"i": i, "a": np.arange(i % 5)} for i in range(n)], "t": tuple(range(n))}
        got = codec.decode(codec.encode(obj))
        assert [x["i"] for x in got["xs"]] == list(range(n))
        assert all(np.array_equal(x["a"], np.arange(i % 5)) for i, x in enumerate(got["xs"]))
        assert got["t"] == list(range(n))


def test_chunked_encoding_names_the_path_of_a_late_failure() -> None:
    items: list[object] = list(range(300))
    items[237] = {"deep": [2**70]}
    with pytest.raises(rlwire.EncodeError, match=r"^\$\.xs\[237\]\.deep\[0\]: cannot encode"):
        MsgpackCodec().encode({"xs": items})


def test_self_containing_object_is_an_encode_error() -> None:
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(rlwire.EncodeError, match="nests too deeply"):
        MsgpackCodec().encode(loop)


# -- structs, containers, dataclasses, scalars ----------------------------------------


class Point(msgspec.Struct):
    x: float
    y: float = 0.0


class WithDefaults(msgspec.Struct):
    name: str
    point: Point = msgspec.field(default_factory=lambda: Point(1.0))
    tags: list[str] = msgspec.field(default_factory=list)
    maybe: int | None = None
    arr: np.ndarray | None = None


class Cat(msgspec.Struct, tag=True):
    lives: int


class Dog(msgspec.Struct, tag="dog"):
    good: bool


class Pets(msgspec.Struct):
    pets: list[Cat | Dog]


class Packed(msgspec.Struct, array_like=True):
    a: int
    b: np.ndarray
    c: str


class Camel(msgspec.Struct, rename="camel"):
    token_ids: np.ndarray
    is_truncated: bool
    some_value: int | None = None


class Frozen(msgspec.Struct, frozen=True):
    arr: np.ndarray
    n: int


@dataclasses.dataclass
class DC:
    x: int
    arr: np.ndarray
    label: str = "d"


def test_struct_defaults_and_optional_fields() -> None:
    codec = MsgpackCodec()
    for obj in (
        WithDefaults("a"),
        WithDefaults("b", Point(2.0, 3.0), ["t"], 5, None),
    ):
        out = codec.decode(codec.encode(obj), type=WithDefaults)
        assert out == obj
    obj = WithDefaults("c", arr=np.arange(6, dtype=">i2").reshape(2, 3))
    out = codec.decode(received(codec.encode(obj)), type=WithDefaults)
    assert out.name == "c"
    assert out.point == Point(1.0)
    assert out.maybe is None
    assert_same_array(out.arr, obj.arr)


def test_tagged_unions() -> None:
    codec = MsgpackCodec()
    obj = Pets([Cat(9), Dog(True), Cat(3)])
    frame = codec.encode(obj)
    assert codec.decode(frame, type=Pets) == obj
    untyped = codec.decode(frame)
    assert untyped == {
        "pets": [
            {"type": "Cat", "lives": 9},
            {"type": "dog", "good": True},
            {"type": "Cat", "lives": 3},
        ]
    }


@pytest.mark.parametrize("threshold", [ALL_OOB, ALL_INLINE])
def test_array_like_struct(threshold: int) -> None:
    codec = MsgpackCodec(inline_threshold=threshold)
    obj = Packed(1, np.arange(4.0), "c")
    frame = codec.encode(obj)
    untyped = codec.decode(frame)
    assert isinstance(untyped, list)
    assert untyped[0] == 1
    assert untyped[2] == "c"
    out = codec.decode(received(frame), type=Packed)
    assert (out.a, out.c) == (1, "c")
    assert_same_array(out.b, obj.b)


def test_renamed_struct() -> None:
    codec = MsgpackCodec()
    obj = Camel(np.arange(3, dtype=np.int32), True)
    frame = codec.encode(obj)
    untyped = codec.decode(frame)
    assert set(untyped) == {"tokenIds", "isTruncated", "someValue"}
    out = codec.decode(frame, type=Camel)
    assert out.is_truncated is True
    assert out.some_value is None
    assert_same_array(out.token_ids, obj.token_ids)


def test_frozen_struct() -> None:
    codec = MsgpackCodec(inline_threshold=ALL_OOB)
    obj = Frozen(np.arange(3), 2)
    out = codec.decode(codec.encode(obj), type=Frozen)
    assert out.n == 2
    assert_same_array(out.arr, obj.arr)


def test_dicts_lists_tuples() -> None:
    codec = MsgpackCodec()
    obj = {
        "ints": [1, -2, 2**63, -(2**63)],
        "floats": [0.5, float("inf")],
        "nested": {"a": [{"b": [None, True, "s"]}], "t": (1, (2, 3))},
        "empty": {"l": [], "d": {}, "t": ()},
        1: "int keys are fine",
    }
    out = codec.decode(codec.encode(obj))
    assert out == {
        "ints": [1, -2, 2**63, -(2**63)],
        "floats": [0.5, float("inf")],
        "nested": {"a": [{"b": [None, True, "s"]}], "t": [1, [2, 3]]},
        "empty": {"l": [], "d": {}, "t": []},
        1: "int keys are fine",
    }
    typed = codec.decode(
        codec.encode({"t": (1, "a", (2.0,))}), type=dict[str, tuple[int, str, tuple[float]]]
    )
    assert typed == {"t": (1, "a", (2.0,))}


def test_arrays_inside_lists_and_tuples() -> None:
    codec = MsgpackCodec(inline_threshold=32)
    arrs = [np.arange(i, dtype=np.int16) for i in range(0, 40, 7)]
    out = codec.decode(received(codec.encode({"l": arrs, "t": tuple(arrs)})))
    for got in (out["l"], out["t"]):
        assert len(got) == len(arrs)
        for g, a in zip(got, arrs, strict=True):
            assert_same_array(g, a)


def test_dataclasses() -> None:
    codec = MsgpackCodec()
    obj = DC(3, np.arange(5, dtype="<f8"))
    frame = codec.encode(obj)
    untyped = codec.decode(frame)
    assert set(untyped) == {"x", "arr", "label"}
    out = codec.decode(received(frame), type=DC)
    assert isinstance(out, DC)
    assert (out.x, out.label) == (3, "d")
    assert_same_array(out.arr, obj.arr)


@pytest.mark.parametrize(
    ("scalar", "expected"),
    [
        (np.float32(1.5), 1.5),
        (np.float64(-0.25), -0.25),
        (np.float16(2.0), 2.0),
        (np.int8(-7), -7),
        (np.int64(2**62), 2**62),
        (np.uint64(2**64 - 1), 2**64 - 1),
        (np.uint8(255), 255),
        (np.bool_(True), True),
        (np.bool_(False), False),
    ],
    ids=repr,
)
def test_numpy_scalars_become_python_scalars(scalar: Any, expected: Any) -> None:
    codec = MsgpackCodec()
    out = codec.decode(codec.encode({"v": scalar, "l": [scalar]}))
    assert out["v"] == expected
    assert type(out["v"]) is type(expected)
    assert type(out["l"][0]) is type(expected)


def test_check_callback_sees_every_struct_the_walk_meets_with_its_path() -> None:
    """The codec looks only where a buffer may be: a Struct found where no annotation
    allows one (WithDefaults.point, a Point) is encoded by msgspec, unseen."""
    seen: list[tuple[str, str]] = []

    def check(struct: Any, path: str) -> None:
        seen.append((type(struct).__name__, path))

    codec = MsgpackCodec(check=check)
    codec.encode({"a": [Point(1.0), {"b": WithDefaults("n")}]})
    assert seen == [("Point", "$.a[0]"), ("WithDefaults", "$.a[1].b")]


def test_check_callback_errors_propagate() -> None:
    def check(struct: Any, path: str) -> None:
        raise rlwire.SchemaError(f"{path}: bad")

    with pytest.raises(rlwire.SchemaError, match=re.escape("$.p: bad")):
        MsgpackCodec(check=check).encode({"p": Point(1.0)})


# -- encode errors --------------------------------------------------------------------


class Leaf(msgspec.Struct):
    b: Any


class Root(msgspec.Struct):
    a: list[Any]


BAD_VALUES = {
    "object-dtype": lambda: np.array([None, 1], dtype=object),
    "unicode-dtype": lambda: np.array(["x", "yz"]),
    "bytes-dtype": lambda: np.array([b"x"]),
    "datetime64": lambda: np.array([1, 2], dtype="M8[ns]"),
    "timedelta64": lambda: np.array([1], dtype="m8[s]"),
    "structured": lambda: np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
    "void": lambda: np.zeros(2, dtype="V8"),
    "object": object,
    "set-of-objects": lambda: {object(), object()},
    "datetime64-scalar": lambda: np.datetime64(1, "s"),
    "datetime64[ns]-scalar": lambda: np.datetime64(1, "ns"),  # arrived as an int
    "timedelta64[ns]-scalar": lambda: np.timedelta64(1, "ns"),  # arrived as an int
    "raw": lambda: msgspec.Raw(b"1"),  # arrived as 49
    "ext": lambda: Ext(2, mp(["<f8", [1], "C", bytes(8)])),  # arrived as an array
    "released-memoryview": lambda: (view := memoryview(b"ab"), view.release())[0],
    "str_-scalar": lambda: np.str_("x"),
    "non-contiguous-memoryview": lambda: memoryview(b"abcdef")[::2],
    "function": lambda: lambda: None,
    "complex": lambda: 1 + 2j,
    "dict-subclass": lambda: __import__("collections").OrderedDict(a=1),
}


def _nestings(bad: Any) -> list[tuple[Any, str]]:
    return [
        ({"a": [0, {"b": bad}]}, "$.a[1].b"),
        (Root([0, Leaf(bad)]), "$.a[1].b"),
        ([{"x": (1, 2, [bad])}], "$[0].x[2][0]"),
        ({"a b": {3: bad}}, "$['a b'][3]"),
        (DC(1, np.arange(1), label=[bad]), "$.label[0]"),  # type: ignore[arg-type]
        ({"routed_experts": [{"c": bad}]}, "$.routed_experts[0].c"),
    ]


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_encode_errors_name_the_exact_path(name: str) -> None:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    for obj, path in _nestings(BAD_VALUES[name]()):
        with pytest.raises(EncodeError) as info:
            codec.encode(obj)
        message = str(info.value)
        assert f"{path}:" in message, (path, message)


def test_a_numpy_string_is_refused_as_a_string() -> None:
    """A np.str_ was refused as "a numpy scalar of dtype <U2 with no plain number
    equivalent": it is a string, and str(value) sends it."""
    for obj in (np.str_("ab"), np.array(["ab"])[0]):
        for tree, path in _nestings(obj):
            with pytest.raises(EncodeError) as info:
                MsgpackCodec().encode(tree)
            assert str(info.value) == (
                f"{path}: numpy str_ values (dtype <U2) are not supported: numpy scalars "
                "are sent as plain numbers; send str(value)"
            )


def test_encode_error_is_a_rlwire_error() -> None:
    assert issubclass(EncodeError, RlwireError)
    assert issubclass(EncodeError, TypeError)
    assert issubclass(DecodeError, RlwireError)
    assert issubclass(CorruptFrameError, DecodeError)
    with pytest.raises(RlwireError):
        MsgpackCodec().encode({"a": object()})


def test_object_array_error_mentions_dtype() -> None:
    with pytest.raises(EncodeError, match="object"):
        MsgpackCodec().encode({"a": np.array([{}], dtype=object)})


@pytest.mark.parametrize(
    "bad",
    [np.complex64(1 + 2j), np.clongdouble(1 + 2j), np.longdouble(1.5), 2**70, -(2**70)],
    ids=["complex64-scalar", "clongdouble-scalar", "longdouble-scalar", "int>u64", "int<i64"],
)
def test_values_msgspec_rejects_late_still_name_their_path(bad: Any) -> None:
    """Values the walker lets through but msgspec cannot encode must still be reported
    at their own path (or round-trip)."""
    codec = MsgpackCodec()
    try:
        frame = codec.encode({"a": [0, {"b": bad}]})
    except EncodeError as exc:
        assert "$.a[1].b" in str(exc), str(exc)
    else:
        assert codec.decode(frame)["a"][1]["b"] == bad


def test_unencodable_dict_key_names_the_dict() -> None:
    with pytest.raises(EncodeError) as info:
        MsgpackCodec().encode({"a": [0, {object(): 1}]})
    assert "$.a[1]" in str(info.value), str(info.value)


# -- decode errors --------------------------------------------------------------------


class InnerInt(msgspec.Struct):
    b: int


class OuterInts(msgspec.Struct):
    a: list[InnerInt]


class NeedsArray(msgspec.Struct):
    x: np.ndarray


def test_decode_into_mismatched_type_names_the_path() -> None:
    codec = MsgpackCodec()
    frame = codec.encode({"a": [{"b": 1}, {"b": "not an int"}]})
    with pytest.raises(DecodeError) as info:
        codec.decode(frame, type=OuterInts)
    assert not isinstance(info.value, CorruptFrameError)
    assert "$.a[1].b" in str(info.value)
    assert codec.decode(codec.encode({"a": [{"b": 1}]}), type=OuterInts) == OuterInts([InnerInt(1)])


@pytest.mark.parametrize("threshold", [ALL_OOB, ALL_INLINE])
def test_decode_array_into_wrong_type(threshold: int) -> None:
    codec = MsgpackCodec(inline_threshold=threshold)
    frame = codec.encode({"a": [{"b": np.arange(3)}]})
    with pytest.raises(DecodeError, match=re.escape("$.a[0].b")):
        codec.decode(frame, type=OuterInts)
    with pytest.raises(DecodeError, match=re.escape("$.x")):
        codec.decode(codec.encode({"x": [1, 2]}), type=NeedsArray)
    with pytest.raises(DecodeError, match=re.escape("$.x")):
        codec.decode(codec.encode({"x": b"abc"}), type=NeedsArray)


def test_decode_missing_field() -> None:
    codec = MsgpackCodec()
    with pytest.raises(DecodeError, match="routed_experts"):
        codec.decode(codec.encode({"ids": np.arange(3)}), type=MySample)


# -- hostile and corrupt headers ------------------------------------------------------


def oob(index: Any, dtype: Any, shape: Any, order: Any = "C") -> Ext:
    return Ext(1, mp([index, dtype, shape, order]))


def inline(dtype: Any, shape: Any, order: Any, data: Any) -> Ext:
    return Ext(2, mp([dtype, shape, order, data]))


def oob_bytes(index: Any) -> Ext:
    return Ext(3, mp([index]))


BAD_DTYPES = [
    "O",
    "|O",
    "<U4",
    "|S4",
    "V8",
    "|V8",
    "[('a','<i4')]",
    "<M8[ns]",
    "<m8[s]",
    "garbage",
    "",
    "<i3",
    "<f1",
    "<i0",
    "<u99",
    "<b2",
    "i4",
    "<i4 ",
    "<i4\n",
    " <i4",
    "<i4,<i4",
    "(2,)<i4",
    "<f8\x00",
]

HOSTILE: dict[str, tuple[Any, list[bytes]]] = {
    **{f"unknown-ext-{code}": (Ext(code, mp([0])), [b"abcd"]) for code in (0, 4, 5, 99, 127, -5)},
    "buffer-index-past-end": (oob(1, "<i4", [1]), [b"abcd"]),
    "buffer-index-negative": (oob(-1, "<i4", [1]), [b"abcd"]),
    "buffer-index-huge": (oob(2**64 - 1, "<i4", [1]), [b"abcd"]),
    "buffer-index-no-buffers": (oob(0, "<i4", [1]), []),
    "bytes-index-past-end": (oob_bytes(3), [b"abcd"]),
    "bytes-index-negative": (oob_bytes(-1), [b"abcd"]),
    "negative-shape": (oob(0, "<i4", [-1]), [b"abcd"]),
    "negative-shape-positive-product": (oob(0, "|u1", [-2, -2]), [b"abcd"]),
    "negative-shape-inline": (inline("|u1", [-4], "C", b"abcd"), []),
    "shape-too-small": (oob(0, "<i4", [3]), [b"abcdefghijklmnop"]),
    "shape-too-large": (oob(0, "<i4", [5]), [b"abcdefghijklmnop"]),
    "0d-needs-one-item": (oob(0, "<i4", []), [b""]),
    "shape-overflows-int64": (oob(0, "<i4", [2**40, 2**40]), [b"abcd"]),
    "shape-product-wraps-to-zero": (oob(0, "|u1", [2**32, 2**32]), [b""]),
    "shape-product-wraps-to-buffer": (oob(0, "|u1", [2**32, 2**32, 2**32 + 1]), [b""]),
    "shape-huge-single-dim": (oob(0, "|u1", [2**64 - 1]), [b"a"]),
    "shape-zero-times-huge": (oob(0, "<i4", [0, 2**63]), [b""]),
    "shape-zero-times-huge-2": (oob(0, "<i4", [0, 2**62]), [b""]),
    "shape-zero-times-huge-inline": (inline("<i4", [0, 2**40, 2**40], "C", b""), []),
    "too-many-dims": (oob(0, "|u1", [1] * 65), [b"a"]),
    "too-many-dims-huge": (oob(0, "|u1", [1] * 100_000), [b"a"]),
    "shape-not-a-list": (oob(0, "<i4", 4), [b"abcd"]),
    "shape-of-strings": (oob(0, "<i4", ["1"]), [b"abcd"]),
    "shape-of-floats": (oob(0, "<i4", [1.0]), [b"abcd"]),
    "shape-of-bools": (oob(0, "<i4", [True]), [b"abcd"]),
    "dtype-not-a-string": (oob(0, 4, [1]), [b"abcd"]),
    "order-A": (oob(0, "<i4", [1], "A"), [b"abcd"]),
    "order-K": (oob(0, "<i4", [1], "K"), [b"abcd"]),
    "order-empty": (oob(0, "<i4", [1], ""), [b"abcd"]),
    "order-lowercase": (oob(0, "<i4", [1], "c"), [b"abcd"]),
    "order-not-a-string": (oob(0, "<i4", [1], 0), [b"abcd"]),
    "inline-bad-order": (inline("<i4", [1], "X", b"abcd"), []),
    "inline-length-mismatch": (inline("<i4", [2], "C", b"abcd"), []),
    "inline-data-not-bytes": (inline("<i4", [1], "C", "abcd"), []),
    "ext-payload-not-an-array": (Ext(1, mp({"index": 0})), [b"abcd"]),
    "ext-payload-too-short": (Ext(1, mp([0, "<i4", [1]])), [b"abcd"]),
    "ext-payload-trailing-bytes": (Ext(1, mp([0, "<i4", [1], "C"]) + b"\x00"), [b"abcd"]),
    "ext-payload-empty": (Ext(1, b""), [b"abcd"]),
    "ext-payload-garbage": (Ext(2, b"\xc1\xc1"), []),
    "ext-inside-ext": (Ext(1, mp([Ext(1, b""), "<i4", [1], "C"])), [b"abcd"]),
    "bytes-ext-not-a-list": (Ext(3, mp(0)), [b"abcd"]),
    **{f"dtype-{d!r}": (oob(0, d, [1]), [b"abcdefgh"]) for d in BAD_DTYPES},
    **{f"inline-dtype-{d!r}": (inline(d, [1], "C", b"abcdefgh"), []) for d in BAD_DTYPES[:10]},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_descriptors_raise_corrupt_frame_error(name: str) -> None:
    ext, bufs = HOSTILE[name]
    codec = MsgpackCodec()
    for header in (mp(ext), mp({"a": [1, ext]})):
        for writable in (False, True):
            frame = Frame(header, tuple(memoryview(b) for b in bufs))
            with pytest.raises(CorruptFrameError):
                codec.decode(frame, writable=writable)
            with pytest.raises(CorruptFrameError):
                codec.decode(frame, type=dict[str, Any], writable=writable)


def _header_cases() -> dict[str, bytes]:
    valid = mp({"x": oob(0, "<i4", [1]), "s": "text", "n": [1, 2, 3]})
    cases = {
        "empty": b"",
        "invalid-opcode": b"\xc1",
        "garbage": b"\xff\xfe\x00\x13garbage",
        "truncated-map": b"\x82\xa1a",
        "truncated-str": b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        "truncated-array32": b"\xdd\xff\xff\xff\xff",
        "truncated-map32": b"\xdf\xff\xff\xff\xff",
        "truncated-bin32": b"\xc6\xff\xff\xff\xff",
        "truncated-ext32": b"\xc9\xff\xff\xff\xff\x01",
        "trailing-bytes": valid + b"\x00",
        "two-objects": valid + valid,
        "map-key-is-a-map": b"\x81\x81\x01\x01\x01",
        "map-key-is-an-array-ext": b"\x81" + mp(oob(0, "<i4", [1])) + b"\x01",
        "map-key-is-an-inline-array-ext": b"\x81" + mp(inline("|u1", [1], "C", b"a")) + b"\x01",
        "invalid-utf8-str": b"\xa1\x80",
        "invalid-utf8-str8": b"\xd9\x02\xc3\x28",
        "invalid-utf8-map-key": b"\x81\xa1\xff\x01",
        "invalid-utf8-inside-array": b"\x92\x01\xa2\xed\xa0",  # a lone surrogate
        "deeply-nested-arrays": b"\x91" * 100_000 + b"\x01",
        "deeply-nested-maps": b"\x81\xa1k" * 100_000 + b"\x01",
    }
    for cut in range(1, len(valid)):
        cases[f"truncated-at-{cut}"] = valid[:cut]
    return cases


HEADERS = _header_cases()


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_garbage_headers_raise_corrupt_frame_error(name: str) -> None:
    frame = Frame(HEADERS[name], (memoryview(b"abcd"),))
    with pytest.raises(CorruptFrameError):
        MsgpackCodec().decode(frame)


@pytest.mark.parametrize("writable_buffer", [False, True])
@pytest.mark.parametrize("writable", [False, True])
def test_bytes_ext_as_map_key_raises_corrupt_frame_error(
    writable_buffer: bool, writable: bool
) -> None:
    """A hostile header may use an out-of-band bytes value as a map key. Hashing the
    resulting view fails when the buffer is writable (e.g. a copy-on-write mmap)."""
    header = b"\x81" + mp(oob_bytes(0)) + b"\x01"
    buf = memoryview(bytearray(b"key") if writable_buffer else b"key")
    try:
        out = MsgpackCodec().decode(Frame(header, (buf,)), writable=writable)
    except CorruptFrameError:
        pass
    else:  # a hashable key is acceptable
        assert len(out) == 1


def test_oob_descriptor_for_empty_buffer_is_fine() -> None:
    codec = MsgpackCodec()
    out = codec.decode(Frame(mp({"x": oob(0, ">f8", [0, 3])}), (memoryview(b""),)))
    assert out["x"].shape == (0, 3)
    assert out["x"].dtype.str == ">f8"


def test_hand_built_f_order_descriptor() -> None:
    data = np.arange(6, dtype="<i2").tobytes()
    out = MsgpackCodec().decode(Frame(mp(oob(0, "<i2", [2, 3], "F")), (memoryview(data),)))
    assert out.flags.f_contiguous
    assert out.shape == (2, 3)
    assert out.tolist() == [[0, 2, 4], [1, 3, 5]]


class Model(msgspec.Struct):
    x: np.ndarray
    y: np.ndarray
    b: bytes
    s: str
    n: list[int]
    small: np.ndarray


def _valid_frame() -> Frame:
    codec = MsgpackCodec()
    obj = Model(
        x=np.arange(2000, dtype="<f4").reshape(40, 50),
        y=np.asfortranarray(np.arange(1200, dtype=">i8").reshape(30, 40)),
        b=b"q" * 5000,
        s="hello",
        n=[1, 2, 3],
        small=np.arange(6, dtype="<c8").reshape(2, 3),
    )
    return received(codec.encode(obj))


VALID = _valid_frame()


@SETTINGS
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(VALID.header) - 1), st.integers(1, 255)),
        min_size=1,
        max_size=4,
    ),
    cut=st.one_of(st.none(), st.integers(0, len(VALID.header))),
    writable=st.booleans(),
)
def test_mutated_headers_never_escape_the_error_hierarchy(
    flips: list[tuple[int, int]], cut: int | None, writable: bool
) -> None:
    header = bytearray(VALID.header)
    for pos, mask in flips:
        header[pos] ^= mask
    if cut is not None:
        del header[cut:]
    frame = Frame(bytes(header), VALID.buffers)
    codec = MsgpackCodec()
    for kwargs in ({}, {"type": Model}, {"type": dict[str, Any]}):
        with contextlib.suppress(RlwireError):
            codec.decode(frame, writable=writable, **kwargs)


@SETTINGS
@given(data=st.binary(max_size=64))
def test_random_headers_never_escape_the_error_hierarchy(data: bytes) -> None:
    with contextlib.suppress(RlwireError):
        MsgpackCodec().decode(Frame(data, VALID.buffers))
