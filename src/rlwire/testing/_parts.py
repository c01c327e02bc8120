"""The contract on steps filled part by part: a sink stores them whole and in order, or
says at once that it cannot."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.schema import TrainingBatch
from rlwire._api.step_writer import StepWriter
from rlwire._api.synthetic import assert_batches_equal, make_batch, make_sample
from rlwire._core.columns import Columns
from rlwire._core.errors import (
    ConfigError,
    EndOfStream,
    ReceiveTimeout,
    StepExistsError,
    StepGapError,
)
from rlwire._core.ragged import Ragged
from rlwire.testing._fixtures import (
    RANKS,
    ContractFixtures,
    Endpoint,
    rank_batches,
    small_samples,
)

__all__ = ["PartsContract"]


class PartsContract(ContractFixtures):
    """``open_step`` / ``put`` / seal, read part by part and whole; for a sink without
    :attr:`~rlwire.abc.Sink.stores_parts`, ``open_step`` must raise ConfigError."""

    async def test_parts_arrive_in_commit_order_or_open_step_is_refused(
        self, endpoint: Endpoint
    ) -> None:
        sender = endpoint.open_sender(sidecar="routed_experts")
        if not sender.sink.stores_parts:
            with pytest.raises(ConfigError, match="cannot store a step part by part"):
                sender.open_step()
            await sender.aclose()
            return
        groups = {f"g{i}": [make_sample(4 + 3 * i, seed=i)] for i in range(5)}
        if not self.persistent:
            await _over_a_stream(sender, endpoint, groups, self.timeout)
            return
        async with sender:
            async with sender.open_step(ranks=RANKS) as writer:
                for key, samples in groups.items():
                    assert await writer.put(samples, key=key) is False
        for rank in range(RANKS):
            keys = writer.assignment[rank]
            with endpoint.open_receiver(rank=rank) as receiver:
                got = [part async for part in receiver.aparts(timeout=self.timeout)]
                assert [(p.key, p.index) for p in got] == [(k, i) for i, k in enumerate(keys)]
                for part in got:
                    assert_batches_equal(
                        part.value, type(part.value)(samples=groups[str(part.key)])
                    )
                assert receiver.next_step == 1
            with endpoint.open_receiver(rank=rank) as receiver:
                whole = await receiver.areceive(timeout=self.timeout)
                assert [len(s.token_ids) for s in whole.samples] == [
                    len(s.token_ids) for k in keys for s in groups[str(k)]
                ]

    async def test_receivers_hold_the_assignment_the_writer_made(self, store: Endpoint) -> None:
        """Parts go to the lightest rank by ``cost`` (here: samples) or to the rank
        forced; each rank reads exactly its keys, in commit order, with their samples."""
        sender = store.open_sender()
        if await _refused(sender):
            return
        groups: dict[str | int, list[Any]] = {
            i: _group(n, seed=10 * i) for i, n in enumerate((5, 1, 1, 1, 3))
        }
        groups["forced"] = _group(1, seed=99)
        async with sender:
            async with sender.open_step(ranks=RANKS, cost=lambda s: float(len(s))) as writer:
                for key, samples in groups.items():
                    forced = 0 if key == "forced" else None
                    assert await writer.put(samples, key=key, rank=forced) is False
        # 5 -> rank 0; then rank 1 is the lighter one until it passes 5 (3 more parts of
        # 1, then 3); "forced" goes where it is told.
        assert writer.assignment == ((0, "forced"), (1, 2, 3, 4))
        for rank in range(RANKS):
            with store.open_receiver(rank=rank) as receiver:
                got = [part async for part in receiver.aparts(timeout=self.timeout)]
            assert [(p.key, p.rank, p.index) for p in got] == [
                (key, rank, i) for i, key in enumerate(writer.assignment[rank])
            ]
            for part in got:
                assert part.key is not None
                assert_batches_equal(part.value, TrainingBatch(samples=groups[part.key]))

    async def test_a_key_is_put_once_in_a_step(self, store: Endpoint) -> None:
        sender = store.open_sender()
        if await _refused(sender):
            return
        async with sender:
            async with sender.open_step() as writer:
                await writer.put(_group(1, seed=1), key="a")
                with pytest.raises(StepExistsError, match="unique within a step"):
                    await writer.put(_group(1, seed=2), key="a")
                await writer.put(_group(1, seed=3), key="b")
        with store.open_receiver() as receiver:
            got = [part async for part in receiver.aparts(timeout=self.timeout)]
        assert [p.key for p in got] == ["a", "b"]
        assert_batches_equal(got[0].value, TrainingBatch(samples=_group(1, seed=1)))

    async def test_an_open_step_resumes_with_its_committed_keys_skipped(
        self, store: Endpoint
    ) -> None:
        """A producer whose block failed leaves the step open with its parts; a sender
        opened with ``on_existing="resume"`` learns their keys, skips them, seals."""
        groups = {key: _group(1, seed=i) for i, key in enumerate("abc")}
        sender = store.open_sender()
        if await _refused(sender):
            return
        with pytest.raises(RuntimeError, match="the producer fails"):
            async with sender:
                async with sender.open_step(ranks=RANKS) as writer:
                    await writer.put(groups["a"], key="a")
                    await writer.put(groups["b"], key="b")
                    raise RuntimeError("the producer fails")
        async with store.open_sender(on_existing="resume") as again:
            async with again.open_step(ranks=RANKS) as writer:
                assert writer.step == 0 and writer.resumed == {"a", "b"}
                for key, samples in groups.items():
                    assert await writer.put(samples, key=key) is (key != "c")
        keys: list[str] = []
        for rank in range(RANKS):
            with store.open_receiver(rank=rank) as receiver:
                got = [part async for part in receiver.aparts(timeout=self.timeout)]
            assert [p.key for p in got] == list(writer.assignment[rank])
            for part in got:
                assert_batches_equal(part.value, TrainingBatch(samples=groups[str(part.key)]))
            keys += [str(p.key) for p in got]
        assert sorted(keys) == ["a", "b", "c"]

    async def test_a_step_sent_again_while_its_parts_are_read_is_never_two_runs(
        self, store: Endpoint
    ) -> None:
        """A producer restarted with ``overwrite`` sends the step again (same keys,
        other samples; three parts, then one) after a receiver took part 0: the receiver
        refuses the new run's part, or its seal, with StepGapError; a receive then
        returns the new run's step, whole."""
        old = {key: _group(1, seed=i) for i, key in enumerate("abc")}
        sender = store.open_sender()
        if await _refused(sender):
            return
        async with sender:
            async with sender.open_step() as writer:
                for key, samples in old.items():
                    await writer.put(samples, key=key)
        for again in (3, 1):
            new = {key: _group(1, seed=10 * again + i) for i, key in enumerate("abc"[:again])}
            with store.open_receiver(record_consumed=False) as receiver:
                parts: Any = receiver.aparts(timeout=self.timeout)  # an async generator: aclose()
                first = await parts.__anext__()
                assert_batches_equal(first.value, TrainingBatch(samples=old[str(first.key)]))
                async with store.open_sender(on_existing="overwrite") as other:
                    async with other.open_step() as writer:
                        for key, samples in new.items():
                            await writer.put(samples, key=key)
                with pytest.raises(StepGapError, match="sent again"):
                    await parts.__anext__()
                await parts.aclose()
            with store.open_receiver(record_consumed=False) as receiver:
                whole = await receiver.areceive(timeout=self.timeout)
            assert_batches_equal(whole, TrainingBatch(samples=[s for g in new.values() for s in g]))
            old = new

    async def test_a_receiver_resumed_after_its_step_was_sent_again_refuses_the_new_run(
        self, store: Endpoint
    ) -> None:
        """A receiver moved past part 0 of a step; the step was sent again (other
        samples, same keys) and the receiver stopped. Resumed (``resume=True``) at part
        1, it refuses the new run's parts, never handing them out after the old run's
        part 0: its rank's part mark names that part 0 (``Source.mark_part(of=)``)."""
        sender = store.open_sender()
        if await _refused(sender):
            return
        async with sender:
            async with sender.open_step() as writer:
                for i, key in enumerate("abc"):
                    await writer.put(_group(1, seed=i), key=key)
        with store.open_receiver() as receiver:
            parts: Any = receiver.aparts(timeout=self.timeout)  # an async generator: aclose()
            await parts.__anext__()
            async with store.open_sender(on_existing="overwrite") as other:
                async with other.open_step() as writer:
                    for i, key in enumerate("abc"):
                        await writer.put(_group(1, seed=10 + i), key=key)
            with pytest.raises(StepGapError, match="sent again"):
                await parts.__anext__()  # having written that it moved past part 0
            await parts.aclose()
        with store.open_receiver(resume=True) as resumed:
            assert (resumed.next_step, resumed.next_part) == (0, 1)
            with pytest.raises(StepGapError, match="sent again"):
                await resumed.aparts(timeout=self.timeout).__anext__()

    async def test_a_whole_step_waits_for_its_seal_and_finish_ends_the_stream(
        self, store: Endpoint
    ) -> None:
        """A part is read as soon as its ``put`` returns, the whole step only once it is
        sealed (before the sender closes), ``EndOfStream`` after ``finish()``, and the
        parts again ``as_columns``."""
        sender = store.open_sender()
        if await _refused(sender):
            return
        first, second = _group(2, seed=1), _group(1, seed=2)
        with store.open_receiver() as receiver, store.open_receiver(as_columns=True) as packed:
            async with sender:
                async with sender.open_step() as writer:
                    await writer.put(first, key="a")
                    live: Any = packed.aparts(timeout=self.timeout)  # an async generator
                    early = await live.__anext__()  # a part is visible once put returns
                    with pytest.raises(ReceiveTimeout):
                        await receiver.areceive(timeout=0.2)  # parts, no seal yet
                    await writer.put(second, key="b")
                # Sealed: the step is whole now, before the sender closes or finishes.
                whole = await receiver.areceive(timeout=self.timeout)
                await sender.finish()
            assert_batches_equal(whole, TrainingBatch(samples=first + second))
            with pytest.raises(EndOfStream):
                await receiver.areceive(timeout=self.timeout)
            parts = [early, *[part async for part in live]]
            assert [p.key for p in parts] == ["a", "b"]
            for part, samples in zip(parts, (first, second), strict=True):
                columns = part.value.samples
                assert isinstance(columns, Columns) and len(columns) == len(samples)
                tokens = columns["token_ids"]
                assert isinstance(tokens, Ragged)
                for i, sample in enumerate(samples):
                    assert np.array_equal(tokens[i], sample.token_ids)

    async def test_a_step_filled_part_by_part_follows_a_rank_left_out(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        """Step 1 goes to rank 0 alone, step 2 is filled part by part for both ranks:
        rank 1 is told of step 1 (StepGapError), and after ``skip()`` reads step 2's
        parts intact, then step 3, then the end of the stream."""
        if await _refused(sender):
            return
        groups = {f"g{i}": _group(1 + i % 3, seed=i) for i in range(4)}
        got: dict[int, list[Any]] = {}

        async def produce() -> None:
            async with sender.open_step(ranks=RANKS, balance="count") as writer:
                for key, samples in groups.items():
                    await writer.put(samples, key=key)
            await sender.send_ranks(rank_batches(3))
            await sender.finish()

        async def consume(rank: int) -> None:
            receiver = receivers[rank]
            got[rank] = [p async for p in receiver.aparts(timeout=self.timeout)]
            step3 = await receiver.areceive(timeout=self.timeout)
            assert_batches_equal(step3, rank_batches(3)[rank])
            with pytest.raises(EndOfStream):
                await receiver.areceive(timeout=self.timeout)

        rank0, rank1 = receivers
        async with sender:
            await sender.send_ranks(rank_batches(0))
            for receiver in receivers:
                await receiver.areceive(timeout=self.timeout)
            await sender.send(make_batch(1, seed=1))
            assert_batches_equal(await rank0.areceive(timeout=self.timeout), make_batch(1, seed=1))
            with pytest.raises(StepGapError, match="step 1"):
                await rank1.areceive(timeout=self.timeout)
            assert rank1.skip() == 1
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                for rank in range(RANKS):
                    tg.start_soon(consume, rank)
        for rank in range(RANKS):
            keys = list(groups)[rank::RANKS]  # by count, in turn
            assert [(p.step, p.key, p.index) for p in got[rank]] == [
                (2, k, i) for i, k in enumerate(keys)
            ]
            for part in got[rank]:
                assert_batches_equal(part.value, type(part.value)(samples=groups[str(part.key)]))


def _group(count: int, seed: int) -> list[Any]:
    """``count`` small samples of 3, 4, ... tokens."""
    return small_samples(range(3, 3 + count), seed)


async def _refused(sender: TrainingBatchSender) -> bool:
    """For a sink that does not store parts: check that ``open_step`` says so, close."""
    if sender.sink.stores_parts:
        return False
    with pytest.raises(ConfigError, match="cannot store a step part by part"):
        sender.open_step()
    await sender.aclose()
    return True


async def _over_a_stream(
    sender: TrainingBatchSender, endpoint: Endpoint, groups: dict[str, list[Any]], timeout: float
) -> None:
    """A stream carries parts to receivers that are there: each rank reads step 0 part
    by part and step 1 whole, while the sender fills both."""
    receivers = [endpoint.open_receiver(rank=rank) for rank in range(RANKS)]
    writers: list[StepWriter] = []
    parts: dict[int, list[Any]] = {}
    wholes: dict[int, Any] = {}

    async def produce() -> None:
        async with sender:
            for _ in range(2):
                async with sender.open_step(ranks=RANKS) as writer:
                    for key, samples in groups.items():
                        assert await writer.put(samples, key=key) is False
                writers.append(writer)

    async def consume(rank: int) -> None:
        parts[rank] = [part async for part in receivers[rank].aparts(timeout=timeout)]
        wholes[rank] = await receivers[rank].areceive(timeout=timeout)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            for rank in range(RANKS):
                tg.start_soon(consume, rank)
    finally:
        for receiver in receivers:
            receiver.close()
    for rank in range(RANKS):
        keys = writers[0].assignment[rank]
        assert writers[1].assignment[rank] == keys
        assert [(p.step, p.key, p.index) for p in parts[rank]] == [
            (0, k, i) for i, k in enumerate(keys)
        ]
        for part in parts[rank]:
            assert_batches_equal(part.value, type(part.value)(samples=groups[str(part.key)]))
        expected = [s for k in keys for s in groups[str(k)]]
        assert_batches_equal(wholes[rank], type(wholes[rank])(samples=expected))
        assert receivers[rank].next_step == 2
