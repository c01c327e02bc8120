"""Partial reads by field (``open_receiver(url, fields=...)``) on every sink that can
read part of a message: files, S3 and ZeroMQ; asyncio and trio."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from s3_server import FaultProxy

import rlwire

pytestmark = pytest.mark.anyio

WANTED = ("token_ids", "advantages")
NAMES = ("token_ids", "mask", "logprobs", "temperatures", "advantages")


def _columns(rows: int = 4, seed: int = 0, tokens: int = 3000) -> rlwire.Columns:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(tokens // 2, tokens, rows)
    arrays = {
        "token_ids": lambda n: rng.integers(0, 50_000, n, dtype=np.int32),
        "mask": lambda n: rng.random(n) < 0.5,
        "logprobs": lambda n: -rng.random(n).astype(np.float32),
        "temperatures": lambda n: np.ones(n, np.float32),
        "advantages": lambda n: rng.random(n).astype(np.float32),
    }
    return rlwire.Columns(
        {
            name: rlwire.Ragged.from_arrays([make(int(n)) for n in lengths])
            for name, make in arrays.items()
        }
        | {"env_name": ["gsm8k"] * rows}
    )


def _samples(cols: rlwire.Columns) -> list[rlwire.TrainingSample]:
    return [rlwire.TrainingSample(**{n: cols[n][i] for n in cols.names}) for i in range(len(cols))]


@pytest.fixture(params=["file", "s3", "zmq"])
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "file":
        return str(tmp_path / "run"), {}
    if request.param == "s3":
        return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")
    return f"zmq+ipc://{tmp_path}/run.sock", {}


def _check(got: rlwire.Columns, sent: rlwire.Columns) -> None:
    assert got.names == WANTED
    for name in WANTED:
        assert np.array_equal(got[name].values, sent[name].values)
        assert np.array_equal(got[name].offsets, sent[name].offsets)


async def test_fields_reads_those_columns_of_packed_and_listed_steps(
    endpoint: tuple[str, dict[str, Any]],
) -> None:
    url, options = endpoint
    packed, listed = _columns(seed=1), _columns(seed=2)
    receiver = rlwire.open_receiver(url, fields=WANTED, storage_options=options)
    async with receiver:
        async with rlwire.open_sender(url, storage_options=options) as sender:
            await sender.send(rlwire.TrainingBatch(samples=packed))  # type: ignore[arg-type]
            await sender.send(rlwire.TrainingBatch(samples=_samples(listed)))
            with anyio.fail_after(20):
                first = await receiver.areceive()
                second = await receiver.areceive()
    for got, sent in ((first, packed), (second, listed)):
        assert isinstance(got, rlwire.TrainingBatch)
        assert isinstance(got.samples, rlwire.Columns)
        _check(got.samples, sent)


async def test_fields_reads_parts_too(endpoint: tuple[str, dict[str, Any]]) -> None:
    url, options = endpoint
    groups = [_columns(rows=2, seed=s) for s in (3, 4)]
    parts: list[Any] = []
    receiver = rlwire.open_receiver(url, fields=WANTED, storage_options=options)

    async def consume() -> None:
        parts.extend([part async for part in receiver.aparts()])

    async with receiver:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                async with rlwire.open_sender(url, storage_options=options) as sender:
                    async with sender.open_step() as writer:
                        for i, group in enumerate(groups):
                            await writer.put(_samples(group), key=f"g{i}")
    assert [p.key for p in parts] == ["g0", "g1"]
    for part, sent in zip(parts, groups, strict=True):
        _check(part.value.samples, sent)


async def test_a_field_not_in_the_step_is_a_typed_error_naming_it(
    endpoint: tuple[str, dict[str, Any]],
) -> None:
    url, options = endpoint
    receiver = rlwire.open_receiver(url, fields=("token_ids", "values"), storage_options=options)
    async with receiver:
        async with rlwire.open_sender(url, storage_options=options) as sender:
            await sender.send(rlwire.TrainingBatch(samples=_columns()))  # type: ignore[arg-type]
            if not url.startswith("zmq"):  # a store: the field may be appended (add_fields)
                # ... and the timeout says which field it waited for, and where
                with pytest.raises(rlwire.ReceiveTimeout, match=r"waiting for a field: .*'values'"):
                    await receiver.areceive(timeout=0.3)
                return
            with anyio.fail_after(20), pytest.raises(rlwire.FieldNotFoundError) as caught:
                await receiver.areceive()
    message = str(caught.value)
    assert "'values'" in message and "step 0" in message and "token_ids" in message
    assert isinstance(caught.value, rlwire.SchemaError)


def test_fields_beside_validate_true_is_refused(tmp_path: Path) -> None:
    """validate=True checks whole TrainingSamples, which a partial read does not hold."""
    with pytest.raises(rlwire.ConfigError, match=r"validate=True .* fields="):
        rlwire.open_receiver(tmp_path, fields=("token_ids",), validate=True)
    with rlwire.open_receiver(tmp_path, fields=("token_ids",), validate=False):
        pass


def _send_sync(url: str, options: dict[str, Any], obj: Any, **sender: Any) -> None:
    async def send() -> None:
        async with rlwire.open_sender(url, storage_options=options, **sender) as s:
            await s.send(obj)

    anyio.run(send)


def _buffer_of(path: Path, column: str) -> tuple[int, int]:
    """Offset and length in the main file of ``column``'s values buffer (the message's
    buffers hold the columns in order: values, then offsets when not inline)."""
    import struct

    import msgspec

    data = path.read_bytes()
    env_len = struct.unpack_from("<8sHHIQ", data)[3]  # docs/format.md, the main file
    env = msgspec.msgpack.decode(data[24 : 24 + env_len])
    offsets = np.frombuffer(env["offsets"], "<u8")
    lengths = np.frombuffer(env["lengths"], "<u8")
    big = [i for i in range(len(offsets)) if lengths[i] > 4096]
    index = big[NAMES.index(column)]
    return int(offsets[index]), int(lengths[index])


@pytest.mark.parametrize("store", ["file", "s3"])
def test_a_damaged_column_not_asked_for_is_never_read(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cols = _columns(rows=3, tokens=20_000)
    local = tmp_path / "run"
    _send_sync(str(local), {}, rlwire.TrainingBatch(samples=cols))  # type: ignore[arg-type]
    main = local / "step-00000000.rank-0000.rlw"
    offset, length = _buffer_of(main, "logprobs")
    with open(main, "r+b") as f:  # one byte in the middle of an unwanted column
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    url, options = str(local), {}
    if store == "s3":
        from s3_server import s3_client

        url = f"{request.getfixturevalue('s3_url')}/run"
        options = request.getfixturevalue("s3_endpoint")
        bucket = url.removeprefix("s3://").partition("/")[0]
        s3_client(options).put_object(Bucket=bucket, Key=f"run/{main.name}", Body=main.read_bytes())
    with rlwire.open_receiver(url, fields=WANTED, storage_options=options) as receiver:
        _check(receiver.receive(timeout=10).samples, cols)
    with rlwire.open_receiver(url, storage_options=options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match="does not match its checksum"):
            receiver.receive(timeout=10)
    with rlwire.open_receiver(url, fields=("logprobs",), storage_options=options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match="does not match its checksum"):
            receiver.receive(timeout=10)


def _fetched(proxy: FaultProxy) -> int:
    total = 0
    for method, path, ranged in proxy.ranges:
        # The step's data only: the probe of its first appended-fields object (add_fields)
        # 404s, and the rank's consumption mark, read before the first step, is a few bytes
        # (both asked for with fsspec's default range of 8 MiB).
        if method == "GET" and ranged and "/step-" in path and ".fields-" not in path:
            start, _, end = ranged.removeprefix("bytes=").partition("-")
            total += int(end) - int(start) + 1
    return total


def test_s3_fetches_only_the_ranges_of_the_fields(s3_url: str, s3_endpoint: dict[str, Any]) -> None:
    cols = _columns(rows=8, tokens=100_000)
    url = f"{s3_url}/run"
    _send_sync(url, s3_endpoint, rlwire.TrainingBatch(samples=cols))  # type: ignore[arg-type]
    wanted = sum(cols[n].values.nbytes + cols[n].offsets.nbytes for n in WANTED)
    with FaultProxy(s3_endpoint) as proxy:
        with rlwire.open_receiver(url, fields=WANTED, storage_options=proxy.options) as r:
            _check(r.receive(timeout=20).samples, cols)
        # (and one GET of the step's first appended-fields object, missing: add_fields)
        gets = [
            x for x in proxy.ranges if x[0] == "GET" and "step-" in x[1] and ".fields-" not in x[1]
        ]
        partial = _fetched(proxy)
        proxy.ranges.clear()
        with rlwire.open_receiver(url, storage_options=proxy.options) as r:
            r.receive(timeout=20)
        whole = _fetched(proxy)
    # The envelope and header (one 64 KiB GET), then the two columns' ranges.
    assert all(ranged for _, _, ranged in gets)
    assert 2 <= len(gets) <= 4
    assert partial <= 1.1 * wanted + (64 << 10)
    assert whole > 2 * partial


def test_file_partial_read_touches_only_those_pages(tmp_path: Path) -> None:
    """Pages resident after a partial read, from a file dropped from the page cache:
    about the wanted columns' bytes (mincore through the mapping's own view)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_fields", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fields.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    dropped, resident_bytes = bench.dropped, bench.resident_bytes

    cols = _columns(rows=8, tokens=200_000)
    path = tmp_path / "run"
    _send_sync(str(path), {}, rlwire.TrainingBatch(samples=cols))  # type: ignore[arg-type]
    main = path / "step-00000000.rank-0000.rlw"
    if not dropped(main):
        pytest.skip("the page cache cannot be dropped for this file here")
    wanted = sum(cols[n].values.nbytes + cols[n].offsets.nbytes for n in WANTED)
    with rlwire.open_receiver(str(path), fields=WANTED) as r:
        _check(r.receive(timeout=10).samples, cols)
    assert resident_bytes(main) <= 1.1 * wanted + (256 << 10)
    assert os.path.getsize(main) > 2 * wanted


