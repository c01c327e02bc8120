"""Fields appended to a committed step (``sender.add_fields``) on files and S3, asyncio
and trio: what receivers get, what is checked, what a failed write leaves, and the
sinks that refuse."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from helpers import plain_sample

import rlwire
from rlwire.transport.layout import StoredSink

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5, 2)


def _sample(n: int) -> rlwire.TrainingSample:
    return plain_sample(n)


def _ragged(lengths: tuple[int, ...] = LENGTHS, start: float = 0.0) -> rlwire.Ragged:
    total = sum(lengths)
    return rlwire.Ragged(
        np.arange(total, dtype=np.float32) + start, np.concatenate([[0], np.cumsum(lengths)])
    )


async def test_appended_fields_come_with_the_step(file_or_s3: tuple[str, dict[str, Any]]) -> None:
    url, options = file_or_s3
    ref = _ragged()
    async with rlwire.open_sender(url, storage_options=options) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in LENGTHS]))
        await sender.add_fields(0, {"ref_logprobs": ref, "score": np.array([1.0, 2.0, 3.0])})
        await sender.add_fields(0, {"values": _ragged(start=100.0)}, rows=3)
    # validate=True holds extras to arrays: a number a sample is a 0-d array there.
    async with rlwire.open_receiver(url, storage_options=options, validate=True) as receiver:
        with anyio.fail_after(20):
            rows = await receiver.areceive()
    assert [s.ref_logprobs.tolist() for s in rows.samples] == [ref[i].tolist() for i in range(3)]
    assert [float(s.extras["score"]) for s in rows.samples] == [1.0, 2.0, 3.0]
    assert all(type(s.extras["score"]) is np.ndarray for s in rows.samples)
    assert rows.samples[2].extras["values"].tolist() == [108.0, 109.0]
    # Only the appended file is read for an appended field; the step's own too, beside.
    async with rlwire.open_receiver(
        url, fields=("ref_logprobs", "token_ids"), storage_options=options
    ) as receiver:
        with anyio.fail_after(20):
            cols = (await receiver.areceive()).samples
    assert isinstance(cols, rlwire.Columns)
    assert set(cols.names) == {"ref_logprobs", "token_ids"}
    assert np.array_equal(cols["ref_logprobs"].offsets, ref.offsets)
    assert np.array_equal(cols["token_ids"].values, np.concatenate([np.arange(n) for n in LENGTHS]))


async def test_a_receiver_waits_for_a_field_not_appended_yet(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in LENGTHS]))
        async with rlwire.open_receiver(url, fields=("values",), storage_options=options) as rx:
            with pytest.raises(rlwire.ReceiveTimeout):
                await rx.areceive(timeout=0.3)  # the step is there, the field not yet
            got: list[Any] = []

            async def receive() -> None:
                got.append(await rx.areceive(timeout=20))

            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                await anyio.sleep(0.2)
                await sender.add_fields(0, {"values": _ragged(start=7.0)})
    assert got[0].samples.names == ("values",)
    assert got[0].samples["values"].values[0] == 7.0


async def test_bad_fields_are_typed_errors_and_write_nothing(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in LENGTHS]))
        with pytest.raises(
            rlwire.SchemaError, match=r"step 0, rank 0: .*'ref_logprobs' row 1 holds 4"
        ):
            await sender.add_fields(0, {"ref_logprobs": _ragged((3, 4, 3))})
        # A list of per-sample arrays is stored as a Ragged: checked as one.
        per_sample = [np.zeros(n, np.float32) for n in (3, 99, 2)]
        with pytest.raises(rlwire.SchemaError, match=r"'ref_logprobs' row 1 holds 99 values"):
            await sender.add_fields(0, {"ref_logprobs": per_sample})
        with pytest.raises(rlwire.SchemaError, match="2 rows, the step 3"):
            await sender.add_fields(0, {"score": np.array([1.0, 2.0])})
        with pytest.raises(rlwire.SchemaError, match="rows=4"):
            await sender.add_fields(0, {"score": np.zeros(3)}, rows=4)
        with pytest.raises(rlwire.ConfigError, match="step 5 is not committed"):
            await sender.add_fields(5, {"score": np.zeros(3)})
        with pytest.raises(rlwire.ConfigError, match="non-empty mapping"):
            await sender.add_fields(0, {})
        # The step's own data is never replaced (a field it left None may be).
        with pytest.raises(rlwire.SchemaError, match="holds data in field 'token_ids'"):
            await sender.add_fields(0, {"token_ids": _ragged(LENGTHS)})
        with pytest.raises(rlwire.SchemaError, match="holds data in field 'env_name'"):
            await sender.add_fields(0, {"env_name": ["x", "y", "z"]})
        await sender.add_fields(0, {"score": np.zeros(3)})
        with pytest.raises(rlwire.SchemaError, match="'score' was appended to the step already"):
            await sender.add_fields(0, {"score": np.ones(3)})
        sink = sender.sink
        assert isinstance(sink, StoredSink)
        assert [n for n in sink.names() if "fields" in n] == [
            "step-00000000.rank-0000.fields-000.rlw"
        ]


async def test_an_error_during_the_write_leaves_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in LENGTHS]))
        sink = sender.sink
        assert isinstance(sink, StoredSink)
        staging = type(sink).staging

        def failing(self: StoredSink, step: int) -> Any:
            staged = staging(self, step)
            add = staged.add

            def add_then_fail(name: str, chunks: Any, *, main: bool) -> Any:
                yield from add(name, chunks, main=main)
                raise OSError(28, "No space left on device")

            staged.add = add_then_fail  # type: ignore[method-assign]
            return staged

        type(sink).staging = failing  # type: ignore[method-assign]
        try:
            with pytest.raises(rlwire.TransportError, match="No space left"):
                await sender.add_fields(0, {"score": np.zeros(3)})
        finally:
            type(sink).staging = staging  # type: ignore[method-assign]
    assert sorted(os.listdir(url)) == ["step-00000000.rank-0000.rlw"]


async def test_parts_sealed_step_and_retention(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url, keep_last=1) as sender:
        async with sender.open_step(0) as writer:
            await writer.put([_sample(3), _sample(5)], key="a")
            await writer.put([_sample(2)], key="b")
        await sender.add_fields(0, {"ref_logprobs": _ragged()})
        with rlwire.open_receiver(url) as receiver:
            got = receiver.receive(timeout=20)
            assert [len(s.ref_logprobs) for s in got.samples] == list(LENGTHS)
            await sender.send(rlwire.TrainingBatch(samples=[_sample(1)]))
            receiver.receive(timeout=20)
            await sender.send(rlwire.TrainingBatch(samples=[_sample(1)]))
    assert not [n for n in os.listdir(url) if n.startswith("step-00000000")]


async def test_overwrite_deletes_appended_files(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(2)]))
        await sender.add_fields(0, {"score": np.zeros(1)})
    async with rlwire.open_sender(url, on_existing="overwrite"):
        pass
    assert os.listdir(url) == ["fence.rlw"]  # the overwriting sender's


async def test_zeromq_refuses(tmp_path: Path) -> None:
    async with rlwire.open_sender(f"zmq+ipc://{tmp_path}/s.sock") as sender:
        with pytest.raises(rlwire.ConfigError, match="keeps none"):
            await sender.add_fields(0, {"score": np.zeros(1)})


def test_sync_sender_adds_fields(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url) as sender:
        sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in LENGTHS]))
        sender.add_fields(0, {"ref_logprobs": _ragged()})
    with rlwire.open_receiver(url, as_columns=True) as receiver:
        cols = receiver.receive(timeout=20).samples
    assert np.array_equal(cols["ref_logprobs"].values, _ragged().values)


async def test_appended_arrays_arrive_as_the_steps_own_columns(tmp_path: Path) -> None:
    """A number a row from an array arrives as a Python number in rows (a numpy scalar
    of its dtype in neither a dict nor a Struct field), as a 0-d array of its dtype in
    extras; a 2-D array arrives as the Ragged of its rows, as the step's own columns."""
    url = str(tmp_path / "run")
    scores = np.array([0.5, 1.5, 2.5], np.float32)
    async with rlwire.open_sender(url) as sender:
        await sender.send({"samples": [{"ids": np.arange(n)} for n in (2, 2, 2)]})
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in (2, 2, 2)]))
        # A vector a sample, not a token: its width is not checked against the tokens.
        await sender.add_fields(0, {"score": scores, "hidden": np.ones((3, 4), np.float16)})
        await sender.add_fields(1, {"score": scores, "ref_logprobs": np.zeros((3, 2), np.float32)})
    async with rlwire.open_receiver(url, type=dict[str, Any]) as receiver:
        dicts = await receiver.areceive(timeout=20)
    assert [type(r["score"]) for r in dicts["samples"]] == [float] * 3
    assert [r["score"] for r in dicts["samples"]] == [0.5, 1.5, 2.5]
    assert dicts["samples"][2]["hidden"].tolist() == [1.0] * 4
    async with rlwire.open_receiver(url, start_step=1, validate=True) as receiver:
        batch = await receiver.areceive(timeout=20)
    extras = [s.extras["score"] for s in batch.samples]
    assert [(e.shape, e.dtype, float(e)) for e in extras] == [
        ((), np.float32, v) for v in (0.5, 1.5, 2.5)
    ]
    assert [s.ref_logprobs.tolist() for s in batch.samples] == [[0.0, 0.0]] * 3
    async with rlwire.open_receiver(url, start_step=1, as_columns=True) as r:
        columns = (await r.areceive(timeout=20)).samples
    assert isinstance(columns["ref_logprobs"], rlwire.Ragged)  # as the step's own
    async with rlwire.open_receiver(url, start_step=1, type=rlwire.TrainingBatch) as r:
        typed = await r.areceive(timeout=20)
    assert [type(s.extras["score"]) for s in typed.samples] == [np.ndarray] * 3


