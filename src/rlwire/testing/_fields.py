"""The contract on reading part of a step and adding to it: ``open_receiver(fields=...)``,
manifests and row ranges of stored messages, and ``add_fields`` on a committed step."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.manifest import Manifest
from rlwire._api.schema import TrainingBatch, TrainingSample
from rlwire._core.columns import Columns
from rlwire._core.errors import ConfigError, FieldNotFoundError, ReceiveTimeout, SchemaError
from rlwire._core.ragged import Ragged
from rlwire.testing._fixtures import ContractFixtures, Endpoint, small_samples

__all__ = ["FieldsContract"]

#: What the partial reads ask for: two of the step's five per-token columns.
WANTED = ("token_ids", "advantages")
LENGTHS = (3, 5, 2)


class FieldsContract(ContractFixtures):
    """Partial reads by field on every sink, whole steps and parts; the manifest and row
    ranges of a stored message where the sink keeps messages to be read again; fields
    appended to a committed step where the sink says it can
    (:attr:`rlwire.abc.Sink.appends_fields`), a ConfigError where it cannot."""

    @pytest.mark.parametrize("inline", [None, 0], ids=["in-header", "buffers"])
    async def test_fields_reads_only_the_named_columns(
        self, endpoint: Endpoint, inline: int | None
    ) -> None:
        """The columns asked for, in the header (small) or each its own buffer
        (``inline_threshold=0``): a source that reads part of a message must hand each
        column its own bytes."""
        samples = _samples(seed=1)
        group = _samples(seed=2)[:2]
        with endpoint.open_receiver(fields=WANTED) as receiver:
            async with endpoint.open_sender(inline_threshold=inline) as sender:
                parts = sender.sink.stores_parts
                await sender.send(TrainingBatch(samples=samples))
                if parts:
                    async with sender.open_step() as writer:
                        await writer.put(group, key="g")
                whole = await receiver.areceive(timeout=self.timeout)
                got = [p async for p in receiver.aparts(timeout=self.timeout)] if parts else []
        _check_columns(whole.samples, samples)
        if parts:
            assert [p.key for p in got] == ["g"]
            _check_columns(got[0].value.samples, group)

    async def test_a_field_the_step_lacks_is_named(self, endpoint: Endpoint) -> None:
        """A stream says at once that the step has no such column; a sink that can
        append fields waits for it, and its timeout names the field."""
        with endpoint.open_receiver(fields=("token_ids", "values")) as receiver:
            async with endpoint.open_sender() as sender:
                appends = sender.sink.appends_fields
                await sender.send(TrainingBatch(samples=_samples()))
                if appends:
                    with pytest.raises(ReceiveTimeout, match=r"waiting for a field: .*'values'"):
                        await receiver.areceive(timeout=0.3)
                    return
                with anyio.fail_after(self.timeout), pytest.raises(FieldNotFoundError) as caught:
                    await receiver.areceive()
        assert "'values'" in str(caught.value) and "token_ids" in str(caught.value)

    async def test_a_manifest_names_the_columns_and_reads_rows(self, endpoint: Endpoint) -> None:
        """The manifest of a stored message: its rows, columns, sizes and checksums,
        through msgpack unchanged; rows ``[1, 3)`` of a column read by it. A sink that
        keeps no messages to be read again refuses with ConfigError."""
        samples = _samples(seed=3, lengths=(300, 500, 200))  # token_ids out-of-band
        with endpoint.open_receiver() as receiver:
            async with endpoint.open_sender() as sender:
                await sender.send(TrainingBatch(samples=samples))
                await receiver.areceive(timeout=self.timeout)
            if not await _keeps_messages(receiver):
                return
            manifest = await receiver.amanifest(0)
            assert manifest is not None
            assert (manifest.step, manifest.rank, manifest.part) == (0, 0, None)
            assert manifest.rows == len(samples)
            tokens = {c.name: c for c in manifest.columns}["token_ids"]
            assert tokens.dtype == samples[0].token_ids.dtype.str and tokens.size > 0
            assert len(tokens.checksums) == len(tokens.buffers) > 0
            assert Manifest.decode(manifest.encode()) == manifest
            rows = await receiver.aread_rows(manifest, "token_ids", 1, 3)
        assert [r.tolist() for r in rows] == [s.token_ids.tolist() for s in samples[1:3]]

    async def test_appended_fields_reach_receivers_that_ask(self, endpoint: Endpoint) -> None:
        """``add_fields`` on a committed step: checked against its rows and lengths
        (a SchemaError leaves nothing), then read with the step's own columns by a
        receiver that waited for it."""
        samples = _samples(seed=4)
        ref = _ragged()
        async with endpoint.open_sender() as sender:
            if not sender.sink.appends_fields:
                with pytest.raises(ConfigError):
                    await sender.add_fields(0, {"ref_logprobs": ref})
                return
            await sender.send(TrainingBatch(samples=samples))
            with endpoint.open_receiver(fields=("token_ids", "ref_logprobs")) as receiver:
                got: list[Any] = []

                async def receive() -> None:
                    got.append(await receiver.areceive(timeout=self.timeout))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(receive)
                    await anyio.sleep(0.2)  # the receiver waits for the field meanwhile
                    assert not got
                    with pytest.raises(SchemaError, match="row 1"):
                        await sender.add_fields(0, {"ref_logprobs": _ragged((3, 4, 2))})
                    await sender.add_fields(0, {"ref_logprobs": ref})
        columns = got[0].samples
        assert isinstance(columns, Columns) and columns.names == ("token_ids", "ref_logprobs")
        appended = columns["ref_logprobs"]
        assert isinstance(appended, Ragged)
        assert np.array_equal(appended.values, ref.values)
        assert np.array_equal(appended.offsets, ref.offsets)


def _samples(seed: int = 0, lengths: tuple[int, ...] = LENGTHS) -> list[TrainingSample]:
    return small_samples(lengths, seed)


def _ragged(lengths: tuple[int, ...] = LENGTHS) -> Ragged:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Ragged(np.arange(sum(lengths), dtype=np.float32), offsets)


def _check_columns(got: Any, samples: list[TrainingSample]) -> None:
    """``got`` is the Columns of exactly :data:`WANTED`, those of ``samples``."""
    assert isinstance(got, Columns) and got.names == WANTED
    for name in WANTED:
        column = got[name]
        assert isinstance(column, Ragged) and len(column) == len(samples)
        for i, sample in enumerate(samples):
            assert np.array_equal(column[i], getattr(sample, name))


async def _keeps_messages(receiver: TrainingBatchReceiver[TrainingBatch]) -> bool:
    """Whether the receiver's source keeps messages to be read again (a manifest of
    step 0 is made); if not, check that it says so with ConfigError."""
    try:
        await receiver.amanifest(0)
    except ConfigError as refused:
        assert "does not keep its messages to be read again" in str(refused), refused
        return False
    return True
