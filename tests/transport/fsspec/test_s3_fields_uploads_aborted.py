"""A large appended-fields object goes up to S3 as a multipart upload; an outage that
keeps a failed ``add_fields`` from aborting it leaves it unfinished. As with a step's
objects, closing the stage's sender (once S3 is back), or the next sender opened with
``on_existing="resume"``, lists and aborts it: nothing billed is left behind. A real
moto server behind the fault proxy. Asyncio and trio."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from s3_server import RESET, FaultProxy, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio

BIG = np.ones((2, 2_000_000))  # 32 MB: a multipart upload


def _uploads(options: dict[str, Any], url: str) -> list[str]:
    out = s3_client(options).list_multipart_uploads(Bucket=url.removeprefix("s3://"))
    return [u["Key"] for u in out.get("Uploads", [])]


async def _fail_an_upload(url: str, proxy: FaultProxy) -> rlwire.TrainingBatchSender:
    """A committed step 0, and a stage whose add_fields an outage cut short."""
    options = proxy.options
    step = rlwire.Ragged.from_lengths(np.arange(5), [2, 3])
    async with rlwire.open_sender(url, storage_options=options) as producer:
        await producer.send({"samples": rlwire.Columns({"token_ids": step})})

    def fault(method: str, target: str) -> str | None:
        if method == "PUT" and "fields-000" in target:
            proxy.down = True  # from the first upload part on, S3 is out of reach
            return RESET
        return None

    proxy.fault = fault
    stage = rlwire.open_sender(url, storage_options=options)
    with pytest.raises(rlwire.TransportError):
        await stage.add_fields(0, {"big": BIG})
    proxy.fault, proxy.down = None, False
    return stage


async def test_closing_the_stage_aborts_its_unfinished_upload(
    s3_url: str, s3_proxy: FaultProxy, s3_endpoint: dict[str, Any]
) -> None:
    stage = await _fail_an_upload(s3_url, s3_proxy)
    assert _uploads(s3_endpoint, s3_url) == ["step-00000000.rank-0000.fields-000.rlw"]
    await stage.add_fields(0, {"big": BIG})  # the retry lands
    await stage.aclose()
    assert _uploads(s3_endpoint, s3_url) == []


async def test_a_resumed_sender_aborts_a_stages_unfinished_upload(
    s3_url: str, s3_proxy: FaultProxy, s3_endpoint: dict[str, Any]
) -> None:
    stage = await _fail_an_upload(s3_url, s3_proxy)
    s3_proxy.down = True  # the stage closes while S3 is still out of reach
    with pytest.warns(ResourceWarning):
        await stage.aclose()
    s3_proxy.down = False
    async with rlwire.open_sender(s3_url, storage_options=s3_endpoint, on_existing="resume"):
        pass
    assert _uploads(s3_endpoint, s3_url) == []
