"""The event-loop toolkit: what rlwire uses to keep an event loop responsive, for yours.

An orchestrator that collects rollouts, scores them and sends batches does CPU work on
the same event loop that serves its inference clients. Every millisecond that work holds
the GIL is a millisecond no request is answered. The tools here are the ones rlwire's
sender and receiver are built on, on asyncio and trio alike (through anyio):

* :func:`offload` runs a call in a worker thread under a ``CapacityLimiter``: for work
  that releases the GIL (compression, hashing, I/O, numpy on large arrays).
* :func:`offload_sliced` runs a *sliced generator* (:data:`Sliced`): Python work cut into
  slices of about :data:`SLICE_SECONDS` (a :class:`SliceTimer` says when to ``yield``),
  run back to back in a worker thread that lets go of the GIL between slices.
  :func:`run_sliced` runs the same generator synchronously.
* :class:`Once` runs an expensive initialisation (a client, a tokenizer, a connection
  pool) once for every caller: concurrent callers share one run, a cancelled caller
  leaves it running for the others, and a failure reaches every waiting caller and is
  retried by the next call, not cached.
* :class:`LagMonitor` measures how late the loop wakes up: a stall you can log per step.

Example:
    >>> import anyio
    >>> from rlwire.aio import LagMonitor, SliceTimer, Sliced, offload_sliced
    >>> def score(rollouts: list[str]) -> Sliced[int]:
    ...     timer, total = SliceTimer(), 0
    ...     for text in rollouts:
    ...         total += text.count("answer")
    ...         if timer.due():
    ...             yield  # the loop may take the GIL here
    ...             timer.restart()
    ...     return total
    >>> async def main() -> int:
    ...     limiter = anyio.CapacityLimiter(2)
    ...     async with LagMonitor(interval=0.1) as lag:  # 10 Hz
    ...         total = await offload_sliced(score(["the answer"] * 50_000), limiter=limiter)
    ...     assert lag.percentile(99) < 1.0
    ...     return total
    >>> anyio.run(main)
    50000
"""

from rlwire._core.faces import claim
from rlwire._core.lag import LagMonitor
from rlwire._core.offload import TRIP_SECONDS, offload, offload_sliced
from rlwire._core.once import Once
from rlwire._core.slicing import SLICE_SECONDS, Sliced, SliceTimer, run_sliced

__all__ = [
    "SLICE_SECONDS",
    "TRIP_SECONDS",
    "LagMonitor",
    "Once",
    "SliceTimer",
    "Sliced",
    "offload",
    "offload_sliced",
    "run_sliced",
]

claim(__name__, globals(), __all__)
