"""Fields appended by a stage of their own (a reference model beside a live producer),
on files and S3, asyncio and trio: a sender that never opened the destination appends
without touching what the producer owns, the check reads a few pages of the step, a
step filled in parts gives its appended fields alone, and the files say 1.3."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import plain_sample
from s3_server import FaultProxy

import rlwire
from rlwire.codecs import make_codec
from rlwire.transport import FileSink
from rlwire.transport.layout import StoredSink

pytestmark = pytest.mark.anyio


def _sample(n: int, experts: int = 0) -> rlwire.TrainingSample:
    return plain_sample(n, (experts, 8) if experts else None)


def _per_token(lengths: list[int], start: float = 0.0) -> rlwire.Ragged:
    values = np.arange(sum(lengths), dtype=np.float32) + np.float32(start)
    return rlwire.Ragged.from_lengths(values, lengths)


async def test_a_stage_appends_beside_the_producer_without_opening(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A sender never opened (no ``async with``) appends and opens nothing: the end mark
    the producer wrote stays (receivers still stop at it), and on files so does what a
    live producer is writing (a temporary file that ``on_existing="resume"`` would take
    for a killed writer's leftover and delete)."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as producer:
        await producer.send(rlwire.TrainingBatch(samples=[_sample(3), _sample(5)]))
        await producer.finish()
    in_flight = Path(url) / ".step-00000001.rank-0000.rlw.0123abcd.tmp"
    if "://" not in url:
        in_flight.write_bytes(b"a live producer's step, half written")
    stage = rlwire.open_sender(url, storage_options=options)  # never opened
    try:
        await stage.add_fields(0, {"ref_logprobs": _per_token([3, 5], 0.5)})
    finally:
        await stage.aclose()
    if "://" not in url:
        assert in_flight.exists()
        assert "end.rlw" in os.listdir(url)
    async with rlwire.open_receiver(url, storage_options=options) as receiver:
        with anyio.fail_after(20):
            got = await receiver.areceive()
            with pytest.raises(rlwire.EndOfStream):
                await receiver.areceive()
    assert [s.ref_logprobs.tolist() for s in got.samples] == [
        [0.5, 1.5, 2.5],
        [3.5, 4.5, 5.5, 6.5, 7.5],
    ]


async def test_a_never_opened_sender_needs_a_committed_step(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    stage = rlwire.open_sender(url, storage_options=options)
    try:
        with pytest.raises(rlwire.ConfigError, match="step 0 is not committed") as caught:
            await stage.add_fields(0, {"score": np.zeros(1)})
        assert (caught.value.step, caught.value.rank) == (0, 0)
    finally:
        await stage.aclose()
    with pytest.raises(rlwire.ClosedError):
        await stage.add_fields(0, {"score": np.zeros(1)})


async def test_only_appended_fields_of_a_step_in_parts(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """``fields=`` naming only appended fields reads a step filled in several parts
    (whose own columns ``fields=`` cannot join yet): the rank's rows, all of them; and
    waits for one not appended yet."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as sender:
        async with sender.open_step(ranks=1) as writer:
            await writer.put([_sample(2)], key="a")
            await writer.put([_sample(4), _sample(1)], key="b")
        await sender.add_fields(0, {"ref_logprobs": _per_token([2, 4, 1])})
        async with rlwire.open_receiver(
            url, fields=("ref_logprobs",), storage_options=options
        ) as receiver:
            with anyio.fail_after(20):
                cols = (await receiver.areceive()).samples
        assert cols.names == ("ref_logprobs",)
        assert cols["ref_logprobs"].offsets.tolist() == [0, 2, 6, 7]
        async with rlwire.open_receiver(url, fields=("values",), storage_options=options) as rx:
            with pytest.raises(rlwire.ReceiveTimeout, match=r"waiting for a field: .*'values'"):
                await rx.areceive(timeout=0.3)


