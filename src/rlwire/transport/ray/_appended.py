"""Fields appended to committed steps on ``ray://NAME``: the
:class:`~rlwire.transport._appended.FieldsSink` of
:class:`~rlwire.transport.ray._sink.RaySink` (:class:`RayFieldsSink`) and the
:class:`~rlwire.transport._appended.FieldsSource` of
:class:`~rlwire.transport.ray._source.RaySource` (:class:`RayFieldsSource`).

A message of fields is stored as a rank's message of a step is (a main object and,
when it has one, a sidecar object, checksummed), handed to the board the same way (so
the board owns it when the sender runs in an async or threaded actor), and committed on
its own as the next one of its step and rank (:mod:`~rlwire.transport.ray._board_fields`).
A receiver waiting for a field asks the board to wake it when another message is
appended to the step (:meth:`RayFieldsSource.expect_fields`), instead of polling.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from rlwire._core.errors import ConfigError, CorruptFrameError, SchemaError, StepExistsError
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport._appended import FieldsSink, FieldsSource, step_replaced
from rlwire.transport._base import Staged
from rlwire.transport.ray._actors import (
    BoardHandle,
    call,
    ensure_ray,
    fetch,
    find_board,
    ray_errors,
)
from rlwire.transport.ray._answers import checked_refs, commit_id
from rlwire.transport.ray._payload import make_payload, parse_payload
from rlwire.transport.ray._staged import Fence, _Staged, check_fence

__all__ = ["RayFieldsSink", "RayFieldsSource", "RayStagedFields"]


class RayStagedFields(_Staged):
    """A message of fields ``names`` for rank ``rank`` of ``step``, staged under
    ``key``: committed, it is the next one appended to the step for the rank (the board
    numbers it, so stages appending at once all commit), if none of its fields was
    appended already and the step is still the commit ``token`` names (when given).
    ``fence`` is the epoch of the sender that opened the destination (none for a stage
    that only appends: it opened nothing, and may append beside the producer)."""

    def __init__(
        self,
        board: BoardHandle,
        where: str,
        key: str,
        step: int,
        rank: int,
        names: frozenset[str],
        token: str | None = None,
        fence: Fence = (),
    ) -> None:
        super().__init__(board, where, key, step, fence)
        self.rank, self.names, self.token = rank, names, token

    def commit(self) -> None:
        """Raises: SchemaError (a field of it appended meanwhile, by another stage),
        ConfigError (the step deleted, or sent again, meanwhile), and what
        :meth:`_commit` raises."""
        answer = self._commit(
            f"the fields appended to step {self.step} rank {self.rank}",
            self.board.commit_fields,
            self.key,
            self.rank,
            None,  # the next index, the board's to give
            self.token,
            sorted(self.names),
        )
        if answer[0] == "appended":
            raise SchemaError(f"add_fields: {answer[1]}", where=self.where)
        if answer[0] == "exists":  # a board that numbers no message (not this version's)
            raise StepExistsError(str(answer[1]), where=self.where)
        if answer[0] == "none":
            raise ConfigError(f"add_fields: {answer[1]}", where=self.where)

    def discard(self) -> None:
        self._discard(range(self.rank, self.rank + 1))


def _refs(answer: Any, what: str, where: str) -> list[tuple[Any, Any, bytes | None]]:
    """The ``[[main, sidecar], ...]`` of a board's answer (each with the checksums the
    board holds for it, ``[main, sidecar, checksums]``, where it gives them), checked."""
    if type(answer[1]) is not list or any(len(refs) not in (2, 3) for refs in answer[1]):
        raise CorruptFrameError(f"the board answered malformed {what}", where=where)
    return [(refs[0], refs[1], refs[2] if len(refs) == 3 else None) for refs in answer[1]]


class RayFieldsSink(FieldsSink):
    """Appended fields on ``ray://`` (a base of
    :class:`~rlwire.transport.ray._sink.RaySink`)."""

    appends_fields = True
    #: (step, rank, token) of the commit :meth:`read_committed` last read: the fields
    #: staged next for that step and rank are committed onto that commit only.
    _read_commit: tuple[int, int, str | None] | None = None

    if TYPE_CHECKING:  # RaySink's
        name: str
        namespace: str | None
        caller_blocks_loop: bool
        _board: BoardHandle | None
        _producer: BoardHandle | None
        _fence: Fence

        @property
        def where(self) -> str: ...
        def _storable(self, frame: Frame) -> Sliced[Frame]: ...
        def _checksums(self, frame: Frame) -> Sliced[bytes | None]: ...
        def _hand(
            self,
            method: Any,
            head: tuple[Any, ...],
            rank_key: str,
            main: list[memoryview],
            side: list[memoryview] | None,
            action: str,
        ) -> Any: ...
        @staticmethod
        def _pulling_actor() -> BoardHandle | None: ...

    def attach_fields(self) -> None:
        """Find the board (a sender must have made it), and whether this process runs
        an actor the board can pull objects from, as :meth:`open` does, opening
        nothing."""
        if self._board is not None:
            return
        ensure_ray(self.where)
        board = find_board(self.name, self.namespace)
        if board is None:
            raise ConfigError(
                "no sender has made this destination (its board does not exist): fields "
                "are appended to steps a sender committed",
                where=self.where,
            )
        self._board = board
        self._producer = None if self.caller_blocks_loop else self._pulling_actor()

    def _fields_board(self) -> BoardHandle:
        self.attach_fields()
        assert self._board is not None
        return self._board

    def _frames(
        self, refs: list[tuple[Any, Any, bytes | None]], where: str, commit: object = None
    ) -> list[Frame]:
        frames = []
        for entry in refs:
            main_ref, side_ref, checksums = checked_refs(*entry, where)
            with ray_errors(where, "get the step's objects"):
                values = fetch([main_ref] if side_ref is None else [main_ref, side_ref])
            frames.append(
                parse_payload(
                    values[0],
                    values[1] if side_ref is not None else None,
                    verify=True,
                    writable=False,
                    where=where,
                    checksums=checksums,
                    message_id=commit_id(commit),
                )
            )
        return frames

    def read_committed(
        self, step: int, rank: int, select: Selector, *, again: bool = False
    ) -> list[Frame] | None:
        del select  # a message of the object store is mapped whole, without a copy
        where = f"{self.where}: step {step} rank {rank}"
        answer = call(
            self._fields_board().committed_refs, step, rank, where=where, action="ask the board"
        )
        if answer[0] == "none":
            return None
        if answer[0] == "ranks":
            raise ConfigError(f"add_fields: {answer[1]}", where=self.where)
        if answer[0] != "step":
            raise CorruptFrameError(f"the board answered {answer[0]!r}", where=where)
        read = self._read_commit
        if again and read is not None and read[:2] == (step, rank) and read[2] != answer[2]:
            raise ConfigError(f"add_fields: {step_replaced(step, True)}", where=self.where)
        self._read_commit = (step, rank, answer[2])
        # The message id of a sealed step's parts is their run (a receiver's, before the seal)
        run = answer[3] if len(answer) > 3 and answer[3] else answer[2]
        return self._frames(_refs(answer, "a step's objects", where), where, run)

    def read_appended(self, step: int, rank: int) -> list[Frame]:
        where = f"{self.where}: fields appended to step {step} rank {rank}"
        answer = call(
            self._fields_board().read_fields, step, rank, where=where, action="ask the board"
        )
        return self._frames(_refs(answer, "appended fields", where), where)

    def stage_fields(
        self, step: int, rank: int, frame: Frame, *, names: frozenset[str] = frozenset()
    ) -> Sliced[Staged]:
        board = self._fields_board()
        key = uuid.uuid4().hex
        read = self._read_commit
        token = read[2] if read is not None and read[:2] == (step, rank) else None
        staged = RayStagedFields(
            board, self.where, key, step, rank, frozenset(names), token, self._fence
        )
        try:
            taken = yield from self._storable(frame)
            sums = yield from self._checksums(taken)
            main, side = make_payload(taken, sums)
            del taken
            answer = self._hand(
                board.stage_fields,
                (step, key, rank),
                f"{key}.{rank}",
                main,
                side,
                f"store the fields appended to step {step} rank {rank}",
            )
            del main, side
            if answer[0] == "none":
                raise ConfigError(f"add_fields: {answer[1]}", where=self.where)
            check_fence(answer, self.where)  # its sender opened, and another since
        except BaseException as exc:
            staged.failed(exc)
            staged.discard()
            raise
        return staged


class RayFieldsSource(FieldsSource):
    """Appended fields read from ``ray://`` (a base of
    :class:`~rlwire.transport.ray._source.RaySource`)."""

    appends_fields = True
    #: (step, count) a receiver waits beyond: what the next wait waits for.
    _fields_expected: tuple[int, int] | None = None
    #: (step, token) of the commit whose fields :meth:`read_appended` last returned,
    #: and of the commit the source's last read of a step (or part) answered
    _fields_commit: tuple[int, object] | None = None
    _step_commit: tuple[int, object] | None = None

    if TYPE_CHECKING:  # RaySource's
        rank: int

        @property
        def where(self) -> str: ...
        def _find(self) -> BoardHandle | None: ...
        def _call(
            self, method: str, *args: Any, where: str, action: str, waits: float = 0.0
        ) -> Any: ...
        def describe(self, step: int) -> str: ...
        def _fetch(
            self, main_ref: Any, side_ref: Any, where: str, checksums: bytes | None = None
        ) -> Frame: ...

    def read_appended(self, step: int) -> list[Frame]:
        self._fields_expected = None
        if self._find() is None:
            return []
        # Asked at every read of a step: a board that is gone fails here first, and the
        # error must not speak of fields the step may not have.
        answer = self._call(
            "read_fields", step, self.rank, where=self.describe(step), action="ask the board"
        )
        where = f"{self.where}: fields appended to step {step} rank {self.rank}"
        refs = _refs(answer, "fields", where)
        self._fields_commit = (step, answer[2]) if refs and len(answer) > 2 else None
        return [self._fetch(main, side, where, sums) for main, side, sums in refs]

    def appended_still_tied(self, step: int) -> bool:
        """Whether the step read since :meth:`read_appended` is the commit whose fields
        it returned (the board deletes a step's fields with it: one sent again between
        the two reads has none of them)."""
        tied = self._fields_commit
        return tied is None or tied[0] != step or self._step_commit == tied

    def expect_fields(self, step: int, count: int) -> None:
        self._fields_expected = (step, count)

    def _wait_fields(self, limit: float) -> bool:
        """Wait on the board (up to ``limit`` seconds) for the message of fields a
        receiver expects, if it expects one: whether it did."""
        expected, self._fields_expected = self._fields_expected, None
        if expected is None:
            return False
        step, count = expected
        self._call(
            "wait_fields",
            step,
            self.rank,
            count,
            limit,
            where=self.where,
            action="wait on the board",
            waits=limit,
        )
        return True
