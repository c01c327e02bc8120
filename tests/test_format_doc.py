"""docs/format.md is enough to read a message: an independent reader built from it alone,
checked against rlwire on every golden file and on fresh messages."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import anyio
import lz4.block
import msgspec
import numpy as np
import pytest
import xxhash
import zstandard
from depth import examples
from golden_cases import AS_COLUMNS, CASES, GOLDEN, array_columns
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire


class DocRagged:
    """A ragged array (extension type 6) as docs/format.md describes it."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        self.values, self.offsets = values, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]


class DocColumns(dict[str, Any]):
    """A columns value (extension type 7) kept as its columns: name -> DocRagged, array
    or list."""

    def __init__(self, count: int, columns: dict[str, Any]) -> None:
        super().__init__(columns)
        self.count = count


def read_ragged(fields: Any) -> DocRagged:
    """'Ragged arrays (type 6)' in docs/format.md: ``[values, offsets]``, each an array."""
    values, offsets = fields
    assert isinstance(values, np.ndarray) and values.ndim >= 1
    assert isinstance(offsets, np.ndarray) and offsets.ndim == 1
    assert offsets.dtype == np.dtype("<i8") and len(offsets) >= 1
    assert offsets[0] == 0 and offsets[-1] == len(values)
    assert (np.diff(offsets) >= 0).all()
    return DocRagged(values, offsets)


def _numbers(column: Any) -> Any:
    if not isinstance(column, list):
        return column  # a ragged array, or an array of one value a row, as it is
    kinds = {type(v) for v in column}
    dtypes = {int: np.int64, float: np.float64, bool: np.bool_}
    if column and len(kinds) == 1 and (kind := kinds.pop()) in dtypes:
        return np.array(column, dtypes[kind])
    return column


def read_columns(fields: Any, as_columns: bool) -> Any:
    """'Columns (type 7)' in docs/format.md: ``[count, layout, names, columns]``, as the
    list of rows it stands for, or as its columns."""
    count, layout, names, columns = fields
    assert type(count) is int and count >= 0 and layout in (0, 1)
    assert all(type(n) is str for n in names) and len(set(names)) == len(names)
    assert len(columns) == len(names) and (names or not count)
    for column in columns:  # a chunked column (type 4) is a list once its chunks are read
        assert isinstance(column, DocRagged | np.ndarray | list) and len(column) == count
        assert not isinstance(column, np.ndarray) or column.ndim >= 1
    if as_columns:  # docs/how-to/packed.md: numbers of one kind come back as an array
        return DocColumns(count, {n: _numbers(c) for n, c in zip(names, columns, strict=True)})

    def cell(column: Any, i: int) -> Any:
        if isinstance(column, DocRagged):
            return column.row(i)
        if isinstance(column, np.ndarray) and column.ndim == 1:
            return column[i].item()  # a number, as msgpack would hold it
        return column[i]

    if layout == 1:
        return [[cell(c, i) for c in columns] for i in range(count)]
    return [{n: cell(c, i) for n, c in zip(names, columns, strict=True)} for i in range(count)]


