"""The board's half for what senders have staged and not committed yet
(:class:`StagingBoard`, a base of :class:`~rlwire.transport.ray._board.Board`'s halves):
a whole step's ranks, a part or a message of appended fields, held under the key its
sender chose until that sender commits or discards it.

What the board lets go of before its sender commits it (a producer that died between
staging and committing leaves it: a later open of the destination at or before its
step, a resumed step, a deletion drop it) leaves a *tombstone*: the key and why it went.
The sender, if it is alive after all (a second producer opened the destination in the
middle of its send), is told that reason at its next stage or commit of that key, not
that the board lost what it had (``("dropped", why)``; the sink raises
``StepExistsError`` or, for appended fields, ``ConfigError``). The last
:data:`TOMBSTONES` are kept: a producer killed mid-send leaves one, a few dozen bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ray import ObjectRef

from rlwire.transport.ray._board_fence import FencingBoard
from rlwire.transport.ray._handover import hand_over

__all__ = ["TOMBSTONES", "Refs", "StagingBoard", "counts", "deleted", "resumed", "taken_over"]

#: One rank's objects: the main object's reference, and the sidecar's or ``None``.
Refs = tuple[ObjectRef[Any], ObjectRef[Any] | None]

#: How many keys let go of before their commit the board remembers (and why).
TOMBSTONES = 1024


def counts(*values: object) -> None:
    """Raise ValueError unless every value is an int >= 0 (a rank, a step, a part)."""
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise ValueError(f"a rank, step or part must be an int >= 0, got {values!r}")


def deleted(step: int) -> str:
    """Why something staged for ``step`` was let go of when the step was deleted."""
    return (
        f"step {step} was deleted (retention, or another sender's overwrite or truncate) "
        "while this sender was staging it"
    )


def taken_over(step: int, on_existing: str) -> str:
    """Why something staged for ``step`` was let go of when another sender opened the
    destination with ``on_existing``, to send the steps from ``step`` on (or at most
    ``step``: it resumed)."""
    return (
        f"step {step} was taken over by another sender: it opened the destination "
        f"(on_existing={on_existing!r}) while this one was sending the step, and what "
        "this one had staged was dropped; two producers on one destination never both "
        "send a step (give each its own destination)"
    )


def resumed(step: int) -> str:
    """Why a part staged for ``step`` was let go of when another sender resumed it."""
    return (
        f"step {step} was taken over by another sender: it resumed the step (open_step) "
        "while this one was filling it, and the part this one had staged was dropped; "
        "two producers on one destination never both send a step"
    )


class StagingBoard(FencingBoard):
    """What the board holds staged, and the tombstones of what it let go of."""

    #: key -> (step, rank -> its objects), not visible yet
    staged: dict[str, tuple[int, dict[int, Refs]]]
    #: key -> (step, why): staged, then let go of before its commit (the last TOMBSTONES)
    dropped: dict[str, tuple[int, str]]

    def _dropped_answer(self, key: str) -> tuple[Any, ...] | None:
        """``("dropped", why, step)`` if what was staged under ``key`` was let go of."""
        tomb = self.dropped.get(key)
        return None if tomb is None else ("dropped", tomb[1], tomb[0])

    def _refused(self, key: str, epoch: int | None, what: str) -> tuple[Any, ...] | None:
        """Why a stage under ``key`` of a sender opened at ``epoch`` is refused, if it
        is: what it staged under ``key`` was let go of (the step taken over: its
        tombstone says so), or the sender is fenced off (``_board_fence``)."""
        return self._dropped_answer(key) or self._fenced(epoch, what)

    def _unstaged(self, key: str) -> tuple[Any, ...]:
        """What a commit of ``key`` answers when nothing is staged under it:
        ``("dropped", why, step)`` if it was let go of (its tombstone goes: a key is
        committed once), else ``("missing",)``."""
        tomb = self.dropped.pop(key, None)
        return ("missing",) if tomb is None else ("dropped", tomb[1], tomb[0])

    async def _hold(
        self,
        step: int,
        key: str,
        rank: int,
        producer: Any,
        has_side: bool,
        refs: list[ObjectRef[Any]] | None,
        timeout: float,
        fence: tuple[int | None, str] = (None, ""),
    ) -> tuple[Any, ...]:
        """Stage rank ``rank``'s objects of ``step`` under ``key``: with ``producer``
        (an actor handle) pulled from it under the key ``f"{key}.{rank}"`` (the board
        owns them), waiting up to ``timeout`` seconds; else ``refs`` are the objects
        the producer put (it owns them). ``("ok",)``; ``("unpulled", timeout)`` if the
        producer's actor did not hand them over in time (every call it can run at once
        was busy); ``("dropped", why, step)`` if the board let go of what was staged
        under ``key`` (before or during the pull), ``("fenced", why)`` if the sender is
        fenced off (before or during the pull: ``fence`` is the epoch it opened at and
        what its call does, for :meth:`_refused`): nothing is held then.

        Raises:
            ValueError: not a step, a rank and a str key (another client's call: a step
                that is no int broke every later open of the board).
        """
        counts(step, rank)
        if not isinstance(key, str):
            raise ValueError(f"a staging key is a str, not {type(key).__name__}")
        gone = self._refused(key, *fence)
        if gone is not None:
            return gone
        if producer is not None:
            count = 2 if has_side else 1
            returned = producer.__ray_call__.options(num_returns=count + 1).remote(
                hand_over, f"{key}.{rank}"
            )
            # Its first return is small: once it is there, so are the others (one call),
            # and awaiting it raises what the hand-over raised.
            try:
                await asyncio.wait_for(returned[0], timeout)
            except TimeoutError:
                return ("unpulled", timeout)
            refs = returned[1:]
            gone = self._refused(key, *fence)  # let go of, or fenced, meanwhile
            if gone is not None:
                return gone
        assert refs is not None
        entry = (refs[0], refs[1] if has_side else None)
        self.staged.setdefault(key, (step, {}))[1][rank] = entry
        return ("ok",)

    def _drop_staged(self, doomed: Callable[[int], bool], why: Callable[[int], str]) -> None:
        """Let go of what is staged for every step ``doomed`` says, leaving for each key
        a tombstone that says ``why(step)``."""
        for key in [k for k, (step, _) in self.staged.items() if doomed(step)]:
            step = self.staged.pop(key)[0]
            self.dropped.pop(key, None)  # the newest last: the oldest go first
            self.dropped[key] = (step, why(step))
        while len(self.dropped) > TOMBSTONES:
            del self.dropped[next(iter(self.dropped))]

    def _free_staged(self, step: int) -> None:
        """Let go of the objects staged for ``step``, just committed or sealed: none of
        them can commit now. Their keys stay (until committed, discarded or the step
        deleted), so that another producer of the step is told at its commit that the
        step exists (a StepExistsError, as on every sink), not that nothing is staged."""
        for key, (staged_step, _) in self.staged.items():
            if staged_step == step:
                self.staged[key] = (step, {})

    async def discard(self, key: str) -> None:
        """Drop what is staged under ``key``, if anything, and its tombstone."""
        self.staged.pop(key, None)
        self.dropped.pop(key, None)
