"""Manifests of stored steps and parts, and rows [a, b) of a column read through one
(``receiver.manifest`` / ``read_rows``), on files and S3; asyncio and trio."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest
from s3_server import FaultProxy

import rlwire

pytestmark = pytest.mark.anyio

NAMES = ("token_ids", "mask", "logprobs", "routed_experts")


def _columns(rows: int = 6, seed: int = 0, tokens: int = 400) -> rlwire.Columns:
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(0, tokens, rows)]
    lengths[1] = 0  # an empty row
    return rlwire.Columns(
        {
            "token_ids": rlwire.Ragged.from_arrays(
                [rng.integers(0, 50_000, n, dtype=np.int32) for n in lengths]
            ),
            "mask": rlwire.Ragged.from_arrays([rng.random(n) < 0.5 for n in lengths]),
            "logprobs": rlwire.Ragged.from_arrays(
                [-rng.random(n).astype(np.float32) for n in lengths]
            ),
            "temperatures": rlwire.Ragged.from_arrays([np.ones(n, np.float32) for n in lengths]),
            "advantages": rlwire.Ragged.from_arrays([np.zeros(n, np.float32) for n in lengths]),
            "routed_experts": rlwire.Ragged.from_arrays(
                [rng.integers(0, 64, (n, 4, 2), dtype=np.uint8) for n in lengths]
            ),
            "env_name": ["gsm8k"] * rows,
        }
    )


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "file":
        return str(tmp_path / "run"), {}
    return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")


def _same(got: rlwire.Ragged, sent: rlwire.Ragged, a: int, b: int) -> None:
    assert len(got) == b - a
    assert [r.tolist() for r in got] == [sent[i].tolist() for i in range(a, b)]
    assert got.offsets[0] == 0 and got.values.dtype == sent.values.dtype


async def _send(url: str, options: dict[str, Any], *batches: Any, **kw: Any) -> None:
    async with rlwire.open_sender(url, storage_options=options, **kw) as sender:
        for batch in batches:
            await sender.send(batch)


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_a_manifest_names_columns_rows_sizes_and_reads_any_rows(
    store: tuple[str, dict[str, Any]], compression: str | None
) -> None:
    url, options = store
    cols = _columns()
    batch = rlwire.TrainingBatch(samples=cols)  # type: ignore[arg-type]
    await _send(url, options, batch, sidecar=("routed_experts",), compression=compression)
    async with rlwire.open_receiver(url, storage_options=options) as receiver:
        manifest = await receiver.amanifest(0)
        assert manifest is not None
        assert (manifest.step, manifest.rank, manifest.part, manifest.key) == (0, 0, None, None)
        assert manifest.rows == 6 and manifest.field == "samples" and manifest.codec == "msgpack"
        assert [c.name for c in manifest.columns] == list(cols.names)
        by = {c.name: c for c in manifest.columns}
        assert by["token_ids"].dtype == "<i4" and by["token_ids"].row_shape == ()
        assert by["routed_experts"].row_shape == (4, 2) and by["mask"].dtype == "|b1"
        assert by["env_name"].dtype is None and by["env_name"].buffers == ()
        assert all(len(c.checksums) == len(c.buffers) for c in manifest.columns)
        if compression is None:
            assert by["token_ids"].size >= cols["token_ids"].values.nbytes
        if url.startswith("/"):
            assert manifest.size == sum(p.stat().st_size for p in Path(url).glob("step-*.rlw"))
        # The wire forms: msgpack and JSON of the Struct, and back.
        assert rlwire.Manifest.decode(manifest.encode()) == manifest
        assert msgspec.json.decode(msgspec.json.encode(manifest), type=rlwire.Manifest) == manifest
        for name in NAMES:
            for a, b in ((0, 6), (1, 2), (2, 5), (5, 6), (3, 3)):
                _same(await receiver.aread_rows(manifest, name, a, b), cols[name], a, b)
        assert receiver.next_step == 0  # a manifest does not move the receiver
        received = await receiver.areceive()
    assert np.array_equal(received.samples[2].token_ids, cols["token_ids"][2])


async def test_rows_of_fortran_order_values_are_read_as_stored(
    store: tuple[str, dict[str, Any]],
) -> None:
    """A ragged column whose values are a Fortran-order block is stored as one (its
    rows are not contiguous): read_rows gives its rows as receive does."""
    url, options = store
    values = np.asfortranarray(np.arange(3000 * 4, dtype=np.int32).reshape(3000, 4))
    ids = rlwire.Ragged.from_lengths(values, [1000, 0, 2000])
    await _send(url, options, {"samples": rlwire.Columns({"ids": ids})})
    async with rlwire.open_receiver(url, storage_options=options, type=dict) as receiver:
        manifest = await receiver.amanifest(0)
        assert manifest is not None
        for a, b in ((0, 3), (0, 1), (2, 3), (1, 2)):
            _same(await receiver.aread_rows(manifest, "ids", a, b), ids, a, b)


async def test_parts_have_manifests_and_any_receiver_reads_their_rows(
    store: tuple[str, dict[str, Any]],
) -> None:
    url, options = store
    groups = [_columns(rows=3, seed=s) for s in (1, 2)]
    async with rlwire.open_sender(url, storage_options=options) as sender:
        async with sender.open_step(0, ranks=2) as writer:
            for i, group in enumerate(groups):
                await writer.put(group, key=f"g{i}", rank=1)  # type: ignore[arg-type]
    async with rlwire.open_receiver(url, storage_options=options) as rank0:
        with pytest.raises(rlwire.ConfigError, match="part by part"):
            await rank0.amanifest(0, rank=1)
        assert await rank0.amanifest(0, rank=1, part=2) is None
        manifest = await rank0.amanifest(0, rank=1, part=1)
        assert manifest is not None
        assert (manifest.part, manifest.key, manifest.rank, manifest.field) == (1, "g1", 1, None)
        handed = rlwire.Manifest.decode(manifest.encode())  # as an orchestrator passes it
    async with rlwire.open_receiver(url, rank=1, storage_options=options) as rank1:
        _same(
            await rank1.aread_rows(handed, "routed_experts", 1, 3),
            groups[1]["routed_experts"],
            1,
            3,
        )


async def test_a_row_read_on_s3_fetches_the_head_the_offsets_and_those_rows_only(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    url = f"{s3_url}/run"
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, 50_000, 100_000 + i, dtype=np.int32) for i in range(8)]
    cols = rlwire.Columns({"token_ids": rlwire.Ragged.from_arrays(rows)})
    await _send(url, s3_endpoint, {"samples": cols})
    with FaultProxy(s3_endpoint) as proxy:
        async with rlwire.open_receiver(url, storage_options=proxy.options) as receiver:
            manifest = await receiver.amanifest(0)
            assert manifest is not None
            made = [r for m, t, r in proxy.ranges if m == "GET" and "step-" in t]
            proxy.ranges.clear()
            got = await receiver.aread_rows(manifest, "token_ids", 3, 5)
        gets = [r for m, t, r in proxy.ranges if m == "GET" and "step-" in t]
    _same(got, cols["token_ids"], 3, 5)
    assert made == [f"bytes=0-{(64 << 10) - 1}"]  # the manifest: the first ranged GET only
    # The head again (is it still this message?), then the rows' bytes: the offsets are
    # inline (9 of them), else they would be one more small range.
    assert gets[0] == f"bytes=0-{(64 << 10) - 1}" and len(gets) == 2
    start, _, end = gets[1].removeprefix("bytes=").partition("-")
    assert int(end) - int(start) + 1 == (rows[3].nbytes + rows[4].nbytes)


async def test_errors_are_typed_and_name_what_is_wrong(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    cols = _columns()
    await _send(url, {}, rlwire.TrainingBatch(samples=cols))  # type: ignore[arg-type]
    async with rlwire.open_receiver(url) as receiver:
        assert await receiver.amanifest(1) is None
        manifest = await receiver.amanifest(0)
        assert manifest is not None
        with pytest.raises(rlwire.FieldNotFoundError, match=r"step 0.*'values'.*token_ids"):
            await receiver.aread_rows(manifest, "values", 0, 1)
        with pytest.raises(rlwire.ConfigError, match=r"rows 4:7 .* 6 rows of 'mask'"):
            await receiver.aread_rows(manifest, "mask", 4, 7)
        with pytest.raises(rlwire.ConfigError, match="rows 3:2"):
            await receiver.aread_rows(manifest, "mask", 3, 2)
        with pytest.raises(rlwire.ConfigError, match="'env_name' is not ragged"):
            await receiver.aread_rows(manifest, "env_name", 0, 1)
        other = msgspec.structs.replace(manifest, url=str(tmp_path / "elsewhere"))
        with pytest.raises(rlwire.StaleManifestError, match="elsewhere"):
            await receiver.aread_rows(other, "mask", 0, 1)
    # The step written again: same name, another message.
    await _send(url, {}, rlwire.TrainingBatch(samples=cols), on_existing="overwrite")
    async with rlwire.open_receiver(url) as receiver:
        with pytest.raises(rlwire.StaleManifestError, match="written again") as caught:
            await receiver.aread_rows(manifest, "mask", 0, 1)
        assert isinstance(caught.value, rlwire.RlwireError)
        fresh = await receiver.amanifest(0)
        assert fresh is not None and fresh.id != manifest.id
        for path in Path(url).glob("step-*"):
            path.unlink()
        with pytest.raises(rlwire.StaleManifestError, match="no longer stored"):
            await receiver.aread_rows(fresh, "mask", 0, 1)
    with pytest.raises(rlwire.ClosedError):
        receiver.manifest(0)


async def test_a_limit_met_by_a_manifest_or_a_row_read_names_the_file_and_the_step(
    store: tuple[str, dict[str, Any]],
) -> None:
    """``max_decompressed_bytes`` met while a manifest decompressed a message's header,
    or a row read a column's values, raised a FrameTooLargeError naming no file (the
    manifest's not even its step), where a receive names the step's file."""
    url, options = store
    n = 2000
    ids = rlwire.Ragged.from_arrays([np.full(500, i, np.int32) for i in range(n)])
    big_header = {"samples": rlwire.Columns({"ids": ids, "env": ["gsm8k" * 10] * n})}
    values = rlwire.Ragged.from_arrays([np.zeros(50_000, np.int32)] * 9)
    await _send(
        url, options, big_header, {"samples": rlwire.Columns({"ids": values})}, compression="zstd"
    )
    async with rlwire.open_receiver(url, storage_options=options) as receiver:
        manifest = await receiver.amanifest(1)
    assert manifest is not None
    limits = rlwire.Limits(max_decompressed_bytes=50_000)
    async with rlwire.open_receiver(url, storage_options=options, limits=limits) as receiver:
        with pytest.raises(rlwire.FrameTooLargeError) as of_manifest:
            await receiver.amanifest(0)
        with pytest.raises(rlwire.FrameTooLargeError) as of_rows:
            await receiver.aread_rows(manifest, "ids", 0, 9)
    for caught, step in ((of_manifest, 0), (of_rows, 1)):
        assert f"/step-{step:08d}.rank-0000.rlw: " in str(caught.value), str(caught.value)
        assert (caught.value.step, caught.value.rank) == (step, 0)


def test_damaged_offsets_are_caught_and_a_damaged_row_outside_the_range_is_not(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "run")
    rows = [np.arange(1000 + i, dtype=np.int64) for i in range(600)]  # offsets out-of-band
    cols = rlwire.Columns({"token_ids": rlwire.Ragged.from_arrays(rows)})
    with rlwire.open_sync_sender(url) as sender:
        sender.send({"samples": cols})
    with rlwire.open_receiver(url) as receiver:
        manifest = receiver.manifest(0)
        assert manifest is not None
        values, offsets = manifest.columns[0].buffers
    main = next(Path(url).glob("step-*.rlw"))
    data = bytearray(main.read_bytes())
    with rlwire.open_receiver(url) as receiver:  # where the buffers lie, from the envelope
        from rlwire.transport._heads import read_head_of

        head = read_head_of(receiver._source, 0, 0, None)
        assert head is not None
        values_at, offsets_at = head.offsets[values], head.offsets[offsets]
    data[values_at] ^= 0xFF  # row 0's first value
    main.write_bytes(data)
    with rlwire.open_receiver(url) as receiver:
        got = receiver.read_rows(manifest, "token_ids", 5, 7)  # not row 0: not read
        assert [r.tolist() for r in got] == [rows[5].tolist(), rows[6].tolist()]
        with pytest.raises(ValueError):
            got.values[0] = 1  # views over the mapped file, read-only
        row0 = receiver.read_rows(manifest, "token_ids", 0, 1)
        assert row0[0][0] != 0  # the damage is there: a sub-range cannot be checked
    data[offsets_at + 8] ^= 0x01
    main.write_bytes(data)
    with rlwire.open_receiver(url) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match=r"buffer 1 .* checksum") as caught:
            receiver.read_rows(manifest, "token_ids", 5, 7)
        assert (caught.value.step, caught.value.rank) == (0, 0)


def test_sources_that_keep_nothing_have_no_manifests(tmp_path: Path) -> None:
    with rlwire.open_receiver(f"zmq+ipc://{tmp_path}/run.sock") as receiver:
        with pytest.raises(rlwire.ConfigError, match="manifests name stored messages"):
            receiver.manifest(0)


async def test_the_manifest_of_a_message_without_columns_has_sizes_only(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    await _send(url, {}, {"x": np.arange(10_000)})
    async with rlwire.open_receiver(url, type=dict) as receiver:
        manifest = await receiver.amanifest(0)
    assert manifest is not None and manifest.rows is None and manifest.columns == ()
    assert manifest.size > 80_000 and manifest.header_checksum is not None
    with anyio.fail_after(5):
        async with rlwire.open_receiver(url, type=dict) as receiver:
            with pytest.raises(rlwire.FieldNotFoundError, match="no column"):
                await receiver.aread_rows(manifest, "x", 0, 1)


def test_inspect_prints_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlwire._api.cli import main

    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url) as sender:
        sender.send(rlwire.TrainingBatch(samples=_columns()))  # type: ignore[arg-type]
        with sender.open_step() as writer:
            writer.put(_columns(rows=2), key="g0")  # type: ignore[arg-type]
    assert main(["inspect", url]) == 0
    out = capsys.readouterr().out
    assert "manifest of step 0 rank 0:" in out and "6 rows in 'samples'" in out
    assert "routed_experts: |u1 rows [n, 4, 2]" in out and "xxh3-64" in out
    assert main(["inspect", url, "--step", "1", "--part", "0"]) == 0
    assert "part 0 (key 'g0')" in capsys.readouterr().out
    assert main(["inspect", url, "--json"]) == 0
    manifest = _from_inspect_json(capsys.readouterr().out)
    with rlwire.open_receiver(url) as receiver:
        assert manifest == receiver.manifest(0)
    assert main(["inspect", url, "--step", "1", "--json"]) == 0  # parts: a list of theirs
    parts = msgspec.json.decode(capsys.readouterr().out, type=list[dict[str, Any]])
    assert [(m["step"], m["part"], m["key"]) for m in parts] == [(1, 0, "g0")]
    # A URL, as the receivers take (it was made a local path: "s3:/bucket/run").
    for where in (f"file://{url}", f"memory://inspect-{tmp_path.name}"):
        if where.startswith("memory"):
            with rlwire.open_sync_sender(where) as sender:
                sender.send(rlwire.TrainingBatch(samples=_columns()))  # type: ignore[arg-type]
        assert main(["inspect", where]) == 0, capsys.readouterr().err
        assert "6 rows in 'samples'" in capsys.readouterr().out


def _from_inspect_json(text: str) -> rlwire.Manifest:
    """The manifest ``rlwire inspect --json`` wrote (its checksums in hex)."""
    data = msgspec.json.decode(text)
    if data.get("header_checksum") is not None:
        data["header_checksum"] = int(data["header_checksum"], 16)
    for column in data["columns"]:
        column["checksums"] = [int(x, 16) for x in column.get("checksums", [])]
    return msgspec.json.decode(msgspec.json.encode(data), type=rlwire.Manifest)


def _big_ints(value: Any) -> list[int]:
    """The integers in decoded JSON that JavaScript and jq would round (above 2**53)."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in _big_ints(v)]
    if isinstance(value, list):
        return [n for v in value for n in _big_ints(v)]
    return [value] if type(value) is int and abs(value) > 2**53 else []


