"""The event-loop toolkit: work offloaded to threads (whole calls, or sliced generators a
slice at a time), loop-lag monitoring, and the thread counts the sender and receiver use.
Public through :mod:`rlwire.aio`."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.abc
from anyio import CapacityLimiter, from_thread, to_thread

from rlwire._core.args import check_int
from rlwire._core.slicing import Sliced

__all__ = [
    "TRIP_SECONDS",
    "LagMonitor",
    "Resumes",
    "drive_sliced",
    "make_limiter",
    "offload",
    "offload_sliced",
    "percentile",
    "thread_count",
]

T = TypeVar("T")
Args = TypeVarTuple("Args")


def make_limiter(limiter: CapacityLimiter | int | None, default: int = 2) -> CapacityLimiter:
    """Return ``limiter`` itself, or a new CapacityLimiter of that many (or ``default``)
    tokens. Safe to call before an event loop runs."""
    if isinstance(limiter, CapacityLimiter):
        return limiter
    if limiter is None:
        return CapacityLimiter(default)
    return CapacityLimiter(check_int(limiter, "limiter (a CapacityLimiter or its size)", low=1))


class Resumes:
    """The trips :func:`offload_sliced` made to worker threads, and the worst delay
    between a trip's last slice finishing and the event loop resuming the caller."""

    __slots__ = ("trips", "worst")

    def __init__(self) -> None:
        self.worst = 0.0
        self.trips = 0


#: The longest one trip to a worker thread runs slices back to back before the event loop
#: hears from it, in seconds. A trip per slice cost a hand-off of ~0.3 ms each, as long as
#: the slice itself; between slices the thread lets go of the GIL instead, and ends the
#: trip early if the caller was cancelled, so a cancellation waits for one slice.
TRIP_SECONDS = 0.02


async def offload(
    func: Callable[[Unpack[Args]], T],
    *args: *Args,
    limiter: CapacityLimiter | None = None,
) -> T:
    """Run ``func(*args)`` in a worker thread, under ``limiter``, and return its result.

    For a call that does its work in C with the GIL released (compression, hashing,
    file I/O, numpy on large arrays), or that is short: the event loop runs meanwhile.
    Python that holds the GIL for long still stalls the loop from the thread; write it
    as a sliced generator and use :func:`offload_sliced`. A cancelled caller waits for
    the call to finish (a thread cannot be stopped midway).

    Args:
        func: the call.
        limiter: bounds how many such calls run at once, shared by every caller that
            passes it (default: anyio's default thread limiter, 40 threads).

    Raises:
        Exception: what ``func`` raised, as it raised it.

    Example:
        >>> import anyio, hashlib
        >>> async def main() -> str:
        ...     limiter = anyio.CapacityLimiter(2)  # at most two CPU-bound calls at once
        ...     digest = await offload(hashlib.sha256, b"rollouts", limiter=limiter)
        ...     return digest.hexdigest()[:8]
        >>> anyio.run(main)
        '6a3db1f6'
    """
    return await to_thread.run_sync(func, *args, limiter=limiter)


async def offload_sliced(slices: Sliced[T], *, limiter: CapacityLimiter | None = None) -> T:
    """Run a sliced generator in worker threads, a slice at a time, and return its result.

    Each slice should hold the GIL briefly (:class:`~rlwire.aio.SliceTimer` tells it
    when to ``yield``). One trip to a worker thread runs slices back to back for up to
    :data:`TRIP_SECONDS` and lets go of the GIL between them, so the event loop gets it
    within a slice. On cancellation or error the generator is closed in a worker thread
    (shielded), so its ``finally`` blocks run off the loop; a cancellation waits for the
    slice under way.

    Args:
        slices: the generator, not yet started.
        limiter: bounds how many trips run at once (default: anyio's default thread
            limiter).

    Raises:
        Exception: what the generator raised, as it raised it.

    Example:
        >>> import anyio
        >>> from rlwire.aio import SliceTimer, Sliced
        >>> def total(values: list[int]) -> Sliced[int]:
        ...     timer, acc = SliceTimer(), 0
        ...     for v in values:
        ...         acc += v
        ...         if timer.due():
        ...             yield
        ...             timer.restart()
        ...     return acc
        >>> anyio.run(offload_sliced, total(list(range(100_000))))
        4999950000
    """
    if limiter is None:
        limiter = to_thread.current_default_thread_limiter()
    return await drive_sliced(slices, limiter)


async def drive_sliced(
    slices: Sliced[T], limiter: CapacityLimiter, resumes: Resumes | None = None
) -> T:
    """:func:`offload_sliced`, recording in ``resumes`` (if given) the trips made and
    how late the loop got back to this call after each."""

    def advance() -> tuple[bool, T | None, float]:
        deadline = time.perf_counter() + TRIP_SECONDS
        while True:
            try:
                next(slices)
            except StopIteration as stop:
                return True, stop.value, time.perf_counter()
            now = time.perf_counter()
            if now >= deadline:
                return False, None, now
            try:
                from_thread.check_cancelled()
            except BaseException:  # the caller was cancelled: end the trip, the loop raises it
                return False, None, now
            time.sleep(0)  # lets go of the GIL: a loop waiting for it runs now

    try:
        while True:
            done, value, finished = await to_thread.run_sync(advance, limiter=limiter)
            if resumes is not None:
                resumes.worst = max(resumes.worst, time.perf_counter() - finished)
                resumes.trips += 1
            if done:
                return value  # type: ignore[return-value]
    except BaseException:
        with anyio.CancelScope(shield=True):
            await to_thread.run_sync(slices.close, limiter=limiter)
        raise


def thread_count(limiter: CapacityLimiter) -> int:
    """How many threads work that releases the GIL (compression) may use under
    ``limiter``: its size, at most the number of cores."""
    return int(min(limiter.total_tokens, os.cpu_count() or 2))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by the nearest-rank method; 0 if empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class LagMonitor:
    """Measures how late the event loop wakes up: a direct reading of loop stalls.

    Use it as an async context manager; it runs a background task that sleeps
    ``interval`` seconds in a loop and records how much later than that it wakes up,
    from entering the block until leaving it. Event loops round timeouts to about a
    millisecond, so lags below ~1 ms are resolution, not stalls.

    Example:
        >>> import anyio
        >>> async def main() -> float:
        ...     async with LagMonitor() as lag:
        ...         await anyio.sleep(0.05)
        ...     return lag.max
        >>> anyio.run(main) < 1.0
        True
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._since = 0.0

    @property
    def max(self) -> float:
        """Worst lag seen, in seconds."""
        return max(self.lags, default=0.0)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of the lags seen, in seconds."""
        return percentile(self.lags, q)

    def reset(self) -> None:
        """Forget the lags seen so far."""
        self.lags.clear()

    def _record(self, now: float) -> None:
        self.lags.append(max(0.0, now - self._since - self.interval))
        self._since = now

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        self._since = time.perf_counter()
        task_status.started()
        while True:
            await anyio.sleep(self.interval)
            self._record(time.perf_counter())

    async def __aenter__(self) -> LagMonitor:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        # start() rather than start_soon(): sampling begins before the body runs.
        await self._tg.start(self._run)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._tg is not None
        self._record(time.perf_counter())  # the sleep in progress counts too
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        self._tg = None
