"""Room for a sender's next step: what ``keep_last`` and ``max_ahead`` decide before
each send, from the consumption marks the receivers record beside the steps."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

import anyio
from anyio import CapacityLimiter

from rlwire._api.options import Retention
from rlwire._core.offload import drive_sliced
from rlwire._core.slicing import Sliced
from rlwire.transport._base import Sink

__all__ = ["EVERY_RANK", "Room", "Widths"]

#: The width of a step every rank reads, whatever the ranks it was sent to.
EVERY_RANK = 2**62


class Widths:
    """How many ranks each step a sender sent went to, from its first step on, as runs
    of steps of one width (a run starts where the width changes): a run of alternating
    ``send`` and ``send_ranks`` costs 16 bytes a step, any other far less.

    Example:
        >>> widths = Widths(first=4)
        >>> for step, ranks in [(4, 2), (5, 1), (6, 1), (7, 2)]:
        ...     widths.record(step, ranks)
        >>> [widths.position(mark, rank=1, step=7) for mark in (None, 4, 5, 6, 7)]
        [4, 4, 7, 7, 7]
        >>> widths.position(3, rank=1, step=7)  # before the first step: not known
        3
        >>> Widths(first=4, before=[(2, 2), (3, 1)]).position(3, rank=1, step=4)
        4
        >>> Widths(first=4, before=[(2, 1)]).position(0, rank=1, step=4)  # 0, 1: gone
        4
    """

    def __init__(self, first: int, before: Sequence[tuple[int, int | None]] = ()) -> None:
        """``before``: the widths of steps before ``first`` sent by an earlier run, as
        ``(step, ranks)`` where they change (``None``: every rank), from the oldest
        step stored: none before it is."""
        self.first = first
        self._starts = array("Q")  # steps go up to 2**64 - 2
        self._ranks = array("q")
        for step, ranks in before:
            self.record(step, EVERY_RANK if ranks is None else ranks)
        # Where the widths are known from: a mark before it is taken as it is, but for
        # a mark before the oldest step a resumed sink kept. The steps between are gone:
        # keep_last deleted them once every rank holding files of them had moved past
        # them, so the rank had none; its receiver skips them (StepGapError).
        self._known = min(first, before[0][0]) if before else first
        self._gone = self._known if before else 0  # marks before it count from it

    def record(self, step: int, ranks: int) -> None:
        """``step`` goes to ``ranks`` ranks; it forgets any later step recorded (a send
        that failed, whose step number is used again)."""
        while self._starts and self._starts[-1] >= step:
            self._starts.pop()
            self._ranks.pop()
        if not self._ranks or self._ranks[-1] != ranks:
            self._starts.append(step)
            self._ranks.append(ranks)

    def position(self, mark: int | None, rank: int, step: int) -> int:
        """Where ``rank``, whose consumption mark is ``mark`` (``None``: it recorded
        nothing: it is at the oldest step a resumed sink kept, else at the first),
        stands for a send of ``step``: the first
        step from its mark on that it was sent, or ``step`` if none before it was. A
        step sent to fewer ranks has nothing for it to move past: its receiver skips
        it (``StepGapError``) when it reads, which may be after the send of a later
        step; counting the rank there could make that send wait for it, and it for the
        send, for ever. A mark before the
        steps whose widths are known (this sender's, and those a resumed sink kept) is
        taken as it is; one before the oldest step a resumed sink kept, as that step."""
        # A rank that recorded nothing is at the oldest step it could read: the oldest a
        # resumed sink kept (the walk below passes those it was left out of), else the
        # first; not at each new sender's first step, which let every restart run
        # max_ahead steps further past a rank that never read.
        at = self._known if mark is None else max(mark, self._gone)
        if at < self._known or at >= step:
            return at
        run = bisect.bisect_right(self._starts, at) - 1
        if run < 0:
            return at  # no send recorded yet
        while run < len(self._ranks) and self._ranks[run] <= rank:
            run += 1  # the whole run went to fewer ranks: on to the next
            at = self._starts[run] if run < len(self._starts) else step
        return min(at, step)


class Room:
    """A sender's retention: before a step is sent, wait while it is more than
    ``max_ahead`` steps ahead of the slowest rank, then delete the steps ``keep_last``
    lets go."""

    def __init__(self, sink: Sink, retention: Retention) -> None:
        self.sink = sink
        self.retention = retention
        self.widths = Widths(0)  # made again once the sender knows its first step
        # Steps before this one are deleted. Not the step asked for: a sink keeps a step
        # some rank holding files of it has not moved past, and says which it kept, so
        # that a later send asks again once that rank has moved past it.
        self.pruned = 0

    @property
    def first_step(self) -> int:
        """Where the sender started: a rank with no mark is there."""
        return self.widths.first

    @first_step.setter
    def first_step(self, step: int) -> None:
        # A resumed sink knows how many ranks each step it kept went to.
        self.widths = Widths(step, self.sink.resumed_widths)

    async def make(
        self, step: int, ranks: int, limiter: CapacityLimiter, *, parts: bool = False
    ) -> None:
        """Wait while ``step`` (for ``ranks`` ranks; ``parts``: to be filled part by
        part) is more than ``max_ahead`` steps ahead of the slowest of those ranks, then
        delete the steps ``keep_last`` lets go."""
        # A step filled part by part leaves no rank out: its seal gives every rank the
        # step, empty for a rank without parts, which that rank reads and moves past.
        self.widths.record(step, EVERY_RANK if parts else ranks)
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
        if max_ahead is not None:
            behind = min(self.widths.position(m, r, step) for r, m in enumerate(marks))
            if step - behind > max_ahead:
                return False
        yield
        if keep_last is not None and all(m is None or m <= step for m in marks):
            # A rank with no mark has moved past nothing, as far as anyone can tell: it
            # counts as being at the sender's first step, and the sink keeps every step
            # holding files of it (prune's contract), so a rank new to the run (a
            # restart with more ranks) holds back its own steps, not the run's older
            # ones. A rank whose mark is ahead of the steps sent is a receiver of the
            # run before a rewrite (overwrite, truncate): it tells nothing of this
            # run's steps, and nothing is deleted while there is one. The marks as they
            # are, not the positions max_ahead takes for ranks left out of steps.
            slowest = min(self.first_step if m is None else m for m in marks)
            below = min(slowest, step + 1 - keep_last)
            if below > self.pruned:
                kept = self.sink.prune(below)
                if kept is not None:  # else the sink does not say: ask again next time
                    self.pruned = min(kept, below)
        return True
