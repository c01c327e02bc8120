"""The JSON codec draws on the one decode allowance of the stored size (defect 4)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson
import pytest
import zstandard
from depth import examples
from helpers import receive_in_child
from hypothesis import given, settings
from hypothesis import strategies as st

from rlwire import Frame, FrameTooLargeError
from rlwire._core.slicing import run_sliced
from rlwire.codecs import JsonCodec
from rlwire.codecs._json.cost import json_cost
from rlwire.transport import FileSink


def test_a_small_zstd_json_file_of_empty_lists_is_refused(tmp_path: Path) -> None:
    """Defect 4: a 5.9 kB file whose zstd header expands to 64 MiB of ``[],`` built
    some 2 GB of lists."""
    doc = b"[" + b"[]," * (21 << 20) + b"[]]"
    packed = zstandard.ZstdCompressor(level=19).compress(doc)
    frame = Frame(packed, (), codec="json", compression=(2,), raw_sizes=(len(doc),))
    sink = FileSink(tmp_path)
    sink.open("resume")
    run_sliced(sink.stage(0, [frame])).commit()
    assert sum(p.stat().st_size for p in tmp_path.glob("*.rlw")) < 16 << 10
    out, peak, _ = receive_in_child(tmp_path, timeout=5)
    assert peak < 400, f"the receiver reached {peak:.0f} MB ({out})"
    assert out.startswith("FrameTooLargeError: "), out
    assert "stored bytes" in out


def test_the_bound_is_on_the_stored_size_not_the_document() -> None:
    doc = b"[" + b"{}," * (2 << 20) + b"{}]"  # 6 MiB of empty objects: ~0.5 GB of dicts
    with pytest.raises(FrameTooLargeError, match="Python objects"):
        JsonCodec().decode(Frame(doc, (), codec="json", stored_size=1000))
    assert len(JsonCodec().decode(Frame(b"[" + b"{}," * 1000 + b"{}]", (), codec="json"))) == 1001


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=30) | st.dictionaries(st.text(), inner, max_size=30),
    max_leaves=300,
)


@settings(max_examples=examples(150), deadline=None)
@given(JSON)
def test_json_cost_is_an_upper_bound_of_what_parsing_takes(value: object) -> None:
    doc = orjson.dumps(value)
    tracemalloc.start()
    try:
        parsed = orjson.loads(doc)
        taken = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del parsed
    assert json_cost(doc) >= taken


def test_honest_documents_decode() -> None:
    value = {"ids": list(range(100_000)), "text": "x" * 10_000, "floats": [0.5] * 1000}
    frame = JsonCodec().encode(value)
    assert JsonCodec().decode(frame) == value
