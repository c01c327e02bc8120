"""Work offloaded to threads (whole calls, or sliced generators a slice at a time), and
the thread counts the sender and receiver use. Public through :mod:`rlwire.aio`; the
loop-lag monitor is :mod:`rlwire._core.lag`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.abc
import anyio.lowlevel
from anyio import CapacityLimiter, from_thread, to_thread

from rlwire._core.backends import make_limiter
from rlwire._core.pools import worker_count
from rlwire._core.slicing import Sliced

__all__ = [
    "HANDOFF_SECONDS",
    "TRIP_SECONDS",
    "Abandoned",
    "Resumes",
    "abandoned",
    "drive_sliced",
    "make_limiter",
    "offload",
    "offload_sliced",
    "run_to_the_end",
    "runs_event_loop",
    "thread_count",
]

T = TypeVar("T")
Args = TypeVarTuple("Args")


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

#: The longest a trip runs slices back to back before it lets go of the GIL, in seconds.
#: Letting go costs ``time.sleep(0)``: some 70 µs here (the kernel's timer slack), time
#: a waiting loop needs to wake and take the GIL (a shorter pause, ``os.sched_yield``,
#: lets the worker take it back first). After every 0.3 ms slice that was a quarter of
#: the work; short slices now run back to back up to this long.
HANDOFF_SECONDS = 0.001


class Abandoned(BaseException):
    """Raised in a worker thread by a wait that gave up because the caller of the trip
    under way was cancelled (:func:`abandoned`): it ends the generator, and
    :func:`drive_sliced` raises the caller's cancellation instead."""


_current = threading.local()  # the _Trips whose trip runs in this thread, if any


def abandoned() -> bool:
    """Whether the caller of the :func:`drive_sliced` trip running in this thread was
    cancelled (by anyio, trio, or asyncio's own cancellation); False outside a trip. A
    long wait inside a slice (a download) asks this now and then, and raises
    :class:`Abandoned` to stop; waits that must end (a commit's writes) never do. A
    commit's read before it makes anything visible (the fence's) may: nothing of the
    step is then visible, and the caller is cancelled. Whatever catches what a slice
    raised to raise it later must let :class:`Abandoned` through (it is no error of the
    work: :func:`drive_sliced` raises the caller's cancellation in its place)."""
    trips: _Trips[object] | None = getattr(_current, "trips", None)
    return trips is not None and trips.cancelled()


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
    the call to finish (a thread cannot be stopped midway), also when asyncio cancels
    the task itself (``asyncio.timeout``, ``wait_for``), which anyio cannot hold off.

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
    running = threading.Lock()
    abandoned = False

    def call() -> T:
        with running:
            if abandoned:  # began after its caller had given up: no one awaits it
                raise RuntimeError("a call whose caller was cancelled")
            return func(*args)

    def settle() -> None:
        nonlocal abandoned
        with running:  # waits for a call under way
            abandoned = True

    try:
        return await to_thread.run_sync(call, limiter=limiter)
    except BaseException:
        # asyncio's own task.cancel() stops the await, not the thread.
        await run_to_the_end(settle)
        raise


async def run_to_the_end(func: Callable[[Unpack[Args]], object], *args: *Args) -> None:
    """Run ``func(*args)`` in a thread of its own and wait until it has ended, whatever
    cancellations come meanwhile (anyio's, held off by a shield, and asyncio's own
    ``task.cancel()``, which a shield does not hold off and which is dropped here: the
    caller is on its way out with a cancellation or an error already). For clean-ups
    that must end before the caller goes on; what ``func`` raises is raised."""
    ended = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            func(*args)
        except BaseException as exc:
            raised.append(exc)
        finally:
            ended.set()

    threading.Thread(target=run, name="rlwire-clean-up", daemon=True).start()
    delay = 0.0005
    while not ended.is_set():
        with anyio.CancelScope(shield=True):
            try:
                await anyio.sleep(delay)
            except anyio.get_cancelled_exc_class():
                pass  # asyncio's own cancellation, again: the clean-up goes on
        delay = min(delay * 2, 0.01)
    if raised:
        raise raised[0]


