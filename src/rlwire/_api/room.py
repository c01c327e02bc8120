"""Room for a sender's next step: what ``keep_last`` and ``max_ahead`` decide before
each send, from the consumption marks the receivers record beside the steps."""

from __future__ import annotations

import anyio
from anyio import CapacityLimiter

from rlwire._api.options import Retention
from rlwire._core.offload import drive_sliced
from rlwire._core.slicing import Sliced
from rlwire.transport._base import Sink

__all__ = ["Room"]


class Room:
    """A sender's retention: before a step is sent, wait while it is more than
    ``max_ahead`` steps ahead of the slowest rank, then delete the steps ``keep_last``
    lets go."""

    def __init__(self, sink: Sink, retention: Retention) -> None:
        self.sink = sink
        self.retention = retention
        self.first_step = 0  # where the sender started: a rank with no mark is there
        # Steps before this one are deleted. Not the step asked for: a sink keeps a step
        # some rank holding files of it has not moved past, and says which it kept, so
        # that a later send asks again once that rank has moved past it.
        self.pruned = 0

    async def make(self, step: int, ranks: int, limiter: CapacityLimiter) -> None:
        """Wait while ``step`` is more than ``max_ahead`` steps ahead of the slowest
        rank, then delete the steps ``keep_last`` lets go."""
        delay = 0.005
        # Sliced: a read of the marks that hangs (S3) gives up when the send is cancelled.
        while not await drive_sliced(self._room(step, ranks), limiter):
            await anyio.sleep(delay)  # the receivers' marks are polled, not pushed
            delay = min(delay * 2, 0.25)

    def _room(self, step: int, ranks: int) -> Sliced[bool]:
        """In worker threads: False while ``step`` is more than ``max_ahead`` steps
        ahead of the slowest rank; else True, once the steps ``keep_last`` lets go are
        deleted (in the slice after the read of the marks)."""
        keep_last, max_ahead = self.retention.keep_last, self.retention.max_ahead
        marks = self.sink.read_consumption(ranks, step)
        slowest = min(self.first_step if m is None else m for m in marks)
        if max_ahead is not None and step - slowest > max_ahead:
            return False
        yield
        if keep_last is not None and all(m is not None and m <= step for m in marks):
            # A rank with no mark has moved past nothing, as far as anyone can tell; one
            # whose mark is ahead of the steps sent is a receiver of the run before a
            # rewrite (overwrite, truncate), which tells nothing of this run's steps.
            below = min(slowest, step + 1 - keep_last)
            if below > self.pruned:
                kept = self.sink.prune(below)
                if kept is not None:  # else the sink does not say: ask again next time
                    self.pruned = min(kept, below)
        return True
