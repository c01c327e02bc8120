"""How a :class:`~rlwire.transport.ray._sink.RaySink` hands a message's objects to the
board (:class:`HandingSink`, one of its bases): the call is made without waiting for the
board's answer, so the sender hashes the message while Ray copies it into the object
store; its prunes are not waited for either. What the board does with the objects is
:mod:`~rlwire.transport.ray._handover`'s.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, NamedTuple

import ray
from ray import ObjectRef

from rlwire._core.errors import TransportError
from rlwire.transport.ray import _actors
from rlwire.transport.ray._actors import BoardHandle, answer_of, ray_errors, submit
from rlwire.transport.ray._handover import offer, withdraw
from rlwire.transport.ray._payload import out_of_band
from rlwire.transport.ray._staged import Fence, check_fence

__all__ = ["Handed", "HandingSink"]


class Handed(NamedTuple):
    """One message handed to the board (:meth:`HandingSink._hand_off`), its answer to come:
    the key the values wait under in this process, the answer's reference, and what
    the call does (for errors)."""

    rank_key: str
    answer: ObjectRef[Any]
    action: str


class HandingSink:
    """The hand-offs and prunes of a :class:`~rlwire.transport.ray._sink.RaySink`."""

    #: A prune the board may still be running (:meth:`prune`).
    _pruning: ObjectRef[Any] | None = None
    #: What the sender names in its calls to the board: the epoch of its open (none
    #: before it opens, for a stage that only appends fields, or from a board of an
    #: rlwire before epochs): ``_board_fence``.
    _fence: Fence = ()

    if TYPE_CHECKING:  # RaySink's
        pull_timeout: float
        _producer: BoardHandle | None

        @property
        def where(self) -> str: ...
        def _require_board(self) -> BoardHandle: ...

    def _hand(
        self,
        method: Any,
        head: tuple[Any, ...],
        rank_key: str,
        main: list[memoryview],
        side: list[memoryview] | None,
        action: str,
    ) -> Any:
        """Hand one message's objects to the board (:meth:`_hand_off`) and wait for its
        answer."""
        return self._answer(self._hand_off(method, head, rank_key, main, side, action))

    def _hand_off(
        self,
        method: Any,
        head: tuple[Any, ...],
        rank_key: str,
        main: list[memoryview],
        side: list[memoryview] | None,
        action: str,
    ) -> Handed:
        """Hand one message's objects to the board, whose ``method`` stages them (called
        with ``head``, then the producer, whether there is a sidecar, the references,
        the pull timeout and the sender's fence): pulled from this actor under
        ``rank_key`` (the board owns them), or put by this process (it owns them; the
        put blocks this worker thread for the copy into the object store). The call is
        not waited for: pass what this returns to :meth:`_answer`, and keep the memory
        of ``main`` and ``side`` as it is until then (the board may still be pulling
        it)."""
        refs = None
        values = [out_of_band(main)] if side is None else [out_of_band(main), out_of_band(side)]
        try:
            if self._producer is None:
                with ray_errors(self.where, action):
                    refs = [ray.put(v) for v in values]
            else:
                offer(rank_key, values)
        finally:
            values = []  # see out_of_band: the table holds them until the board pulls
        try:
            ref = submit(
                method,
                *head,
                self._producer,
                side is not None,
                refs,
                self.pull_timeout,
                *self._fence,
                where=self.where,
                action=action,
            )
        except BaseException:
            withdraw(rank_key)
            raise
        return Handed(rank_key, ref, action)

    def _answer(self, handed: Handed) -> Any:
        """The board's answer to a hand-off (:meth:`_hand_off`), waited for.

        Raises:
            TransportError: the board is gone, failed to pull the objects, or waited for
                them longer than ``pull_timeout``.
        """
        try:
            # The board's answer waits for its pull (if it pulls), which it gives up
            # after pull_timeout.
            pulls = self._producer is not None
            limit = _actors.BOARD_ANSWER_SECONDS + (self.pull_timeout if pulls else 0.0)
            answer = answer_of(handed.answer, self.where, handed.action, limit)
        finally:
            withdraw(handed.rank_key)  # handed over, or never to be
        if isinstance(answer, tuple) and answer[:1] == ("unpulled",):
            raise TransportError(
                f"cannot {handed.action}: the board waited {answer[1]:g} s (pull_timeout) "
                "for the producer's actor to hand the objects over, and every call that "
                "actor runs at once was busy; send from an async actor, or give a threaded "
                "one a max_concurrency above the calls it runs at once",
                where=self.where,
            )
        return answer

    def _quiesce(self, handed: Handed, silent: bool = False) -> None:
        """Wait for the board's answer to ``handed``, whatever it is (a failed send
        discards what it staged once it is in); not when the board is ``silent`` (did
        not answer another call in time: it would wait as long again), which only lets
        go of the values the board did not pull."""
        if silent:
            withdraw(handed.rank_key)
            return
        with contextlib.suppress(TransportError):
            self._answer(handed)

    def prune(self, below: int) -> None:
        """Ask the board to delete every step before ``below``, without waiting for it:
        the sink's next send waits for it before its step is staged in full, and so do
        its ``seal``, ``finish`` and ``close``. Whether the board runs the prune or the
        send's stage calls first does not matter: they touch different steps. Says
        nothing of the steps the board kept (it answers later): the sender asks again at
        its next send, and a step held for a rank is dropped once the rank moved past it."""
        self._settle_prune()
        self._pruning = submit(
            self._require_board().prune,
            below,
            *self._fence,
            where=self.where,
            action="delete steps",
        )

    def _settle_prune(self) -> None:
        """Wait for the prune :meth:`prune` asked for, if it is not answered yet.

        Raises:
            TransportError: the board is gone, or failed to prune.
            ClosedError: the sender is fenced off: the prune deleted nothing.
        """
        pruning, self._pruning = self._pruning, None
        if pruning is not None:
            check_fence(answer_of(pruning, self.where, "delete steps"), self.where)