async def offload_sliced(slices: Sliced[T], *, limiter: CapacityLimiter | None = None) -> T:
    """Run a sliced generator in worker threads, a slice at a time, and return its result.

    Each slice should hold the GIL briefly (:class:`~rlwire.aio.SliceTimer` tells it
    when to ``yield``). One trip to a worker thread runs slices back to back for up to
    :data:`TRIP_SECONDS` and lets go of the GIL between them, so the event loop gets it
    within a slice. On cancellation or error the generator is closed in a worker thread
    (shielded), so its ``finally`` blocks run off the loop; a cancellation waits for the
    slice under way. asyncio's own cancellation (``asyncio.timeout``, ``wait_for``)
    waits for the trip under way (up to :data:`TRIP_SECONDS`), and when the generator
    returned in that trip, its result is dropped.

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
    slices: Sliced[T],
    limiter: CapacityLimiter,
    resumes: Resumes | None = None,
    *,
    dropped: Callable[[T], object] | None = None,
) -> T:
    """:func:`offload_sliced`, recording in ``resumes`` (if given) the trips made and
    how late the loop got back to this call after each. ``dropped``, if given, is called
    (in a worker thread) with the result of work that finished in a trip whose caller
    asyncio had cancelled meanwhile: a result no one receives, to undo or clean up."""

    trips = _Trips(slices)
    try:
        while True:
            done, finished = await to_thread.run_sync(trips.advance, limiter=limiter)
            if trips.abandoned:  # a wait gave up on a cancelled caller: raise its cancellation
                await anyio.lowlevel.checkpoint()
                raise RuntimeError("a sliced generator gave up on a caller that was not cancelled")
            if resumes is not None:
                resumes.worst = max(resumes.worst, time.perf_counter() - finished)
                resumes.trips += 1
            if done:
                return trips.returned[0]
    except BaseException:
        await run_to_the_end(trips.close)
        if trips.returned and dropped is not None:
            await run_to_the_end(dropped, trips.returned[0])
        raise


class _Trips(Generic[T]):
    """The trips of one :func:`drive_sliced` call to worker threads.

    A cancellation that does not go through anyio (asyncio's own ``task.cancel()``, as
    ``asyncio.timeout`` and ``wait_for`` do) stops the caller's await but not the thread:
    :meth:`close` waits for the trip under way to end, so a trip is neither cut in the
    middle of a slice nor left to go on after the generator's fate was decided (a send's
    commit happens before the sender settles the step, never after)."""

    def __init__(self, slices: Sliced[T]) -> None:
        self._slices = slices
        self._lock = threading.Lock()  # held by a trip while it runs slices
        self._closed = False
        self._leaving = threading.Event()  # close() was called: the caller is gone
        self.abandoned = False  # the generator raised Abandoned: it is over
        self.returned: list[T] = []  # what the generator returned, once it has

    def cancelled(self) -> bool:
        """Whether the caller was cancelled (asked from the thread of a trip)."""
        if self._leaving.is_set():
            return True
        try:
            from_thread.check_cancelled()
        except BaseException:
            return True
        return False

    def advance(self) -> tuple[bool, float]:
        """Run slices for up to :data:`TRIP_SECONDS`: (whether the generator returned,
        into ``returned``; when the trip ended)."""
        with self._lock:
            handed = time.perf_counter()
            if self._closed:  # a trip that began after close(): no work
                return False, handed
            deadline = handed + TRIP_SECONDS
            _current.trips = self
            try:
                return self._run(handed, deadline)
            finally:
                _current.trips = None

    def _run(self, handed: float, deadline: float) -> tuple[bool, float]:
        """The slices of one trip (:meth:`advance`, the lock held)."""
        while True:
            try:
                next(self._slices)
            except StopIteration as stop:
                self.returned.append(stop.value)
                return True, time.perf_counter()
            except Abandoned:
                self.abandoned = self._closed = True
                return False, time.perf_counter()
            now = time.perf_counter()
            if now >= deadline:
                return False, now
            if now - handed >= HANDOFF_SECONDS:
                try:
                    from_thread.check_cancelled()
                except BaseException:  # the caller was cancelled: the loop raises it
                    return False, now
                time.sleep(0)  # lets go of the GIL, long enough for a waiting loop to run
                handed = time.perf_counter()

    def close(self) -> None:
        """Close the generator once the trip under way (if any) has ended."""
        self._leaving.set()
        with self._lock:
            self._closed = True
            self._slices.close()


def thread_count(limiter: CapacityLimiter) -> int:
    """How many threads work that releases the GIL (compression) may use under
    ``limiter``: its size, within the one policy of :func:`~rlwire._core.pools.worker_count`."""
    return worker_count(limiter.total_tokens)


def runs_event_loop() -> bool:
    """True on a thread that runs an event loop (asyncio's, or trio's)."""
    try:
        anyio.get_current_task()
    except RuntimeError:
        return False
    return True
