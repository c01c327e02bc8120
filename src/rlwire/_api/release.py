"""A received step freed in a thread of its own once its caller drops it.

A step of thousands of samples is tens of thousands of objects (a Struct and five numpy
views a sample: 48,000 for 8,000 samples). Freeing them happens wherever the last
reference goes, which for a trainer is the line that replaces the step it held with the
next one (``batch = await receiver.areceive()``): on the event loop, which that held
2.5-3 ms for 8,000 samples. So a receiver notes each :class:`~rlwire.TrainingBatch` of
many samples it returns, and when one of them is freed (``TrainingBatch.__del__``), its
list of samples goes to a thread of its own, which frees it a slice at a time; dropping
the step costs the caller a few microseconds.

Only a list nothing else holds goes: one the caller kept (``samples = batch.samples``)
stays where it is, whole, and is freed where the caller drops it. What runs where the
batch is freed takes no lock and starts no thread (a batch may be freed anywhere, inside
another library's locked section too): a look at a set, a reference count, and a put on
a :class:`queue.SimpleQueue`, which is reentrant.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import Any

from rlwire._core.slicing import Sliced, SliceTimer, run_sliced_beside

__all__ = ["MANY_ITEMS", "note_received", "on_drop"]

#: A step with this many samples or more is freed in the release thread (fewer cost the
#: caller well under 0.1 ms to free).
MANY_ITEMS = 1024
# Items freed between two looks at the slice timer (a few tens of microseconds).
_GROUP = 64
# Lists waiting for the release thread beyond which a step is freed where it is dropped
# (a caller that holds the GIL nearly all the time leaves the thread little of it).
_BACKLOG = 2
# Never set: each list is freed to its end.
_NEVER = threading.Event()


class _Releaser:
    """The release thread and its queue, made again in a forked child."""

    def __init__(self) -> None:
        self.received: set[int] = set()  # ids of noted steps not yet freed
        self.queue: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self) -> bool:
        """Start the release thread unless it runs; False if it cannot start (no new
        thread at interpreter shutdown, a limit on threads): steps are then freed where
        they are dropped, as before."""
        with self.lock:
            if self.thread is None:
                thread = threading.Thread(
                    target=_release_forever, args=(self.queue,), name="rlwire-release", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:
                    return False
                self.thread = thread
            return True


_releaser = _Releaser()


def _after_fork() -> None:
    global _releaser
    _releaser = _Releaser()  # the child starts a release thread of its own when it receives


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def note_received(batch: Any) -> None:
    """Note ``batch``, a :class:`~rlwire.TrainingBatch` a receiver returns, so that its
    list of samples is freed in the release thread once ``batch`` is, if it has at least
    :data:`MANY_ITEMS` of them. Called where the receiver reads, never where a step is
    freed (it may start the thread).

    Example:
        >>> import rlwire
        >>> batch = rlwire.TrainingBatch(samples=[None] * 2000)  # type: ignore[list-item]
        >>> note_received(batch)
        >>> del batch  # its list of 2,000 items is freed by the release thread
    """
    samples = batch.samples
    if type(samples) is not list or len(samples) < MANY_ITEMS:
        return
    releaser = _releaser
    if releaser.start():
        releaser.received.add(id(batch))


def on_drop(batch: Any) -> None:
    """Called by ``TrainingBatch.__del__``, in whatever thread frees ``batch``: if a
    receiver noted it, give its list of samples to the release thread when the dying
    batch is the list's only holder; else nothing (the list goes as any object does)."""
    received = _releaser.received
    key = id(batch)
    if key not in received:
        return
    received.discard(key)
    if type(batch.samples) is not list or len(batch.samples) < MANY_ITEMS:
        return  # replaced since by a short list, or by Columns: freed here, as any object
    # No local holds the list: read as the probe below is. qsize takes no lock.
    if _references(batch) <= _ALONE and _releaser.queue.qsize() < _BACKLOG:
        _releaser.queue.put(batch.samples)


def _references(holder: Any) -> int:
    """The references to ``holder.samples``, read the same way for the probe below."""
    return sys.getrefcount(holder.samples)


class _Probe:
    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: list[Any] = []


# What _references reads for a list only its holder holds: it depends on the
# interpreter (3.14 lends a local to a call without a reference of its own), never on
# the list, so it is read once, the way on_drop reads it.
_probe = _Probe()
_ALONE = _references(_probe)
del _probe


def _release_forever(items_queue: queue.SimpleQueue[list[Any]]) -> None:
    """The release thread: free each list put on the queue, a slice at a time, letting
    go of the GIL between slices so that an event loop waiting for it takes it."""
    while True:
        run_sliced_beside(_freed(items_queue.get()), _NEVER)


def _freed(items: list[Any]) -> Sliced[None]:
    """Empty ``items`` a group at a time, yielding when a slice is over."""
    timer = SliceTimer()
    while items:
        del items[-_GROUP:]
        if timer.due():
            yield
            timer.restart()
