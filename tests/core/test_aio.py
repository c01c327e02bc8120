"""The event-loop toolkit: LagMonitor sees stalls; offload bounds its threads; offload_sliced
runs many slices a trip and cleans up on cancellation (Once has its own file)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anyio
import pytest

import rlwire
from rlwire._core.offload import Resumes, drive_sliced, run_to_the_end
from rlwire._core.slicing import Sliced
from rlwire.aio import TRIP_SECONDS, offload, offload_sliced

pytestmark = pytest.mark.anyio


async def test_lag_monitor_sees_blocking_at_both_edges() -> None:
    async with rlwire.LagMonitor() as lag:
        time.sleep(0.05)  # blocks the loop right after entering
    assert lag.max >= 0.04
    async with rlwire.LagMonitor() as lag:
        await anyio.sleep(0.01)
        time.sleep(0.05)  # and right before leaving
    assert lag.max >= 0.04
    assert lag.percentile(100) == lag.max


async def test_lag_monitor_quiet_loop() -> None:
    async with rlwire.LagMonitor(interval=0.002) as lag:
        await anyio.sleep(0.05)
    assert len(lag.lags) >= 5
    assert lag.percentile(50) < 0.02


async def test_run_slices_runs_in_threads_and_returns() -> None:
    threads: list[int] = []

    def work() -> Sliced[int]:
        for _ in range(3):
            threads.append(threading.get_ident())
            yield
        return 7

    assert await offload_sliced(work(), limiter=anyio.CapacityLimiter(1)) == 7
    assert threading.get_ident() not in threads


async def test_run_slices_closes_generator_on_cancel() -> None:
    cleaned = threading.Event()
    started = anyio.Event()

    def work() -> Sliced[None]:
        try:
            while True:
                time.sleep(0.001)
                yield
        finally:
            cleaned.set()

    async def watch() -> None:
        await anyio.sleep(0.02)
        started.set()

    with anyio.move_on_after(0.05):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await offload_sliced(work())
    assert started.is_set() and cleaned.is_set()


async def test_one_trip_to_a_worker_thread_runs_many_short_slices() -> None:
    # A trip per slice cost a thread hand-off per slice, as long as the slice itself.
    def work() -> Sliced[int]:
        for _ in range(2000):
            yield
        return 7

    resumes = Resumes()
    assert await drive_sliced(work(), anyio.CapacityLimiter(1), resumes) == 7
    assert 1 <= resumes.trips <= 20


async def test_a_trip_ends_once_its_slices_have_run_for_trip_seconds() -> None:
    # So a cancellation waits for one trip at most, not for the whole generator.
    def work() -> Sliced[None]:
        for _ in range(4):
            time.sleep(TRIP_SECONDS)
            yield

    resumes = Resumes()
    await drive_sliced(work(), anyio.CapacityLimiter(1), resumes)
    assert resumes.trips == 5  # one per slice, and the last to see it return


async def test_a_cancelled_caller_ends_the_trip_after_the_slice_under_way() -> None:
    ran = 0
    started = threading.Event()
    closed = threading.Event()

    def work() -> Sliced[None]:
        nonlocal ran
        started.set()
        try:
            for _ in range(1000):
                time.sleep(0.001)  # 20 of these fill a trip
                ran += 1
                yield
        finally:
            closed.set()

    with anyio.move_on_after(0.004):
        await offload_sliced(work())
    # A loaded machine may cancel it before the worker thread took its first slice:
    # then the generator never ran, and there is nothing to close.
    assert closed.is_set() == started.is_set()
    assert ran < 12, f"{ran} slices ran: the trip went on after the cancellation"


async def test_offload_runs_calls_in_threads_no_more_at_once_than_the_limiter_allows() -> None:
    running: list[int] = []
    most = 0
    lock = threading.Lock()

    def work(i: int) -> tuple[int, int]:
        nonlocal most
        with lock:
            running.append(i)
            most = max(most, len(running))
        time.sleep(0.02)
        with lock:
            running.remove(i)
        return i, threading.get_ident()

    limiter = anyio.CapacityLimiter(2)
    results: list[tuple[int, int]] = []

    async def one(i: int) -> None:
        results.append(await offload(work, i, limiter=limiter))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert sorted(i for i, _ in results) == list(range(6))
    assert most == 2
    assert threading.get_ident() not in {thread for _, thread in results}


async def test_offload_and_offload_sliced_raise_what_the_work_raised() -> None:
    closed = threading.Event()

    def fails() -> Sliced[None]:
        try:
            yield
            raise ValueError("bad rollout 3")
        finally:
            closed.set()

    with pytest.raises(ValueError, match="bad rollout 3"):
        await offload_sliced(fails())
    assert closed.is_set()
    with pytest.raises(ZeroDivisionError):
        await offload(divmod, 1, 0)


# asyncio's own cancellation (task.cancel(), which asyncio.timeout and wait_for use)
# stops an await without going through anyio's cancel scopes, so a shield does not hold
# it off and the worker thread goes on. Trio has no such cancellation: asyncio only.


def _cancel_natively_while(
    held: threading.Event, release: threading.Event, work: Any, events: list[str]
) -> BaseException | None:
    """Run the coroutine ``work`` as an asyncio task, cancel the task natively once
    ``held`` is set, let the worker thread go on 0.1 s later; what the task raised,
    noted in ``events`` (``"raised"``) when the caller saw it."""

    async def main() -> BaseException | None:
        task = asyncio.ensure_future(work)
        await asyncio.to_thread(held.wait, 10)
        task.cancel()
        threading.Timer(0.1, release.set).start()
        try:
            await task
        except BaseException as exc:
            events.append("raised")
            return exc
        return None

    return asyncio.run(main())


def test_offload_sliced_cancelled_by_asyncio_closes_its_generator_after_the_trip() -> None:
    held, release = threading.Event(), threading.Event()
    events: list[str] = []

    def work() -> Sliced[None]:
        try:
            yield
            held.set()
            release.wait(10)  # a long slice under way when the task is cancelled
            events.append("slice ended")
            yield
            events.append("went on")
        finally:
            events.append("closed")

    raised = _cancel_natively_while(held, release, offload_sliced(work()), events)
    # Not "generator already executing": the generator is closed once its trip ended,
    # and before the caller sees its cancellation.
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert events == ["slice ended", "closed", "raised"]


def test_offload_cancelled_by_asyncio_returns_once_the_call_has_ended() -> None:
    held, release = threading.Event(), threading.Event()
    events: list[str] = []

    def call() -> None:
        held.set()
        release.wait(10)
        events.append("call ended")

    raised = _cancel_natively_while(held, release, offload(call), events)
    assert isinstance(raised, asyncio.CancelledError), repr(raised)
    assert events == ["call ended", "raised"]


def test_run_to_the_end_waits_for_its_call_through_asyncios_cancellations() -> None:
    release = threading.Event()
    events: list[str] = []

    def call() -> None:
        release.wait(10)
        events.append("call ended")

    async def main() -> None:
        task = asyncio.ensure_future(run_to_the_end(call))
        for _ in range(3):  # each while the call runs
            await asyncio.sleep(0.02)
            task.cancel()
        threading.Timer(0.05, release.set).start()
        await task  # the cancellations are dropped: the caller is on its way out already
        events.append("caller went on")

    asyncio.run(main())
    assert events == ["call ended", "caller went on"]
