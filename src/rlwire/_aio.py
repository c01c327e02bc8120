"""Async helpers shared by the sender and receiver: piece offload and loop-lag monitoring."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio
import anyio.abc
from anyio import CapacityLimiter, to_thread

from ._pieces import Pieces
from .errors import ConfigError

__all__ = ["LagMonitor", "make_limiter", "map_threads", "percentile", "run_pieces"]

T = TypeVar("T")
U = TypeVar("U")


def make_limiter(limiter: CapacityLimiter | int | None, default: int = 2) -> CapacityLimiter:
    """Return ``limiter`` itself, or a new CapacityLimiter of that many (or ``default``)
    tokens. Safe to call before an event loop runs."""
    if isinstance(limiter, CapacityLimiter):
        return limiter
    if limiter is None:
        return CapacityLimiter(default)
    if isinstance(limiter, bool) or not isinstance(limiter, int) or limiter < 1:
        raise ConfigError(f"limiter must be a CapacityLimiter or a positive int, got {limiter!r}")
    return CapacityLimiter(limiter)


async def run_pieces(pieces: Pieces[T], limiter: CapacityLimiter) -> T:
    """Run each piece of ``pieces`` in a worker thread and return the generator's result.

    The event loop gets the GIL back between pieces. On cancellation or error the
    generator is closed in a worker thread (shielded), so its cleanup runs off the loop.
    """

    def advance() -> tuple[bool, T | None]:
        try:
            next(pieces)
        except StopIteration as stop:
            return True, stop.value
        return False, None

    try:
        while True:
            done, value = await to_thread.run_sync(advance, limiter=limiter)
            if done:
                return value  # type: ignore[return-value]
    except BaseException:
        with anyio.CancelScope(shield=True):
            await to_thread.run_sync(pieces.close, limiter=limiter)
        raise


async def map_threads(
    func: Callable[[T], U], items: Sequence[T], limiter: CapacityLimiter
) -> list[U]:
    """``[func(item) for item in items]`` in worker threads, as many at once as ``limiter``
    allows (for work that releases the GIL, such as compression).

    A few worker tasks share the items, each thread call taking items until about a
    millisecond has passed: spawning a task per item would keep the event loop busy with
    bookkeeping for thousands of small items. The first error is raised.
    """
    results: list[U] = [None] * len(items)  # type: ignore[list-item]
    indices = iter(range(len(items)))
    lock = threading.Lock()

    def run_batch() -> bool:
        """Process items for about a millisecond; False once none are left."""
        deadline = time.perf_counter() + 0.001
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return False
            results[i] = func(items[i])
            if time.perf_counter() >= deadline:
                return True

    async def worker() -> None:
        while await to_thread.run_sync(run_batch, limiter=limiter):
            pass

    workers = int(min(len(items), limiter.total_tokens))
    if workers == 1:
        await worker()
    elif workers:
        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(worker)
    return results


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