def read_as_documented(
    directory: Path, step: int, rank: int, limit: int = 1 << 30, *, as_columns: bool = False
) -> Any:
    """Follow 'Reading, step by step' in docs/format.md; ``as_columns``: keep each columns
    value (type 7) as its columns rather than make its rows."""
    main = (directory / f"step-{step:08d}.rank-{rank:04d}.rlw").read_bytes()
    magic, major, _minor, env_len, env_sum = struct.unpack_from("<8sHHIQ", main)
    assert magic == b"\x89RLW\r\n\x1a\n" and major == 1
    raw_env = main[24 : 24 + env_len]
    assert xxhash.xxh3_64_intdigest(raw_env) == env_sum
    env = msgspec.msgpack.decode(raw_env)
    assert env["size"] == len(main) and (env["step"], env["rank"]) == (step, rank)
    n = len(env["parts"])
    offsets = struct.unpack(f"<{n}Q", env["offsets"])
    lengths = struct.unpack(f"<{n}Q", env["lengths"])
    parts = [main, b""]
    if 1 in env["parts"]:
        side = (directory / f"step-{step:08d}.rank-{rank:04d}.sidecar.rlw").read_bytes()
        assert side[:8] == b"\x89RLS\r\n\x1a\n" and side[16:32] == env["id"]
        assert len(side) == env["sidecar_size"]
        parts[1] = side
    h_off, h_len = env["header"]
    segments = [main[h_off : h_off + h_len]]
    for part, offset, length in zip(env["parts"], offsets, lengths, strict=True):
        assert offset % 64 == 0
        segments.append(parts[part][offset : offset + length])
    if "checksum" in env:
        assert env["checksum"] == "xxh3-64"
        sums = struct.unpack(f"<{n + 1}Q", env["checksums"])
        assert [xxhash.xxh3_64_intdigest(s) for s in segments] == list(sums)
    if "compression" in env:
        raw_sizes = struct.unpack(f"<{n + 1}Q", env["raw_sizes"])
        ids = env["compression"]
        assert sum(size for cid, size in zip(ids, raw_sizes, strict=True) if cid) <= limit
        for k, (cid, size) in enumerate(zip(ids, raw_sizes, strict=True)):
            if cid == 1:
                segments[k] = lz4.block.decompress(segments[k], uncompressed_size=size)
            elif cid == 2:
                assert zstandard.frame_content_size(segments[k]) == size
                segments[k] = zstandard.ZstdDecompressor().decompress(segments[k])
            else:
                assert cid == 0
            assert len(segments[k]) == size
    header, buffers = segments[0], segments[1:]
    if env["codec"] == "json":
        assert not buffers
        return json.loads(header)
    assert env["codec"] == "msgpack"

    def ext_hook(code: int, data: memoryview) -> object:
        # The payloads of types 6 and 7 hold extension values themselves.
        fields = msgspec.msgpack.decode(data, ext_hook=ext_hook if code in (6, 7) else None)
        if code == 1:
            index, dtype, shape, order = fields
            return np.frombuffer(buffers[index], dtype).reshape(shape, order=order)
        if code == 2:
            dtype, shape, order, raw = fields
            return np.frombuffer(raw, dtype).reshape(shape, order=order)
        if code in (4, 5):
            index, count, ranges = fields
            out: Any = {} if code == 5 else []
            for start, end in zip(ranges[::2], ranges[1::2], strict=True):
                part = msgspec.msgpack.decode(buffers[index][start:end], ext_hook=ext_hook)
                if code == 5:
                    out.update(part)
                else:
                    out.extend(part)
            assert len(out) == count
            return out
        if code == 6:
            return read_ragged(fields)
        if code == 7:
            return read_columns(fields, as_columns)
        assert code == 3
        return buffers[fields[0]]

    return msgspec.msgpack.decode(header, ext_hook=ext_hook)


