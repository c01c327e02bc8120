"""A receive from S3 cancelled while it downloads a large step must return within a
slice or two of its deadline, not once the whole step is in memory (a 400 MB step took
12 s after a cancellation at 0.05 s): the download of one object ran inside one slice
(``S3Bucket.run``), which no cancellation could end. Here the sidecar's ranged GETs after
its first are held by the test's proxy, as a slow link holds them, so that the receive
is inside the download when its deadline comes; the next receive gets the step whole,
and a receiver opened with ``resume=True`` starts at it."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest
from s3_server import HOLD, FaultProxy
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio


def batch(tag: int) -> list[dict[str, Any]]:
    # 10 MB of routed_experts in the sidecar: two ranged GETs (8 MB, then the rest).
    experts = np.full((26_000, 48, 8), tag, np.uint8)
    return [{"token_ids": np.arange(4) + tag, "routed_experts": experts}]


def same(got: list[dict[str, Any]], tag: int) -> bool:
    want = batch(tag)[0]
    return all(np.array_equal(got[0][k], want[k]) for k in want)


@pytest.mark.parametrize("how", ["areceive", "aparts"])
async def test_a_receive_cancelled_inside_a_large_download_returns_at_its_deadline(
    s3_proxy: FaultProxy, s3_url: str, how: str
) -> None:
    options = s3_proxy.options
    async with rlwire.open_sender(
        s3_url, storage_options=options, sidecar=("routed_experts",)
    ) as sender:
        for tag in (0, 1):
            await sender.send(batch(tag))
    sidecar_gets: list[str] = []

    def fault(method: str, target: str) -> str | None:
        if method != "GET" or "step-00000000.rank-0000.sidecar" not in target:
            return None
        sidecar_gets.append(target)
        return HOLD if len(sidecar_gets) > 1 else None  # its first range passes

    async with rlwire.open_receiver(s3_url, storage_options=options, type=list) as rx:
        s3_proxy.fault = fault
        cancelled_at: list[float] = []

        async def receive(scope: anyio.CancelScope) -> None:
            with scope:
                if how == "areceive":
                    await rx.areceive(timeout=10)
                else:
                    async for _ in rx.aparts(timeout=10):
                        pass

        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive, scope)
            with anyio.fail_after(30):  # a loaded machine reaches the held range late
                while len(sidecar_gets) < 2:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.1)  # inside the held range's wait
            cancelled_at.append(time.monotonic())
            scope.cancel()
        took = time.monotonic() - cancelled_at[0]
        s3_proxy.fault = None
        threading.Timer(0.1, s3_proxy.release).start()
        assert scope.cancelled_caught
        assert took < 2.0, f"the cancelled receive returned {took:.1f} s after its cancel"
        assert rx.next_step == 0
        assert same(await rx.areceive(timeout=10), 0)  # nothing lost, nothing half-taken
    async with rlwire.open_receiver(s3_url, storage_options=options, type=list, resume=True) as rx:
        assert same(await rx.areceive(timeout=10), 0)  # not moved past: taken again
        assert same(await rx.areceive(timeout=10), 1)
