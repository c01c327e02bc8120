"""Integers beyond 64 bits in JSON written by another tool: JsonCodec.decode, load_jsonl and
aload_jsonl read them exactly (they came back as rounded floats, without a word); an
array field cannot hold one, and says so. rlwire's own writers refuse them (test_json.py).
"""

from __future__ import annotations

import io
import json
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire import CorruptFrameError, DecodeError, Frame
from rlwire.codecs import JsonCodec
from rlwire.codecs.jsonl import aload_jsonl, load_jsonl

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

codec = JsonCodec()

#: Integers of up to 300 digits, most of them beyond 64 bits.
BIG = st.one_of(
    st.integers(),
    st.integers(2**64, 10**300),
    st.integers(-(10**300), -(2**63) - 1),
)
#: Documents as Python's json writes them: ints among floats, strings and nesting.
DOCS = st.recursive(
    st.one_of(BIG, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=10,
)


def _text(doc: Any) -> bytes:
    return json.dumps(doc).encode()


@SETTINGS
@given(doc=DOCS)
def test_documents_of_other_writers_read_back_exactly(doc: Any) -> None:
    got = codec.decode(Frame(_text(doc), codec="json"))
    assert got == doc
    assert _text(got) == _text(doc)  # the same types too: an int is not a float
    lines = list(load_jsonl(io.BytesIO(_text({"r": doc}) + b"\n" + _text([doc]))))
    assert lines == [{"r": doc}, [doc]]


class Record(msgspec.Struct):
    id: int
    xs: list[int]


def test_a_big_id_is_read_exactly_with_and_without_a_type() -> None:
    text = (
        b'{"id": 123456789012345678901234567890, '
        b'"xs": [-9223372036854775809, 18446744073709551616]}'
    )
    exact = {"id": 123456789012345678901234567890, "xs": [-(2**63) - 1, 2**64]}
    assert codec.decode(Frame(text, codec="json")) == exact
    assert codec.decode(Frame(text, codec="json"), type=Record) == Record(**exact)
    assert list(load_jsonl(io.BytesIO(text + b"\n"), type=Record)) == [Record(**exact)]


def test_an_array_field_cannot_hold_one_and_says_why() -> None:
    for text in (b'{"x": [1, 18446744073709551616]}', b'{"x": [[1], [-9223372036854775809]]}'):
        with pytest.raises(DecodeError, match=r"beyond 64 bits inside an array.*\$"):
            codec.decode(Frame(text, codec="json"), type=dict[str, np.ndarray])
        with pytest.raises(DecodeError, match=r"line 1: .*beyond 64 bits"):
            list(load_jsonl(io.BytesIO(text), type=dict[str, np.ndarray]))
    # Each fits in 64 bits, but int64 and uint64 together: numpy made them float64, rounded.
    both = b'{"x": [[-1, 18446744073709551615]]}'
    with pytest.raises(DecodeError, match=r"int64 and uint64 range together inside an array"):
        codec.decode(Frame(both, codec="json"), type=dict[str, np.ndarray])
    assert codec.decode(Frame(both, codec="json"), type=dict[str, list[list[int]]]) == {
        "x": [[-1, 2**64 - 1]]
    }
    for text, dtype in ((b"[0, 18446744073709551615]", np.uint64), (b"[-1.5, 1e19]", np.float64)):
        got = codec.decode(Frame(text, codec="json"), type=np.ndarray)
        assert got.dtype == dtype and got.tolist() == orjson.loads(text)


def test_malformed_documents_are_still_named_by_orjson() -> None:
    with pytest.raises(CorruptFrameError, match="header: malformed JSON: trailing comma"):
        codec.decode(Frame(b"[1, 123456789012345678901234567890,]", codec="json"))
    with pytest.raises(CorruptFrameError, match="header: malformed JSON: depth limit"):
        codec.decode(Frame(b"[" * 1100 + b"]" * 1100, codec="json"))
    deep = b"[" * 1010 + b"1" + b"]" * 1010  # past Python's recursion limit, within orjson's
    assert codec.decode(Frame(deep, codec="json")) is not None


@pytest.mark.anyio
async def test_aload_jsonl_reads_them_exactly() -> None:
    text = b'{"id": 123456789012345678901234567890}\n[-340282366920938463463374607431768211456]\n'
    got = [r async for r in aload_jsonl(io.BytesIO(text))]
    assert got == [{"id": 123456789012345678901234567890}, [-(2**128)]]
