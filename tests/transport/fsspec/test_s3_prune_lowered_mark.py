"""A trainer restarted from a checkpoint lowers its mark to step S before it reads
anything, so that keep_last keeps S while it is read (docs/how-to/lifecycle.md). A
sender's prune that read the marks just before, and is deleting S, must not delete S's
sidecar once the trainer has read S's main object: it reads the marks again after
deleting the main objects. The test's proxy orders the requests: the sender's first
delete waits until the trainer has read step 1's main object, and the trainer's read of
its sidecar until the sender's send (its prune) is over."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest
from s3_server import FaultProxy, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio


def batch(step: int) -> dict[str, Any]:
    return {"step": step, "side": np.full(1 << 14, step, np.int64)}


async def test_a_step_a_restarted_trainer_lowered_its_mark_to_keeps_its_sidecar(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    deleting, main_read, sent = threading.Event(), threading.Event(), threading.Event()
    sidecar = "step-00000001.rank-0000.sidecar.rlw"

    def fault(method: str, target: str) -> None:
        if method == "POST" and target.endswith("?delete") and not deleting.is_set():
            deleting.set()  # the sender read the marks (2): steps 0 and 1 go
            main_read.wait(10)
        elif method == "GET" and target.endswith(sidecar) and deleting.is_set():
            main_read.set()  # the trainer read step 1's main object, its mark lowered
            sent.wait(10)

    async with rlwire.open_sender(
        s3_url, keep_last=1, sidecar=("side",), storage_options=s3_proxy.options
    ) as sender:
        for step in (0, 1):
            assert await sender.send(batch(step)) == step
        async with rlwire.open_receiver(s3_url, type=dict, storage_options=s3_endpoint) as rx:
            for step in (0, 1):
                assert (await rx.areceive(timeout=10))["step"] == step
            with pytest.raises(rlwire.ReceiveTimeout):
                await rx.areceive(timeout=0.2)  # asks for step 2: mark 2
        s3_proxy.fault = fault

        async def send() -> None:
            try:
                assert await sender.send(batch(2)) == 2
            finally:
                sent.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            assert await anyio.to_thread.run_sync(deleting.wait, 10)
            async with rlwire.open_receiver(
                s3_url, type=dict, start_step=1, storage_options=s3_proxy.options
            ) as rx:
                got = await rx.areceive(timeout=20)
                assert (await rx.areceive(timeout=10))["step"] == 2  # moved past step 1
        assert main_read.is_set()
        assert got["step"] == 1 and (np.asarray(got["side"]) == 1).all()
        s3_proxy.fault = None
        assert await sender.send(batch(3)) == 3  # the trainer moved past step 1: it goes
    client, bucket = s3_client(s3_endpoint), s3_url.removeprefix("s3://").partition("/")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket[0]).get("Contents", [])]
    assert not [k for k in keys if "step-00000001" in k or "step-00000000" in k], keys
