"""A ``ray://`` sender and receiver awaited under one backend, then the other
(successive ``anyio.run`` calls, each way): the thread limiter and lock rlwire made serve
both (anyio's were bound to the first backend, and the second await raised its
``RuntimeError: no running event loop``)."""

from __future__ import annotations

import anyio
import pytest
from helpers import assert_batches_equal, make_batch

import rlwire

pytest.importorskip("ray")


@pytest.mark.parametrize(("first", "second"), [("asyncio", "trio"), ("trio", "asyncio")])
def test_ray_sender_and_receiver_move_to_another_backend(
    ray_url: str, first: str, second: str
) -> None:
    batches = [make_batch(2, seed=s) for s in range(3)]
    sender = rlwire.open_sender(ray_url, on_existing="overwrite")
    receiver = rlwire.open_receiver(ray_url)
    got = []

    async def one(step: int) -> None:
        await sender.send(batches[step])
        got.append(await receiver.areceive(timeout=30))

    for step, backend in enumerate([first, second, first]):
        anyio.run(one, step, backend=backend)
    anyio.run(sender.aclose, backend=second)
    receiver.close()
    for batch, want in zip(got, batches, strict=True):
        assert_batches_equal(batch, want)
