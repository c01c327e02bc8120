"""The board's half for steps filled part by part (:class:`PartsBoard`, a base of
:class:`~rlwire.transport.ray._board.Board`): per step and rank, the parts in commit
order (each part's objects, key and cost), and the seal that closes the step.

A part is staged under a fresh key as a whole step's rank is, then committed on its own:
:meth:`PartsBoard.commit_part` checks, with nothing else running meanwhile, that the
step is still open, that the part takes the rank's next index and that its key is new
in the step, then appends it and wakes every waiting receiver. The seal is recorded
only if it lists exactly the parts committed. Answers are plain values, as the board's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ray import ObjectRef

from rlwire.transport.ray._board_end import EndingBoard
from rlwire.transport.ray._board_staged import Refs, StagingBoard, counts, resumed

__all__ = ["PartKey", "PartsBoard"]

#: A part's key, as the producer gave it (plain: what the board answers is plain).
PartKey = str | int


@dataclass(frozen=True)
class _Part:
    """A committed part: its objects, key and cost."""

    refs: Refs
    key: PartKey
    cost: float


def _same_key(a: PartKey, b: PartKey) -> bool:
    return type(a) is type(b) and a == b  # 1 and "1" are different keys


#: How many differing parts a seal's ``("differs", why)`` names (it counts the rest).
SHOWN = 3
#: How many characters of a key's repr it shows: a key may be 1024 characters long.
KEY_TEXT = 60


def _key_text(keys: list[PartKey], index: int) -> str:
    """The key at ``index`` of ``keys`` as a message shows it: its repr, cut at
    :data:`KEY_TEXT` characters; "missing" past the end of ``keys``."""
    if index >= len(keys):
        return "missing"
    text = repr(keys[index])
    return text if len(text) <= KEY_TEXT else text[: KEY_TEXT - 3] + "..."


def _differs(rank: int, step: int, have: list[PartKey], listed: list[PartKey]) -> str:
    """Why a seal listing ``listed`` for rank ``rank`` of ``step`` does not match its
    committed parts' keys ``have``: the counts, how many parts differ and the first
    :data:`SHOWN` of them, in a message bounded whatever the number of parts."""
    differ = [
        i
        for i in range(max(len(have), len(listed)))
        if i >= len(have) or i >= len(listed) or not _same_key(have[i], listed[i])
    ]
    named = "; ".join(
        f"part {i} is {_key_text(have, i)} on the board, {_key_text(listed, i)} in the seal"
        for i in differ[:SHOWN]
    )
    more = f"; {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
    return (
        f"rank {rank} of step {step} has {len(have)} parts committed, the seal lists "
        f"{len(listed)}: {len(differ)} parts differ ({named}{more})"
    )


class PartsBoard(StagingBoard, EndingBoard):
    """The parts and seals of a board; :class:`~rlwire.transport.ray._board.Board`
    holds the rest of the state and the helpers declared here."""

    committed: dict[int, list[Refs]]
    #: step -> rank -> its parts in commit order
    parts: dict[int, dict[int, list[_Part]]]
    #: step -> (each rank's keys, each rank's costs)
    seals: dict[int, tuple[list[list[PartKey]], list[list[float]]]]
    #: step -> the token of its commit (a whole step's) or of its seal, which a
    #: StepHandle names: the same step number after an overwrite is another commit
    tokens: dict[int, str]
    #: step -> the run of its parts, named when its first part is committed: a part
    #: of the step sent again (an overwrite) is of another run, sealed or not yet
    runs: dict[int, str]

    async def _notify(self) -> None:
        raise NotImplementedError

    def _parts_of(self, step: int, rank: int) -> list[_Part]:
        return self.parts.get(step, {}).get(rank, [])

    def _closed(self, step: int) -> str | None:
        """Why no part can be added to ``step``, if none can."""
        if step in self.committed:
            return f"step {step} was sent whole"
        if step in self.seals:
            return f"step {step} is sealed already"
        return None

    async def stage_part(  # noqa: PLR0913 (a remote call's arguments, each a plain value)
        self,
        step: int,
        key: str,
        rank: int,
        index: int,
        producer: Any,
        has_side: bool,
        refs: list[ObjectRef[Any]] | None,
        timeout: float,
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Hold the objects of part ``index`` of rank ``rank`` of ``step``, not visible
        yet, under ``key``, as :meth:`~rlwire.transport.ray._board.Board.stage` holds a
        rank's. ``("ok",)``, ``("exists", why)`` when the step is closed or the part
        exists, ``("fenced", why)`` when the sender, opened at ``epoch``, is fenced off
        (``_board_fence``)."""
        what = f"store part {index} of rank {rank} of step {step}"
        refused = self._refused(key, epoch, what)
        if refused is not None:
            return refused
        why = self._closed(step)
        if why is None and len(self._parts_of(step, rank)) > index:
            why = f"part {index} of rank {rank} of step {step} already exists"
        if why is not None:
            return ("exists", why)
        return await self._hold(step, key, rank, producer, has_side, refs, timeout, (epoch, what))

    async def commit_part(
        self,
        key: str,
        rank: int,
        index: int,
        part_key: PartKey,
        cost: float,
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Make the part staged under ``key`` visible as part ``index`` of rank ``rank``
        with the producer's key ``part_key``, and wake the receivers: ``("ok",)``,
        ``("missing",)`` if nothing is staged under ``key``, ``("dropped", why, step)``
        if the board let go of it (another sender resumed the step, or opened the
        destination, meanwhile), ``("fenced", why)`` if the sender, opened at ``epoch``,
        is fenced off (what it staged goes), ``("exists", why)`` if the step is closed,
        the index is taken (another sender) or skips one, or the key is committed
        already."""
        entry = self.staged.pop(key, None)
        if entry is None:
            return self._unstaged(key)
        step, staged = entry
        fenced = self._fenced(epoch, f"commit part {index} of rank {rank} of step {step}")
        if fenced is not None:
            return fenced
        why = self._closed(step)
        have = self._parts_of(step, rank)
        if why is None and len(have) != index:
            why = f"part {index} of rank {rank} of step {step} " + (
                "already exists" if len(have) > index else f"would follow part {len(have) - 1}"
            )
        if why is None and any(
            _same_key(p.key, part_key) for ranks in self.parts.get(step, {}).values() for p in ranks
        ):
            why = f"key {part_key!r} is committed already in step {step}"
        if why is not None:
            return ("exists", why)
        if rank not in staged:
            return ("missing",)
        self._reopen_end()
        if step not in self.parts:
            self.runs[step] = uuid.uuid4().hex
        self.parts.setdefault(step, {}).setdefault(rank, []).append(
            _Part(staged[rank], part_key, cost)
        )
        await self._notify()
        return ("ok",)

    async def committed_parts(self, step: int, epoch: int | None = None) -> tuple[Any, ...]:
        """The parts of ``step`` committed so far, for a producer that resumes it:
        ``("ok", [(rank, index, key, cost), ...])``, ``("exists", why)`` when it is
        sealed or was sent whole, or ``("fenced", why)`` when the producer, opened at
        ``epoch``, is fenced off. What killed producers staged for it is dropped."""
        fenced = self._fenced(epoch, f"resume step {step} part by part")
        if fenced is not None:
            return fenced
        why = self._closed(step)
        if why is not None:
            return ("exists", why)
        # Staged by a killed producer, or by one still alive (told why at its commit).
        self._drop_staged(lambda s: s == step, resumed)
        return (
            "ok",
            [
                (rank, index, part.key, part.cost)
                for rank, parts in sorted(self.parts.get(step, {}).items())
                for index, part in enumerate(parts)
            ],
        )

    async def seal(
        self,
        step: int,
        keys: list[list[PartKey]],
        costs: list[list[float]],
        token: str = "",
        epoch: int | None = None,
    ) -> tuple[Any, ...]:
        """Close ``step``: record, for each rank, its parts' ``keys`` and ``costs``,
        which must be exactly the parts committed, and wake the receivers. ``("ok",)``,
        ``("exists", why)`` when it is sealed or was sent whole, ``("differs", why)``
        when the committed parts are not those listed (another sender's), ``("fenced",
        why)`` when the sender, opened at ``epoch``, is fenced off. ``token`` names the
        seal (kept in ``tokens``). ValueError: ``step`` is no step (as
        :meth:`~rlwire.transport.ray._board.Board.mark`)."""
        counts(step)
        fenced = self._fenced(epoch, f"seal step {step}")
        if fenced is not None:
            return fenced
        why = self._closed(step)
        if why is not None:
            return ("exists", why)
        ranks = self.parts.get(step, {})
        for rank in sorted(set(ranks) | set(range(len(keys)))):
            have = [p.key for p in ranks.get(rank, [])]
            listed = keys[rank] if rank < len(keys) else []
            if len(have) != len(listed) or not all(map(_same_key, have, listed)):
                return ("differs", _differs(rank, step, have, listed))
        self._reopen_end()
        self.seals[step] = (keys, costs)
        self.tokens[step] = token
        self._free_staged(step)  # nothing staged can commit any more
        await self._notify()
        return ("ok",)

    async def read_part(self, step: int, rank: int, index: int) -> tuple[Any, ...]:
        """Rank ``rank``'s part ``index`` of ``step``: ``("part", [main, sidecar], key,
        cost, token, run)`` (``token`` the seal's, ``None`` before the seal; ``run``
        the step's parts'), or ``("none",)`` while it is not committed."""
        parts = self._parts_of(step, rank)
        if index >= len(parts):
            return ("none",)
        part = parts[index]
        token = self.tokens.get(step)
        return ("part", list(part.refs), part.key, part.cost, token, self.runs.get(step))

    async def first_run(self, step: int, rank: int) -> tuple[Any, ...]:
        """Whether rank ``rank`` has a part 0 of ``step`` and which run it is of, as
        :meth:`read_part` of part 0 says, without its objects (a reader that only
        checks the run borrows no references): ``("part", token, run)``, or
        ``("none",)``."""
        if not self._parts_of(step, rank):
            return ("none",)
        return ("part", self.tokens.get(step), self.runs.get(step))

    async def read_seal(self, step: int) -> tuple[Any, ...]:
        """The seal of ``step``: ``("seal", keys, costs, token)``, or ``("none",)``."""
        if step not in self.seals:
            return ("none",)
        keys, costs = self.seals[step]
        return ("seal", keys, costs, self.tokens.get(step))