def assert_same(got: Any, want: Any) -> None:
    """Compare an independently read value with what rlwire returned, or either with
    the object sent: the same values, arrays of the same dtype."""
    if isinstance(want, rlwire.Chunked):  # received as one contiguous array
        assert isinstance(got, np.ndarray) and got.flags.c_contiguous
        want = want.to_array()
    if isinstance(want, rlwire.Ragged | DocRagged):
        assert isinstance(got, rlwire.Ragged | DocRagged)
        assert_same(got.offsets, want.offsets)
        assert_same(got.values, want.values)
    elif isinstance(want, rlwire.Columns | DocColumns):
        if isinstance(got, list) and isinstance(want, rlwire.Columns):  # received as rows
            # A 1-D array column's numbers come in rows as Python numbers (docs/format.md).
            rows = [{k: _python(v) for k, v in row.items()} for row in want.rows()]
            assert_same(got, rows)
            return
        assert isinstance(got, rlwire.Columns | DocColumns) and _rows(got) == _rows(want)
        assert list(got.keys()) == list(want.keys())
        for name, column in want.items():
            assert_same(got[name], column)
    elif isinstance(want, msgspec.Struct):
        _assert_same_struct(got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (sorted(got), sorted(want))
        for key, value in want.items():
            assert_same(got[key], value)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for x, y in zip(got, want, strict=True):
            assert_same(x, y)
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        assert got.shape == want.shape and np.array_equal(got, want)
    elif isinstance(want, bytes | memoryview):
        assert bytes(got) == bytes(want)
    else:
        assert got == want and type(got) is type(want), (got, want)


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _rows(columns: rlwire.Columns | DocColumns) -> int:
    return columns.count if isinstance(columns, DocColumns) else len(columns)


def _assert_same_struct(got: Any, want: msgspec.Struct) -> None:
    """A Struct: the same Struct, or what msgspec writes for it (an array of its fields
    with ``array_like``, else a map of their encoded names)."""
    fields = msgspec.structs.fields(want)
    if type(got) is type(want):
        for f in fields:
            assert_same(getattr(got, f.name), getattr(want, f.name))
    elif want.__struct_config__.array_like:
        assert_same(got, [getattr(want, f.name) for f in fields])
    else:
        assert_same(got, {f.encode_name: getattr(want, f.name) for f in fields})


@pytest.mark.parametrize("name", sorted(CASES))
def test_independent_reader_reads_golden_files(name: str) -> None:
    """The reader built from the page gets the object sent, and what rlwire decodes
    (into plain builtins: arrays, Ragged, rows as dicts or lists)."""
    make, _, _ = CASES[name]
    ours = read_as_documented(GOLDEN / name, 0, 0)
    assert_same(ours, make())
    with rlwire.open_receiver(GOLDEN / name, type=Any) as receiver:
        assert_same(ours, receiver.receive(timeout=5))


@pytest.mark.parametrize("name", sorted(AS_COLUMNS))
def test_independent_reader_reads_golden_columns(name: str) -> None:
    """Kept as columns, the reader's columns are rlwire's ``as_columns`` ones."""
    ours = read_as_documented(GOLDEN / name, 0, 0, as_columns=True)
    with rlwire.open_receiver(GOLDEN / name, type=Any, as_columns=True) as receiver:
        theirs = receiver.receive(timeout=5)
    assert_same(ours, theirs)
    assert_same(theirs, AS_COLUMNS[name]())


def test_independent_reader_matches_a_fresh_message(tmp_path: Path) -> None:
    obj = {
        "routed_experts": np.arange(100_000, dtype=np.uint16).reshape(500, 50, 4) % 7,
        "fortran": np.asfortranarray(np.arange(6000, dtype=">f8").reshape(60, 100)),
        "small": np.array([1.5, 2.5], dtype=np.float32),
        "blob": b"x" * 100_000,
    }

    async def send() -> None:
        async with rlwire.open_sender(
            tmp_path, sidecar=["routed_experts"], compression="zstd"
        ) as sender:
            # A dict's keys vary by step: the name not met yet is warned about, once.
            with pytest.warns(rlwire.SidecarWarning, match="'routed_experts' matched no"):
                await sender.send({"a": 1})
            await sender.send(obj)

    anyio.run(send)
    with rlwire.open_receiver(tmp_path, type=dict, start_step=1) as receiver:
        ours = receiver.receive(timeout=5)
    assert_same(read_as_documented(tmp_path, 1, 0), ours)
    assert_same(ours, obj)


_DTYPES = ("<i8", "<i4", "|u1", "<f4", ">f8", "|b1")


@st.composite
def rows_of_arrays(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A list of dicts with the same keys, each field's arrays alike in every row (a
    ragged column) or not (in dtype, trailing shape, dimensions or presence: a column
    of values), of any length including 0, small or large enough to go out-of-band."""
    count = draw(st.integers(1, 6))
    fields: dict[str, list[Any]] = {}
    for k in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(_DTYPES))
        tail = draw(st.sampled_from([(), (3,), (2, 2)]))
        scale = draw(st.sampled_from([1, 700]))  # 700 rows of 8 bytes: out-of-band
        alike = draw(st.booleans())  # else each row may differ, or be None
        column = []
        for i in range(count):
            row_dtype = dtype if alike or draw(st.booleans()) else draw(st.sampled_from(_DTYPES))
            row_tail = tail if alike or k != 3 else draw(st.sampled_from([(), (3,)]))
            n = draw(st.integers(0, 5)) * scale
            size = n * int(np.prod(row_tail, dtype=np.int64))
            value = (np.arange(size) % 5 + i).astype(row_dtype).reshape(n, *row_tail)
            column.append(value if alike or draw(st.integers(0, 5)) else None)
        fields[f"f{k}"] = column
    fields["env"] = [f"env-{i}" for i in range(count)]
    return [{name: column[i] for name, column in fields.items()} for i in range(count)]


@settings(max_examples=examples(25), deadline=None)
@given(rows=rows_of_arrays(), sidecar=st.booleans())
def test_independent_reader_matches_fresh_columns(
    rows: list[dict[str, Any]], sidecar: bool
) -> None:
    """Whatever mix of fields a list of samples has, the reader built from the page gets
    the rows rlwire returns (and that were sent), and its columns are rlwire's."""
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)

        async def send() -> None:
            side = ["f0"] if sidecar else []
            async with rlwire.open_sender(directory, sidecar=side) as sender:
                await sender.send({"samples": rows})

        anyio.run(send)
        with rlwire.open_receiver(directory, type=Any) as receiver:
            theirs = receiver.receive(timeout=5)
        ours = read_as_documented(directory, 0, 0)
        assert_same(ours, theirs)
        assert_same(ours, {"samples": rows})
        with rlwire.open_receiver(directory, type=Any, as_columns=True) as receiver:
            theirs_columns = receiver.receive(timeout=5)
        assert_same(read_as_documented(directory, 0, 0, as_columns=True), theirs_columns)


