"""Loop lag: how late the event loop wakes up, a direct reading of its stalls. Public
through :mod:`rlwire.aio`."""

from __future__ import annotations

import math
import time

import anyio
import anyio.abc

__all__ = ["LagMonitor", "percentile"]


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
