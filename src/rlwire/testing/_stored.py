"""The contract on stored steps: they outlive the sender, and a stream can end and resume."""

from __future__ import annotations

import anyio
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.schema import TrainingBatch
from rlwire._api.synthetic import assert_batches_equal, make_batch
from rlwire._core.errors import (
    ClosedError,
    EndOfStream,
    StepExistsError,
)
from rlwire.testing._fixtures import (
    ContractFixtures,
    Endpoint,
    rank_batches,
    send_steps,
)

__all__ = ["StoredContract"]


class StoredContract(ContractFixtures):
    """Steps that outlive the sender, on_existing, restarts from a checkpoint, finish."""

    async def test_steps_outlive_the_sender(
        self, store: Endpoint, sender: TrainingBatchSender
    ) -> None:
        batches = [make_batch(2, seed=s) for s in range(2)]
        async with sender:
            for batch in batches:
                await sender.send(batch)
        with store.open_receiver() as receiver:
            for batch in batches:
                assert_batches_equal(await receiver.areceive(timeout=self.timeout), batch)

    async def test_existing_steps_are_refused_resumed_or_overwritten(
        self, store: Endpoint, sender: TrainingBatchSender
    ) -> None:
        async with sender:
            await sender.send(make_batch(1, seed=1))
            await sender.send(make_batch(1, seed=2))
        with pytest.raises(StepExistsError):
            async with store.open_sender(on_existing="error"):
                pass
        resumed = make_batch(1, seed=3)
        async with store.open_sender(on_existing="resume") as again:
            assert await again.send(resumed) == 2
        with store.open_receiver(start_step=2) as receiver:
            assert_batches_equal(await receiver.areceive(timeout=self.timeout), resumed)
        fresh = make_batch(1, seed=4)
        async with store.open_sender(on_existing="overwrite") as again:
            assert await again.send(fresh) == 0
        with store.open_receiver() as receiver:
            assert_batches_equal(await receiver.areceive(timeout=self.timeout), fresh)
            assert receiver.poll() is None  # steps 1 and 2 of the old run are gone

    async def test_restart_from_a_checkpoint_truncates_later_steps(self, store: Endpoint) -> None:
        old = [rank_batches(s) for s in range(4)]

        def reopen(on_existing: str, start_step: int | None) -> TrainingBatchSender:
            return store.open_sender(on_existing=on_existing, start_step=start_step)

        async with reopen("error", None) as first:
            await send_steps(first, old)
        for on_existing in ("error", "resume"):
            with pytest.raises(StepExistsError, match=r"steps 2\.\.3"):
                async with reopen(on_existing, 2):
                    pass
        new = [make_batch(1, seed=99 + r) for r in range(2)]
        async with reopen("truncate", 2) as again:
            assert again.next_step == 2
            assert await again.send_ranks(new) == 2
        for rank in range(2):
            with store.open_receiver(rank=rank) as rx:
                for step in range(2):  # the steps before the checkpoint are kept
                    assert_batches_equal(await rx.areceive(timeout=self.timeout), old[step][rank])
                assert_batches_equal(await rx.areceive(timeout=self.timeout), new[rank])
                assert rx.poll() is None  # the old step 3 is gone
        async with reopen("resume", None) as resumed:
            assert resumed.next_step == 3

    async def test_finish_ends_the_stream(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        steps = [rank_batches(s) for s in range(2)]

        async def send_all() -> None:
            async with sender:
                await send_steps(sender, steps)
                await sender.finish()
                await sender.finish()  # a second call does nothing
                with pytest.raises(ClosedError, match="finished"):
                    await sender.send(steps[0][0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_all)
            for rank, receiver in enumerate(receivers):
                with anyio.fail_after(self.timeout):
                    got = [batch async for batch in receiver]  # ends at the mark
                assert len(got) == 2
                for step, batch in enumerate(got):
                    assert_batches_equal(batch, steps[step][rank])
                with pytest.raises(EndOfStream):
                    await receiver.areceive(timeout=self.timeout)

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
            assert await receiver.await_next(timeout=self.timeout)
            assert receiver.last_step is None and receiver.next_step == 0
            assert await receiver.await_next(timeout=0)  # still there, still not taken
            assert_batches_equal(receiver.poll(), batch)  # type: ignore[arg-type]
        assert receiver.last_step == 0 and not receiver.wait_next(timeout=0.05)

    async def test_a_finished_stream_resumes(
        self, store: Endpoint, sender: TrainingBatchSender
    ) -> None:
        async with sender:
            await sender.send(make_batch(1, seed=1))
            await sender.finish()
        with store.open_receiver(start_step=5) as late:
            with pytest.raises(EndOfStream):  # started beyond the end
                late.receive(timeout=self.timeout)
            with pytest.raises(EndOfStream):
                late.wait_next(timeout=0)
        with pytest.raises(StepExistsError):
            async with store.open_sender():
                pass
        more = make_batch(1, seed=2)
        with store.open_receiver() as receiver:
            assert len(receiver.receive(timeout=self.timeout).samples) == 1  # step 0
            with pytest.raises(EndOfStream):  # then the end
                receiver.receive(timeout=self.timeout)
            async with store.open_sender(on_existing="resume") as again:
                assert await again.send(more) == 1
            assert_batches_equal(receiver.receive(timeout=self.timeout), more)

    async def test_a_stream_finished_past_its_last_step_resumes_at_its_end(
        self, store: Endpoint
    ) -> None:
        """A sender opened at step 5 finishes without sending: the stream ends at step 5,
        and a receiver there is told so. A sender resumed after it goes on at step 5, not
        at step 0, where the receiver would wait for ever."""
        async with store.open_sender(start_step=5) as sender:
            await sender.finish()
        with store.open_receiver(start_step=5) as receiver:
            with pytest.raises(EndOfStream):
                receiver.receive(timeout=self.timeout)
            batch = make_batch(1, seed=3)
            async with store.open_sender(on_existing="resume") as again:
                assert again.next_step == 5
                assert await again.send(batch) == 5
            assert_batches_equal(receiver.receive(timeout=self.timeout), batch)
