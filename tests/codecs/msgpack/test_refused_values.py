"""Values msgspec would write but the msgpack codec refuses, wherever they are: a
msgspec.Raw (bytes copied into the header unchecked) and a msgspec.msgpack.Ext (read back
by rlwire's own extension hook). Each is an EncodeError naming its path."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from rlwire import EncodeError
from rlwire.codecs import MsgpackCodec

PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
KEYS = st.from_regex(r"[a-z]{1,4}", fullmatch=True)
REFUSED = st.one_of(
    st.binary(max_size=8).map(msgspec.Raw),
    st.builds(Ext, st.integers(-128, 127), st.binary(max_size=8)),
)


class Holder(msgspec.Struct):
    held: Any
    ids: list[int] = []
    note: str = ""


def _in_list(args: tuple[tuple[Any, str], list[Any], list[Any]]) -> tuple[Any, str]:
    (value, path), before, after = args
    return [*before, value, *after], f"[{len(before)}]{path}"


def _in_dict(args: tuple[tuple[Any, str], dict[str, Any], str]) -> tuple[Any, str]:
    (value, path), others, key = args
    return {**others, key: value}, f".{key}{path}"


def _beside_an_array(args: tuple[tuple[Any, str], int]) -> tuple[Any, str]:
    (value, path), n = args
    return {"arr": np.arange(n), "v": value}, f".v{path}"


def placed(bad: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, str]]:
    """A tree holding one value of ``bad``, and the path of that value in it (after ``$``)."""

    def wrap(inner: st.SearchStrategy[tuple[Any, str]]) -> st.SearchStrategy[tuple[Any, str]]:
        return st.one_of(
            st.tuples(inner, st.lists(PLAIN, max_size=3), st.lists(PLAIN, max_size=3)).map(
                _in_list
            ),
            st.tuples(inner, st.dictionaries(KEYS, PLAIN, max_size=3), KEYS).map(_in_dict),
            inner.map(lambda vp: (Holder(vp[0]), f".held{vp[1]}")),
            st.tuples(inner, st.integers(0, 2000)).map(_beside_an_array),
        )

    return st.recursive(bad.map(lambda v: (v, "")), wrap, max_leaves=4)


@given(case=placed(REFUSED), threshold=st.sampled_from([0, 4096, 1 << 62]))
def test_raw_and_ext_values_are_refused_naming_their_path(
    case: tuple[Any, str], threshold: int
) -> None:
    obj, path = case
    with pytest.raises(EncodeError) as info:
        MsgpackCodec(inline_threshold=threshold).encode(obj)
    assert str(info.value).startswith(f"${path}: msgspec."), str(info.value)


@pytest.mark.parametrize("threshold", [0, 1 << 62])
def test_heavy_structs_in_a_list_keep_their_arrays_and_bytes(threshold: int) -> None:
    """A Struct in a list that stays heavy once walked (a long string) is walked again
    when the list is chunked: the extension values the first walk put in place of its
    arrays and bytes are the codec's own, not the user's."""
    codec = MsgpackCodec(inline_threshold=threshold)
    note = "x" * (1 << 20)
    sent = [Holder([np.arange(i + 1)], list(range(10_000)), note) for i in range(2)]
    sent[1].held = {"b": bytes(5000), "a": [np.ones(3)]}
    got = codec.decode(codec.encode(sent), type=list[Holder])
    assert np.array_equal(got[0].held[0], np.arange(1))
    assert got[1].held["b"] == bytes(5000)
    assert np.array_equal(got[1].held["a"][0], np.ones(3))
    assert [(h.ids, h.note) for h in got] == [(h.ids, h.note) for h in sent]


class Blob(msgspec.Struct):
    data: bytes
    ids: list[int] = []


@pytest.mark.parametrize("size", [3, 4095, 4096, 5000])
@pytest.mark.parametrize("threshold", [0, 4096, 1 << 62])
@pytest.mark.parametrize("side", [False, True])
def test_a_numpy_bytes_scalar_is_refused_whatever_its_size(
    size: int, threshold: int, side: bool
) -> None:
    """A np.bytes_ (a subclass of bytes) was taken for bytes where one went out of band
    (from inline_threshold bytes on, or in a sidecar field) and arrived as a memoryview,
    while a smaller one was refused by msgspec ("cannot encode"): numpy scalars are sent
    as plain numbers, and a numpy string is refused as a np.str_ is, whatever its size."""
    value = np.bytes_(b"x" * size)
    codec = MsgpackCodec(inline_threshold=threshold, sidecar=("held", "data") if side else ())
    for obj, path in [
        (value, "$"),
        ({"held": [1, value]}, "$.held[1]"),
        (Holder({"a": value}), "$.held.a"),
        ([Blob(b"ok"), Blob(value)], "$[1].data"),
        ({"arr": np.arange(3), "v": (value,)}, "$.v[0]"),
    ]:
        with pytest.raises(EncodeError) as info:
            codec.encode(obj)
        assert str(info.value) == (
            f"{path}: numpy bytes_ values (dtype |S{size}) are not supported: numpy scalars "
            "are sent as plain numbers; send bytes(value)"
        )
