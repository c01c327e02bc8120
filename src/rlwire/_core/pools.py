"""How many threads rlwire gives work that releases the GIL, and the one pool they run in.

Compression, decompression and hashing spend their time in C with the GIL released
(lz4, zstd, xxhash), so one message's segments can be worked on by several threads at
once. One rule sizes that: :func:`worker_count`, the cores, at most :data:`MAX_WORKERS`
(more threads than that rarely pay: the work is bound by memory bandwidth by then). The
threads come from one executor shared by every sender and receiver of the process,
:func:`shared_executor`, created on first use. Each caller bounds its own work (how many
tasks it has in the executor at once) by :func:`worker_count`, or by the threads its
limiter allows; the executor starts threads only as that work needs them.

Tasks given to the executor must never wait for other tasks of it: a full executor
would then wait for itself.

A process forked after using the executor (``os.fork``, multiprocessing's ``"fork"``
start method, which PyTorch's DataLoader workers use) has only the thread that forked: the
executor's threads stayed in the parent, yet the executor would believe an idle one
waits for work, and the child's first compression would wait forever. So the child
forgets the parent's executor (and its lock, which another thread may have held at the
fork) and creates its own on first use (:func:`_forget_after_fork`).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

__all__ = ["EXECUTOR_THREADS", "MAX_WORKERS", "shared_executor", "worker_count"]

#: The most threads one piece of work (the segments of one message) is spread over.
MAX_WORKERS = 8
#: The most threads the shared executor starts, whatever the callers ask for: a ceiling
#: for many senders and receivers in one process, not a size any one of them uses.
EXECUTOR_THREADS = 64

_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def worker_count(limit: float | None = None, *, spare: int = 0) -> int:
    """How many threads one piece of GIL-releasing work may use: the cores less
    ``spare`` (left to the event loop), at most :data:`MAX_WORKERS`, and at most
    ``limit`` when given; at least 1.

    Example:
        >>> 1 <= worker_count() <= MAX_WORKERS
        True
        >>> worker_count(limit=1)
        1
    """
    count = max(1, min((os.cpu_count() or 1) - spare, MAX_WORKERS))
    return count if limit is None else max(1, min(count, int(limit)))


def shared_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The executor of every thread that compresses, decompresses or hashes, created on
    first use; thread-safe. Its threads start as work needs them, at most
    :data:`EXECUTOR_THREADS`.

    Example:
        >>> shared_executor().submit(sum, [1, 2, 3]).result()
        6
        >>> shared_executor() is shared_executor()
        True
    """
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                EXECUTOR_THREADS, thread_name_prefix="rlwire-worker"
            )
        return _executor


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's executor, whose threads do not exist here,
    and its lock, which a thread of the parent may have held when the process forked."""
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_forget_after_fork)
