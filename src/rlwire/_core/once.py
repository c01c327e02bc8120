"""Single-flight lazy initialisation, shared by threads and async tasks alike."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from anyio import CapacityLimiter, to_thread

__all__ = ["Once"]

T = TypeVar("T")


class Once(Generic[T]):
    """Runs an expensive zero-argument ``factory`` at most once at a time, caching its
    result for every later caller.

    Concurrent first callers share one run: the first starts it, the others wait for it.
    If the run fails, every caller waiting on that run gets its exception, and the next
    call starts a new run (a transient network error is not cached forever). From async
    code, :meth:`aget` runs the factory in a worker thread, so the event loop never
    blocks on it, and a cancelled caller leaves the run going for the others.

    A process forked while a run is under way in another thread (that thread stays in
    the parent) forgets the run: the child's first caller starts its own. A result the
    parent already had is kept.

    Example:
        >>> calls = []
        >>> once = Once(lambda: calls.append(1) or "ready")
        >>> once.get(), once.get(), len(calls)
        ('ready', 'ready', 1)
    """

    __slots__ = ("__weakref__", "_factory", "_lock", "_result", "_running")

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._running: Future[T] | None = None
        # A 1-tuple once a run has succeeded, so that a factory may return None.
        self._result: tuple[T] | None = None
        _LIVE.add(self)

    @property
    def done(self) -> bool:
        """True once a run has succeeded (``get`` then returns at once)."""
        return self._result is not None

    def get(self) -> T:
        """The factory's result, running it first if no run has succeeded yet.

        Blocks while another thread's run is in progress. Raises what that run raised.
        """
        result = self._result
        if result is not None:  # the common case, without taking the lock
            return result[0]
        with self._lock:
            if self._result is not None:
                return self._result[0]
            running = self._running
            if running is None:
                running = self._running = Future()
                owner = True
            else:
                owner = False
        if not owner:
            return running.result()
        try:
            value = self._factory()
        except BaseException as exc:
            with self._lock:
                self._running = None  # the next call tries again
            running.set_exception(exc)
            raise
        with self._lock:
            self._result = (value,)
            self._running = None
        running.set_result(value)
        return value

    async def aget(self, limiter: CapacityLimiter | None = None) -> T:
        """:meth:`get` without blocking the event loop.

        The wait runs in a worker thread (under ``limiter``) that is abandoned if this
        caller is cancelled: the run itself carries on, so other callers, and later
        ones, still get its result.
        """
        result = self._result
        if result is not None:
            return result[0]
        return await to_thread.run_sync(self.get, limiter=limiter, abandon_on_cancel=True)


#: Every Once alive, for :func:`_forget_runs_after_fork`.
_LIVE: weakref.WeakSet[Once[Any]] = weakref.WeakSet()


def _forget_runs_after_fork() -> None:
    """In a forked child: forget the runs under way (their threads stayed in the parent)
    and the locks (a thread of the parent may have held one when the process forked)."""
    for once in list(_LIVE):
        once._lock = threading.Lock()
        once._running = None


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_forget_runs_after_fork)