async def test_the_check_fetches_a_few_pages_of_the_step_from_s3(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    """``add_fields`` checks the rows against the step as stored: it fetches the step's
    head and its ``token_ids`` (which come first), not its other columns (here 95 %
    of it)."""
    url = f"{s3_url}/run"
    lengths = [2000 + 100 * i for i in range(24)]
    with FaultProxy(s3_endpoint) as proxy:
        async with rlwire.open_sender(url, storage_options=proxy.options) as sender:
            await sender.send(rlwire.TrainingBatch(samples=[_sample(n, 16) for n in lengths]))
            seen = len(proxy.ranges)
            await sender.add_fields(0, {"ref_logprobs": _per_token(lengths)})
            await sender.add_fields(0, {"values": _per_token(lengths)})
        gets = [r for r in proxy.ranges[seen:] if r[0] == "GET" and "rank-0000.rlw" in r[1]]
    fetched = 0
    for _, _, ranged in gets:
        assert ranged is not None  # never the whole object
        start, _, end = ranged.removeprefix("bytes=").partition("-")
        fetched += int(end) - int(start) + 1
    step_bytes = sum(lengths) * (8 + 1 + 4 * 3 + 16 * 8)
    assert 0 < fetched < 0.1 * step_bytes, (fetched, step_bytes)


async def test_the_check_reads_a_few_pages_of_the_step_from_files(tmp_path: Path) -> None:
    if not Path("/proc/self/io").exists():
        pytest.skip("no /proc/self/io to count the bytes read")

    def read_bytes() -> int:
        lines = Path("/proc/self/io").read_text().splitlines()
        return int(next(line for line in lines if line.startswith("rchar")).split()[1])

    lengths = [2000 + 100 * i for i in range(24)]
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n, 16) for n in lengths]))
        step_bytes = (tmp_path / "step-00000000.rank-0000.rlw").stat().st_size
        before = read_bytes()
        await sender.add_fields(0, {"ref_logprobs": _per_token(lengths)})
        read = read_bytes() - before
    assert read < 0.1 * step_bytes, (read, step_bytes)


async def test_appended_files_say_version_1_5(tmp_path: Path) -> None:
    """An appended message says 1.5 (bytes 8-11), its step, sent whole, 1.8."""
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(3)]))
        await sender.add_fields(0, {"score": np.ones(1)})
    for name, version in {
        "step-00000000.rank-0000.rlw": (1, 8),
        "step-00000000.rank-0000.fields-000.rlw": (1, 5),
    }.items():
        assert struct.unpack_from("<HH", (tmp_path / name).read_bytes(), 8) == version


