"""What a ZeroMQ sender must not pile up over a long run: a run lasts days, and whatever
it keeps per step or per receiver opened grows until it stops the run. And what a
trainer that opens a receiver per step gets (docs/reliability.md, "ZeroMQ reconnects")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import rlwire
from rlwire.testing import assert_batches_equal, make_batch

pytestmark = pytest.mark.anyio

#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 10.0


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


async def announced(sender: rlwire.TrainingBatchSender, before: bytes | None) -> bytes:
    """Wait until the sender has read the ``ready`` of a receiver of rank 0 other than
    ``before``; its routing id. A receiver announces itself on opening, but the sender
    reads it only as it next sends: until then it sends rank 0's step to the receiver it
    knows, closed or not (its ``bye`` read late: see the test below)."""
    peers = sender.sink._peers  # type: ignore[attr-defined]
    with anyio.fail_after(LONG):
        while True:
            peers.drain()
            owner: bytes | None = peers._owners.owner(0)
            if owner is not None and owner != before:
                return owner
            await anyio.sleep(0.005)


async def test_receivers_opened_per_step_leave_nothing_behind_in_the_sender(
    tmp_path: Path,
) -> None:
    """A trainer that opens a receiver for each step (and closes it) is a new receiver
    each time, under a routing id no later one uses. The sender kept the sequence
    number, the count read and the protocol of every receiver that ever announced
    itself, so a run of a receiver per step grew by three entries a step for good.

    Each step is sent once the sender has read the new receiver's ``ready``: sent before
    (and before the old one's ``bye`` is read, which a loaded machine delays), it goes
    to the receiver that just closed and is lost, as documented; the next test."""
    url = f"zmq+ipc://{tmp_path / 'run.sock'}"
    steps = 60
    async with rlwire.open_sender(url, storage_options={"linger": 1}) as sender:
        before = None
        for step in range(steps):
            async with rlwire.open_receiver(url, start_step=step) as receiver:
                before = await announced(sender, before)
                batch = make_batch(1, n=8, seed=step)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender.send, batch)
                    with anyio.fail_after(LONG):
                        assert_batches_equal(await receiver.areceive(), batch)
        peers = sender.sink._peers  # type: ignore[attr-defined]
        peers.drain()  # the last receiver's bye
        # The receivers there now, and one whose bye is on its way at most.
        assert max(len(peers._seq), len(peers._acked), len(peers._minor)) <= 2, steps


async def test_a_step_sent_to_a_receiver_that_closes_unread_is_one_gap_for_the_next(
    tmp_path: Path,
) -> None:
    """A step sent to a rank's receiver that then closes without reading it is lost with
    it (the sender sends zero-copy and keeps nothing once ZeroMQ let go): the rank's next
    receiver, opened at that step, reports it as one StepGapError when the next step
    comes, then returns that step and every later one. Never a step twice, never a wait
    past the next step."""
    url = f"zmq+ipc://{tmp_path / 'run.sock'}"
    batches = [make_batch(1, n=8, seed=step) for step in range(4)]
    async with rlwire.open_sender(url, storage_options={"linger": 1}) as sender:
        async with rlwire.open_receiver(url) as first:
            old = await announced(sender, None)
            await sender.send(batches[0])
            with anyio.fail_after(LONG):
                assert_batches_equal(await first.areceive(), batches[0])
            await sender.send(batches[1])  # queued in its socket, never read
        async with rlwire.open_receiver(url, start_step=1) as second:
            await announced(sender, old)
            await sender.send(batches[2])
            with anyio.fail_after(LONG):
                with pytest.raises(rlwire.StepGapError, match="expected step 1, got step 2"):
                    await second.areceive()
                assert_batches_equal(await second.areceive(), batches[2])
                await sender.send(batches[3])
                assert_batches_equal(await second.areceive(), batches[3])
