"""A large appended-fields object goes up to S3 as a multipart upload; an outage that
keeps a failed ``add_fields`` from aborting it leaves it unfinished. As with a step's
objects, closing the stage's sender (once S3 is back), or the next sender opened with
``on_existing="resume"``, lists and aborts it: nothing billed is left behind. The
other way round, a producer opened while a live stage uploads aborts the stage's
upload: the stage uploads again (or is told the step was sent again). A real moto
server behind the fault proxy. Asyncio and trio."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest
from s3_server import RESET, FaultProxy, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire
from rlwire.transport.fsspec import _s3_upload

pytestmark = pytest.mark.anyio

#: 12 MB: a multipart upload of two upload parts (8 MB each at most), as any object
#: above 1 MB is; more bytes than that only make each upload slower.
BIG = np.ones((2, 750_000))


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """rlwire's own retries after a failed request wait 0.1-2 s (3.4 s in all), meant
    for an outage; the same schedule, shorter, keeps these tests quick."""
    monkeypatch.setattr(_s3_upload, "RETRY_DELAYS", (0.05, 0.1, 0.2, 0.4))


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


def _hold(proxy: FaultProxy, window: str) -> tuple[threading.Event, threading.Event]:
    """Hold the stage's requests of its fields' upload in ``window`` (every upload
    part, or the completion) until the second event is set; the first is set when one
    is held. Every part, not one: a part that reached moto while the producer's open
    aborted the upload got a 500 there while the upload was still listed (a race of
    moto's, which botocore's retries ride out against S3; these tests allow none)."""
    held, go = threading.Event(), threading.Event()

    def fault(method: str, target: str) -> str | None:
        part = method == "PUT" and "partNumber=" in target
        complete = method == "POST" and "uploadId=" in target
        if "fields-000" in target and (part if window == "part" else complete):
            held.set()
            go.wait(30)
        return None

    proxy.fault = fault
    return held, go


@pytest.mark.parametrize("window", ["part", "completion"])
async def test_a_producer_resuming_during_a_stages_upload_takes_nothing_from_it(
    s3_url: str, s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], window: str
) -> None:
    """A producer restarted with ``resume`` while a stage uploads large fields aborts
    the stage's unfinished multipart upload as a killed writer's: the stage uploads its
    fields again (as on files, where the file in the making is removed) instead of
    failing with S3's bare answer to a request of an aborted upload."""
    url = f"{s3_url}/run"
    step = rlwire.Ragged.from_lengths(np.arange(5), [2, 3])
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as producer:
        await producer.send({"samples": rlwire.Columns({"token_ids": step})})
    held, go = _hold(s3_proxy, window)

    async def restart() -> None:
        await anyio.to_thread.run_sync(held.wait, abandon_on_cancel=True)
        opened = rlwire.open_sender(url, storage_options=s3_endpoint, on_existing="resume")
        async with opened as resumed:
            assert resumed.next_step == 1
        go.set()

    stage = rlwire.open_sender(url, storage_options=s3_proxy.options)
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(restart)
                await stage.add_fields(0, {"big": BIG})
    finally:
        go.set()
        await stage.aclose()
    async with rlwire.open_receiver(
        url, storage_options=s3_endpoint, type=dict, as_columns=True, record_consumed=False
    ) as receiver:
        got = (await receiver.areceive(timeout=20))["samples"]
    assert got.names == ("token_ids", "big")
    assert np.array_equal(np.asarray(got["big"].values).reshape(BIG.shape), BIG)
    assert _uploads(s3_endpoint, s3_url) == []


async def test_a_producer_overwriting_during_a_stages_upload_gets_its_fields_refused(
    s3_url: str, s3_proxy: FaultProxy, s3_endpoint: dict[str, Any]
) -> None:
    """A producer restarted with ``overwrite`` deletes the step and sends it again while
    the stage uploads: the stage's call refuses, naming the step sent again."""
    url = f"{s3_url}/run"
    step = rlwire.Ragged.from_lengths(np.arange(5), [2, 3])
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as producer:
        await producer.send({"samples": rlwire.Columns({"token_ids": step})})
    held, go = _hold(s3_proxy, "part")

    async def restart() -> None:
        await anyio.to_thread.run_sync(held.wait, abandon_on_cancel=True)
        opened = rlwire.open_sender(url, storage_options=s3_endpoint, on_existing="overwrite")
        async with opened as again:
            await again.send({"samples": rlwire.Columns({"token_ids": step})})
        go.set()

    stage = rlwire.open_sender(url, storage_options=s3_proxy.options)
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(restart)
                with pytest.raises(rlwire.ConfigError, match="step 0 was deleted"):
                    await stage.add_fields(0, {"big": BIG})
    finally:
        go.set()
        await stage.aclose()
    assert _uploads(s3_endpoint, s3_url) == []