async def test_a_field_left_none_in_every_row_is_waited_for(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A TrainingSample's ``ref_logprobs`` left ``None`` is stored as a column of Nones:
    asked for by name, it counts as not there yet (the receiver waits, saying why),
    until it is appended; a step that holds it in some rows is read as stored."""
    url, options = file_or_s3
    some = [_sample(2), _sample(3)]
    some[1].ref_logprobs = np.full(3, -1.0, np.float32)
    async with rlwire.open_sender(url, storage_options=options) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(2), _sample(3)]))
        await sender.send(rlwire.TrainingBatch(samples=some))
        async with rlwire.open_receiver(
            url, fields=("ref_logprobs",), storage_options=options
        ) as receiver:
            with pytest.raises(rlwire.ReceiveTimeout, match="'ref_logprobs' is None in every row"):
                await receiver.areceive(timeout=0.3)
            await sender.add_fields(0, {"ref_logprobs": _per_token([2, 3], 1.0)})
            with anyio.fail_after(20):
                first = (await receiver.areceive()).samples
                second = (await receiver.areceive()).samples
    assert first["ref_logprobs"].values.tolist() == [1, 2, 3, 4, 5]
    assert second["ref_logprobs"][0] is None
    assert second["ref_logprobs"][1].tolist() == [-1, -1, -1]


async def test_the_check_reads_compressed_offsets(tmp_path: Path) -> None:
    """600 rows: ``token_ids``' offsets are a buffer of their own (not inline in the
    header), compressed; the check decompresses that buffer alone and still finds the
    first bad row."""
    from rlwire._frame.compression import Compressor

    lengths = [1 + i % 7 for i in range(600)]
    async with rlwire.open_sender(tmp_path, compression=Compressor("zstd", 3, 1024)) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in lengths]))
        bad = [*lengths[:450], lengths[450] + 1, *lengths[451:]]
        with pytest.raises(rlwire.SchemaError, match=r"'ref_logprobs' row 450 holds"):
            await sender.add_fields(0, {"ref_logprobs": _per_token(bad)})
        await sender.add_fields(0, {"ref_logprobs": _per_token(lengths)})
    with rlwire.open_receiver(tmp_path, fields=("ref_logprobs",)) as receiver:
        got = receiver.receive(timeout=20).samples["ref_logprobs"]
    assert np.array_equal(np.diff(got.offsets), lengths)


async def test_a_receiver_with_fields_leaves_other_appended_fields_unread(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    """``fields=`` names columns to read: a message of appended fields holding none of
    them is not fetched beyond its head (it was fetched whole, 32 MB here, for a
    trainer that reads ``token_ids`` only); one holding some is read and returned."""
    url = f"{s3_url}/run"
    lengths = [3, 5]
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in lengths]))
        await sender.add_fields(0, {"values": np.ones((2, 2_000_000))})
        await sender.add_fields(0, {"ref_logprobs": _per_token(lengths, 0.5)})
    with FaultProxy(s3_endpoint) as proxy:
        for fields in [("token_ids",), ("token_ids", "ref_logprobs")]:
            seen = len(proxy.ranges)
            async with rlwire.open_receiver(
                url, fields=fields, storage_options=proxy.options, record_consumed=False
            ) as receiver:
                with anyio.fail_after(20):
                    cols = (await receiver.areceive()).samples
            assert cols.names == fields
            assert cols["token_ids"].offsets.tolist() == [0, 3, 8]
            fetched = 0
            for method, target, ranged in proxy.ranges[seen:]:
                if method == "GET" and "fields-000.rlw" in target:
                    assert ranged is not None
                    start, _, end = ranged.removeprefix("bytes=").partition("-")
                    fetched += int(end) - int(start) + 1
            assert fetched <= 1 << 16, (fields, fetched)
        assert cols["ref_logprobs"].values.tolist() == _per_token(lengths, 0.5).values.tolist()


async def test_a_plugin_sink_written_before_appended_names_were_passed_still_appends(
    tmp_path: Path,
) -> None:
    """A sink overriding ``stage_fields(step, rank, frame)`` (before ``add_fields``
    passed the fields' ``names``) is still called by ``add_fields``: the base wraps it,
    and the fields reach the receiver."""
    calls: list[tuple[int, int]] = []

    class OldSink(FileSink):
        def stage_fields(self, step: int, rank: int, frame: Any) -> Any:  # type: ignore[override]
            calls.append((step, rank))
            return super().stage_fields(step, rank, frame)

    async with rlwire.TrainingBatchSender(OldSink(tmp_path), make_codec("msgpack")) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(3), _sample(5)]))
        await sender.add_fields(0, {"ref_logprobs": _per_token([3, 5], 0.5)})
    assert calls == [(0, 0)]
    with rlwire.open_receiver(tmp_path, record_consumed=False) as receiver:
        got = receiver.receive(timeout=5)
    assert [s.ref_logprobs.tolist() for s in got.samples] == [
        [0.5, 1.5, 2.5],
        [3.5, 4.5, 5.5, 6.5, 7.5],
    ]


async def test_appended_fields_are_compressed_as_the_stages_steps(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    lengths = [20_000] * 4
    async with rlwire.open_sender(url, storage_options=options) as producer:
        await producer.send(rlwire.TrainingBatch(samples=[_sample(n) for n in lengths]))
    ref = rlwire.Ragged.from_lengths(np.zeros(sum(lengths), np.float32), lengths)  # 320 kB
    stage = rlwire.open_sender(url, storage_options=options, compression="zstd")
    try:
        await stage.add_fields(0, {"ref_logprobs": ref, "score": np.arange(4.0)})
        sink = stage.sink
        assert isinstance(sink, StoredSink)
        appended = "step-00000000.rank-0000.fields-000.rlw"
        assert appended in sink.names()
        assert len(sink.load_head(appended, 1 << 24) or b"") < 20_000  # was 320 kB
    finally:
        await stage.aclose()
    for fields in (None, ("ref_logprobs", "score")):
        async with rlwire.open_receiver(
            url, storage_options=options, fields=fields, record_consumed=False
        ) as receiver:
            with anyio.fail_after(20):
                samples = (await receiver.areceive()).samples
        refs = samples["ref_logprobs"] if fields else [s.ref_logprobs for s in samples]
        assert [len(r) for r in refs] == lengths
        assert not any(np.any(r) for r in refs)
        scores = samples["score"] if fields else [s.extras["score"] for s in samples]
        assert [float(x) for x in scores] == [0.0, 1.0, 2.0, 3.0]
