"""Tests of rlwire.codecs.jsonl: JSON-lines files written and read, sync and async:
streaming, atomic replacement, appending, corrupt input and cancellation."""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import re
import tracemalloc
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import hypothesis.extra.numpy as hnp
import msgspec
import numpy as np
import orjson
import pytest
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire import CorruptFrameError, DecodeError, EncodeError
from rlwire.codecs._json.codec import JsonCodec
from rlwire.codecs.jsonl import (
    DEFAULT_MAX_LINE_BYTES,
    adump_jsonl,
    aload_jsonl,
    dump_jsonl,
    load_jsonl,
)
from rlwire.errors import ConfigError, FrameTooLargeError, TransportError

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

codec = JsonCodec()


def _jsonl(records: list[Any]) -> bytes:
    buf = io.BytesIO()
    dump_jsonl(records, buf)
    return buf.getvalue()


# Records of any JSON value, numeric arrays (NaN and Inf included, any byte order) too.
NUMERIC_DTYPES = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    hnp.arrays(NUMERIC_DTYPES, hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4)),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)
RECORDS = st.lists(st.dictionaries(st.text(max_size=5), VALUES, max_size=3), max_size=5)


# -- writing and reading --------------------------------------------------------------


@SETTINGS
@given(records=RECORDS)
def test_lines_are_the_codec_documents_and_read_back(records: list[dict[str, Any]]) -> None:
    buf = io.BytesIO()
    assert dump_jsonl(records, buf) == len(records)
    data = buf.getvalue()
    assert data.count(b"\n") == len(records)
    # The value rules are the codec's (tested in test_json.py): each line is its document.
    assert data == b"".join(bytes(codec.encode(r).header) + b"\n" for r in records)
    assert list(load_jsonl(io.BytesIO(data))) == [orjson.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=repr)
def test_nan_and_inf_are_written_as_null(value: float) -> None:
    records = [{"v": value}, {"v": np.float32(value)}, {"v": np.array([1.0, value])[::-1]}]
    assert _jsonl(records) == b'{"v":null}\n{"v":null}\n{"v":[null,1.0]}\n'


class Count(msgspec.Struct):
    b: int


class Rollout(msgspec.Struct):
    i: int
    ids: np.ndarray
    lp: np.ndarray


def test_jsonl_round_trip_through_a_path(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    records = [
        {"i": i, "ids": np.arange(i % 50), "lp": np.full(3, -0.5, np.float32)} for i in range(3000)
    ]
    assert dump_jsonl(iter(records), path) == 3000
    assert os.listdir(tmp_path) == ["r.jsonl"]
    typed = list(load_jsonl(str(path), type=Rollout))
    assert [r.i for r in typed] == list(range(3000))
    assert np.array_equal(typed[49].ids, np.arange(49))
    assert typed[0].lp.dtype == np.float64
    with pytest.raises(ConfigError, match="cannot decode into"):
        list(load_jsonl(path, type=dict[str, np.ndarray | int]))


def test_jsonl_type_mismatch_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"b": 1}\n\n{"b": "x"}\n')
    with pytest.raises(DecodeError, match=r"r\.jsonl: line 3: does not match Count.*\$\.b"):
        list(load_jsonl(path, type=Count))


def test_jsonl_type_applies_to_each_line() -> None:
    with pytest.raises(DecodeError, match="line 1"):
        list(load_jsonl(io.BytesIO(b'{"a": 1}\n'), type=list[int]))


def test_jsonl_blank_lines_crlf_and_missing_final_newline() -> None:
    data = b'\n{"a": 1}\r\n   \n\t\n[2]\r\n{"b": null}'
    assert list(load_jsonl(io.BytesIO(data))) == [{"a": 1}, [2], {"b": None}]
    assert list(load_jsonl(io.BytesIO(b""))) == []
    assert list(load_jsonl(io.BytesIO(b"\n\n  "))) == []


def test_jsonl_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2,}\n{"a": 3}\n')
    records = load_jsonl(path)
    assert next(records) == {"a": 1}
    with pytest.raises(CorruptFrameError, match=rf"{re.escape(str(path))}: line 3: malformed JSON"):
        next(records)


def test_jsonl_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": [1, 2')
    with pytest.raises(CorruptFrameError, match="line 2: truncated"):
        list(load_jsonl(path))


@SETTINGS
@given(records=RECORDS.filter(bool), data=st.data())
def test_jsonl_damaged_files_give_corrupt_frame_errors_only(
    records: list[dict[str, Any]], data: st.DataObject
) -> None:
    raw = _jsonl(records)
    cut = data.draw(st.integers(1, len(raw) - 1))
    if b"\n" not in raw[cut - 1 : cut + 1]:  # cut inside a line: the last record is truncated
        with pytest.raises(CorruptFrameError, match="truncated"):
            list(load_jsonl(io.BytesIO(raw[:cut])))
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CorruptFrameError):
        list(load_jsonl(io.BytesIO(bytes(damaged))))


