"""The board's half for fields appended to committed steps (:class:`FieldsBoard`, a
base of :class:`~rlwire.transport.ray._board.Board`): per step and rank, the objects of
each message of fields appended to it (``add_fields``), in commit order.

A message is staged under a fresh key as a whole step's rank is (pulled from the
producer's actor, so the board owns it, or put by the producer), then committed on its
own: :meth:`FieldsBoard.commit_fields` checks, with nothing else running meanwhile,
that the step is still committed and that none of the message's fields was appended
already, then gives it the rank's next index (so stages appending to one step at once
all commit, each in one call), appends it and wakes every waiting receiver. The
messages go with their step when it is deleted (retention, an overwrite, a truncate).
Answers are plain values, as the board's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import ObjectRef

from rlwire.transport._appended import no_such_rank, step_replaced
from rlwire.transport.ray._board_parts import PartKey, _Part
from rlwire.transport.ray._board_staged import Refs, StagingBoard

__all__ = ["FieldsBoard"]


class FieldsBoard(StagingBoard):
    """The appended fields of a board; :class:`~rlwire.transport.ray._board.Board`
    holds the rest of the state and the helpers declared here."""

    committed: dict[int, list[Refs]]
    parts: dict[int, dict[int, list[_Part]]]
    seals: dict[int, tuple[list[list[PartKey]], list[list[float]]]]
    #: step -> rank -> the objects of its appended messages, in commit order
    fields: dict[int, dict[int, list[Refs]]]
    #: step -> rank -> the names of the fields its messages hold (those committed
    #: with their names: every one an rlwire of this version commits)
    field_names: dict[int, dict[int, set[str]]]
    #: step -> the token of its commit or seal (the board's)
    tokens: dict[int, str]
    runs: dict[int, str]

    def _checksums_of(self, step: int, rank: int) -> bytes | None:
        raise NotImplementedError

    @property
    def changed(self) -> asyncio.Condition:
        raise NotImplementedError

    async def _notify(self) -> None:
        raise NotImplementedError

    def _fields_of(self, step: int, rank: int) -> list[Refs]:
        return self.fields.get(step, {}).get(rank, [])

    def _committed_refs(self, step: int, rank: int) -> list[Refs] | None:
        """Rank ``rank``'s objects of the committed ``step``: its one message, or its
        parts the seal lists; ``None`` when the step is not committed for the rank."""
        ranks = self.committed.get(step)
        if ranks is not None:
            return [ranks[rank]] if rank < len(ranks) else None
        if step in self.seals:
            keys = self.seals[step][0]
            count = len(keys[rank]) if rank < len(keys) else 0
            return [part.refs for part in self.parts.get(step, {}).get(rank, [])[:count]]
        return None

    def _no_such_rank(self, step: int, rank: int) -> str | None:
        """Why ``rank`` is none of the committed ``step``'s ranks, or ``None``."""
        ranks = self.committed.get(step)
        count = len(ranks) if ranks is not None else len(self.seals.get(step, ([], []))[0])
        return no_such_rank(step, rank, count) if 0 < count <= rank else None

    async def committed_refs(self, step: int, rank: int) -> tuple[Any, ...]:
        """Rank ``rank``'s objects of the committed ``step``, what ``add_fields`` checks
        against: ``("step", [[main, sidecar, checksums], ...], token)`` (one for a step
        sent whole, one per part of a sealed one; ``checksums`` ``None`` when they are in
        the envelope; ``token`` that of the step's commit, which :meth:`commit_fields`
        checks), then the run of a sealed step's parts, ``("ranks", why)`` when the step
        has no rank ``rank``, or ``("none",)``."""
        why = self._no_such_rank(step, rank)
        if why is not None:
            return ("ranks", why)
        refs = self._committed_refs(step, rank)
        if refs is None:
            return ("none",)
        sums = self._checksums_of(step, rank) if step in self.committed else None
        return ("step", [[*r, sums] for r in refs], self.tokens.get(step), self.runs.get(step))

    async def stage_fields(
        self,
        step: int,
        key: str,
        rank: int,
        producer: Any,
        has_side: bool,
        refs: list[ObjectRef[Any]] | None,
        timeout: float,
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Hold the objects of a message of fields for rank ``rank`` of ``step``, not
        visible yet, under ``key``, as :meth:`~rlwire.transport.ray._board.Board.stage`
        holds a rank's. ``("ok",)``, ``("none", why)`` when the step is not committed,
        has no rank ``rank``, or was deleted while they were pulled, ``("fenced", why)``
        when the sender, opened at ``epoch``, is fenced off (``_board_fence``; a stage
        that only appends opened nothing, and names no epoch)."""
        what = f"append fields to step {step} rank {rank}"
        fenced = self._fenced(epoch, what)
        if fenced is not None:
            return fenced
        why = self._no_such_rank(step, rank)
        if why is not None:
            return ("none", why)
        if self._committed_refs(step, rank) is None:
            return ("none", f"step {step} is not committed (sent whole, or sealed)")
        held = await self._hold(step, key, rank, producer, has_side, refs, timeout, (epoch, what))
        return ("none", held[1]) if held[0] == "dropped" else held

    async def commit_fields(
        self,
        key: str,
        rank: int,
        index: int | None = None,
        token: str | None = None,
        names: list[str] | None = None,
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Make the message staged under ``key`` visible as the next one of fields
        appended to its step for rank ``rank``, and wake the receivers. With ``names``
        (the fields it holds), it takes the next index, whatever messages other senders
        appended since it was staged (concurrent stages all commit), unless one of them
        holds a field of ``names``; else (a sender that names none) it must be the
        ``index``-th. ``("ok",)``, ``("missing",)`` if nothing is staged under ``key``,
        ``("appended", why)`` if a field of ``names`` was appended to the step and rank
        already, ``("exists", why)`` if (no ``names``) ``index`` is taken, ``("none",
        why)`` if the step was deleted meanwhile, or (``token`` given: the one
        :meth:`committed_refs` answered) deleted and sent again, ``("fenced", why)`` if
        the sender, opened at ``epoch``, is fenced off (what it staged goes)."""
        entry = self.staged.pop(key, None)
        if entry is None:
            gone = self._unstaged(key)  # let go of with its step: say so
            return ("none", gone[1]) if gone[0] == "dropped" else gone
        step, staged = entry
        fenced = self._fenced(epoch, f"append fields to step {step} rank {rank}")
        if fenced is not None:
            return fenced
        if rank not in staged:
            return ("missing",)
        if self._committed_refs(step, rank) is None:
            return ("none", step_replaced(step, False))
        if token is not None and self.tokens.get(step) != token:
            return ("none", step_replaced(step, True))
        have = self._fields_of(step, rank)
        held = self.field_names.get(step, {}).get(rank, set())
        if names is not None:
            twice = sorted(set(names) & held)
            if twice:
                return (
                    "appended",
                    f"field {twice[0]!r} was appended to step {step} rank {rank} already "
                    "(by another stage, meanwhile)",
                )
        elif len(have) != index:
            return (
                "exists",
                f"fields were appended to step {step} rank {rank} meanwhile (another sender)",
            )
        self.fields.setdefault(step, {}).setdefault(rank, []).append(staged[rank])
        self.field_names.setdefault(step, {}).setdefault(rank, set()).update(names or ())
        await self._notify()
        return ("ok",)

    async def read_fields(self, step: int, rank: int) -> tuple[Any, ...]:
        """The objects of every message of fields appended to ``step`` for ``rank``, in
        commit order, and the token of the step's commit they belong to: ``("fields",
        [[main, sidecar], ...], token)``."""
        refs = [list(refs) for refs in self._fields_of(step, rank)]
        return ("fields", refs, self.tokens.get(step))

    async def wait_fields(
        self, step: int, rank: int, count: int, timeout: float
    ) -> tuple[Any, ...]:
        """Wait up to ``timeout`` seconds until ``step`` holds more than ``count``
        messages of fields for ``rank``, or is no longer committed (deleted): then
        ``("ready",)``, else ``("none",)``."""

        def ready() -> bool:
            more = len(self._fields_of(step, rank)) > count
            return more or self._committed_refs(step, rank) is None

        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout)
            except TimeoutError:
                return ("none",)
        return ("ready",)