def test_a_reference_in_a_maps_key_is_a_corrupt_frame_for_a_partial_read(tmp_path: Path) -> None:
    """A columns value whose row is a map keyed by out-of-band bytes (msgpack allows it;
    rlwire never writes it), stored whole with valid checksums: a read of that column
    alone is refused, as a whole read is (an adversarial run got the reader's own
    NOT_READ placeholder back as the key)."""
    import msgspec

    from rlwire import Frame
    from rlwire.aio import run_sliced
    from rlwire.transport import FileSink

    def ext(code: int, payload: bytes) -> bytes:
        return b"\xc7" + bytes([len(payload)]) + bytes([code]) + payload

    mp = msgspec.msgpack.encode
    array = lambda data: msgspec.msgpack.Ext(2, mp(["<i8", [2], "C", data]))  # noqa: E731
    ids = msgspec.msgpack.Ext(6, mp([array(bytes(16)), array(np.array([0, 2], "<i8").tobytes())]))
    row = b"\x81" + ext(3, mp([0])) + b"\x01"  # {<out-of-band bytes of buffer 0>: 1}
    body = b"\x94" + mp(1) + mp(0) + mp(["a", "ids"]) + b"\x92\x91" + row + mp(ids)
    header = b"\x81" + mp("samples") + ext(7, body)
    sink = FileSink(str(tmp_path))
    sink.open("overwrite")
    run_sliced(sink.stage(0, [Frame(header, (memoryview(b"k" * 5000),))])).commit()
    for fields in (None, ["a"]):
        with rlwire.open_receiver(tmp_path, type=dict, fields=fields) as receiver:
            with pytest.raises(rlwire.CorruptFrameError, match="value as a map's key"):
                receiver.receive(timeout=5)


