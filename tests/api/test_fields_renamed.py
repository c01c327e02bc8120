"""``fields=`` and the samples' Struct fields renamed (``rename="camel"``,
``msgspec.field(name=...)``): a receiver of that Struct type takes a field's attribute
name as the name it is stored under, as ``sidecar=`` does, and reads that column; a
receiver that knows no such type reads stored names only. Files and S3, asyncio and
trio."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5)


class Camel(msgspec.Struct, rename="camel"):
    token_ids: np.ndarray
    routed_experts: np.ndarray = msgspec.field(name="experts")
    score: float = 0.0


class CamelBatch(msgspec.Struct):
    samples: list[Camel]


async def test_a_renamed_fields_attribute_name_reads_its_column(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    sent = [Camel(np.arange(n), np.full((n, 2), 7, np.uint8), float(n)) for n in LENGTHS]
    async with rlwire.open_sender(url, storage_options=options, validate=False) as sender:
        await sender.send(CamelBatch(sent))
    async with rlwire.open_receiver(
        url,
        storage_options=options,
        type=CamelBatch,
        fields=("token_ids", "routed_experts", "score"),
        record_consumed=False,
    ) as receiver:
        with anyio.fail_after(20):  # waited for "token_ids" until its timeout before
            cols = (await receiver.areceive(timeout=10)).samples
    assert cols.names == ("tokenIds", "experts", "score")
    assert [row.tolist() for row in cols["tokenIds"]] == [list(range(n)) for n in LENGTHS]
    assert [row.shape for row in cols["experts"]] == [(n, 2) for n in LENGTHS]
    # A receiver that knows no Struct type reads stored names only: it waits for
    # "token_ids", which may still be appended, and says so.
    async with rlwire.open_receiver(
        url, storage_options=options, type=dict, fields=("token_ids",), record_consumed=False
    ) as receiver:
        with pytest.raises(rlwire.ReceiveTimeout, match="token_ids"):
            await receiver.areceive(timeout=0.5)


class Reference(msgspec.Struct, rename="camel"):
    token_ids: np.ndarray
    ref_logprobs: np.ndarray | None = None


class ReferenceBatch(msgspec.Struct):
    samples: list[Reference]


@pytest.mark.parametrize("name", ["ref_logprobs", "refLogprobs"])
async def test_a_field_appended_by_its_attribute_name_is_read_by_either(
    file_or_s3: tuple[str, dict[str, Any]], name: str
) -> None:
    url, options = file_or_s3
    ref = rlwire.Ragged.from_lengths(np.full(sum(LENGTHS), 9.0, np.float32), list(LENGTHS))
    async with rlwire.open_sender(url, storage_options=options, validate=False) as sender:
        await sender.send(ReferenceBatch([Reference(np.arange(n)) for n in LENGTHS]))
        await sender.add_fields(0, {"ref_logprobs": ref})  # stored as refLogprobs: left None
    async with rlwire.open_receiver(
        url,
        storage_options=options,
        type=ReferenceBatch,
        fields=("token_ids", name),
        record_consumed=False,
    ) as receiver:
        with anyio.fail_after(20):
            cols = (await receiver.areceive(timeout=10)).samples
    assert set(cols.names) == {"tokenIds", "refLogprobs"}
    assert [row.tolist() for row in cols["refLogprobs"]] == [[9.0] * n for n in LENGTHS]