def test_inspect_json_writes_checksums_as_hex_strings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rlwire inspect --json`` wrote each XXH3-64 checksum as a bare JSON integer: most
    are above 2**53, which JavaScript and jq round (a checksum compared there never
    matched). Each is now a string of 16 hex digits, as the text output and xxhsum show
    it, for a whole step's manifest and for the list of a step's parts alike."""
    from rlwire._api.cli import main

    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url) as sender:
        sender.send(rlwire.TrainingBatch(samples=_columns(9, tokens=4000)))  # type: ignore[arg-type]
        with sender.open_step() as writer:
            writer.put(_columns(2, tokens=4000), key="g0")  # type: ignore[arg-type]
    with rlwire.open_receiver(url) as receiver:
        made = [receiver.manifest(0), receiver.manifest(1, part=0)]
    assert main(["inspect", url, "--json"]) == 0
    whole = msgspec.json.decode(capsys.readouterr().out)
    assert main(["inspect", url, "--step", "1", "--json"]) == 0
    written = [whole, *msgspec.json.decode(capsys.readouterr().out)]
    assert _big_ints(written) == []
    for got, manifest in zip(written, made, strict=True):
        assert manifest.header_checksum is not None and manifest.columns
        assert got["header_checksum"] == f"{manifest.header_checksum:016x}"
        for column, sent in zip(got["columns"], manifest.columns, strict=True):
            assert column.get("checksums", []) == [f"{x:016x}" for x in sent.checksums]
            assert len(sent.checksums) == len(sent.buffers)
        assert sum(len(c.checksums) for c in manifest.columns) >= 3
        assert got == msgspec.json.decode(msgspec.json.encode(manifest)) | {
            "header_checksum": got["header_checksum"],
            "columns": got["columns"],
        }  # everything else is the manifest's JSON, as it was


def test_an_array_column_is_described_as_one_array_and_not_read_by_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A numpy column of a Columns (one value a row) has its size and buffer in the
    manifest; read_rows refuses it in words that say what it is; a partial read of it
    with no rows is not taken for a field left None (it waited forever)."""
    from rlwire._api.cli import main

    url = str(tmp_path / "run")
    ids = rlwire.Ragged.from_lengths(np.arange(6), [3, 3])
    hidden = np.ones((2, 1000), np.float32)  # out-of-band
    with rlwire.open_sync_sender(url, sidecar=("hidden",)) as sender:
        sender.send({"samples": rlwire.Columns({"ids": ids, "hidden": hidden})})
        empty = rlwire.Ragged(np.zeros(0, np.int64), [0])
        sender.send({"samples": rlwire.Columns({"ids": empty, "r": np.zeros(0, np.float32)})})
    with rlwire.open_receiver(url, type=dict) as receiver:
        manifest = receiver.manifest(0)
        column = manifest.column("hidden")
        assert column is not None and column.dtype is None and column.row_shape == (1000,)
        assert column.size == hidden.nbytes and len(column.buffers) == 1 and column.checksums
        with pytest.raises(rlwire.ConfigError, match=r"not ragged \(one value a row, one array"):
            receiver.read_rows(manifest, "hidden", 0, 1)
    assert main(["inspect", url, "--step", "0"]) == 0
    assert "hidden: one value a row, one array, 8000 bytes" in capsys.readouterr().out
    with rlwire.open_receiver(url, type=dict, start_step=1, fields=["r"], as_columns=True) as r:
        got = r.receive(timeout=5)["samples"]["r"]
    assert got.dtype == np.float32 and got.shape == (0,)


