"""The contract on retention: keep_last and max_ahead, for sinks that record consumption."""

from __future__ import annotations

import functools

import anyio
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.schema import TrainingBatch
from rlwire._api.synthetic import assert_batches_equal, make_batch
from rlwire._core.errors import StepGapError
from rlwire.testing._fixtures import ContractFixtures, Endpoint, rank_batches
from rlwire.transport._base import Sink

__all__ = ["RetentionContract"]


class RetentionContract(ContractFixtures):
    """keep_last and max_ahead, skipped for a sink that records no consumption."""

    def _require_retention(self, sender: TrainingBatchSender) -> None:
        if type(sender.sink).read_consumption is Sink.read_consumption:
            pytest.skip("the sink does not record what receivers consumed (optional)")

    def _stored(self, store: Endpoint, steps: int, rank: int = 0) -> list[int]:
        """The steps of ``rank`` still stored, read without recording anything."""
        kept = []
        for step in range(steps):
            with store.open_receiver(start_step=step, rank=rank, record_consumed=False) as probe:
                try:
                    if probe.poll() is not None:
                        kept.append(step)
                except StepGapError:  # deleted while a later step is stored
                    pass
        return kept

    async def test_keep_last_deletes_only_what_every_rank_moved_past(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        sender = store.open_sender(keep_last=1)
        self._require_retention(sender)

        async def take(rank: int, count: int) -> None:
            for _ in range(count):
                await receivers[rank].areceive(timeout=self.timeout)
            receivers[rank].wait_next(timeout=0)  # looks for the next step: moves past

        async with sender:
            for s in range(3):
                await sender.send_ranks(rank_batches(s))
            assert self._stored(store, 3) == [0, 1, 2]
            await take(0, 3)  # rank 0 moved past steps 0-2, rank 1 past none
            await sender.send_ranks(rank_batches(3))
            assert self._stored(store, 4) == [0, 1, 2, 3]
            await take(1, 1)  # rank 1 moved past step 0
            await sender.send_ranks(rank_batches(4))
            assert self._stored(store, 5) == [1, 2, 3, 4]
            await take(1, 4)  # every rank moved past 0-2; rank 0 is still at step 3
            await sender.send_ranks(rank_batches(5))
            assert self._stored(store, 6) == [3, 4, 5]
            await take(0, 3)
            await take(1, 1)  # both moved past everything: only the newest is kept
            await sender.send_ranks(rank_batches(6))
            assert self._stored(store, 7) == [6]
        # A receiver that asks for a deleted step is told so, not left waiting for it.
        with store.open_receiver(record_consumed=False) as late:
            with pytest.raises(StepGapError):
                await late.areceive(timeout=self.timeout)

    async def test_keep_last_deletes_a_step_held_for_a_rank_left_out_once_it_moved_past(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """Step 0 goes to both ranks, the later steps to rank 0 alone, which stays at
        step 1: the sink keeps step 0 while rank 1 has not moved past it, and deletes it
        at the first send after rank 1 did, though rank 0 has not moved since."""
        sender = store.open_sender(keep_last=1)
        self._require_retention(sender)
        async with sender:
            await sender.send_ranks(rank_batches(0))
            await receivers[0].areceive(timeout=self.timeout)
            receivers[0].wait_next(timeout=0)  # rank 0 moved past step 0; stays at 1
            await sender.send(make_batch(1, seed=1))
            assert self._stored(store, 2, rank=1) == [0]  # rank 1 has not read it
            await receivers[1].areceive(timeout=self.timeout)
            with pytest.raises(StepGapError, match="step 1"):  # it was left out of step 1
                receivers[1].wait_next(timeout=0)  # rank 1 moved past step 0
            await sender.send(make_batch(1, seed=2))
            kept = self._stored(store, 3, rank=1)
            assert kept == [], f"rank 1's step 0 outlived its prune: {kept} stored"
            assert self._stored(store, 3) == [1, 2]  # rank 0 is at step 1

    async def test_keep_last_keeps_a_step_filled_part_by_part_for_a_rank_without_parts(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """Step 1 is filled part by part for both ranks, every part on rank 0; steps 2
        and 3 go to rank 0 alone. Rank 1 has no file of step 1, yet reads it (empty):
        its seal counts rank 1, so the sink keeps it until rank 1 moved past it."""
        sender = store.open_sender(keep_last=1)
        self._require_retention(sender)
        if not sender.sink.stores_parts:
            await sender.aclose()
            pytest.skip("the sink cannot store a step part by part (optional)")
        rank0, rank1 = receivers

        move_past = functools.partial(_move_past, timeout=self.timeout)

        async with sender:
            await sender.send_ranks(rank_batches(0))
            for receiver in receivers:
                await move_past(receiver)
            async with sender.open_step(ranks=2) as writer:
                await writer.put(rank_batches(1)[0].samples, key="a", rank=0)
            await move_past(rank0)
            await sender.send(make_batch(1, seed=2))
            await move_past(rank0)
            await sender.send(make_batch(1, seed=3))
            assert self._stored(store, 4, rank=1) == [1], "rank 1's step 1 was deleted"
            assert len((await rank1.areceive(timeout=self.timeout)).samples) == 0  # no parts
            assert rank1.last_stats is not None and rank1.last_stats.step == 1
            with pytest.raises(StepGapError, match="step 2"):  # sent to rank 0 alone
                rank1.wait_next(timeout=0)  # looks for step 2: moved past step 1
            await move_past(rank0)
            await sender.send(make_batch(1, seed=4))
            assert self._stored(store, 5, rank=1) == []  # moved past: deleted
            assert self._stored(store, 5) == [4]

    async def test_max_ahead_waits_for_the_slowest_rank(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        sender = store.open_sender(max_ahead=1)
        self._require_retention(sender)
        batch = make_batch(1, seed=3)
        async with sender:
            await sender.send(batch)
            await sender.send(batch)  # one step ahead of the receivers: allowed
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.3):
                    await sender.send(batch)  # two ahead: waits
            assert sender.next_step == 2  # the cancelled wait sent nothing
            assert self._stored(store, 3) == [0, 1]

            async def move_on() -> None:
                await anyio.sleep(0.2)
                await receivers[0].areceive(timeout=self.timeout)  # step 0
                receivers[0].wait_next(timeout=0)  # looks for step 1: moves past step 0

            async with anyio.create_task_group() as tg:
                tg.start_soon(move_on)
                with anyio.fail_after(self.timeout):
                    assert await sender.send(batch) == 2
            stats = sender.last_stats
            assert stats is not None and stats.wait_seconds >= 0.1

    async def test_max_ahead_waits_for_no_rank_on_steps_it_was_left_out_of(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """max_ahead=0: step 0 goes to both ranks, steps 1 and 2 to rank 0 alone (a
        ``send``, then a ``send_ranks`` of one), step 3 to both. Rank 1 moved past step
        0 and, not reading meanwhile, does not move past steps 1 and 2 (its receiver
        skips them, StepGapError, when it next reads). So the send of step 3 must not
        wait for rank 1 there, which would be the two waiting for each other for ever;
        on a step it was sent, rank 1 still holds the sender back."""
        sender = store.open_sender(max_ahead=0)
        self._require_retention(sender)
        rank0, rank1 = receivers

        move_past = functools.partial(_move_past, timeout=self.timeout)

        async with sender:
            with anyio.fail_after(self.timeout):
                await sender.send_ranks(rank_batches(0))
                await move_past(rank0)
                await move_past(rank1)  # rank 1 is at step 1 from now on
                await sender.send(make_batch(1, seed=1))
                await move_past(rank0)
                await sender.send_ranks([make_batch(1, seed=2)])
                await move_past(rank0)
                assert await sender.send_ranks(rank_batches(3)) == 3
            for step in (1, 2):
                with pytest.raises(StepGapError, match=f"step {step}"):
                    await rank1.areceive(timeout=self.timeout)
                assert rank1.skip() == step
            await move_past(rank0)  # rank 0 moved past step 3, rank 1 has not
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.3):
                    await sender.send_ranks(rank_batches(4))  # waits for rank 1
            assert sender.next_step == 4
            with anyio.fail_after(self.timeout):
                assert_batches_equal(await move_past(rank1), rank_batches(3)[1])
                assert await sender.send_ranks(rank_batches(4)) == 4

    async def test_max_ahead_after_resume_waits_for_no_rank_on_steps_it_was_left_out_of(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """As above across a restart: step 0 goes to both ranks, step 1 to rank 0
        alone, then the sender stops. A sender resumed with ``max_ahead=0`` must send
        step 2 to both ranks without waiting for rank 1 to move past step 1, which it
        was never sent (the resumed sink says how many ranks each kept step went to)."""
        rank0, rank1 = receivers
        first = store.open_sender(max_ahead=0)
        self._require_retention(first)
        async with first:
            with anyio.fail_after(self.timeout):
                await first.send_ranks(rank_batches(0))
                for receiver in receivers:
                    await receiver.areceive(timeout=self.timeout)
                    receiver.wait_next(timeout=0)  # moves past step 0
                await first.send(make_batch(1, seed=1))
                await rank0.areceive(timeout=self.timeout)
                rank0.wait_next(timeout=0)
        async with store.open_sender(max_ahead=0, on_existing="resume") as again:
            with anyio.fail_after(self.timeout):
                assert await again.send_ranks(rank_batches(2)) == 2
            with pytest.raises(StepGapError, match="step 1"):
                await rank1.areceive(timeout=self.timeout)
            assert rank1.skip() == 1
            assert_batches_equal(await rank1.areceive(timeout=self.timeout), rank_batches(2)[1])

    async def test_max_ahead_after_resume_waits_for_no_rank_on_deleted_steps_it_was_left_out_of(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """With ``keep_last=1``: step 0 goes to both ranks, steps 1-3 to rank 0 alone,
        each read, so steps 0-2 are deleted and rank 1's mark stays at step 1. Resumed
        with ``max_ahead=1``, the send of step 4 must not wait for rank 1 to move past
        steps 1-3: the resumed sink no longer has them to say they left rank 1 out, and
        rank 1 can read none of them (it skips them, then waits for step 4)."""
        rank0, rank1 = receivers
        first = store.open_sender(keep_last=1)
        self._require_retention(first)
        async with first:
            with anyio.fail_after(self.timeout):
                await first.send_ranks(rank_batches(0))
                await rank1.areceive(timeout=self.timeout)
                rank1.wait_next(timeout=0)  # moves past step 0
                for step in range(4):
                    if step:
                        await first.send(make_batch(1, seed=step))
                    await rank0.areceive(timeout=self.timeout)
                    rank0.wait_next(timeout=0)
        async with store.open_sender(max_ahead=1, on_existing="resume") as again:
            with anyio.fail_after(self.timeout):
                assert await again.send_ranks(rank_batches(4)) == 4
            for step in (1, 2, 3):
                with pytest.raises(StepGapError, match=f"step {step}"):
                    await rank1.areceive(timeout=self.timeout)
                assert rank1.skip() == step
            assert_batches_equal(await rank1.areceive(timeout=self.timeout), rank_batches(4)[1])

    async def test_max_ahead_after_resume_holds_for_a_rank_that_never_read(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """``max_ahead=1``: steps 0 and 1 go to both ranks; rank 0 reads them, rank 1
        reads nothing (no mark). A resumed sender must still wait for rank 1 before
        step 2, as the first sender would have: counting it at each new sender's first
        step let every restart run ``max_ahead`` steps further past it."""
        rank0, rank1 = receivers
        first = store.open_sender(max_ahead=1)
        self._require_retention(first)
        async with first:
            with anyio.fail_after(self.timeout):
                for step in range(2):
                    await first.send_ranks(rank_batches(step))
                    await _move_past(rank0, self.timeout)
        async with store.open_sender(max_ahead=1, on_existing="resume") as again:
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.3):
                    await again.send_ranks(rank_batches(2))  # two ahead of rank 1
            assert again.next_step == 2
            with anyio.fail_after(self.timeout):
                assert_batches_equal(await _move_past(rank1, self.timeout), rank_batches(0)[1])
                assert await again.send_ranks(rank_batches(2)) == 2

    async def test_max_ahead_after_resume_with_more_ranks_passes_a_step_filled_part_by_part(
        self, store: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """Step 0 is filled part by part for ranks 0 and 1, steps 1-3 go to both, and
        both read everything. Resumed with four ranks and ``max_ahead=2``, the send of
        step 4 must go at once: ranks 2 and 3 had no step before it (step 0's seal
        counts two ranks), though they recorded nothing."""
        first = store.open_sender()
        self._require_retention(first)
        if not first.sink.stores_parts:
            await first.aclose()
            pytest.skip("the sink cannot store a step part by part (optional)")
        async with first:
            async with first.open_step(ranks=2) as writer:
                for rank in range(2):
                    await writer.put(make_batch(1, seed=rank).samples, key=rank, rank=rank)
            for step in range(1, 4):
                await first.send_ranks(rank_batches(step))
        with anyio.fail_after(self.timeout):
            for receiver in receivers:
                for _ in range(4):
                    await receiver.areceive(timeout=self.timeout)
                receiver.wait_next(timeout=0)  # moves past step 3
        async with store.open_sender(max_ahead=2, on_existing="resume") as again:
            with anyio.fail_after(self.timeout):
                assert await again.send_ranks([make_batch(1, seed=r) for r in range(4)]) == 4


async def _move_past(
    receiver: TrainingBatchReceiver[TrainingBatch], timeout: float
) -> TrainingBatch:
    """Receive the next step, then look for the one after it: the rank moves past it."""
    batch = await receiver.areceive(timeout=timeout)
    receiver.wait_next(timeout=0)
    return batch
