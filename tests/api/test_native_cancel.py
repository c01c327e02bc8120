"""Sends, puts and receives cancelled by asyncio itself (``task.cancel()``, as
``asyncio.timeout`` and ``asyncio.wait_for`` do at their deadline), not through an anyio
cancel scope. Such a cancellation stops the await but not the worker thread running the
trip under way: a step must still end whole and counted, or not visible at all, and a
step a receive took goes to the next receive. asyncio only: trio has no cancellation
outside its scopes."""

from __future__ import annotations

import asyncio
import os
import random
import re
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire.codecs import MsgpackCodec
from rlwire.testing import make_batch
from rlwire.transport import FileSink

MAIN = re.compile(r"step-(\d+)\.rank-\d+\.rlw")


class Hold:
    """Called in a worker thread (in the last slice of a trip): once ``hold`` is set, it
    waits there until ``release``, as a slow last slice would."""

    def __init__(self) -> None:
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *_: object) -> None:
        if self.hold:
            self.entered.set()
            self.release.wait(10)


class HeldSink(FileSink):
    """A file sink whose staging ends with its :class:`Hold`: the last slice of a
    large write, made slow on purpose."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.held = Hold()

    def stage(self, step: int, frames: Any) -> Generator[None, None, Any]:
        staged = yield from super().stage(step, frames)
        self.held()
        return staged

    def stage_part(self, step: int, part: Any, frame: Any) -> Generator[None, None, Any]:
        staged = yield from super().stage_part(step, part, frame)
        self.held()
        return staged

    def seal(self, seal: Any) -> None:
        super().seal(seal)
        self.held()

    def finish(self, end: int) -> None:
        super().finish(end)
        self.held()


#: Cancelled once, or twice: the second time while the first one's clean-up waits.
TIMES = pytest.mark.parametrize("times", [1, 2])


def visible_steps(root: Path) -> set[int]:
    return {int(m.group(1)) for n in os.listdir(root) if (m := MAIN.fullmatch(n))}


async def cancel_while_held(held: Hold, work: Any, times: int) -> BaseException:
    """Run ``work`` in a task, cancel the task natively while its trip is held (again
    50 ms later, while it cleans up, if ``times`` is 2), release the trip 0.2 s after
    the first; what the task raised."""
    held.hold = True
    task = asyncio.ensure_future(work)
    await asyncio.to_thread(held.entered.wait, 10)
    task.cancel()
    threading.Timer(0.2, held.release.set).start()
    for _ in range(times - 1):
        await asyncio.sleep(0.05)
        task.cancel()
    try:
        await task
    except BaseException as exc:
        return exc
    finally:
        held.hold = False
    raise AssertionError("the cancelled task returned")


@TIMES
def test_a_send_cancelled_by_asyncio_counts_the_step_its_trip_committed(
    tmp_path: Path, times: int
) -> None:
    async def main() -> None:
        sink = HeldSink(tmp_path)
        async with rlwire.TrainingBatchSender(sink, MsgpackCodec()) as sender:
            await sender.send({"a": 0})
            raised = await cancel_while_held(sink.held, sender.send({"a": 1}), times)
            # The cancellation, as asyncio raised it, once the trip has ended: not an
            # error of closing a generator another thread still runs.
            assert isinstance(raised, asyncio.CancelledError), repr(raised)
            # The trip committed step 1 before the sender settled the step's fate.
            assert visible_steps(tmp_path) == {0, 1}
            assert (sender.last_step, sender.next_step) == (1, 2)
            assert await sender.send({"a": 2}) == 2

    asyncio.run(main())


@TIMES
def test_a_put_cancelled_by_asyncio_records_the_part_its_trip_committed(
    tmp_path: Path, times: int
) -> None:
    async def main() -> None:
        sink = HeldSink(tmp_path)
        async with rlwire.TrainingBatchSender(sink, MsgpackCodec()) as sender:
            async with sender.open_step() as writer:
                raised = await cancel_while_held(sink.held, writer.put([{"x": 1}], key="a"), times)
                assert isinstance(raised, asyncio.CancelledError), repr(raised)
                assert writer.assignment == (("a",),)  # on disk and recorded
                with pytest.raises(rlwire.StepExistsError, match="key 'a' was put already"):
                    await writer.put([{"x": 2}], key="a")
                await writer.put([{"x": 3}], key="b")
        with rlwire.open_receiver(tmp_path, type=list[dict[str, int]]) as receiver:
            assert [p.key for p in receiver.parts(timeout=5)] == ["a", "b"]

    asyncio.run(main())


@TIMES
def test_a_seal_cancelled_by_asyncio_once_written_ends_the_step(tmp_path: Path, times: int) -> None:
    # The seal was written by the thread asyncio's cancellation did not stop: the step
    # is sealed, and the sender goes on after it (it used to take the step for open, and
    # refuse both the next step and opening this one again).
    async def main() -> None:
        sink = HeldSink(tmp_path)
        async with rlwire.TrainingBatchSender(sink, MsgpackCodec()) as sender:
            async with sender.open_step() as writer:
                await writer.put([{"x": 1}], key="a")
                raised = await cancel_while_held(sink.held, writer.seal(), times)
                assert isinstance(raised, asyncio.CancelledError), repr(raised)
            assert (sender.last_step, sender.next_step) == (0, 1)
            assert await sender.send([{"x": 2}]) == 1
        with rlwire.open_receiver(tmp_path, type=list[dict[str, int]]) as receiver:
            assert [receiver.receive(timeout=5) for _ in range(2)] == [[{"x": 1}], [{"x": 2}]]

    asyncio.run(main())


@TIMES
def test_a_finish_cancelled_by_asyncio_once_marked_stops_sends(tmp_path: Path, times: int) -> None:
    # The end mark was written by the thread asyncio's cancellation did not stop: a send
    # after it would give receivers a step past the end they were told (it used to).
    async def main() -> None:
        sink = HeldSink(tmp_path)
        async with rlwire.TrainingBatchSender(sink, MsgpackCodec()) as sender:
            await sender.send({"a": 0})
            raised = await cancel_while_held(sink.held, sender.finish(), times)
            assert isinstance(raised, asyncio.CancelledError), repr(raised)
            with pytest.raises(rlwire.ClosedError, match=r"finish\(\) was cancelled"):
                await sender.send({"a": 1})
            await sender.finish()  # again: marked, and the sender knows it
            with pytest.raises(rlwire.ClosedError, match="finished its stream"):
                await sender.send({"a": 1})
        assert visible_steps(tmp_path) == {0}
        with rlwire.open_receiver(tmp_path, type=dict[str, int]) as receiver:
            assert list(receiver) == [{"a": 0}]

    asyncio.run(main())


def test_sends_under_asyncio_deadlines_leave_exactly_the_counted_steps(tmp_path: Path) -> None:
    # Random asyncio.wait_for deadlines around sends of several sizes: after each, at
    # once, the visible steps are exactly those the sender counted.
    async def main() -> None:
        rng = random.Random(7)
        batches = [make_batch(count, n=32, seed=count) for count in (3, 200, 2000)]
        outcomes = {"sent": 0, "timeout": 0}
        async with rlwire.open_sender(tmp_path) as sender:
            for i in range(80):
                deadline = None if i % 4 == 0 else rng.uniform(0, 0.03)  # some sends finish
                try:
                    await asyncio.wait_for(sender.send(rng.choice(batches)), deadline)
                    outcomes["sent"] += 1
                except TimeoutError:
                    outcomes["timeout"] += 1
                assert visible_steps(tmp_path) == set(range(sender.next_step))
                assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        assert outcomes["sent"] and outcomes["timeout"], outcomes

    asyncio.run(main())


@TIMES
def test_a_receive_cancelled_by_asyncio_leaves_its_step_to_the_next(
    tmp_path: Path, times: int
) -> None:
    # The take finished in the worker thread after asyncio cancelled it: the step it
    # took went to no one, so the receiver stays before it.
    async def main() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            for tag in range(3):
                await sender.send([{"tag": tag}])
        check = Hold()
        with rlwire.open_receiver(
            tmp_path, type=list[dict[str, int]], validate=rlwire.Checks(check=check)
        ) as receiver:
            assert await receiver.areceive() == [{"tag": 0}]
            raised = await cancel_while_held(check, receiver.areceive(), times)
            assert isinstance(raised, asyncio.CancelledError), repr(raised)
            assert receiver.next_step == 1
            assert receiver.last_stats is not None and receiver.last_stats.step == 0
            assert await receiver.areceive() == [{"tag": 1}]
            assert await receiver.areceive() == [{"tag": 2}]

    asyncio.run(main())


@TIMES
def test_parts_cancelled_by_asyncio_yield_the_part_again(tmp_path: Path, times: int) -> None:
    async def main() -> None:
        async with rlwire.open_sender(tmp_path) as sender:
            async with sender.open_step() as writer:
                for key in "ab":
                    await writer.put([{"key": ord(key)}], key=key)
        check = Hold()
        with rlwire.open_receiver(
            tmp_path, type=list[dict[str, int]], validate=rlwire.Checks(check=check)
        ) as receiver:
            raised = await cancel_while_held(check, anext(aiter(receiver.aparts())), times)
            assert isinstance(raised, asyncio.CancelledError), repr(raised)
            assert receiver.next_part == 0
            assert [part.key async for part in receiver.aparts()] == ["a", "b"]

    asyncio.run(main())


def test_receives_under_asyncio_deadlines_get_every_step_once_in_order(tmp_path: Path) -> None:
    async def main() -> None:
        rng = random.Random(3)
        counts = [rng.choice((3, 200, 1000)) for _ in range(16)]
        async with rlwire.open_sender(tmp_path) as sender:
            for step, count in enumerate(counts):
                await sender.send(make_batch(count, n=8, seed=step))
            await sender.finish()
        got, timeouts = [], 0
        with rlwire.open_receiver(tmp_path) as receiver:
            while True:
                try:
                    batch = await asyncio.wait_for(receiver.areceive(), rng.uniform(0, 0.05))
                except TimeoutError:
                    timeouts += 1
                    continue
                except rlwire.EndOfStream:
                    break
                got.append(len(batch.samples))
        assert got == counts
        assert timeouts

    asyncio.run(main())
