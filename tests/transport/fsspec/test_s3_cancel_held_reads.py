"""Waits that read from S3, cancelled while a GET hangs (held by the test's proxy, as a
stalled connection holds it): a receive, an ``add_fields``, and a send waiting under
``max_ahead`` for the ranks' consumption marks. Each stops at its deadline and leaves
the next call to go on: their GETs and listings (``S3Bucket.run_read``) give up when
the caller of the worker-thread trip they run in is cancelled, instead of waiting for
botocore's read timeout (cut to 4 s here, 15 s by default). Nothing is lost meanwhile."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from s3_server import FaultProxy, cancelled_while_held, short_reads
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio


async def cut_short(proxy: FaultProxy, work: Callable[[], Awaitable[Any]]) -> float:
    """Seconds ``work`` took to return once cancelled while its first GET is held (the
    retries that follow it pass). A TransportError is what the read timeout gave: the
    caller's assertion tells."""
    took, _ = await cancelled_while_held(
        proxy, work, lambda method, target: method == "GET", quiet=(rlwire.TransportError,)
    )
    proxy.release()
    return took


def batch(tag: int) -> dict[str, Any]:
    return {"x": np.arange(400_000) * (tag + 1)}


async def test_a_receive(s3_proxy: FaultProxy, s3_url: str) -> None:
    options = short_reads(s3_proxy)
    async with rlwire.open_sender(s3_url, storage_options=options) as sender:
        for tag in (0, 1):
            await sender.send(batch(tag))
    async with rlwire.open_receiver(s3_url, storage_options=options, type=dict) as rx:
        took = await cut_short(s3_proxy, lambda: rx.areceive(timeout=10))
        for tag in (0, 1):  # the cancelled receive lost nothing
            assert (await rx.areceive(timeout=10))["x"].tobytes() == batch(tag)["x"].tobytes()
    assert took < 1.5, f"the cancelled receive returned after {took:.1f} s"


async def test_add_fields(s3_proxy: FaultProxy, s3_url: str) -> None:
    options = short_reads(s3_proxy)
    async with rlwire.open_sender(s3_url, storage_options=options) as sender:
        await sender.send({"samples": [{"token_ids": np.arange(3)}] * 4})
        took = await cut_short(s3_proxy, lambda: sender.add_fields(0, {"score": [0.5] * 4}))
        await sender.add_fields(0, {"score": [0.5] * 4})
    assert took < 1.5, f"the cancelled add_fields returned after {took:.1f} s"


async def test_a_send_waiting_under_max_ahead(s3_proxy: FaultProxy, s3_url: str) -> None:
    options = short_reads(s3_proxy)
    retention = rlwire.Retention(max_ahead=1)
    async with rlwire.open_sender(s3_url, storage_options=options, retention=retention) as sender:
        for tag in (0, 1):
            await sender.send(batch(tag))
        took = await cut_short(s3_proxy, lambda: sender.send(batch(2)))  # no rank read
        assert sender.next_step == 2
    assert took < 1.5, f"the cancelled wait returned after {took:.1f} s"
