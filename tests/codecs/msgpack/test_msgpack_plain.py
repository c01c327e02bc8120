"""Plain builtins (dicts, lists, tuples, strings, numbers, small bytes) are weighed
without the encoder's walk and left to msgspec, and the frames are the same byte for byte
as the walk made them: arrays, large bytes, Structs and refused values anywhere inside
still go where they went, and errors still name the same paths."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire import EncodeError
from rlwire.codecs import MsgpackCodec


class Meta(msgspec.Struct):
    name: str
    score: float
    tags: list[str]


@dataclasses.dataclass
class Note:
    text: str
    ids: list[int]


def sample(i: int) -> dict[str, Any]:
    return {"prompt_id": i, "reward": 0.5, "tokens": [1, 2, 3], "text": "ok"}


def cases() -> dict[str, tuple[dict[str, Any], Any]]:
    long = "é" * 70 + "x" * 200
    out: dict[str, tuple[dict[str, Any], Any]] = {}
    out["samples"] = ({}, {"samples": [sample(i) for i in range(20_000)]})
    out["samples_tuple"] = ({}, {"samples": tuple(sample(i) for i in range(9_000))})
    out["top_list"] = ({}, [sample(i) for i in range(12_000)])
    out["wide_map"] = ({}, {f"k{i}": {"v": i, "l": [i, i + 1]} for i in range(9_000)})
    out["nested"] = ({}, [[{"a": j, "s": "t" * (j % 90)} for j in range(300)] for _ in range(40)])
    mid = [1] * 1001
    mid[500] = "x" * 6400
    out["sampled"] = ({}, {"a": mid, "b": [long, 1, 2, long], "c": [[1] * 3000, [2.5] * 10]})
    out["boundary"] = ({}, {f"t{k}": [{"t": [0] * k}] for k in range(8186, 8196)})
    out["boundary_sum"] = (
        {},
        [{"t": [0] * n} for n in (4000, 4089, 100, 2, 1021, 1022, 1023, 1024)],
    )
    out["scalars_mixed"] = ({}, {"m": [1, "a", None, True, 2.5, [1], {"x": None}] * 3000})
    out["bytes"] = (
        {},
        {
            "rows": [
                {
                    "b": b"ab" * (i % 50),
                    "ba": bytearray(b"q" * (i % 7)),
                    "big": bytes(5000) if i % 997 == 0 else b"",
                }
                for i in range(12_000)
            ]
        },
    )
    arrs = []
    for i in range(12_000):
        row: dict[str, Any] = {"i": i, "f": [0.5, 1.5]}
        if i % 100 == 0:
            row["x"] = np.arange(10)
        if i % 3001 == 0:
            row["y"] = np.arange(2000)
        arrs.append(row)
    out["arrays"] = ({}, {"rows": arrs})
    out["structs"] = (
        {},
        {"rows": [{"m": Meta(f"n{i}", i / 3, ["a", "b"]), "k": i} for i in range(10_000)]},
    )
    out["dataclasses"] = ({}, {"rows": [{"n": Note("t", [i, i]), "k": i} for i in range(10_000)]})
    out["sidecar"] = (
        {"sidecar": ["img"]},
        {
            "rows": [
                {"img": b"z" * 10, "k": i} if i % 5 == 0 else {"k": i, "v": [i]}
                for i in range(10_000)
            ]
        },
    )
    deep: Any = 1
    for _ in range(150):
        deep = [deep, {"d": deep if isinstance(deep, int) else 0}]
    out["deep"] = ({}, {"deep": deep})
    out["np_scalars"] = (
        {},
        {
            "rows": [
                {"f": np.float32(0.25), "i": np.int64(i), "b": np.bool_(i % 2)}
                for i in range(9_000)
            ]
        },
    )
    out["keys"] = (
        {},
        {"rows": [{1: [1, 2], 2.5: None, None: {}} for _ in range(9_000)]},
    )
    out["empties"] = ({}, {"rows": [[], {}, (), [[]], [{}], ""] * 3000})
    out["heavy_entries"] = (
        {},
        {f"e{k}": [[1, 2]] * k for k in (100, 300, 340, 341, 342, 500, 2000, 5000)},
    )
    out["threshold"] = (
        {"inline_threshold": 64},
        {"rows": [{"b": bytes(i % 130), "t": [i]} for i in range(10_000)]},
    )
    out["small"] = ({}, {"a": [1, 2, {"b": "c"}], "d": (None, 2.5), "e": b"xy"})
    return out


def error_cases() -> dict[str, tuple[dict[str, Any], Any]]:
    out: dict[str, tuple[dict[str, Any], Any]] = {}
    rows: list[Any] = [sample(i) for i in range(15_000)]
    rows[12_345] = {**sample(0), "tokens": [1, msgspec.msgpack.Ext(9, b"x")]}
    out["ext"] = ({}, {"samples": rows})
    rows = [sample(i) for i in range(15_000)]
    rows[11_111] = {**sample(0), "text": np.bytes_(b"ab")}
    out["np_bytes"] = ({}, {"samples": rows})
    rows = [sample(i) for i in range(15_000)]
    rows[14_000] = {**sample(0), "prompt_id": 2**70}
    out["big_int"] = ({}, {"samples": rows})
    rows = [sample(i) for i in range(15_000)]
    rows[9_000] = {**sample(0), "tokens": [1, 2, object()]}
    out["object"] = ({}, {"samples": rows})
    rows = [sample(i) for i in range(300)]
    rows[200] = {**sample(0), "reward": 2**65}
    out["big_int_small"] = ({}, {"samples": rows})
    cyc: list[Any] = [1]
    cyc.append(cyc)
    out["cycle"] = ({}, {"c": [sample(0), cyc]})
    return out


def digest(frame: Any) -> str:
    h = hashlib.sha256()
    h.update(bytes(frame.header))
    for view in frame.views():
        h.update(len(view).to_bytes(8, "big"))
        h.update(view)
    h.update(repr(sorted(frame.sidecar)).encode())
    return h.hexdigest()[:24]


#: Digests of the frames of :func:`cases` as the walk wrote them (rlwire before the
#: thirty-second session), each value visited in Python.
FRAMES = {
    "samples": "51f16c27c762aea70d1398ce",
    "samples_tuple": "b71497c482f9eaa0e6a75ab1",
    "top_list": "3dfd830f7f67bf6601b630ec",
    "wide_map": "6d80093655b33fa2266d394e",
    "nested": "634d369d79a5782015208be5",
    "sampled": "7fb453bcfec4b9551f88ac19",
    "boundary": "da65557e152c93eec088eae6",
    "boundary_sum": "0dcf8d24ad42015e4497c888",
    "scalars_mixed": "917533de5d172cdd2842799f",
    "bytes": "15ac88cbadb8fd238d8748ee",
    "arrays": "0262b5b92ab061d0fe9103bc",
    "structs": "78167d92282f25938c9c6646",
    "dataclasses": "61f64c6ee833cec012f78dfc",
    "sidecar": "3fd926aec0a9d3b23ca678f5",
    "deep": "e73695d9df835d9e30687338",
    "np_scalars": "450dec6eb353a5f04f517fc1",
    "keys": "5433af0be0e631d585c5c89f",
    "empties": "6146602fc2372d2085ba57a9",
    "heavy_entries": "8bf13c1e1a77e0ada7fe9391",
    "threshold": "588fe770591ae73393981f32",
    "small": "339aed4da20cd057988af0d7",
}

#: The errors of :func:`error_cases` as the walk raised them.
ERRORS = {
    "ext": (
        "$.samples[12345].tokens[1]: msgspec.msgpack.Ext values (here code 9) are not "
        "supported: rlwire reserves msgpack extension types for its own buffers; send "
        "the code and data as plain values (e.g. a tuple)"
    ),
    "np_bytes": (
        "$.samples[11111].text: numpy bytes_ values (dtype |S2) are not supported: numpy "
        "scalars are sent as plain numbers; send bytes(value)"
    ),
    "big_int": (
        "$.samples[14000].prompt_id: cannot encode: can't serialize ints < -2**63 or > 2**64 - 1"
    ),
    "object": (
        "$.samples[9000].tokens[2]: cannot encode value of type builtins.object: "
        "Encoding objects of type object is unsupported"
    ),
    "big_int_small": (
        "$.samples[200].reward: cannot encode: can't serialize ints < -2**63 or > 2**64 - 1"
    ),
    "cycle": ("$: nests too deeply for Python's recursion limit (or contains itself)"),
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frames_are_the_walks_byte_for_byte(name: str) -> None:
    options, obj = cases()[name]
    assert digest(MsgpackCodec(**options).encode(obj)) == FRAMES[name]


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_name_the_walks_paths(name: str) -> None:
    options, obj = error_cases()[name]
    with pytest.raises(EncodeError) as caught:
        MsgpackCodec(**options).encode(obj)
    assert str(caught.value) == ERRORS[name]


def _python_calls(run: Callable[[], Any]) -> int:
    """How many Python functions ``run`` calls (C functions not counted)."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_plain_samples_are_not_walked_value_by_value() -> None:
    """The walk made some 40 Python calls a sample (a generator per value, a weight per
    value and a slice check after each); the weighing of plain values makes a few."""
    n = 20_000
    obj = {"samples": [sample(i) for i in range(n)]}
    codec = MsgpackCodec()
    calls = _python_calls(lambda: codec.encode(obj))
    assert calls < 5 * n, f"{calls / n:.1f} Python calls a sample"
    assert codec.decode(codec.encode(obj)) == obj


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=3)
    | st.sampled_from(["x" * 64, "é" * 200, "y" * 700])
    | st.binary(max_size=80)
)
KEYS = st.text(max_size=3) | st.integers(-3, 3)
COUNTS = st.sampled_from([0, 3, 1023, 1024, 2730, 8191, 8192, 12_000])
#: How :func:`_built` lays out copies of an item: around the weights where containers
#: are chunked (1,024 and 8,192), in lists, tuples, maps and lists of lists.
SHAPES = st.tuples(st.sampled_from(["list", "tuple", "map"]), COUNTS, st.just(0)) | st.sampled_from(
    [("nested", 1024, 3), ("nested", 3, 2730), ("nested", 100, 100), ("nested", 8192, 2)]
)


