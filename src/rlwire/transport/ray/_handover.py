"""How the board comes to own a step's objects: it asks the producer's actor for them.

An object belongs to the worker that created it and dies with it; ``ray.put`` makes the
producer its owner. An object that is the *return value* of an actor call belongs to the
caller instead. So the sink leaves a step's values here, in a table of its process, and the
board calls :func:`hand_over` on the producer's actor (``__ray_call__``), which returns
them: Ray copies them into the object store as that call's return values, owned by the
board, and they outlive the producer. :func:`producer_actor` says whether this process
is an actor the board can call so.
"""

from __future__ import annotations

import threading
from pickle import PickleBuffer
from typing import Any

import ray
from ray.actor import ActorHandle

__all__ = ["hand_over", "offer", "producer_actor", "withdraw"]

_TABLE: dict[str, list[list[PickleBuffer]]] = {}
_LOCK = threading.Lock()


def offer(key: str, values: list[list[PickleBuffer]]) -> None:
    """Keep ``values`` (one list per object) under ``key`` for :func:`hand_over`."""
    with _LOCK:
        _TABLE[key] = values


def withdraw(key: str) -> None:
    """Forget the values of ``key``, if they were not handed over."""
    with _LOCK:
        _TABLE.pop(key, None)


def hand_over(actor: object, key: str) -> tuple[Any, ...]:
    """Run by the producer's actor at the board's call: ``True`` (a small first return
    the board awaits, so it learns of a failure), then the values of each object of
    ``key``, as the call's return values (``num_returns`` is one more than the objects).

    Raises:
        KeyError: nothing is kept under ``key`` (withdrawn: the send was cancelled).
    """
    del actor  # __ray_call__ passes the actor instance first
    with _LOCK:
        values = _TABLE.pop(key)
    # Ray stores the values and drops the tuple: by reference counting, never by the
    # cyclic collector (see rlwire.transport.ray._payload.out_of_band).
    return (True, *values)


def producer_actor() -> ActorHandle[Any] | None:
    """The handle of the actor this process runs, when the board can pull a step's
    objects from it: an actor that runs more than one call at a time (an async actor by
    default; a threaded one with ``max_concurrency`` > 1), free to answer the board's
    call while a send waits for it. ``None`` in a driver, a task, or an actor that runs
    one call at a time, async or not (the board's call would wait behind the send that
    waits for it)."""
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return None
    core = getattr(ray._private.worker.global_worker, "core_worker", None)
    try:
        # One call at a time, async or not: the board's call would queue behind the send.
        pullable = core is not None and core.current_actor_max_concurrency() > 1
    except AttributeError:  # a Ray without these: never risk the wait
        pullable = False
    return context.current_actor if pullable else None