def test_the_wire_form_is_the_documented_map() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "format.md").read_text()
    section = doc.split("## Manifests", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    column = rlwire.ManifestColumn(name="x", dtype="<i4", row_shape=(2,), buffers=(0,))
    full = rlwire.Manifest(
        url="u",
        step=1,
        rank=0,
        part=2,
        key="k",
        id=bytes(16),
        codec="msgpack",
        size=9,
        rows=1,
        field="samples",
        columns=(column,),
        header_checksum=3,
    )
    wire = msgspec.msgpack.decode(full.encode())
    assert set(wire) | set(wire["columns"][0]) | {"size", "checksums"} == documented
    assert (
        set(rlwire.Manifest.__struct_fields__) | set(rlwire.ManifestColumn.__struct_fields__)
        == documented
    )
    with pytest.raises(rlwire.DecodeError, match="not an rlwire manifest"):
        rlwire.Manifest.decode(b"\x81\xa3url\x01")


@pytest.mark.parametrize("writable", [False, True])
async def test_rows_of_a_small_inline_column_are_memory_of_their_own(
    tmp_path: Path, writable: bool
) -> None:
    """A column small enough to be kept in the header is read as the larger ones are:
    copies a writable receiver may write to, and otherwise read-only views of memory of
    their own, never of the header's bytes (a one-byte value there is the object
    CPython shares for every ``b"\\x01"``, which a library that ignores the read-only
    flag, as torch does, would overwrite)."""
    url = str(tmp_path / "run")
    ids = rlwire.Ragged.from_lengths(np.array([7], np.uint8), [1])
    await _send(url, {}, {"samples": rlwire.Columns({"ids": ids, "n": [1]})})
    async with rlwire.open_receiver(url, type=dict, writable=writable) as receiver:
        manifest = await receiver.amanifest(0)
        assert manifest is not None
        got = await receiver.aread_rows(manifest, "ids", 0, 1)
    assert got.values.tolist() == [7] and got.values.flags.writeable is writable
    got.values.flags.writeable = True  # numpy refuses this of a view over bytes
    got.values[0] = 1
    assert bytes([7]) == b"\x07"