def _plain(extra: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS | extra,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.lists(inner, max_size=4).map(tuple)
            | st.dictionaries(KEYS, inner, max_size=4)
        ),
        max_leaves=10,
    )


def _built(item: Any, other: Any, shape: tuple[str, int, int]) -> dict[str, Any]:
    """A message of many copies of ``item`` beside ``other``, built in the test: as an
    argument its repr would be megabytes long."""
    kind, a, b = shape
    if kind == "list":
        return {"x": other, "h": [item] * a}
    if kind == "tuple":
        return {"h": tuple([item] * a), "x": other}
    if kind == "map":
        return {"x": other, "h": {f"k{i}": item for i in range(a)}}
    return {"h": [[item] * a for _ in range(b)], "x": other}


def _plain_copy(obj: Any) -> Any:
    """``obj`` as a receiver gets it back: tuples as lists, bytes as bytes."""
    if isinstance(obj, dict):
        return {key: _plain_copy(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain_copy(item) for item in obj]
    return obj


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plain(st.nothing()), _plain(st.nothing()), SHAPES)
def test_plain_data_is_msgspecs_bytes_or_chunks_of_them(
    item: Any, other: Any, shape: tuple[str, int, int]
) -> None:
    """Plain data the walk left whole is msgspec's own bytes; heavier, it is chunked
    and comes back equal."""
    codec = MsgpackCodec()
    obj = _built(item, other, shape)
    frame = codec.encode(obj)
    if not frame.buffers:
        assert frame.header == msgspec.msgpack.encode(obj)
    assert codec.decode(frame) == _plain_copy(obj)


