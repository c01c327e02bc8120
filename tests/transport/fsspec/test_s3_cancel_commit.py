"""A send (or a part's ``put``) to S3 cancelled while its commit reads the fence back
(the GET of ``fence.rlw``, held by the test's proxy as a stalled connection holds it)
is just cancelled: the read gives up on the cancelled caller, nothing of the step is
visible, and the next send takes the same step. The commit ran in the write's last trip
to a worker thread, which kept what it raised for later: the read's giving up, a
private BaseException, escaped the caller's cancel scope instead of its cancellation."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from s3_server import FaultProxy, cancelled_while_held, s3_client, short_reads
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio


async def cancelled_at_the_fence(proxy: FaultProxy, work: Callable[[], Awaitable[Any]]) -> float:
    """Run ``work``, cancel it while its read of the fence is held, and return how long
    it took to end once cancelled; the cancellation must end it, nothing else."""
    took, scope = await cancelled_while_held(
        proxy, work, lambda method, target: method == "GET" and "fence.rlw" in target
    )
    threading.Timer(0.1, proxy.release).start()
    assert scope.cancelled_caught
    return took


def keys(options: dict[str, Any], url: str, step: int) -> list[str]:
    """The objects of ``step`` at ``url``."""
    client, bucket = s3_client(options), url.removeprefix("s3://")
    objects = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [o["Key"] for o in objects if f"step-{step:08d}" in o["Key"]]


def batch(tag: int) -> dict[str, Any]:
    # No list of samples: no checks of rows run beside the write, so the commit is
    # always in the write's last trip.
    return {"x": np.arange(1000) * (tag + 1)}


#: The sender's checks: none (the commit is in the write's last trip), or checks still
#: running when the write ends, so that the commit is a trip of its own after them; its
#: read of the fence gives up on the cancelled caller there too (it was shielded: the
#: send ended at botocore's read timeout, 4 s here).
CHECKS = pytest.mark.parametrize(
    "checks",
    [True, rlwire.Checks(check=lambda obj: time.sleep(0.3))],
    ids=["in-the-last-trip", "checks-end-after-the-write"],
)


@CHECKS
async def test_a_send(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str, checks: Any
) -> None:
    options = short_reads(s3_proxy)
    async with rlwire.open_sender(s3_url, storage_options=options, validate=checks) as sender:
        assert await sender.send(batch(0)) == 0
        took = await cancelled_at_the_fence(s3_proxy, lambda: sender.send(batch(1)))
        assert sender.next_step == 1
        assert keys(s3_endpoint, s3_url, 1) == []
        assert await sender.send(batch(2)) == 1
    assert took < 1.5, f"the cancelled send returned after {took:.1f} s"
    async with rlwire.open_receiver(s3_url, storage_options=s3_endpoint, type=dict) as rx:
        for tag in (0, 2):
            assert (await rx.areceive(timeout=10))["x"].tolist() == batch(tag)["x"].tolist()


@CHECKS
async def test_a_put(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str, checks: Any
) -> None:
    options = short_reads(s3_proxy)
    # Columns: no checks of rows run beside the write, so the commit is in its last trip.
    part = rlwire.Columns({"score": [0.5, 1.5]})
    async with rlwire.open_sender(s3_url, storage_options=options, validate=checks) as sender:
        async with sender.open_step(ranks=1) as writer:
            took = await cancelled_at_the_fence(s3_proxy, lambda: writer.put(part, key="a"))
            assert keys(s3_endpoint, s3_url, 0) == []
            assert await writer.put(part, key="a") is False
        assert sender.next_step == 1
    assert took < 1.5, f"the cancelled put returned after {took:.1f} s"
