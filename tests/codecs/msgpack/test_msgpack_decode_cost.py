"""Decoding is bounded by the message's size, whatever its header holds.

A msgpack byte can become a 64-byte Python object; the decoder tells what a header
would cost before decoding it (``rlwire.codecs._msgpack.cost``) and refuses one that
would take more than 16 times the message's size plus 256 MiB. Arrays and bytes values
each have a buffer of their own, so that a small header cannot have one large buffer
copied many times.
"""

from __future__ import annotations

import itertools
import struct
import time
import tracemalloc
from typing import Any

import msgspec
import pytest
from depth import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

from rlwire import CorruptFrameError, Frame, FrameTooLargeError, TrainingBatch
from rlwire.codecs._msgpack import allowance
from rlwire.codecs._msgpack.codec import MsgpackCodec
from rlwire.codecs._msgpack.cost import WORST_RATIO, plain_cost
from rlwire.codecs._msgpack.extensions import EXT_INLINE_ARRAY

MiB = 1 << 20


def _array32(item: bytes, count: int) -> bytes:
    return b"\xdd" + struct.pack(">I", count) + item * count


def _peak(call: Any) -> tuple[Any, int]:
    """What ``call()`` returns or raises, and the peak of memory it traced."""
    tracemalloc.start()
    try:
        try:
            out: Any = call()
        except Exception as exc:  # handed back to the test to check
            out = exc
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# Plain values of every msgpack kind, nested: what msgspec decodes ``Any`` into.
PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=20)
        | st.dictionaries(st.text(max_size=8) | st.integers(-1000, 1000), inner, max_size=20)
    ),
    max_leaves=200,
)


@settings(max_examples=examples(100), deadline=None)
@given(PLAIN)
def test_plain_cost_is_an_upper_bound_of_what_decoding_takes(value: Any) -> None:
    data = mp(value)
    decoded, peak = _peak(lambda: msgspec.msgpack.decode(data))
    assert decoded == value
    assert plain_cost(data, 1 << 62) + 2048 >= peak  # 2 KiB: the decode call itself
    assert plain_cost(data, 1 << 62) <= WORST_RATIO * len(data)


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=64), st.integers(0, 1 << 20))
def test_plain_cost_of_any_bytes_is_a_number(data: bytes, limit: int) -> None:
    """Malformed or truncated input is for the decoder to report: the walk just stops
    (charging what a truncated head declares, which msgspec never allocates); and
    WORST_RATIO bounds the cost of any well-formed bytes, which the decoder's charge
    relies on."""
    assert plain_cost(data, limit) >= 0
    try:
        msgspec.msgpack.decode(data, ext_hook=lambda code, payload: None)
    except (msgspec.DecodeError, TypeError, ValueError):
        return
    assert plain_cost(data, 1 << 62) <= WORST_RATIO * len(data)


@pytest.mark.parametrize(
    "data",
    [
        bytes([0x81, 0xFA, 0x90]),  # {-6: []}: what once broke a bound of 96
        bytes([0x81, 0x80, 0x80]),
        bytes([0x81, 0x80]) * 500 + bytes([0x80]),  # {{}: {{}: ...}}
        bytes([0xD4, EXT_INLINE_ARRAY, 0]),
        bytes([0xDD, 0, 0, 3, 232]) + bytes([0xD4, EXT_INLINE_ARRAY, 0]) * 1000,
        bytes([0x8F]) + bytes([0x80]) * 30,
        bytes([0xDD, 0, 0, 3, 232]) + bytes([0x81, 0x80, 0x80]) * 1000,
    ],
)
def test_the_dearest_bytes_stay_within_the_worst_ratio(data: bytes) -> None:
    assert plain_cost(data, 1 << 62) <= WORST_RATIO * len(data)


@pytest.mark.parametrize(
    ("item", "each"),
    [(b"\x90", 56), (b"\x80", 64), (b"\xe0", 32), (b"\xcb" + bytes(8), 24), (b"\xa2ab", 51)],
    ids=["empty arrays", "empty maps", "negative fixints", "floats", "2-letter strings"],
)
def test_plain_cost_counts_long_runs_in_bulk(item: bytes, each: int) -> None:
    count = 200_000
    data = _array32(item, count)
    assert plain_cost(data, 1 << 62) >= count * (each + 8)
    limit = count * each // 2
    assert limit < plain_cost(data, limit) <= limit + 64 * 1024 * (each + 8)  # stops soon past it


