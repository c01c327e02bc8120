"""The async helpers: LagMonitor sees stalls; offload_sliced runs many slices a trip and
cleans up on cancellation."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

import rlwire
from rlwire._aio import TRIP_SECONDS, Resumes, offload_sliced
from rlwire._slicing import Sliced

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

    assert await offload_sliced(work(), anyio.CapacityLimiter(1)) == 7
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
            await offload_sliced(work(), anyio.CapacityLimiter(1))
    assert started.is_set() and cleaned.is_set()


async def test_one_trip_to_a_worker_thread_runs_many_short_slices() -> None:
    # A trip per slice cost a thread hand-off per slice, as long as the slice itself.
    def work() -> Sliced[int]:
        for _ in range(2000):
            yield
        return 7

    resumes = Resumes()
    assert await offload_sliced(work(), anyio.CapacityLimiter(1), resumes) == 7
    assert 1 <= resumes.trips <= 20


async def test_a_trip_ends_once_its_slices_have_run_for_trip_seconds() -> None:
    # So a cancellation waits for one trip at most, not for the whole generator.
    def work() -> Sliced[None]:
        for _ in range(4):
            time.sleep(TRIP_SECONDS)
            yield

    resumes = Resumes()
    await offload_sliced(work(), anyio.CapacityLimiter(1), resumes)
    assert resumes.trips == 5  # one per slice, and the last to see it return
