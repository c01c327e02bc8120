"""One wait on the board at a time per receiver, cancelled or not (:class:`OneWait`).

A receiver's async wait runs in a worker thread, since Ray's references cannot be
awaited under trio; a cancelled await abandons its thread, which goes on waiting on the
board until the board answers (at most the slice it asked for, plus the board's time to
answer). Were the next await to start another wait beside it, a loop that cancels its
receives quickly (a trainer polling with a short ``move_on_after``) would keep as many
threads and board calls running as it cancels in one slice (measured: 45-51 threads
and 40-47 board calls at once, 200 receives cancelled 10 ms in), each board call one of
the board's concurrent calls, which senders' commits need too. Instead the next await
waits for the wait left running (on an event it sets when it ends, no thread), then
returns, and the receiver reads again: never more than one thread and one board call
waiting per receiver.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import anyio
from anyio import from_thread, to_thread

__all__ = ["OneWait"]

T = TypeVar("T")


class _Running:
    """A wait running in a worker thread, until ``until`` (``time.monotonic``) at most."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.woken = anyio.Event()  # set on the event loop, once it ended and was left
        self._lock = threading.Lock()
        self._ended = False
        self._left = False

    def end(self) -> None:
        """In its thread, as it ends: wake the await waiting for it, if it was left."""
        with self._lock:
            self._ended, left = True, self._left
        if left:
            # RuntimeError: the event loop has finished meanwhile; nobody waits.
            with contextlib.suppress(RuntimeError):
                from_thread.run_sync(self.woken.set)

    def leave(self) -> bool:
        """On the event loop, its await cancelled: whether it still runs (then its end
        sets ``woken``)."""
        with self._lock:
            self._left = not self._ended
            return self._left


class OneWait:
    """Runs a receiver's waits on the board in worker threads, one at a time."""

    def __init__(self) -> None:
        self._left: _Running | None = None

    async def run(self, wait: Callable[[], T], longest: float, timeout: float | None) -> T | None:
        """``wait()`` in a worker thread, which a cancelled await abandons (it ends within
        ``longest`` seconds); what it returned. If a cancelled await left one running,
        wait for that one to end instead (up to ``timeout`` seconds) and return
        ``None``, starting none: the caller reads again, and waits again if it must."""
        left = self._left
        if left is not None:
            limit = left.until - time.monotonic()
            if timeout is not None:
                limit = min(limit, timeout)
            with anyio.move_on_after(max(0.0, limit)), contextlib.suppress(RuntimeError):
                # RuntimeError: an event of another event loop (the receiver's last one)
                await left.woken.wait()
            self._left = None  # ended, or past its time: the next await starts one
            return None
        running = _Running(time.monotonic() + longest)

        def run_then_end() -> T:
            try:
                return wait()
            finally:
                running.end()

        try:
            return await to_thread.run_sync(run_then_end, abandon_on_cancel=True)
        except BaseException:
            if running.leave():  # cancelled (or failed) while its thread goes on
                self._left = running
            raise
