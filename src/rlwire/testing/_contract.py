"""The contract suite every sink passes; :mod:`rlwire.testing` is its face."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import anyio
import pytest

from rlwire._api.receiver import TrainingBatchReceiver, open_receiver
from rlwire._api.schema import TrainingBatch
from rlwire._api.sender import TrainingBatchSender, open_sender
from rlwire._api.synthetic import assert_batches_equal, make_batch, make_sample
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    EndOfStream,
    ReceiveTimeout,
    StepExistsError,
)
from rlwire.transport._base import Sink

__all__ = ["SinkContract", "assert_batches_equal", "make_batch", "make_sample"]

T = TypeVar("T")

#: Seconds a contract test waits for something that should happen.
TIMEOUT = 30.0


class SinkContract:
    """The behaviour every sink shares, as pytest tests; subclass it to run them.

    Provide a ``sink_url`` fixture (a fresh URL per test); optionally override the
    ``sender_options`` and ``receiver_options`` fixtures (the ``storage_options`` of the
    sender and of the receivers) and :attr:`persistent`.

    Receivers are opened before anything is sent and sends run beside the receives, so
    the same tests fit stores (files, objects) and streams (sockets, which may wait for
    their receivers before sending).
    """

    #: Steps outlive the sender and can be read, refused, resumed or overwritten later.
    #: Set to False for streams; the tests that need a store are then skipped.
    persistent: ClassVar[bool] = True

    pytestmark = pytest.mark.anyio

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        if request.param == "trio":
            pytest.importorskip("trio")
        return str(request.param)

    @pytest.fixture
    def sink_url(self) -> str:
        raise NotImplementedError("a SinkContract subclass must define a sink_url fixture")

    @pytest.fixture
    def sender_options(self) -> Mapping[str, Any]:
        return {}

    @pytest.fixture
    def receiver_options(self) -> Mapping[str, Any]:
        return {}

    @pytest.fixture
    def sender(self, sink_url: str, sender_options: Mapping[str, Any]) -> TrainingBatchSender:
        return open_sender(sink_url, storage_options=sender_options, sidecar="routed_experts")

    @pytest.fixture
    def receivers(
        self, sink_url: str, receiver_options: Mapping[str, Any]
    ) -> Iterator[list[TrainingBatchReceiver[TrainingBatch]]]:
        opened = [
            open_receiver(sink_url, rank=rank, storage_options=receiver_options)
            for rank in range(2)
        ]
        yield opened
        for receiver in opened:
            receiver.close()

    def _require_store(self) -> None:
        if not self.persistent:
            pytest.skip("needs a sink whose steps outlive the sender")

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
                assert_batches_equal(await receivers[0].areceive(timeout=TIMEOUT), batch)
                assert receivers[0].step == i

    async def test_each_rank_gets_its_own_payload(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        steps = [[make_batch(2, seed=100 * s + r) for r in range(2)] for s in range(2)]

        async def send_all() -> None:
            async with sender:
                for payloads in steps:
                    await sender.send_ranks(payloads)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_all)
            for payloads in steps:
                for rank, receiver in enumerate(receivers):
                    got = await receiver.areceive(timeout=TIMEOUT)
                    assert_batches_equal(got, payloads[rank])

    async def test_blocking_receive_in_a_thread(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        batch = make_batch(2, seed=7)

        async def send_one() -> None:
            async with sender:
                await sender.send(batch)

        got = await _receive_beside(
            send_one, lambda: anyio.to_thread.run_sync(receivers[0].receive, TIMEOUT)
        )
        assert_batches_equal(got, batch)

    async def test_receive_times_out_when_nothing_is_sent(
        self, receivers: list[TrainingBatchReceiver[TrainingBatch]]
    ) -> None:
        with anyio.fail_after(TIMEOUT), pytest.raises(ReceiveTimeout):
            await receivers[0].areceive(timeout=0.2)
        with pytest.raises(ReceiveTimeout):
            receivers[0].receive(timeout=0.1)
        assert receivers[0].poll() is None

    async def test_receiver_that_starts_late_gets_step_zero(
        self, sink_url: str, sender: TrainingBatchSender, receiver_options: Mapping[str, Any]
    ) -> None:
        batch = make_batch(2, seed=3)
        async with sender, anyio.create_task_group() as tg:
            tg.start_soon(sender.send, batch)
            await anyio.sleep(0.3)
            with open_receiver(sink_url, storage_options=receiver_options) as receiver:
                assert_batches_equal(await receiver.areceive(timeout=TIMEOUT), batch)
                assert receiver.step == 0

    @pytest.mark.parametrize(
        "options",
        [{"compression": "lz4"}, {"compression": "zstd", "checksum": False}],
        ids=["lz4", "zstd-no-checksum"],
    )
    async def test_codecs_and_compression_pass_through(
        self,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
        options: dict[str, Any],
    ) -> None:
        batch = make_batch(2, n=5000, seed=5)
        routed = batch.samples[0].routed_experts
        assert routed is not None
        routed[:] = 1  # compressible, so lz4/zstd keep their output

        async def send_one() -> None:
            async with open_sender(sink_url, storage_options=sender_options, **options) as s:
                await s.send(batch)

        got = await _receive_beside(send_one, lambda: receivers[0].areceive(timeout=TIMEOUT))
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

        got = await _receive_beside(
            send_then_scribble, lambda: receivers[0].areceive(timeout=TIMEOUT)
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
                assert_batches_equal(await receivers[0].areceive(timeout=TIMEOUT), batch)
            with anyio.fail_after(TIMEOUT):
                await closed.wait()

    async def test_cancelled_send_leaves_no_partial_step(
        self,
        sender: TrainingBatchSender,
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
    ) -> None:
        big = _big_batch()
        small = make_batch(2, seed=22)
        cancelled = False

        async def send_both() -> None:
            nonlocal cancelled
            async with sender:
                # 2 ms into a send of 64 MB: encoding, writing or committing, never done.
                with anyio.move_on_after(0.002) as scope:
                    await sender.send(big)
                cancelled = scope.cancelled_caught
                await sender.send(small)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_both)
            first = await receivers[0].areceive(timeout=TIMEOUT)
            if first.samples[0].token_ids.size == big.samples[0].token_ids.size:
                # A stream may have handed the whole message over before the cancel.
                assert_batches_equal(first, big)
                first = await receivers[0].areceive(timeout=TIMEOUT)
            assert_batches_equal(first, small)
        assert cancelled, "the send finished before it was cancelled: nothing was tested"

    async def test_unknown_storage_option_is_a_config_error(self, sink_url: str) -> None:
        with pytest.raises(ConfigError, match="no_such_option"):
            async with open_sender(sink_url, storage_options={"no_such_option": 1}) as s:
                await s.send(make_batch(1))
        with pytest.raises(ConfigError, match="no_such_option"):
            with open_receiver(sink_url, storage_options={"no_such_option": 1}) as r:
                r.poll()

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
            assert receiver.step is None and receiver.next_step == 0
            assert await receiver.await_next(timeout=0)  # still there, still not taken
            assert_batches_equal(receiver.poll(), batch)  # type: ignore[arg-type]
        assert receiver.step == 0 and not receiver.wait(timeout=0.05)

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
                late.wait(timeout=0)
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

    def _require_retention(self, sender: TrainingBatchSender) -> None:
        if type(sender.sink).read_consumption is Sink.read_consumption:
            pytest.skip("the sink does not record what receivers consumed (optional)")

    def _stored(self, sink_url: str, receiver_options: Mapping[str, Any], steps: int) -> list[int]:
        """The steps of rank 0 still stored, read without recording anything."""
        kept = []
        for step in range(steps):
            with open_receiver(
                sink_url,
                start_step=step,
                record_consumed=False,
                storage_options=receiver_options,
            ) as probe:
                if probe.poll() is not None:
                    kept.append(step)
        return kept

    async def test_keep_last_deletes_only_what_every_rank_moved_past(
        self,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
        receiver_options: Mapping[str, Any],
    ) -> None:
        self._require_store()
        sender = open_sender(sink_url, storage_options=sender_options, keep_last=1)
        self._require_retention(sender)

        def step(s: int) -> list[TrainingBatch]:
            return [make_batch(1, seed=10 * s + r) for r in range(2)]

        async def take(rank: int, count: int) -> None:
            for _ in range(count):
                await receivers[rank].areceive(timeout=TIMEOUT)
            receivers[rank].wait(timeout=0)  # looks for the next step: moves past

        async with sender:
            for s in range(3):
                await sender.send_ranks(step(s))
            assert self._stored(sink_url, receiver_options, 3) == [0, 1, 2]
            await take(0, 3)  # rank 0 moved past steps 0-2, rank 1 past none
            await sender.send_ranks(step(3))
            assert self._stored(sink_url, receiver_options, 4) == [0, 1, 2, 3]
            await take(1, 1)  # rank 1 moved past step 0
            await sender.send_ranks(step(4))
            assert self._stored(sink_url, receiver_options, 5) == [1, 2, 3, 4]
            await take(1, 4)  # every rank moved past 0-2; rank 0 is still at step 3
            await sender.send_ranks(step(5))
            assert self._stored(sink_url, receiver_options, 6) == [3, 4, 5]
            await take(0, 3)
            await take(1, 1)  # both moved past everything: only the newest is kept
            await sender.send_ranks(step(6))
            assert self._stored(sink_url, receiver_options, 7) == [6]

    async def test_max_ahead_waits_for_the_slowest_rank(
        self,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receivers: list[TrainingBatchReceiver[TrainingBatch]],
        receiver_options: Mapping[str, Any],
    ) -> None:
        self._require_store()
        sender = open_sender(sink_url, storage_options=sender_options, max_ahead=1)
        self._require_retention(sender)
        batch = make_batch(1, seed=3)
        async with sender:
            await sender.send(batch)
            await sender.send(batch)  # one step ahead of the receivers: allowed
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.3):
                    await sender.send(batch)  # two ahead: waits
            assert sender.next_step == 2  # the cancelled wait sent nothing
            assert self._stored(sink_url, receiver_options, 3) == [0, 1]

            async def move_on() -> None:
                await anyio.sleep(0.2)
                await receivers[0].areceive(timeout=TIMEOUT)  # step 0
                receivers[0].wait(timeout=0)  # looks for step 1: moves past step 0

            async with anyio.create_task_group() as tg:
                tg.start_soon(move_on)
                with anyio.fail_after(TIMEOUT):
                    assert await sender.send(batch) == 2
            stats = sender.last_stats
            assert stats is not None and stats.wait_seconds >= 0.1


def _big_batch() -> TrainingBatch:
    """About 64 MB, so that a send takes long enough to be cancelled midway."""
    return TrainingBatch(samples=[make_sample(1 << 20, layers=16, topk=2, seed=s) for s in (1, 2)])


async def _receive_beside(
    send: Callable[[], Coroutine[Any, Any, object]], receive: Callable[[], Awaitable[T]]
) -> T:
    """What ``receive`` returns, with ``send`` running beside it in a task: a stream may
    wait for its receivers before it sends."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(send)
        got = await receive()
    return got