def _names(url: str, options: dict[str, Any]) -> list[str]:
    """What the store holds under ``url``, read from the store itself."""
    if not url.startswith("s3://"):
        return sorted(os.listdir(url))
    from s3_server import s3_client

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    listed = s3_client(options).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    return sorted(item["Key"] for item in listed.get("Contents", []))


@pytest.mark.parametrize(
    ("how", "ranks", "rank", "words"),
    [
        ("whole", 2, 5, "step 0 has 2 ranks (0-1), not rank 5"),
        ("whole", 1, 1, "step 0 has 1 rank (0), not rank 1"),
        ("parts", 2, 5, "step 0 has 2 ranks (0-1), not rank 5"),
    ],
    ids=["whole-2", "whole-1", "parts-2"],
)
async def test_a_rank_beyond_the_steps_is_refused_naming_them_and_writes_nothing(
    file_or_s3: tuple[str, dict[str, Any]], how: str, ranks: int, rank: int, words: str
) -> None:
    """add_fields for a rank the committed step does not have (sent whole, or sealed
    part by part) is a ConfigError naming the step, the rank and the step's ranks,
    whatever the row count (no row too: a rank with no parts has none), and stores
    nothing (a file for rank 5 held the step, and every later one, from keep_last)."""
    url, options = file_or_s3
    one = [_sample(n) for n in LENGTHS]
    async with rlwire.open_sender(url, storage_options=options) as sender:
        if how == "whole":
            await sender.send_ranks([rlwire.TrainingBatch(samples=one)] * ranks)
        else:
            async with sender.open_step(0, ranks=ranks) as writer:
                for r in range(ranks):
                    await writer.put(one, key=f"k{r}", rank=r)
        before = _names(url, options)
        for fields in ({"score": np.zeros(0)}, {"score": np.zeros(3)}):
            with pytest.raises(rlwire.ConfigError) as caught:
                await sender.add_fields(0, fields, rank=rank)
            assert f"add_fields: {words}" in str(caught.value), str(caught.value)
            assert caught.value.step == 0 and caught.value.rank == rank
        assert _names(url, options) == before
        await sender.add_fields(0, {"score": np.zeros(3)}, rank=ranks - 1)  # one it has
