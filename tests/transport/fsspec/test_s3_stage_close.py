"""A stage that appended large fields (a multipart upload) closes while the live
producer's send of the next step is mid-upload, on the S3 test server: the stage's
close aborts what it may have left, never the producer's upload, whose send then
completes and is read whole. The producer's upload is held by the fault proxy until
the stage has closed (the overlap forced, not hoped for). Asyncio and trio."""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest
from s3_server import FaultProxy, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio

#: Above the size S3 objects go up as multipart uploads (1 MiB).
BIG = 600_000


def _batch(first: float) -> dict[str, object]:
    return {"samples": [{"token_ids": np.arange(BIG) + first}]}


async def test_a_stage_closing_never_aborts_the_producers_upload(
    s3_url: str, s3_proxy: FaultProxy
) -> None:
    url, options = f"{s3_url}/run", s3_proxy.options
    held, go = threading.Event(), threading.Event()

    def fault(method: str, target: str) -> None:
        # The producer's upload of step 1: its first part waits for the stage's close.
        mine = method == "PUT" and "step-00000001" in target and "uploadId" in target
        if mine and not held.is_set():
            held.set()
            go.wait(30)

    async with rlwire.open_sender(url, storage_options=options) as producer:
        await producer.send(_batch(0))
        s3_proxy.fault = fault
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer.send, _batch(1000))
            await anyio.to_thread.run_sync(held.wait, 30)
            stage = rlwire.open_sender(url, storage_options=options)
            try:
                await stage.add_fields(0, {"ref": np.ones((1, BIG))})  # multipart too
            finally:
                await stage.aclose()  # settles what it may have left: only its own
            go.set()
    s3_proxy.fault = None
    async with rlwire.open_receiver(
        url, storage_options=options, type=dict, start_step=1, record_consumed=False
    ) as receiver:
        with anyio.fail_after(30):
            got = await receiver.areceive()
    assert np.array_equal(got["samples"][0]["token_ids"], np.arange(BIG) + 1000)
    uploads = s3_client(options).list_multipart_uploads(Bucket=s3_url[5:])
    assert not uploads.get("Uploads")