def test_one_letter_strings_are_counted_in_bulk() -> None:
    """They cost nothing (CPython caches them) but their list slots; they were walked
    one at a time in Python, some 0.7 s of CPU a million (a header of 4M took 3-9 s to
    receive in the chaos campaign)."""
    count = 2_000_000
    data = _array32(b"\xa1a", count)
    began = time.process_time()
    assert plain_cost(data, 1 << 62) == 56 + 8 * count
    assert time.process_time() - began < 0.3
    mixed = b"\xdd" + struct.pack(">I", 4000) + b"\xa1a\xa1\x7f\xa2ab\xa1b" * 1000  # no runs
    assert plain_cost(mixed, 1 << 62) == 56 + 8 * 4000 + 51 * 1000


def test_header_of_empty_arrays_received_as_any_is_refused_before_it_is_built() -> None:
    """8 MB of empty arrays would build 512 MB of lists (the limit for an 8 MB message
    is 384 MiB); the decoder refuses it having allocated almost nothing."""
    frame = Frame(_array32(b"\x90", 8_000_000), ())
    error, peak = _peak(lambda: MsgpackCodec().decode(frame))
    assert isinstance(error, FrameTooLargeError), error
    assert "Python objects" in str(error) and "Struct type" in str(error)
    assert peak < 32 * MiB


def test_the_same_header_into_a_struct_skips_the_unknown_field() -> None:
    header = b"\x81\xa4junk" + _array32(b"\x90", 8_000_000)
    error, peak = _peak(lambda: MsgpackCodec().decode(Frame(header, ()), type=TrainingBatch))
    assert not isinstance(error, FrameTooLargeError)
    assert peak < 32 * MiB


@pytest.fixture
def small_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The allowance's floor at 1 MiB instead of 256, so that the tests below need
    messages of kilobytes, not megabytes, to reach it."""
    monkeypatch.setattr(allowance, "heap_allowance", lambda frame: MiB + 16 * frame.stored_nbytes)


@pytest.mark.usefixtures("small_floor")
def test_header_of_tiny_inline_arrays_received_as_any_is_refused() -> None:
    one = mp(Ext(2, mp(["|u1", [1], "C", b"x"])))
    frame = Frame(_array32(one, 10_000), ())  # 6.5 MB of arrays; the limit is 3.4 MB
    with pytest.raises(FrameTooLargeError):
        MsgpackCodec().decode(frame)


@pytest.mark.usefixtures("small_floor")
def test_large_header_of_cheap_values_is_walked_and_decoded() -> None:
    """200 KB of small ints could cost 19 MB at worst, over this message's limit (4.2 MB),
    so the decoder walks it, finds 1.6 MB, and decodes it."""
    frame = Frame(_array32(b"\x07", 200_000), ())
    out = MsgpackCodec().decode(frame)
    assert len(out) == 200_000 and out[-1] == 7


@pytest.mark.usefixtures("small_floor")
def test_chunks_share_the_message_allowance() -> None:
    """Chunks of empty arrays: together they are refused, though each alone would fit."""
    chunk = _array32(b"\x90", 10_000)  # 0.56 MB of lists; the limit is 1.8 MB
    ranges = [i * len(chunk) for i in range(9)]
    header = mp(Ext(4, mp([0, 80_000, [r for pair in itertools.pairwise(ranges) for r in pair]])))
    frame = Frame(header, (memoryview(chunk * 8),))
    for annotation in (Any, list[list[int]]):
        error, _ = _peak(lambda: MsgpackCodec().decode(frame, annotation))  # noqa: B023
        assert isinstance(error, FrameTooLargeError), (annotation, error)


@pytest.mark.parametrize("annotation", [Any, list[list[int]]])
def test_a_chunk_listed_twice_is_corrupt(annotation: Any) -> None:
    """Defect 3: one chunk listed four times made the reader decode it four times."""
    chunk = _array32(b"\x90", 10)
    for ranges in ([0, len(chunk)] * 4, [0, len(chunk), 1, len(chunk)]):
        header = mp(Ext(4, mp([0, 40, ranges])))
        with pytest.raises(CorruptFrameError, match="overlaps another chunk"):
            MsgpackCodec().decode(Frame(header, (memoryview(chunk),)), annotation)


@pytest.mark.parametrize("code", [1, 3], ids=["arrays", "bytes"])
@pytest.mark.parametrize("writable", [False, True])
def test_a_buffer_referred_to_twice_is_corrupt(code: int, writable: bool) -> None:
    """Otherwise a 1 MB header could have one 64 MiB buffer copied 50,000 times."""
    ref = Ext(code, mp([0, "|u1", [4], "C"] if code == 1 else [0]))
    frame = Frame(mp([ref, ref]), (memoryview(b"abcd"),))
    with pytest.raises(CorruptFrameError, match="refers to buffer 0 twice"):
        MsgpackCodec().decode(frame, writable=writable)