@pytest.mark.parametrize("chunked", [False, True], ids=["inline", "chunked"])
@pytest.mark.parametrize("fields", [["turns"], ["ids", "turns"]])
def test_a_field_holding_a_list_of_records_with_arrays_is_read_alone(
    tmp_path: Path, fields: list[str], chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such a field is a columns value inside a column: a partial read keeps it whole (it
    looked for ``turns`` among the inner columns' names, and waited for it forever), the
    column chunked too (its chunks are decoded after the samples' columns value)."""
    if chunked:  # as a column of thousands of rows is
        monkeypatch.setattr("rlwire.codecs._msgpack.encode.CHUNK_WEIGHT", 2)
    samples = [
        {"ids": np.arange(3), "turns": [{"x": np.arange(2)}, {"x": np.arange(4)}]},
        {"ids": np.arange(5), "turns": [{"x": np.arange(1, dtype=np.int32)}]},
    ] * 4
    with rlwire.open_sync_sender(tmp_path) as sender:
        sender.send({"samples": samples})
    with rlwire.open_receiver(tmp_path, type=dict, fields=fields) as receiver:
        got = receiver.receive(timeout=10)["samples"]
    assert got.names == tuple(fields)
    with rlwire.open_receiver(tmp_path, type=dict, as_columns=True) as receiver:
        whole = receiver.receive(timeout=10)["samples"]
    for got_row, whole_row in zip(got["turns"], whole["turns"], strict=True):
        assert isinstance(got_row, rlwire.Columns)  # as a whole read gives it as columns
        assert [r.tolist() for r in got_row["x"]] == [r.tolist() for r in whole_row["x"]]
    assert [len(row) for row in got["turns"]] == [2, 1] * 4
