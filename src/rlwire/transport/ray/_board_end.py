"""The board's end of the stream (:class:`EndingBoard`, a base of
:class:`~rlwire.transport.ray._board.Board`'s halves), as a stored sink's end mark
(:mod:`~rlwire.transport._stored.ended`): ``finish()`` records it, and a sender opened
with ``on_existing="resume"`` that finds it keeps it until that sender makes something
new visible (a step's or a part's commit, a seal), in the same call. The resumed open
deleted it: a sender that closed, or was killed, before sending anything left a
finished run without its end, so receivers short of it waited for ever instead of
raising :class:`~rlwire.EndOfStream`, and the next ``"resume"`` went on after the last
step on the board, not at the end the run recorded (a truncate to a far
``start_step``, then ``finish()``)."""

from __future__ import annotations

from typing import Any

from rlwire.transport.ray._board_fence import FencingBoard
from rlwire.transport.ray._board_staged import counts

__all__ = ["EndingBoard"]


class EndingBoard(FencingBoard):
    """The end of the stream of a board, and whether a resumed open kept it."""

    parts: dict[int, Any]
    seals: dict[int, Any]
    #: the end of the stream, once a sender finished it (``None``: not finished)
    end: int | None = None
    #: whether the newest open (``"resume"``) found the end, still there
    end_kept: bool = False

    async def _notify(self) -> None:
        raise NotImplementedError

    def _keep_end(self, resumed: bool) -> None:
        """Note whether an open, ``resumed`` or not, keeps the end it finds (until its
        sender's first commit: :meth:`_reopen_end`); one that does not deletes it."""
        self.end_kept = resumed and self.end is not None

    def _reopen_end(self) -> None:
        """Forget the end a resumed open kept (:meth:`_keep_end`), in the call that
        makes the first new step, part or seal visible: left there, it would end a
        receiver past that step."""
        if self.end_kept:
            self.end, self.end_kept = None, False

    async def finish(self, end: int, epoch: int | None = None) -> tuple[Any, ...]:
        """Mark the end of the stream at ``end``: ``("ok",)``, or ``("open",)`` without
        marking it when ``end`` is open part by part (a killed producer's step: its parts
        would be read past the end), ``("fenced", why)`` when the sender, opened at
        ``epoch``, is fenced off. ValueError: not a step (as
        :meth:`~rlwire.transport.ray._board.Board.mark`)."""
        counts(end)
        fenced = self._fenced(epoch, f"mark the end of the stream at step {end}")
        if fenced is not None:
            return fenced
        if end in self.parts and end not in self.seals:
            return ("open",)
        self.end, self.end_kept = end, False
        await self._notify()
        return ("ok",)
