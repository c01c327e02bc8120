"""The producer's own ``add_fields`` beside its sends held back by ``max_ahead``, asyncio
and trio: a send (or ``open_step``) waiting for room waits for a receiver that waits for
fields the producer appends to an earlier step; the append must not wait behind that
send, or nothing moves until the receiver's timeout."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest
from helpers import plain_sample

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5, 2)
STEPS = 3


def _batch() -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[plain_sample(n) for n in LENGTHS])


@pytest.mark.parametrize("parts", [False, True], ids=["send", "open_step"])
async def test_add_fields_does_not_wait_behind_a_send_waiting_for_room(
    tmp_path: Path, parts: bool
) -> None:
    url = str(tmp_path / "run")
    got: list[list[float]] = []

    async def trainer() -> None:
        # Records what it consumed: the producer's room, once it has each step's "ref".
        async with rlwire.open_receiver(url, fields=("token_ids", "ref")) as receiver:
            for _ in range(STEPS):
                batch = await receiver.areceive(timeout=30)
                got.append(batch.samples["ref"].tolist())

    async with rlwire.open_sender(url, max_ahead=1) as producer:

        async def append(step: int) -> None:
            await anyio.sleep(0.2)  # the reference model's work
            await producer.add_fields(step, {"ref": np.full(len(LENGTHS), float(step))})

        with anyio.fail_after(20):  # was a hang: send 2 held the lock add_fields(0) needs
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(trainer)
                for step in range(STEPS):
                    if parts:
                        async with producer.open_step() as writer:
                            await writer.put(_batch().samples, key=f"group-{step}")
                    else:
                        await producer.send(_batch())
                    tasks.start_soon(append, step)
    assert got == [[float(step)] * len(LENGTHS) for step in range(STEPS)]


async def test_aclose_waits_for_an_add_fields_in_flight(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    sender = rlwire.open_sender(url)
    await sender.send(_batch())
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(sender.add_fields, 0, {"ref": np.zeros(len(LENGTHS))})
        await anyio.wait_all_tasks_blocked()  # the call has started (in a worker thread)
        await sender.aclose()
    with pytest.raises(rlwire.ClosedError):
        await sender.add_fields(0, {"other": np.zeros(len(LENGTHS))})
    async with rlwire.open_receiver(url, fields=("ref",)) as receiver:
        with anyio.fail_after(20):
            assert (await receiver.areceive()).samples["ref"].tolist() == [0.0] * len(LENGTHS)
