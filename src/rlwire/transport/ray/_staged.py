"""What the board holds staged for a sender, not visible yet: a whole step's ranks
(:class:`RayStaged`) or one part (:class:`RayStagedPart`); committing asks the board to
make it visible, in one call that either does or does not, and that names the sender's
epoch (refused once another sender opened the destination: :func:`check_fence`)."""

from __future__ import annotations

import contextlib
from typing import Any

from rlwire._core.errors import ClosedError, StepExistsError, TransportError
from rlwire.transport._base import Staged
from rlwire.transport._parts import PartInfo
from rlwire.transport.ray._actors import BoardHandle, call, submit, unanswered
from rlwire.transport.ray._handover import withdraw

__all__ = ["Fence", "RayStaged", "RayStagedPart", "check_fence", "open_step_error", "taken_over"]

#: What a sender names in its calls to the board: its epoch, or nothing (a stage that
#: only appends fields, or a sender of a board made by an rlwire before epochs).
Fence = tuple[int, ...]


def open_step_error(step: int, where: str) -> StepExistsError:
    """The error for a whole step sent as ``step`` while it is being filled part by part."""
    return StepExistsError(
        f"step {step} was being filled part by part and is not sealed: finish it with "
        f"open_step({step}), or truncate it",
        where=where,
    )


def taken_over(answer: tuple[Any, ...], where: str) -> StepExistsError:
    """The error for the board's ``("dropped", why, step)``: what a sender staged was let
    go of, another sender having opened the destination (or resumed the step) since."""
    return StepExistsError(str(answer[1]), where=where)


def check_fence(answer: Any, where: str) -> None:
    """Raise if the board's ``answer`` is ``("fenced", why)``: another sender opened the
    destination after this one (``_board_fence``), and nothing of the call was stored.

    Raises:
        ClosedError: the sender is fenced off, saying by which open.
    """
    if isinstance(answer, tuple) and answer[:1] == ("fenced",):
        raise ClosedError(str(answer[1]), where=where)


class _Staged(Staged):
    """Staged under ``key`` on ``board`` by a sender that names ``fence`` in its calls;
    :meth:`_commit` makes it visible."""

    #: Whether a call of its stage or commit found the board not answering in time: its
    #: discard then asks the board without waiting for an answer (it would wait the
    #: board's answer time again before the sender raised).
    silent = False

    def __init__(self, board: BoardHandle, where: str, key: str, step: int, fence: Fence) -> None:
        self.board, self.where, self.key, self.step = board, where, key, step
        self.fence = fence

    def failed(self, exc: BaseException) -> None:
        """Note what its stage raised (:attr:`silent`), before it is discarded."""
        self.silent = self.silent or unanswered(exc)

    def _commit(self, what: str, method: Any, *args: Any) -> tuple[Any, ...]:
        """Call the board's commit ``method`` (with ``args`` and the sender's fence); its
        answer, with :attr:`visible` set.

        Raises:
            TransportError: the board is gone or does not answer (visible: unknown), or
                no longer holds it staged.
            StepExistsError: the board let go of it: another sender opened the
                destination (or resumed the step) since it was staged.
            ClosedError: the sender is fenced off (another opened the destination since
                it did); the board let go of it.
        """
        try:
            answer: tuple[Any, ...] = call(
                method, *args, *self.fence, where=self.where, action=f"commit {what}"
            )
        except TransportError as exc:
            self.visible = None  # the board may have committed it before it failed
            self.failed(exc)
            raise
        if answer[0] == "ok":
            self.visible = True
        elif answer[0] == "dropped":  # another sender opened the destination meanwhile
            raise taken_over(answer, self.where)
        elif answer[0] == "missing":
            raise TransportError(
                f"cannot commit {what}: the board no longer holds it staged (was the board "
                "restarted, or the step resumed or deleted by another sender?)",
                where=self.where,
            )
        check_fence(answer, self.where)
        return answer

    def _discard(self, ranks: range) -> None:
        for rank in ranks:
            withdraw(f"{self.key}.{rank}")
        action = "discard a step"
        with contextlib.suppress(TransportError):  # a board that is gone holds nothing
            if self.silent:  # it runs the call once it answers again, if it does
                submit(self.board.discard, self.key, where=self.where, action=action)
            else:
                call(self.board.discard, self.key, where=self.where, action=action)


class RayStaged(_Staged):
    """The ``ranks`` ranks of a whole ``step``, staged under ``key``; committed with
    each rank's ``checksums`` when the sender hashed them beside the store's copy
    (``None``: they are in the envelopes)."""

    def __init__(
        self, board: BoardHandle, where: str, key: str, step: int, ranks: int, fence: Fence
    ) -> None:
        super().__init__(board, where, key, step, fence)
        self.ranks = ranks
        self.checksums: list[bytes | None] | None = None

    def commit(self) -> None:
        answer = self._commit(
            f"step {self.step}", self.board.commit, self.key, self.ranks, self.checksums
        )
        if answer[0] == "exists":
            raise StepExistsError(
                f"step {self.step} was committed by another sender meanwhile", where=self.where
            )
        if answer[0] == "open":
            raise open_step_error(self.step, self.where)

    def discard(self) -> None:
        self._discard(range(self.ranks))


class RayStagedPart(_Staged):
    """One part of ``step``, staged under ``key``: committed, it is part ``part.index``
    of rank ``part.rank``."""

    def __init__(
        self, board: BoardHandle, where: str, key: str, step: int, part: PartInfo, fence: Fence
    ) -> None:
        super().__init__(board, where, key, step, fence)
        self.part = part

    def commit(self) -> None:
        part = self.part
        answer = self._commit(
            f"part {part.index} of rank {part.rank} of step {self.step}",
            self.board.commit_part,
            self.key,
            part.rank,
            part.index,
            part.key,
            part.cost,
        )
        if answer[0] == "exists":
            raise StepExistsError(f"{answer[1]} (another sender's?)", where=self.where)

    def discard(self) -> None:
        self._discard(range(self.part.rank, self.part.rank + 1))
