"""Copies into new ``bytes`` / ``bytearray`` objects made a slice at a time
(``rlwire._core.copying``): exact bytes at every size around the thresholds, one slice per
chunk copied, and nothing left referenced once a copy is dropped midway."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire._core import copying as _copying
from rlwire._core.copying import concatenated, copied, copied_into
from rlwire._core.slicing import SliceTimer, run_sliced


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> int:
    """Thresholds small enough that hypothesis's sizes cross every boundary."""
    monkeypatch.setattr(_copying, "_SMALL", 64)
    monkeypatch.setattr(_copying, "COPY_CHUNK_BYTES", 1000)
    return 1000


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=st.binary(max_size=5000), kind=st.sampled_from([bytes, bytearray]), skip=st.integers(0, 7)
)
def test_a_copy_holds_exactly_the_source_bytes(
    small_steps: int, data: bytes, kind: type[bytes] | type[bytearray], skip: int
) -> None:
    view = memoryview(data)[skip:]  # views that start inside a buffer, too
    got = run_sliced(copied(view, kind))
    assert type(got) is kind
    assert got == bytes(view)


def test_each_chunk_is_copied_in_a_slice_of_its_own(small_steps: int) -> None:
    source = np.arange(4500, dtype=np.uint8)
    slices = copied(memoryview(source), bytes)
    count = 0
    while True:
        try:
            next(slices)
        except StopIteration as stop:
            got = stop.value
            break
        count += 1
    assert count == 5  # 4,500 bytes in chunks of 1,000
    assert got == source.tobytes()


def test_a_copy_leaves_its_source_untouched_and_does_not_share_it(small_steps: int) -> None:
    source = bytearray(b"x" * 3000)
    got = run_sliced(copied(memoryview(source), bytearray))
    got[0] = ord("y")
    assert source[0] == ord("x")


def test_copies_of_views_that_are_not_contiguous_are_right() -> None:
    data = np.arange(3 << 20, dtype=np.uint8)
    view = memoryview(data)[::3]
    assert run_sliced(copied(view, bytes)) == bytes(view)


def test_a_copy_closed_midway_releases_its_source(small_steps: int) -> None:
    source = np.arange(5000, dtype=np.uint8)
    alive = weakref.ref(source)
    slices = copied(memoryview(source), bytes)
    next(slices)
    slices.close()
    del slices, source
    gc.collect()
    assert alive() is None


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(parts=st.lists(st.binary(max_size=700), max_size=20))
def test_concatenated_is_the_join_and_lets_go_of_each_part(
    small_steps: int, parts: list[bytes]
) -> None:
    want = b"".join(parts)
    given_parts = list(parts)
    got = run_sliced(concatenated(given_parts, len(want)))
    assert type(got) is bytes
    assert got == want
    if len(want) >= 64:  # copied part by part: none is held twice
        assert all(part == b"" for part in given_parts)


@pytest.mark.parametrize("size", [2999, 3001])
def test_concatenated_refuses_parts_that_do_not_add_up(small_steps: int, size: int) -> None:
    with pytest.raises(ValueError, match="bytes"):
        run_sliced(concatenated([b"a" * 1000] * 3, size))


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.binary(max_size=2500), max_size=12), st.booleans())
def test_copied_into_fills_the_target_with_the_join_a_chunk_per_slice(
    small_steps: int, parts: list[bytes], as_views: bool
) -> None:
    """Rows and parts larger than a chunk alike; bytes or byte views; no slice copies
    much more than a chunk."""
    given_parts: list[bytes | memoryview] = [memoryview(p) if as_views else p for p in parts]
    target = np.full(sum(map(len, parts)), 7, np.uint8)
    slices = copied_into(given_parts, target)
    copied_before = 0
    for _ in slices:
        filled = int(np.count_nonzero(target != 7))  # a lower bound of what was copied
        assert filled - copied_before <= 2 * small_steps + 2500
        copied_before = filled
    assert target.tobytes() == b"".join(parts)


@pytest.mark.parametrize("extra", [-1, 1])
def test_copied_into_refuses_parts_that_do_not_fill_the_target(extra: int) -> None:
    target = np.zeros(10 + extra, np.uint8)
    with pytest.raises(ValueError, match="the parts hold"):
        run_sliced(copied_into([b"01234", memoryview(b"56789")], target))


def test_many_small_parts_end_a_slice_by_time_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of rows cost microseconds of Python each: a slice ends when its time is
    up, not only after a chunk of bytes (8 MiB of 8 KiB rows held the GIL 2 ms)."""
    monkeypatch.setattr(_copying, "SliceTimer", lambda: SliceTimer(0.0))  # always due
    rows = [bytes([i]) * 100 for i in range(50)]  # 5,000 bytes, far below a chunk
    target = np.zeros(5000, np.uint8)
    assert sum(1 for _ in copied_into(list(rows), target)) == len(rows)
    assert target.tobytes() == b"".join(rows)
    monkeypatch.setattr(_copying, "_SMALL", 64)  # concatenated copies part by part
    joined = concatenated(list(rows), 5000)
    count = 0
    while True:
        try:
            next(joined)
        except StopIteration as stop:
            assert stop.value == b"".join(rows)
            break
        count += 1
    assert count == len(rows)
