"""Work cut into pieces: the shape every CPU- or I/O-heavy step of rlwire takes.

A *piece generator* does its work between ``yield`` statements and returns its result.
Each resumption is short (about a millisecond of GIL-holding Python, or one bounded
system call that releases the GIL), so a driver can run every piece in a worker thread
and the event loop gets the GIL back between pieces. The same generator runs
synchronously with :func:`run_sync`; :mod:`rlwire._aio` drives it from async code.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TypeVar

__all__ = ["Pieces", "Slicer", "run_sync"]

T = TypeVar("T")

#: A generator that yields between pieces of work and returns a result.
Pieces = Generator[None, None, T]

#: Default length of one piece of GIL-holding Python work, in seconds.
SLICE_SECONDS = 0.0003


class Slicer:
    """Tells a piece generator when its current piece has run long enough.

    Example:
        >>> s = Slicer(0.001)
        >>> s.due()  # just started
        False
    """

    __slots__ = ("_deadline", "_seconds")

    def __init__(self, seconds: float = SLICE_SECONDS) -> None:
        self._seconds = seconds
        self._deadline = time.perf_counter() + seconds

    def due(self) -> bool:
        """True when the current piece is over: yield, then call :meth:`restart`."""
        return time.perf_counter() >= self._deadline

    def restart(self) -> None:
        """Start a new piece now (call after resuming from a yield)."""
        self._deadline = time.perf_counter() + self._seconds


def run_sync(pieces: Pieces[T]) -> T:
    """Run every piece of ``pieces`` in the calling thread and return its result."""
    while True:
        try:
            next(pieces)
        except StopIteration as stop:
            result: T = stop.value
            return result
