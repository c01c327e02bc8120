"""What a ZeroMQ sender must not pile up over a long run: a run lasts days, and whatever
it keeps per step or per receiver opened grows until it stops the run."""

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


async def test_receivers_opened_per_step_leave_nothing_behind_in_the_sender(
    tmp_path: Path,
) -> None:
    """A trainer that opens a receiver for each step (and closes it) is a new receiver
    each time, under a routing id no later one uses. The sender kept the sequence
    number, the count read and the protocol of every receiver that ever announced
    itself, so a run of a receiver per step grew by three entries a step for good."""
    url = f"zmq+ipc://{tmp_path / 'run.sock'}"
    steps = 60
    async with rlwire.open_sender(url, storage_options={"linger": 1}) as sender:
        for step in range(steps):
            async with rlwire.open_receiver(url, start_step=step) as receiver:
                batch = make_batch(1, n=8, seed=step)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender.send, batch)
                    with anyio.fail_after(LONG):
                        assert_batches_equal(await receiver.areceive(), batch)
        peers = sender.sink._peers  # type: ignore[attr-defined]
        peers.drain()  # the last receiver's bye
        # The receivers there now, and one whose bye is on its way at most.
        assert max(len(peers._seq), len(peers._acked), len(peers._minor)) <= 2, steps
