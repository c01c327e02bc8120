"""The board: a named async Ray actor that keeps a ``ray://NAME`` destination's state.

It records, per step and rank, the references of the step's objects (a main object and,
when the message has one, a sidecar object) and the checksums its commit brought (the
sender hashes a step while Ray copies it in), which steps are committed, each rank's
consumption mark and part mark (as a store's files record them) and the end of the
stream (kept by a resumed open until its sender's first commit:
:mod:`~rlwire.transport.ray._board_end`). A step filled part by part has, per rank, its
parts in commit order (each part's objects, key and cost) and, once closed, its seal
(for each rank, its parts' keys and costs). Receivers wait on it (an
:class:`asyncio.Condition`, notified by every commit) instead of polling. Steps it
deletes (``keep_last``, an overwrite, a truncate) lose their references, parts and
seal included, so the object store frees their memory once no reader holds a view of
it; so do objects staged and never committed (a producer died between the two) once
a sender opens the destination at or before their step, or their step is committed
again, sealed or deleted (a producer that was alive after all is told why at its
commit: :mod:`~rlwire.transport.ray._board_staged`). Each open of the destination is
given the next epoch, and a sender opened before the newest one is refused every call
that would change anything (:mod:`~rlwire.transport.ray._board_fence`).

Objects the board pulled from a producer's actor (``_handover``) are owned by the
board: they survive the producer and die with the board. Its methods answer with plain
values (tuples of str and int, references), never rlwire's exceptions, so nothing of
rlwire's is pickled on the way back; the sink and source raise the errors.

Every method is a coroutine, so Ray runs the board as an async actor: one event loop,
no locks, no suspension point between reading and changing the state but the waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray import ObjectRef

from rlwire._core.errors import RlwireError
from rlwire.transport._base import OnExisting
from rlwire.transport._stored.names import (
    CONSUMED_PART_RE,
    CONSUMED_RE,
    END_NAME,
    SEAL_RE,
    STEP_PART_RE,
    STORED_RE,
    consumed_name,
    consumed_part_name,
    main_name,
    names_to_delete,
    part_name,
    part_sidecar_name,
    seal_name,
    sidecar_name,
    start_step,
)
from rlwire.transport._stored.resumed import stored_widths
from rlwire.transport._stored.retention import held_back
from rlwire.transport.ray._board_end import EndingBoard
from rlwire.transport.ray._board_fields import FieldsBoard
from rlwire.transport.ray._board_parts import PartsBoard
from rlwire.transport.ray._board_staged import Refs, counts, deleted, taken_over

__all__ = ["Board", "Refs", "board_name"]


def board_name(name: str) -> str:
    """The Ray actor name of the board of ``ray://name``."""
    return f"rlwire-board:{name}"