class CountingReader(io.RawIOBase):
    """A file object that records how many bytes each read asks for and has given."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)
        self.requests: list[int] = []
        self.given = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        self.requests.append(size)
        chunk = self.inner.read(size)
        self.given += len(chunk)
        return chunk


def _big_file() -> bytes:
    record = {"text": "x" * 2000, "ids": np.arange(500)}
    return _jsonl([record] * 2000)  # ~6 MB


def test_load_jsonl_streams_in_bounded_reads() -> None:
    data = _big_file()
    reader = CountingReader(data)
    records = load_jsonl(reader)
    first = next(records)
    assert first["text"] == "x" * 2000
    assert reader.given <= 1 << 20 < len(data)  # the first record came before the rest was read
    assert sum(1 for _ in records) == 1999
    assert all(0 < n <= 1 << 20 for n in reader.requests)  # never read(-1)
    assert reader.given == len(data)


def test_max_line_bytes_bounds_memory() -> None:
    reader = CountingReader(b"[" + b"1," * (3 << 20))
    with pytest.raises(FrameTooLargeError, match="line 1: longer than max_line_bytes=1000000"):
        list(load_jsonl(reader, max_line_bytes=1_000_000))
    assert reader.given <= 1_000_000 + (1 << 20)
    ok = b'{"a": "' + b"y" * 2000 + b'"}\n'
    assert (
        list(load_jsonl(io.BytesIO(ok * 3), max_line_bytes=len(ok) - 1)) == [{"a": "y" * 2000}] * 3
    )
    with pytest.raises(FrameTooLargeError, match="line 2"):
        list(load_jsonl(io.BytesIO(b"1\n" + ok), max_line_bytes=len(ok) - 2))
    with pytest.raises(FrameTooLargeError, match="line 2"):
        list(load_jsonl(io.BytesIO(b"1\n" + ok.rstrip()), max_line_bytes=len(ok) - 2))
    assert DEFAULT_MAX_LINE_BYTES == 256 << 20
    with pytest.raises(ConfigError):
        list(load_jsonl(io.BytesIO(b""), max_line_bytes=0))


def test_a_line_of_tiny_values_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """A JSON-lines file gets the decode bound of every message, per line: 16 MiB of
    ``{},`` would build some 0.9 GB of dicts, over 256 MiB + 16 x its length."""
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b'{"ok": 1}\n[' + b"{}," * ((16 << 20) // 3) + b"{}]\n")
    records = load_jsonl(path)
    assert next(records) == {"ok": 1}
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLargeError, match=r"line 2: parsing it could build") as err:
            next(records)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.where == str(path)
    assert peak < 200 << 20
    honest = [{"ids": list(range(200_000))}] * 2  # 1.3 MB lines: counted, and accepted
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in honest))
    assert list(load_jsonl(path)) == honest


def test_dump_jsonl_writes_while_records_are_still_coming(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sizes: list[int] = []

    def records() -> Iterator[dict[str, Any]]:
        for i in range(3000):
            if i == 2500:
                assert not path.exists()  # not visible before the end ...
                (tmp,) = tmp_path.iterdir()
                sizes.append(tmp.stat().st_size)  # ... but being written already
            yield {"i": i, "text": "z" * 1000}

    assert dump_jsonl(records(), path) == 3000
    assert sizes[0] > 1 << 20
    assert path.stat().st_size > 3_000_000
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_failed_dump_leaves_nothing_at_the_destination(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    records: list[Any] = [{"i": i, "text": "z" * 1000} for i in range(3000)]
    records[2900] = {"extras": {"x": np.array(["s"])}}
    with pytest.raises(
        EncodeError, match=r"^record 2900: \$\.extras\.x: numpy arrays of dtype <U1"
    ):
        dump_jsonl(records, path)
    assert os.listdir(tmp_path) == []
    path.write_bytes(b'{"old": true}\n')
    with pytest.raises(EncodeError):
        dump_jsonl(records, path)
    assert path.read_bytes() == b'{"old": true}\n'
    assert os.listdir(tmp_path) == ["out.jsonl"]

    def interrupted() -> Iterator[Any]:
        yield from records[:2000]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dump_jsonl(interrupted(), path)
    assert path.read_bytes() == b'{"old": true}\n'
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_append_writes_whole_lines_up_to_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert dump_jsonl([{"a": 1}], path, append=True) == 1
    assert dump_jsonl([{"a": 2}, {"a": 3}], path, append=True) == 2
    with pytest.raises(EncodeError, match=r"^record 2: \$\.b: "):
        dump_jsonl([{"a": 4}, {"a": 5}, {"b": object()}, {"a": 6}], path, append=True)
    assert [r["a"] for r in load_jsonl(path)] == [1, 2, 3, 4, 5]
    buf = io.BytesIO()
    with pytest.raises(EncodeError, match=r"^record 1: \$: dict keys must be str"):
        dump_jsonl([{"a": 1}, {2: 3}], buf)
    assert buf.getvalue() == b'{"a":1}\n'


def test_file_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="append=True applies to paths"):
        dump_jsonl([], io.BytesIO(), append=True)
    with pytest.raises(ConfigError, match="binary file"):
        dump_jsonl([], io.StringIO())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="binary file"):
        list(load_jsonl(io.StringIO("{}\n")))  # type: ignore[arg-type]
    with pytest.raises(TransportError, match="cannot create a file") as info:
        dump_jsonl([{}], tmp_path / "missing-dir" / "x.jsonl")
    assert isinstance(info.value, OSError)
    with pytest.raises(TransportError, match="cannot open the file"):
        list(load_jsonl(tmp_path / "nope.jsonl"))
    assert os.listdir(tmp_path) == []


# -- async ----------------------------------------------------------------------------


async def _agen(records: list[Any], seen: list[int] | None = None) -> AsyncIterator[Any]:
    for i, record in enumerate(records):
        if seen is not None:
            seen.append(i)
        await anyio.lowlevel.checkpoint()
        yield record


class Numbered(msgspec.Struct):
    i: int
    x: np.ndarray


@pytest.mark.anyio
async def test_async_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    records = [{"i": i, "x": np.arange(i % 5, dtype=np.float32) / 2} for i in range(700)]
    expected = _jsonl(records + records[:300])
    assert await adump_jsonl(records, path) == 700
    assert await adump_jsonl(_agen(records[:300]), path, append=True, limiter=1) == 300
    got = [r async for r in aload_jsonl(path, type=Numbered, limiter=2)]
    assert len(got) == 1000
    assert [r.i for r in got] == list(range(700)) + list(range(300))
    assert np.array_equal(got[703].x, [0.0, 0.5, 1.0])
    assert got[703].x.dtype == np.float64
    assert path.read_bytes() == expected


@pytest.mark.anyio
async def test_aload_streams_records() -> None:
    reader = CountingReader(_big_file())
    records = aload_jsonl(reader)
    try:
        first = await records.__anext__()
        assert first["ids"] == list(range(500))
        assert reader.given <= 1 << 20
    finally:
        await records.aclose()
    assert all(0 < n <= 1 << 20 for n in reader.requests)


@pytest.mark.anyio
async def test_adump_from_async_iterable_streams_in_batches(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    seen: list[int] = []
    sizes: list[int] = []

    async def records() -> AsyncIterator[Any]:
        async for record in _agen([{"text": "q" * 1000}] * 3000, seen):
            if len(seen) == 2000:
                (tmp,) = tmp_path.iterdir()
                sizes.append(tmp.stat().st_size)
            yield record

    assert await adump_jsonl(records(), path) == 3000
    assert sizes[0] > 1 << 20
    assert [r["text"] for r in load_jsonl(path)] == ["q" * 1000] * 3000


@pytest.mark.anyio
async def test_async_errors_and_cancellation_leave_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    records: list[Any] = [{"i": i, "pad": "p" * 2000} for i in range(2000)]
    bad = [*records, {"z": {1, object()}}]
    with pytest.raises(EncodeError, match=r"^record 2000: \$\.z: "):
        await adump_jsonl(bad, path)
    with pytest.raises(EncodeError, match=r"^record 2000: \$\.z: "):
        await adump_jsonl(_agen(bad), path)
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
async def test_cancelled_adump_leaves_nothing(tmp_path: Path) -> None:
    """Cancelled once lines are being written (the temporary file holds several runs of lines),
    from an async iterable on the loop and from an iterable read in a worker thread."""
    path = tmp_path / "x.jsonl"
    record = {"pad": "p" * 2000}

    def cancel_mid_write(n: int, cancel: Any) -> None:
        if n == 3000:
            (tmp,) = tmp_path.iterdir()
            assert tmp.stat().st_size > 1 << 20
            cancel()

    with anyio.CancelScope() as scope:

        async def endless() -> AsyncGenerator[Any, None]:
            for n in itertools.count():
                await anyio.lowlevel.checkpoint()
                cancel_mid_write(n, scope.cancel)
                yield record

        async with contextlib.aclosing(endless()) as gen:
            await adump_jsonl(gen, path)
    assert scope.cancelled_caught
    assert os.listdir(tmp_path) == []

    with anyio.CancelScope() as scope:

        def endless_in_thread() -> Iterator[Any]:
            for n in itertools.count():
                cancel_mid_write(n, lambda: anyio.from_thread.run_sync(scope.cancel))
                yield record

        await adump_jsonl(endless_in_thread(), path)
    assert scope.cancelled_caught
    assert os.listdir(tmp_path) == []


@pytest.mark.anyio
async def test_aload_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"[1]\n[2]\n{oops}\n")
    got: list[Any] = []
    with pytest.raises(CorruptFrameError, match="line 3: malformed JSON"):
        async for record in aload_jsonl(path):
            got.append(record)
    assert got == [[1], [2]]