SPECIAL = st.one_of(
    st.sampled_from([0, 3, 600]).map(np.arange),
    st.sampled_from([10, 5000]).map(bytes),
    st.builds(Meta, st.text(max_size=3), st.floats(allow_nan=False), st.lists(st.text(max_size=2))),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plain(SPECIAL), _plain(SPECIAL), SHAPES)
def test_mixed_data_keeps_its_buffers_and_structs(
    item: Any, other: Any, shape: tuple[str, int, int]
) -> None:
    """Arrays, large bytes and Structs anywhere in plain data come back as they went:
    arrays and large bytes out of band."""
    codec = MsgpackCodec()
    obj = _built(item, other, shape)
    assert _normal(codec.decode(codec.encode(obj))) == _normal(obj)


def _normal(obj: Any) -> Any:
    """``obj`` comparable after a round trip: arrays as lists, Structs and bytes-like
    values as plain data."""
    if isinstance(obj, np.ndarray):
        return ("array", obj.tolist())
    if isinstance(obj, Meta):
        return {"name": obj.name, "score": obj.score, "tags": obj.tags}
    if isinstance(obj, bytes | bytearray | memoryview):
        return bytes(obj)
    if isinstance(obj, dict):
        return {key: _normal(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [_normal(item) for item in obj]
    return obj


def test_decoding_plain_samples_settles_a_chunk_or_two_a_slice() -> None:
    """A decode charges each chunk its worst case, and walks earlier chunks for their
    real cost once those no longer fit: every earlier chunk was walked in one slice
    (160,000 Python calls for this message, a quarter of a second), now only as many
    as make room."""
    codec = MsgpackCodec()
    obj = {"samples": [sample(i) for i in range(100_000)]}
    frame = codec.encode(obj)
    sliced = codec.decode_sliced(frame)
    done: list[Any] = []

    def one_slice() -> None:
        try:
            next(sliced)
        except StopIteration as stop:
            done.append(stop.value)

    most = 0
    while not done:
        most = max(most, _python_calls(one_slice))
    back = done[0]
    assert back == obj
    assert most < 30_000, f"{most} Python calls in one slice"