class Board(PartsBoard, FieldsBoard, EndingBoard):
    """The state of one ``ray://NAME`` destination (see the module's docstring).

    Created through :func:`ray.remote` (``_actors`` does); callers use its methods'
    ``.remote``. ``where`` names the destination in messages.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.committed: dict[int, list[Refs]] = {}  # step -> one entry per rank
        # step -> each rank's checksums, for a step committed with them (the sender hashed
        # it while Ray copied it, so they are not in its envelope)
        self.checksums: dict[int, list[bytes | None]] = {}
        self.staged: dict[str, tuple[int, dict[int, Refs]]] = {}  # key -> (step, ranks)
        self.dropped: dict[str, tuple[int, str]] = {}  # key -> (step, why): tombstones
        self.parts = {}
        self.seals = {}
        self.tokens = {}
        self.runs = {}
        self.fields = {}
        self.field_names = {}
        self.consumed: dict[int, int] = {}
        # rank -> (step, next part, the run of the parts before it)
        self.consumed_parts: dict[int, tuple[int, int, bytes]] = {}
        self.end, self.end_kept = None, False  # the end of the stream (_board_end)
        self.epoch, self.opens = 0, {}  # the fence (_board_fence)
        self._changed: asyncio.Condition | None = None

    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:  # made on the actor's loop
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _names(self) -> list[str]:
        """The destination as the stored layout would list it, so that the rules of
        ``on_existing`` are exactly those of every stored sink."""
        names = []
        for step, ranks in self.committed.items():
            for rank, (_, side) in enumerate(ranks):
                names.append(main_name(step, rank))
                if side is not None:
                    names.append(sidecar_name(step, rank))
        for step, by_rank in self.parts.items():
            for rank, parts in by_rank.items():
                for index, part in enumerate(parts):
                    names.append(part_name(step, rank, index))
                    if part.refs[1] is not None:
                        names.append(part_sidecar_name(step, rank, index))
        names += [seal_name(step) for step in self.seals]
        names += [consumed_name(rank) for rank in self.consumed]
        names += [consumed_part_name(rank) for rank in self.consumed_parts]
        if self.end is not None:
            names.append(END_NAME)
        return names

    def _delete(self, names: list[str]) -> None:
        for name in names:
            if name == END_NAME:
                self.end = None
            elif m := CONSUMED_RE.fullmatch(name):
                self.consumed.pop(int(m.group(1)), None)
            elif m := CONSUMED_PART_RE.fullmatch(name):
                self.consumed_parts.pop(int(m.group(1)), None)
            elif m := (
                STORED_RE.fullmatch(name) or STEP_PART_RE.fullmatch(name) or SEAL_RE.fullmatch(name)
            ):
                self._drop_step(int(m.group(1)))  # one call: no reader sees it half gone

    def _drop_step(self, step: int) -> None:
        """Forget everything of ``step``: its objects, parts, seal and what is staged."""
        self.committed.pop(step, None)
        self.checksums.pop(step, None)
        self.parts.pop(step, None)
        self.seals.pop(step, None)
        self.tokens.pop(step, None)
        self.runs.pop(step, None)
        self.fields.pop(step, None)
        self.field_names.pop(step, None)
        self._drop_staged(lambda s: s == step, deleted)

    def _stored(self) -> set[int]:
        """The steps holding anything committed: whole, parts or a seal."""
        return set(self.committed) | set(self.parts) | set(self.seals)

    async def open(self, on_existing: OnExisting, first: int | None) -> tuple[Any, ...]:
        """Apply ``on_existing`` (and the sender's ``start_step``, ``first``) as every
        stored sink does; ``("ok", step, epoch, widths)`` with the first step to send,
        the sender's epoch (every sender opened before it is fenced off from now on:
        ``_board_fence``) and, resumed, the widths of the steps kept (``stored_widths``;
        else ``[]``), or ``(error class name, message)``. Atomic."""
        names = self._names()
        # A step commits whole, for every rank at once: stored steps went to their ranks.
        whole = lambda step, rank: len(self.committed[step])  # noqa: E731
        try:
            step = start_step(self.where, names, on_existing, first, whole)
            if on_existing == "resume" and first is None and self.end is not None:
                step = max(step, self.end)  # a stream finished past its last step
        except RlwireError as exc:
            return (type(exc).__name__, exc.message)
        self._keep_end(on_existing == "resume")  # until its first commit (_board_end)
        for batch in names_to_delete(names, on_existing, first):
            self._delete([name for name in batch if not (self.end_kept and name == END_NAME)])
        # What killed producers staged from the first step to send on can never commit
        # (the sender stages those steps anew): its objects go now. A producer still
        # alive (two on one destination) is told why at its next stage or commit.
        self._drop_staged(lambda s: s >= step, lambda s: taken_over(s, on_existing))
        epoch = self._open_epoch(on_existing)
        await self._notify()
        widths = stored_widths(names, step, self._sealed_for) if on_existing == "resume" else []
        return ("ok", step, epoch, widths)

    async def stage(
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
        """Hold rank ``rank``'s objects of ``step``, not visible yet, under ``key``: a
        main object, and a sidecar object when ``has_side``. With ``producer`` (an actor
        handle) they are pulled from it under the key ``f"{key}.{rank}"`` (the board
        owns them), waiting up to ``timeout`` seconds; else ``refs`` are the objects the
        producer put (it owns them). ``("ok",)``; ``("exists",)`` when the step is
        committed already, ``("open",)`` when it is being filled part by part,
        ``("unpulled", timeout)`` when the producer did not hand them over in time,
        ``("dropped", why, step)`` when the board let go of what was staged under
        ``key`` (another sender opened the destination meanwhile: ``_board_staged``),
        ``("fenced", why)`` when the sender, opened at ``epoch``, is fenced off."""
        what = f"store step {step} rank {rank}"
        refused = self._refused(key, epoch, what)
        if refused is not None:
            return refused
        if step in self.committed or step in self.seals:
            return ("exists",)
        if step in self.parts:
            return ("open",)
        return await self._hold(step, key, rank, producer, has_side, refs, timeout, (epoch, what))

    async def commit(
        self,
        key: str,
        ranks: int,
        checksums: list[bytes | None] | None = None,
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Make the step staged under ``key`` visible, all ``ranks`` ranks at once, with
        each rank's ``checksums`` when they are not in its envelope (packed u64, kept
        and given to readers with the references): ``("ok",)``, ``("exists",)`` if
        another sender committed it first, ``("dropped", why, step)`` if the board let
        go of it (another sender opened the destination meanwhile), ``("fenced", why)``
        if the sender, opened at ``epoch``, is fenced off (what it staged goes),
        ``("missing",)`` if not every rank is staged under ``key``."""
        entry = self.staged.pop(key, None)
        if entry is None:
            return self._unstaged(key)
        step, staged = entry
        fenced = self._fenced(epoch, f"commit step {step}")
        if fenced is not None:
            return fenced
        if step in self.committed or step in self.seals:
            return ("exists",)
        if step in self.parts:
            return ("open",)
        if sorted(staged) != list(range(ranks)):
            return ("missing",)
        self._reopen_end()
        self.committed[step] = [staged[rank] for rank in range(ranks)]
        self.tokens[step] = key  # which commit this step is: a StepHandle names it
        if checksums is not None:
            self.checksums[step] = list(checksums)
        # What else is staged for this step can never commit: a producer that died
        # between staging and committing it left it (its restart just committed it).
        self._free_staged(step)
        await self._notify()
        return ("ok",)

    def _checksums_of(self, step: int, rank: int) -> bytes | None:
        """Rank ``rank``'s checksums of the whole ``step``, if committed with them."""
        sums = self.checksums.get(step)
        return sums[rank] if sums is not None and rank < len(sums) else None

    def _state(self, step: int, rank: int) -> tuple[Any, ...]:
        ranks = self.committed.get(step)
        if ranks is not None and rank < len(ranks):
            token = self.tokens.get(step)
            return ("step", [*ranks[rank], self._checksums_of(step, rank)], token)
        # Committed for fewer ranks: a commit is whole here, so the rank left out is told
        # at once, not when the next step comes (a rollout later).
        if ranks is not None:
            return ("fewer", len(ranks))
        if self.end is not None and step >= self.end:
            return ("end", self.end)
        stored = self._stored()
        if stored and min(stored) > step:
            return ("gone", min(stored))
        return ("none",)

    async def read(self, step: int, rank: int) -> tuple[Any, ...]:
        """Rank ``rank``'s objects of ``step``: ``("step", [main, sidecar, checksums],
        token)`` (``checksums`` ``None`` when they are in the envelope; ``token`` names
        the commit, as a :class:`~rlwire.transport.ray.StepHandle` does); else
        ``("fewer", ranks)`` when it was committed for ``ranks`` ranks, not ``rank``;
        ``("end", end)`` past the end of the stream, ``("gone", oldest)`` when it was
        deleted (a later step is kept, none at or before it), or ``("none",)``."""
        return self._state(step, rank)

    async def wait(
        self, step: int, rank: int, timeout: float, index: int | None = None
    ) -> tuple[Any, ...]:
        """Wait up to ``timeout`` seconds until :meth:`read` of ``step`` would answer
        something other than ``("none",)``, the step is sealed, or (``index`` given)
        rank ``rank``'s part ``index`` of it is committed. ``("none",)`` if none of them
        happened; the answer of :meth:`read_part` when the part is there, or of
        :meth:`read` when the step is (either saves the receiver a call); else
        ``("ready",)``."""

        def ready() -> bool:
            return (
                self._state(step, rank)[0] != "none"
                or step in self.seals
                or (index is not None and len(self._parts_of(step, rank)) > index)
            )

        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout)
            except TimeoutError:
                return ("none",)
        if index is not None and len(self._parts_of(step, rank)) > index:
            return await self.read_part(step, rank, index)
        state = self._state(step, rank)
        return state if state[0] == "step" else ("ready",)

    async def mark(self, rank: int, next_step: int) -> None:
        """Record that rank ``rank`` moved past every step before ``next_step``.

        Raises:
            ValueError: not a rank and a step (another client's call: nothing else is
                stored where receivers and senders read marks).
        """
        counts(rank, next_step)
        self.consumed[rank] = next_step

    async def mark_part(self, rank: int, step: int, next_part: int, of: bytes = b"") -> None:
        """Record that rank ``rank`` moved past parts ``0`` to ``next_part - 1`` of
        ``step``, of the run ``of`` (its part mark, beside a consumption mark of ``step``).

        Raises:
            ValueError: not a rank, a step and a part (and bytes), as :meth:`mark`.
        """
        counts(rank, step, next_part)
        if not isinstance(of, bytes):
            raise ValueError(f"a part mark's run is bytes, not {type(of).__name__}")
        self.consumed_parts[rank] = (step, next_part, of)

    async def part_of(self, rank: int, step: int) -> bytes:
        """The run rank ``rank``'s part mark records, if it is of ``step``; else b""."""
        marked, _, of = self.consumed_parts.get(rank, (step, 0, b""))
        return of if marked == step else b""

    async def consumption(
        self, ranks: int, epoch: int | None = None
    ) -> list[int | None] | tuple[Any, ...]:
        """Each rank's consumption mark, ``None`` where it recorded none; ``("fenced",
        why)`` when the sender, opened at ``epoch``, is fenced off (its ``max_ahead``
        would wait on another run's receivers)."""
        fenced = self._fenced(epoch, "read the consumption marks")
        return self._marks(ranks) if fenced is None else fenced

    def _marks(self, ranks: int, _sent: int = 0) -> list[int | None]:
        """The consumption marks of ranks ``0..ranks-1`` (``None``: none recorded)."""
        return [self.consumed.get(rank) for rank in range(ranks)]

    def _sealed_for(self, step: int) -> int:  # the ranks the seal of ``step`` counts
        return len(self.seals[step][0])

    async def position(self, rank: int) -> tuple[int, int] | None:
        """Rank ``rank``'s consumption mark and, when its part mark is of that step, its
        part (else 0); ``None`` without a consumption mark."""
        step = self.consumed.get(rank)
        if step is None:
            return None
        marked, part, _ = self.consumed_parts.get(rank, (step, 0, b""))
        return (step, part if marked == step else 0)

    async def prune(self, below: int, epoch: int | None = None) -> tuple[Any, ...] | None:
        """Delete every step before ``below``: its references go, and with them the
        memory once no reader holds a view of it. A step some rank of it (with objects
        of it, or counted by its seal) has not moved past is kept, as every stored sink
        keeps it. ``None``; ``("fenced", why)``, deleting nothing, when the sender,
        opened at ``epoch``, is fenced off."""
        fenced = self._fenced(epoch, f"delete the steps before step {below}")
        if fenced is not None:
            return fenced
        below = held_back(self._names(), below, self._marks, self._sealed_for)
        for step in [s for s in self._stored() if s < below]:
            self._drop_step(step)
        self._drop_staged(lambda s: s < below, deleted)
        await self._notify()
        return None

    async def steps(self) -> list[int]:
        """The steps holding anything committed (whole, parts or a seal), ascending."""
        return sorted(self._stored())


# The actor class, made once: ray.remote wraps the plain class (kept plain for reading
# and for tests of its logic). No CPU: it only keeps references and answers calls.
BoardActor = ray.remote(num_cpus=0)(Board)
