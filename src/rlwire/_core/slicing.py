"""Work cut into slices: the shape every CPU- or I/O-heavy step of rlwire takes.

A *sliced generator* does its work between ``yield`` statements and returns its result.
Each resumption is short (about a millisecond of GIL-holding Python, or one bounded
system call that releases the GIL), so a driver can run the slices in a worker thread,
letting go of the GIL between them, and the event loop gets it back between slices.
The same generator runs synchronously with :func:`run_sliced`; :mod:`rlwire._core.offload`
drives it from async code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from typing import TypeVar

__all__ = ["SliceTimer", "Sliced", "hold", "run_sliced", "run_sliced_beside", "timed"]

T = TypeVar("T")

#: A generator that yields between slices of work and returns a result.
Sliced = Generator[None, None, T]

#: Default length of one slice of GIL-holding Python work, in seconds.
SLICE_SECONDS = 0.0003


class SliceTimer:
    """Tells a sliced generator when its current slice has run long enough.

    Example:
        >>> s = SliceTimer(60.0)
        >>> s.due()  # a slice of a minute has just started
        False
        >>> SliceTimer(0.0).due()  # a slice of no time is over at once
        True
    """

    __slots__ = ("_deadline", "_seconds")

    def __init__(self, seconds: float | None = None) -> None:
        self._seconds = SLICE_SECONDS if seconds is None else seconds
        self._deadline = time.perf_counter() + self._seconds

    def due(self) -> bool:
        """True when the current slice is over: yield, then call :meth:`restart`."""
        return time.perf_counter() >= self._deadline

    def restart(self) -> None:
        """Start a new slice now (call after resuming from a yield)."""
        self._deadline = time.perf_counter() + self._seconds


def run_sliced(slices: Sliced[T]) -> T:
    """Run every slice of ``slices`` in the calling thread and return its result."""
    while True:
        try:
            next(slices)
        except StopIteration as stop:
            result: T = stop.value
            return result


def run_sliced_beside(slices: Sliced[None], stop: threading.Event) -> None:
    """Run ``slices`` in a thread of its own, beside other work: between slices it lets
    go of the GIL (``time.sleep(0)``), so the event loop and the other threads get it
    within a slice; once ``stop`` is set it closes the generator after the current slice.

    Example:
        >>> def work() -> Sliced[None]:
        ...     yield
        >>> run_sliced_beside(work(), threading.Event())
    """
    try:
        while not stop.is_set():
            try:
                next(slices)
            except StopIteration:
                return
            time.sleep(0)
    finally:
        slices.close()


def timed(slices: Sliced[T], seconds: dict[str, float], key: str) -> Sliced[T]:
    """``slices``, adding the time spent inside each of its slices to ``seconds[key]``
    (the time between slices, in hand-offs or waits, is not counted).

    Example:
        >>> seconds = {"work": 0.0}
        >>> def work() -> Sliced[int]:
        ...     yield
        ...     return 7
        >>> run_sliced(timed(work(), seconds, "work")), seconds["work"] < 1
        (7, True)
    """
    try:
        while True:
            began = time.perf_counter()
            try:
                next(slices)
            except StopIteration as stop:
                seconds[key] += time.perf_counter() - began
                result: T = stop.value
                return result
            seconds[key] += time.perf_counter() - began
            yield
    finally:
        slices.close()


#: How long one try of :func:`hold` waits for its lock before it yields, in seconds.
HOLD_TRY_SECONDS = 0.002


class _Held:
    """What :func:`hold` returns: releases its lock when the ``with`` block ends."""

    __slots__ = ("_lock",)

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def hold(lock: threading.Lock) -> Sliced[_Held]:
    """Take ``lock`` from a sliced generator, yielding between short tries: ``with
    (yield from hold(lock)):``. A generator that blocked on the lock instead would keep
    its worker thread, and the limiter token the thread holds, for as long as another
    generator holds the lock between its own trips to worker threads; with every token
    so held, the holder never got one to go on. Between tries a driver ends the trip in
    time, giving the token back. The lock is released when the ``with`` block ends (any
    thread may release a ``threading.Lock``)."""
    while not lock.acquire(timeout=HOLD_TRY_SECONDS):
        yield
    return _Held(lock)
