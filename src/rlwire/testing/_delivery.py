"""The contract on delivery: every sink moves steps in order, per rank, intact."""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch
from rlwire._api.sender import open_sender
from rlwire._api.synthetic import assert_batches_equal, make_batch, make_sample
from rlwire._core.errors import (
    ConfigError,
    ReceiveTimeout,
    SchemaError,
    StepGapError,
)
from rlwire.testing._fixtures import (
    ContractFixtures,
    Endpoint,
    big_batch,
    rank_batches,
    receive_beside,
    send_steps,
)

__all__ = ["DeliveryContract"]


class DeliveryContract(ContractFixtures):
    """Round trips, ranks, timeouts, late receivers, codecs, cancellation, closing."""

    async def test_round_trip_in_order(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        batches = [make_batch(3, seed=10 * i) for i in range(3)]

        async def send_all() -> None:
            async with sender:
                for i, batch in enumerate(batches):
                    assert await sender.send(batch) == i

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_all)
            for i, batch in enumerate(batches):
                assert_batches_equal(await receivers[0].areceive(timeout=self.timeout), batch)
                assert receivers[0].last_step == i

    async def test_each_rank_gets_its_own_payload(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        steps = [rank_batches(s, samples=2, seed_stride=100) for s in range(2)]

        async def send_all() -> None:
            async with sender:
                await send_steps(sender, steps)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_all)
            for payloads in steps:
                for rank, receiver in enumerate(receivers):
                    got = await receiver.areceive(timeout=self.timeout)
                    assert_batches_equal(got, payloads[rank])

    async def test_a_rank_left_out_of_a_step_is_told_before_the_next_step(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        """Step 0 goes to both ranks, step 1 to rank 0 alone, and nothing follows for a
        while (a rollout is long): rank 1's receiver must not wait for step 1 until step 2
        is sent, but raise StepGapError for it now; after ``skip()`` it gets step 2, and
        hears of the gap only once. (On a stream, the receivers are there before the
        sends, as a stream tells only the receivers it knows.)"""
        rank0, rank1 = receivers
        async with sender:
            await sender.send_ranks(rank_batches(0))
            for receiver in receivers:
                await receiver.areceive(timeout=self.timeout)
            await sender.send(make_batch(1, seed=1))
            assert_batches_equal(await rank0.areceive(timeout=self.timeout), make_batch(1, seed=1))
            started = time.monotonic()
            with pytest.raises(StepGapError, match="step 1"):
                await rank1.areceive(timeout=self.timeout)
            told = time.monotonic() - started
            assert told < self.timeout / 2, f"rank 1 was told after {told:.1f} s"
            assert rank1.skip() == 1
            await sender.send_ranks(rank_batches(2))
            for rank, receiver in enumerate(receivers):
                got = await receiver.areceive(timeout=self.timeout)
                assert_batches_equal(got, rank_batches(2)[rank])

    async def test_blocking_receive_in_a_thread(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        batch = make_batch(2, seed=7)

        async def send_one() -> None:
            async with sender:
                await sender.send(batch)

        got = await receive_beside(
            send_one, lambda: anyio.to_thread.run_sync(receivers[0].receive, self.timeout)
        )
        assert_batches_equal(got, batch)

    async def test_receive_times_out_when_nothing_is_sent(
        self, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        with anyio.fail_after(self.timeout), pytest.raises(ReceiveTimeout):
            await receivers[0].areceive(timeout=0.2)
        with pytest.raises(ReceiveTimeout):
            receivers[0].receive(timeout=0.1)
        assert receivers[0].poll() is None

    async def test_receiver_that_starts_late_gets_step_zero(
        self, endpoint: Endpoint, sender: TrainingBatchSender
    ) -> None:
        batch = make_batch(2, seed=3)
        async with sender, anyio.create_task_group() as tg:
            tg.start_soon(sender.send, batch)
            await anyio.sleep(0.3)
            with endpoint.open_receiver() as receiver:
                assert_batches_equal(await receiver.areceive(timeout=self.timeout), batch)
                assert receiver.last_step == 0

    @pytest.mark.parametrize(
        "options",
        [{"compression": "lz4"}, {"compression": "zstd", "checksum": False}],
        ids=["lz4", "zstd-no-checksum"],
    )
    async def test_codecs_and_compression_pass_through(
        self,
        endpoint: Endpoint,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
        options: dict[str, Any],
    ) -> None:
        batch = make_batch(2, n=5000, seed=5)
        routed = batch.samples[0].routed_experts
        assert routed is not None
        routed[:] = 1  # compressible, so lz4/zstd keep their output

        async def send_one() -> None:
            async with endpoint.open_sender(**options) as s:
                await s.send(batch)

        got = await receive_beside(send_one, lambda: receivers[0].areceive(timeout=self.timeout))
        assert_batches_equal(got, batch)

    async def test_arrays_may_be_reused_once_send_returns(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        batch = make_batch(2, n=70_000, seed=11)
        sent = make_batch(2, n=70_000, seed=11)

        async def send_then_scribble() -> None:
            async with sender:
                await sender.send(batch)
                for sample in batch.samples:
                    sample.token_ids[:] = -1
                    assert sample.routed_experts is not None
                    sample.routed_experts[:] = 0

        got = await receive_beside(
            send_then_scribble, lambda: receivers[0].areceive(timeout=self.timeout)
        )
        assert_batches_equal(got, sent)

    async def test_closing_flushes_accepted_steps(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        # Small enough to sit in a socket's queues, so that sends return before anything
        # is read and closing must deliver what is still queued.
        batches = [make_batch(2, seed=s) for s in range(3)]
        closed = anyio.Event()

        async def send_and_close() -> None:
            async with sender:
                for batch in batches:
                    await sender.send(batch)
            closed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_and_close)
            for batch in batches:
                assert_batches_equal(await receivers[0].areceive(timeout=self.timeout), batch)
            with anyio.fail_after(self.timeout):
                await closed.wait()

    async def test_cancelled_send_leaves_no_partial_step(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        big = big_batch()
        small = make_batch(2, seed=22)
        cancelled = False

        async def send_both() -> None:
            nonlocal cancelled
            async with sender:
                # Some ms into a send of 64 MB: encoding, writing or committing. A sink
                # that writes it in one trip may finish before the loop sees the deadline
                # (a loaded machine): a sooner one then, the finished steps delivered.
                for deadline in (0.002, 0.001, 0.0005, 0.0002, 0.0001):
                    with anyio.move_on_after(deadline) as scope:
                        await sender.send(big)
                    if scope.cancelled_caught:
                        cancelled = True
                        break
                await sender.send(small)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_both)
            first = await receivers[0].areceive(timeout=self.timeout)
            while first.samples[0].token_ids.size == big.samples[0].token_ids.size:
                # A send that finished, or a stream that handed the whole message over
                # before the cancel: whole.
                assert_batches_equal(first, big)
                first = await receivers[0].areceive(timeout=self.timeout)
            assert_batches_equal(first, small)
        assert cancelled, "every send finished before it was cancelled: nothing was tested"

    async def test_a_step_being_written_is_never_read_in_part(
        self, endpoint: Endpoint, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        """A receiver polling as fast as it can while a step of about 27 MB (no
        sidecar: one message) is written finds nothing, then the whole step: never a
        message cut short, which a sink that writes where readers look, or commits
        before its writes end, hands out."""
        batch = TrainingBatch(
            samples=[make_sample(1 << 18, layers=16, topk=2, seed=s) for s in (3, 4)]
        )
        deadline = time.monotonic() + self.timeout

        def watch() -> TrainingBatch:
            polls = 0
            while time.monotonic() < deadline:
                got = receivers[0].poll()  # CorruptFrameError: it read a message in part
                polls += 1
                if got is not None:
                    return got
            pytest.fail(f"the step did not arrive within {self.timeout} s ({polls} polls)")

        async def send_one() -> None:
            async with endpoint.open_sender() as sender:
                await sender.send(batch)

        got = await receive_beside(send_one, lambda: anyio.to_thread.run_sync(watch))
        assert_batches_equal(got, batch)

    async def test_received_arrays_are_read_only_unless_writable(
        self, endpoint: Endpoint, sender: TrainingBatchSender
    ) -> None:
        """Rank 0 (the default) gets read-only arrays; rank 1, opened with
        ``writable=True``, gets arrays it may write into, and on a store its writes
        never reach what is stored: read again, the step is as sent."""
        # Arrays of some size (out-of-band, not in a header); the same bits twice.
        payloads, sent = ([make_batch(2, n=20_000, seed=30 + r) for r in (0, 1)] for _ in "ab")
        with (
            endpoint.open_receiver(rank=0) as reader,
            endpoint.open_receiver(rank=1, writable=True) as writer,
        ):

            async def send() -> None:
                async with sender:
                    await sender.send_ranks(payloads)

            async def receive() -> list[TrainingBatch]:
                return [await r.areceive(timeout=self.timeout) for r in (reader, writer)]

            got = await receive_beside(send, receive)
        for rank, batch in enumerate(got):
            assert_batches_equal(batch, sent[rank])
            for sample in batch.samples:
                arrays = [v for v in msgspec.structs.astuple(sample) if isinstance(v, np.ndarray)]
                flags = {a.flags.writeable for a in arrays}
                assert flags == {rank == 1}, f"rank {rank}: writeable flags {flags}"
                if rank == 1:
                    for array in arrays:
                        array[...] = 0
        if not self.persistent:
            return
        with endpoint.open_receiver(rank=1, record_consumed=False) as again:
            assert_batches_equal(await again.areceive(timeout=self.timeout), sent[1])

    async def test_a_step_that_fails_its_checks_is_never_delivered(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        # The checks of a list of samples run beside the write: the step is written (or
        # uploaded) first, and must still never reach a receiver.
        bad = make_batch(41, seed=23)
        bad.samples[17].logprobs[3] = float("nan")
        good = make_batch(3, seed=24)

        async def send_both() -> None:
            async with sender:
                with pytest.raises(SchemaError, match=r"samples\[17\]\.logprobs") as info:
                    await sender.send(bad)
                assert info.value.step == 0
                assert await sender.send(good) == 0  # the failed step was not used up

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_both)
            assert_batches_equal(await receivers[0].areceive(timeout=self.timeout), good)
            assert receivers[0].last_step == 0

    async def test_a_step_one_rank_fails_is_delivered_to_no_rank(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        """``send_ranks`` whose rank 1 fails its checks (after rank 0 was written, and
        on some sinks after rank 1 was too) makes no rank of the step visible: rank 0
        finds nothing, not its half of a step that failed, and the step's number, not
        used up, then delivers the step sent in its place to every rank."""
        failed = [make_batch(2, seed=40), make_batch(3, seed=41)]
        failed[1].samples[1].logprobs[0] = float("nan")
        again = [make_batch(2, seed=42), make_batch(2, seed=43)]
        async with sender:
            with pytest.raises(SchemaError, match=r"samples\[1\]\.logprobs") as info:
                await sender.send_ranks(failed)
            assert (info.value.step, info.value.rank) == (0, 1)
            for rank, receiver in enumerate(receivers):
                got = receiver.poll()
                assert got is None, f"rank {rank} got step {receiver.last_step} of a failed send"
            assert await sender.send_ranks(again) == 0  # the failed step was not used up
            for rank, receiver in enumerate(receivers):
                assert_batches_equal(await receiver.areceive(timeout=self.timeout), again[rank])
                assert receiver.last_step == 0

    async def test_unknown_storage_option_is_a_config_error(self, sink_url: str) -> None:
        with pytest.raises(ConfigError, match="no_such_option"):
            async with open_sender(sink_url, storage_options={"no_such_option": 1}) as s:
                await s.send(make_batch(1))
        with pytest.raises(ConfigError, match="no_such_option"):
            with open_receiver(sink_url, storage_options={"no_such_option": 1}) as r:
                r.poll()
