"""Fields appended to a step that is deleted and written again while the stage's commit
is under way (a producer restarted with ``on_existing="overwrite"`` beside a stage that
appends): the stage's fields, checked against the old step, must never come with the
new step of that number. A real moto server on loopback; the stage's PUT of its
``fields-000`` object is held by the fault proxy until the producer has rewritten the
step (the race forced, not hoped for). The stage is told (its commit checks the step
again); the old step's file stays, tied to the old message (format 1.5's ``of``), which
no reader takes, and a new stage appends to the new step beside it. Asyncio and trio."""

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


def _batch(first: int) -> dict[str, Any]:
    return {
        "samples": rlwire.Columns(
            {"token_ids": rlwire.Ragged.from_lengths(np.arange(first, first + 5), [2, 3])}
        )
    }


async def test_fields_of_a_step_rewritten_during_the_commit_never_come_with_the_new_one(
    s3_url: str, s3_proxy: FaultProxy
) -> None:
    url = f"{s3_url}/run"
    options = s3_proxy.options
    async with rlwire.open_sender(url, storage_options=options) as producer:
        await producer.send(_batch(0))
    held, go = threading.Event(), threading.Event()

    def fault(method: str, target: str) -> None:
        if method == "PUT" and "fields-000" in target and not held.is_set():
            held.set()
            go.wait(30)  # the stage's commit waits here, past its checks

    s3_proxy.fault = fault
    stage = rlwire.open_sender(url, storage_options=options)
    outcome: list[BaseException | None] = []

    async def append() -> None:
        try:
            await stage.add_fields(0, {"score": [1.0, 2.0]})
            outcome.append(None)
        except rlwire.RlwireError as exc:
            outcome.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            await anyio.to_thread.run_sync(held.wait, 30)
            # The producer, restarted: the old step 0 goes, a new step 0 comes.
            async with rlwire.open_sender(
                url, storage_options=options, on_existing="overwrite"
            ) as producer:
                await producer.send(_batch(100))
            go.set()
        await stage.aclose()

    async def received() -> Any:
        async with rlwire.open_receiver(
            url, storage_options=options, type=dict, as_columns=True, record_consumed=False
        ) as receiver:
            with anyio.fail_after(20):
                return (await receiver.areceive())["samples"]

    got = await received()
    assert got["token_ids"].values.tolist() == list(range(100, 105))
    assert "score" not in got.names, f"the old step's fields came with the new one: {got['score']}"
    assert outcome and isinstance(outcome[0], rlwire.ConfigError), outcome
    assert "step 0 was deleted and sent again" in str(outcome[0])
    keys = s3_client(options).list_objects_v2(Bucket=s3_url[5:]).get("Contents", [])
    assert [o["Key"] for o in keys if "fields" in o["Key"]] == [
        "run/step-00000000.rank-0000.fields-000.rlw"
    ]
    again = rlwire.open_sender(url, storage_options=options)  # a stage: opens nothing
    try:
        await again.add_fields(0, {"score": [7.0, 8.0]})
    finally:
        await again.aclose()
    got = await received()
    assert got["score"].tolist() == [7.0, 8.0]
