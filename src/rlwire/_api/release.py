"""A received step freed in a worker thread once its caller drops it.

A step of thousands of samples is tens of thousands of objects (a Struct and five numpy
views a sample: 48,000 for 8,000 samples). Freeing them happens wherever the last
reference goes, which for a trainer is the line that replaces the step it held with the
next one (``batch = await receiver.areceive()``): on the event loop, which that held
2.5-3 ms for 8,000 samples. A receiver therefore keeps its own reference to each long
list of a step it returns, and when the step itself is freed, hands those lists to a
worker thread that frees them a slice at a time; dropping the step then costs the
caller a fraction of a millisecond.

Only what nothing else holds is freed there: a list the caller kept (``samples =
batch.samples``) is left to the caller, untouched. This takes a step that can be
referred to weakly (a Struct declared ``weakref=True``, as :class:`~rlwire.TrainingBatch`
is); others are freed where they are dropped, as any object.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import msgspec

from rlwire._core.pools import shared_executor
from rlwire._core.slicing import Sliced, SliceTimer, run_sliced_beside

__all__ = ["MANY_ITEMS", "release_in_a_worker"]

#: A list field this long is freed in a worker thread (shorter ones cost the caller
#: under 0.1 ms to free).
MANY_ITEMS = 1024
# Items freed between two looks at the slice timer (a few tens of microseconds each).
_GROUP = 64
# Never set: each release runs to its end (the thread is a daemon of the shared executor).
_NEVER = threading.Event()


def release_in_a_worker(obj: Any) -> None:
    """Arrange for the long lists held by the fields of ``obj`` (a received step) to be
    freed in a worker thread once ``obj`` is: if ``obj`` is a Struct that takes weak
    references and has a list field of at least :data:`MANY_ITEMS` items; else nothing.

    Example:
        >>> import gc, rlwire
        >>> batch = rlwire.TrainingBatch(samples=[None] * 2000)  # type: ignore[list-item]
        >>> release_in_a_worker(batch)
        >>> del batch  # the list of 2,000 items is freed by a worker thread
    """
    if not isinstance(obj, msgspec.Struct) or not obj.__struct_config__.weakref:
        return
    lists = [
        value
        for name in obj.__struct_fields__
        if type(value := getattr(obj, name, None)) is list and len(value) >= MANY_ITEMS
    ]
    if lists:
        weakref.finalize(obj, _hand_over, lists).atexit = False


def _hand_over(lists: list[list[Any]]) -> None:
    """Called where the step is freed (the caller's thread): start the release."""
    shared_executor().submit(run_sliced_beside, _released(lists), _NEVER)


def _released(lists: list[list[Any]]) -> Sliced[None]:
    """Free each list of ``lists`` a group of items at a time, a slice at a time, if this
    is its last reference; else only drop this reference."""
    timer = SliceTimer()
    while lists:
        items = lists.pop()
        # Two references: ``items`` and getrefcount's argument. Anyone else holding the
        # list may still read it, so it is not touched.
        if sys.getrefcount(items) > 2:
            continue
        while items:
            del items[-_GROUP:]
            if timer.due():
                yield
                timer.restart()
