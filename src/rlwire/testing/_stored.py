"""The contract on stored steps: they outlive the sender, and a stream can end and resume."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch
from rlwire._api.sender import open_sender
from rlwire._api.synthetic import assert_batches_equal, make_batch
from rlwire._core.errors import (
    ClosedError,
    EndOfStream,
    StepExistsError,
)
from rlwire.testing._fixtures import TIMEOUT, ContractFixtures

__all__ = ["StoredContract"]


class StoredContract(ContractFixtures):
    """Steps that outlive the sender, on_existing, restarts from a checkpoint, finish."""

    async def test_steps_outlive_the_sender(
        self,
        sender: TrainingBatchSender,
        sink_url: str,
        receiver_options: Mapping[str, Any],
    ) -> None:
        self._require_store()
        batches = [make_batch(2, seed=s) for s in range(2)]
        async with sender:
            for batch in batches:
                await sender.send(batch)
        with open_receiver(sink_url, storage_options=receiver_options) as receiver:
            for batch in batches:
                assert_batches_equal(await receiver.areceive(timeout=TIMEOUT), batch)

    async def test_existing_steps_are_refused_resumed_or_overwritten(
        self,
        sender: TrainingBatchSender,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receiver_options: Mapping[str, Any],
    ) -> None:
        self._require_store()
        async with sender:
            await sender.send(make_batch(1, seed=1))
            await sender.send(make_batch(1, seed=2))

        def reopen(on_existing: Any) -> TrainingBatchSender:
            return open_sender(sink_url, storage_options=sender_options, on_existing=on_existing)

        with pytest.raises(StepExistsError):
            async with reopen("error"):
                pass
        resumed = make_batch(1, seed=3)
        async with reopen("resume") as again:
            assert await again.send(resumed) == 2
        with open_receiver(sink_url, start_step=2, storage_options=receiver_options) as receiver:
            assert_batches_equal(await receiver.areceive(timeout=TIMEOUT), resumed)
        fresh = make_batch(1, seed=4)
        async with reopen("overwrite") as again:
            assert await again.send(fresh) == 0
        with open_receiver(sink_url, storage_options=receiver_options) as receiver:
            assert_batches_equal(await receiver.areceive(timeout=TIMEOUT), fresh)
            assert receiver.poll() is None  # steps 1 and 2 of the old run are gone

    async def test_restart_from_a_checkpoint_truncates_later_steps(
        self,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receiver_options: Mapping[str, Any],
    ) -> None:
        self._require_store()
        old = [[make_batch(1, seed=10 * s + r) for r in range(2)] for s in range(4)]

        def reopen(on_existing: Any, start_step: int | None) -> TrainingBatchSender:
            return open_sender(
                sink_url,
                storage_options=sender_options,
                on_existing=on_existing,
                start_step=start_step,
            )

        async with reopen("error", None) as first:
            for per_rank in old:
                await first.send_ranks(per_rank)
        for on_existing in ("error", "resume"):
            with pytest.raises(StepExistsError, match=r"steps 2\.\.3"):
                async with reopen(on_existing, 2):
                    pass
        new = [make_batch(1, seed=99 + r) for r in range(2)]
        async with reopen("truncate", 2) as again:
            assert again.next_step == 2
            assert await again.send_ranks(new) == 2
        for rank in range(2):
            with open_receiver(sink_url, rank=rank, storage_options=receiver_options) as rx:
                for step in range(2):  # the steps before the checkpoint are kept
                    assert_batches_equal(await rx.areceive(timeout=TIMEOUT), old[step][rank])
                assert_batches_equal(await rx.areceive(timeout=TIMEOUT), new[rank])
                assert rx.poll() is None  # the old step 3 is gone
        async with reopen("resume", None) as resumed:
            assert resumed.next_step == 3

    async def test_finish_ends_the_stream(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        steps = [[make_batch(1, seed=10 * s + r) for r in range(2)] for s in range(2)]

        async def send_all() -> None:
            async with sender:
                for payloads in steps:
                    await sender.send_ranks(payloads)
                await sender.finish()
                await sender.finish()  # a second call does nothing
                with pytest.raises(ClosedError, match="finished"):
                    await sender.send(steps[0][0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_all)
            for rank, receiver in enumerate(receivers):
                with anyio.fail_after(TIMEOUT):
                    got = [batch async for batch in receiver]  # ends at the mark
                assert len(got) == 2
                for step, batch in enumerate(got):
                    assert_batches_equal(batch, steps[step][rank])
                with pytest.raises(EndOfStream):
                    await receiver.areceive(timeout=TIMEOUT)

    async def test_wait_does_not_consume(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        receiver = receivers[0]
        assert not await receiver.await_next(timeout=0.05)
        batch = make_batch(2, seed=5)

        async def send_one() -> None:
            async with sender:
                await sender.send(batch)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_one)
            assert await receiver.await_next(timeout=TIMEOUT)
            assert receiver.last_step is None and receiver.next_step == 0
            assert await receiver.await_next(timeout=0)  # still there, still not taken
            assert_batches_equal(receiver.poll(), batch)  # type: ignore[arg-type]
        assert receiver.last_step == 0 and not receiver.wait_next(timeout=0.05)

    async def test_a_finished_stream_resumes(
        self,
        sender: TrainingBatchSender,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receiver_options: Mapping[str, Any],
    ) -> None:
        self._require_store()
        async with sender:
            await sender.send(make_batch(1, seed=1))
            await sender.finish()
        with open_receiver(sink_url, start_step=5, storage_options=receiver_options) as late:
            with pytest.raises(EndOfStream):  # started beyond the end
                late.receive(timeout=TIMEOUT)
            with pytest.raises(EndOfStream):
                late.wait_next(timeout=0)
        with pytest.raises(StepExistsError):
            async with open_sender(sink_url, storage_options=sender_options):
                pass
        more = make_batch(1, seed=2)
        with open_receiver(sink_url, storage_options=receiver_options) as receiver:
            assert [len(b.samples) for b in receiver] == [1]  # step 0, then the end
            async with open_sender(
                sink_url, storage_options=sender_options, on_existing="resume"
            ) as again:
                assert await again.send(more) == 1
            assert_batches_equal(receiver.receive(timeout=TIMEOUT), more)
