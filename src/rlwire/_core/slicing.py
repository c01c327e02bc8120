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
from collections import deque
from collections.abc import Callable, Generator
from functools import partial
from itertools import chain, compress
from operator import call
from typing import TypeVar

__all__ = ["Held", "SliceTimer", "Sliced", "run_sliced", "run_sliced_beside", "timed"]

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


#: How long one try of :meth:`Held.take` waits for its lock before it yields, in seconds.
HOLD_TRY_SECONDS = 0.002


class Held:
    """A lock taken from a sliced generator, yielding between short tries::

        held = Held(lock)
        try:
            yield from held.take()
            ...  # the lock is held here
        finally:
            held.release()

    A generator that blocked on the lock instead would keep its worker thread, and the
    limiter token the thread holds, for as long as another generator holds the lock
    between its own trips to worker threads; with every token so held, the holder never
    got one to go on. Between tries a driver ends the trip in time, giving the token
    back. Any thread may release a ``threading.Lock``; :meth:`release` releases it only
    if :meth:`take` took it, and only once.

    Interrupts: an exception raised between two bytecodes (a ``KeyboardInterrupt`` from
    a signal handler, as Ctrl-C's is) must never leave the lock held, or every later
    call waits for it for ever. CPython raises it only at some bytecodes, among them the
    end of every call and the start of every Python function. So the ``try`` begins
    before the lock is taken; a try of the lock that takes it records so within the same
    call of C code; and :meth:`release` is C code too (no Python function, such as a
    ``with`` block's ``__exit__``, whose start could be interrupted before the release).

    Example:
        >>> lock = threading.Lock()
        >>> def work():
        ...     held = Held(lock)
        ...     try:
        ...         yield from held.take()
        ...         return lock.locked()
        ...     finally:
        ...         held.release()
        >>> run_sliced(work()), lock.locked()
        (True, False)
    """

    __slots__ = ("_lock", "_taken", "release")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._taken: list[Callable[[], None]] = []  # the lock's release, while held
        #: Release the lock if this took it, once: each release in ``_taken`` called,
        #: then the list cleared, all within one call of C code.
        self.release: Callable[[], object] = partial(
            deque[object](maxlen=0).extend,
            chain(map(call, self._taken), iter(self._taken.clear, None)),
        )

    def take_now(self) -> bool:
        """Take the lock if it is free, without waiting: whether it took it."""
        lock = self._lock
        self._taken.extend(compress((lock.release,), map(lock.acquire, (False,))))
        return bool(self._taken)

    def take(self) -> Sliced[None]:
        """Take the lock, yielding between tries of :data:`HOLD_TRY_SECONDS`."""
        lock, taken = self._lock, self._taken
        while True:
            # One call of C code tries the lock and, if it took it, records its release.
            taken.extend(compress((lock.release,), map(lock.acquire, (True,), (HOLD_TRY_SECONDS,))))
            if taken:
                return
            yield