def read_mark_as_documented(path: Path, magic: bytes) -> int:
    """Follow 'Marks' in docs/format.md."""
    found, major, minor, step = struct.unpack("<4sHHQ", path.read_bytes())
    assert (found, major, minor) == (magic, 1, 1)
    return int(step)


def test_marks_are_as_documented(tmp_path: Path) -> None:
    async def send() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            for _ in range(3):
                await sender.send(rlwire.TrainingBatch(samples=[]))
            await sender.finish()

    anyio.run(send)
    with rlwire.open_receiver(tmp_path) as receiver:
        assert len(list(receiver)) == 3  # asks for step 3 last: moved past 0-2
    assert read_mark_as_documented(tmp_path / "end.rlw", b"RLWE") == 3
    assert read_mark_as_documented(tmp_path / "consumed.rank-0000.rlw", b"RLWC") == 3


def test_independent_reader_reads_array_columns(tmp_path: Path) -> None:
    sent = array_columns()

    async def send() -> None:
        async with rlwire.open_sender(tmp_path, sidecar=["logits"]) as sender:
            await sender.send(sent)

    anyio.run(send)
    with rlwire.open_receiver(tmp_path, type=Any, as_columns=True) as receiver:
        theirs = receiver.receive(timeout=5)
    ours = read_as_documented(tmp_path, 0, 0, as_columns=True)
    assert_same(ours, theirs)
    for key, columns in sent.items():
        for name in columns.names:
            want, got = columns[name], theirs[key][name]
            if isinstance(want, np.ndarray):  # dtype and shape as sent, not float64
                assert (got.dtype, got.shape) == (want.dtype, want.shape), (key, name)
                assert np.array_equal(got, want), (key, name)
    with rlwire.open_receiver(tmp_path, type=Any) as receiver:
        rows = receiver.receive(timeout=5)
    assert_same(read_as_documented(tmp_path, 0, 0), rows)
    first = rows["batch"][1]
    assert type(first["reward"]) is float and type(first["done"]) is bool
    assert first["seed"] == 2**63 + 5 and first["turns"] == 1
    assert first["hidden"].tolist() == [4.0, 5.0, 6.0, 7.0] and rows["none"] == []
