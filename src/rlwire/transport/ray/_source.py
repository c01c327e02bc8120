"""RaySource: reads one rank's steps of a ``ray://NAME`` destination from the board."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from rlwire._core.errors import (
    CorruptFrameError,
    EndOfStream,
    StepGapError,
    TransportError,
)
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._options import SourceOptions, reject_unknown
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._stored.gaps import deleted, fewer
from rlwire.transport._url import URL
from rlwire.transport.ray import _actors
from rlwire.transport.ray._actors import (
    BoardHandle,
    board_id,
    call,
    ensure_ray,
    fetch,
    find_board,
    ray_errors,
)
from rlwire.transport.ray._answers import (
    checked_commit,
    checked_part,
    checked_refs,
    checked_seal,
    commit_id,
    missing_commit,
)
from rlwire.transport.ray._appended import RayFieldsSource
from rlwire.transport.ray._payload import parse_payload
from rlwire.transport.ray._url import OPTIONS, board_options, handle_options, parse_name
from rlwire.transport.ray._waiting import OneWait

__all__ = ["RaySource"]

#: The longest one wait on the board: a cancelled await leaves its thread waiting until
#: the board answers, within this (plus the board's time to answer); the next await waits
#: for that one rather than beside it (``_waiting``): one such thread per receiver.
_WAIT_SLICE = 0.5
#: How long a wait sleeps while the board does not exist yet (no sender opened).
_NO_BOARD_SLEEP = 0.05


class RaySource(RayFieldsSource, Source):
    """Reads rank ``rank``'s steps of ``ray://NAME``: asks the board for a step's
    objects and maps them (zero-copy on the same node; Ray fetches them from another
    node), verifying checksums. Waiting is the board's: a receiver waits on it, never
    polls. Until a sender has created the board, it looks for it every 50 ms. The board
    has :data:`~rlwire.transport.ray._actors.BOARD_ANSWER_SECONDS` to answer each call,
    beyond the time it waits.

    A receiver reads one board: the first it finds under the name (or the one a
    :class:`~rlwire.transport.ray.StepHandle` names). If that board dies, every step it
    held dies with it, and the receiver's next call raises a ``TransportError``, also
    when a sender has made a new board under the name meanwhile: that board's steps are
    another run's, which a new receiver reads.

    Storage options: ``namespace`` (the board's Ray namespace, as the sender's);
    ``board`` (the id of the board to read, as a ``StepHandle`` gives it: another board
    under the name is an error); ``commit`` (a ``StepHandle``'s step and the token of
    its commit: another commit of that step, after an overwrite, is an error).

    Raises:
        ConfigError: a malformed URL or option; Ray is not initialized.

    Example:
        >>> from rlwire.abc import SourceOptions
        >>> from rlwire.transport import parse_url
        >>> RaySource.from_url(parse_url("ray://rollouts"), SourceOptions(rank=1)).rank
        1
    """

    def __init__(
        self,
        name: str,
        *,
        rank: int = 0,
        namespace: str | None = None,
        verify: bool = True,
        writable: bool = False,
        board: str | None = None,
        commit: tuple[int, str] | None = None,
    ) -> None:
        self.name = name
        self.rank = rank
        self.namespace = namespace
        self.verify = verify
        self.writable = writable
        self._board: BoardHandle | None = None
        # The id of the board this receiver reads: the handle's, or the first it found.
        self._identity = board
        # The step a StepHandle names and the token of its commit: another is refused.
        self._commit = commit
        self._answered = False  # whether the board answered a call: it has started
        self._expected = 0  # the step the last read missed: what a wait waits for
        # The part the last read_part missed, (step, index): a wait waits for it too.
        self._expected_part: tuple[int, int] | None = None
        # The board's answer for that part, when a wait returned with it.
        self._ready_part: tuple[int, int, tuple[Any, ...]] | None = None
        # The board's answer for a whole step, when a wait returned with it.
        self._ready_step: tuple[int, tuple[Any, ...]] | None = None
        self._waits = OneWait()  # its async waits, one at a time
        self._closed = False

    def __repr__(self) -> str:
        return f"RaySource({self.where!r}, rank={self.rank})"

    @property
    def where(self) -> str:
        return f"ray://{self.name}"

    @classmethod
    def from_url(cls, url: URL, options: SourceOptions) -> RaySource:
        opts = options.storage_options
        reject_unknown(url, opts, (*OPTIONS, "board", "commit"))
        namespace, _ = board_options(url, opts)
        board, commit = handle_options(url, opts)
        return cls(
            parse_name(url),
            rank=options.rank,
            namespace=namespace,
            verify=options.verify,
            writable=options.writable,
            board=board,
            commit=commit,
        )

    def _find(self) -> BoardHandle | None:
        """The board, looked up if not known yet: ``None`` while no sender has made
        one (and this receiver has read from none).

        Raises:
            TransportError: the board this receiver read from (or its handle names) is
                gone, or another board holds the name.
        """
        if self._board is None:
            ensure_ray(self.where)
            board = find_board(self.name, self.namespace)
            if board is None:
                if self._identity is not None:
                    raise TransportError(
                        "the board this receiver reads is gone (killed, or its process "
                        "or node died), and every step it held with it",
                        where=self.where,
                    )
                return None
            identity = board_id(board)
            if self._identity is None:
                self._identity = identity
            elif identity != self._identity:
                raise TransportError(
                    "the board under this name is not the one this receiver reads: that "
                    "one died, and every step it held with it, and a sender made a new "
                    "one; open a new receiver to read the new board's steps",
                    where=self.where,
                )
            self._board = board
        return self._board

    def _call(self, method: str, *args: Any, where: str, action: str, waits: float = 0.0) -> Any:
        """Call the board's ``method``, which may take ``waits`` seconds (a wait) and
        :data:`~rlwire.transport.ray._actors.BOARD_ANSWER_SECONDS` more (the first call,
        :data:`~rlwire.transport.ray._actors.BOARD_START_SECONDS`); a board found
        dead, or silent that long, is looked up again next time (and must be the same
        board, :meth:`_find`).

        Raises:
            TransportError: the board is gone, or did not answer in time.
        """
        board = self._find()
        assert board is not None
        # A board that never answered yet may still be starting its process.
        answers = _actors.BOARD_ANSWER_SECONDS if self._answered else _actors.BOARD_START_SECONDS
        try:
            answer = call(
                getattr(board, method), *args, where=where, action=action, timeout=waits + answers
            )
        except TransportError:
            self._board = None
            raise
        self._answered = True
        return answer

    def describe(self, step: int) -> str:
        return f"{self.where}: step {step} rank {self.rank}"

    def read(self, step: int) -> Frame | None:
        board = self._find()
        if board is None:
            self._expected = step
            return None
        where = self.describe(step)
        ready, self._ready_step = self._ready_step, None
        if ready is not None and ready[0] == step:
            answer = ready[1]  # a committed step's objects: the wait's answer is still true
        else:
            answer = self._call("read", step, self.rank, where=where, action="ask the board")
        if answer[0] == "step":
            self._check_commit(step, answer[2], where)
            main_ref, side_ref, checksums = answer[1]
            return self._fetch(main_ref, side_ref, where, checksums, answer[2])
        self._expected = step
        if answer[0] == "end":
            raise EndOfStream.at(int(answer[1]), where=self.where)
        if answer[0] == "fewer":
            raise StepGapError(fewer(step, int(answer[1]), self.rank), where=where)
        if answer[0] == "gone":
            raise StepGapError(deleted(step, int(answer[1])), where=where)
        if answer[0] != "none":
            raise CorruptFrameError(f"the board answered {answer[0]!r}", where=where)
        return None

    stores_parts = True

    def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
        board = self._find()
        if board is None:
            self._expect_part(step, index)
            return None
        where = f"{self.describe(step)} part {index}"
        ready, self._ready_part = self._ready_part, None
        if ready is not None and ready[:2] == (step, index):
            answer = ready[2]  # committed parts stay: the wait's answer is still true
        else:
            answer = self._call(
                "read_part", step, self.rank, index, where=where, action="ask the board"
            )
        if answer[0] == "none":
            self._expect_part(step, index)
            return None
        if answer[0] != "part":
            raise CorruptFrameError(f"the board answered {answer[0]!r}", where=where)
        (main_ref, side_ref), key, cost = answer[1], answer[2], answer[3]
        self._check_commit(step, answer[4], where)
        # Every part of one run of the step (part 0 too) names that run, or (a board of
        # an rlwire before runs) the seal's commit: what part 0's is, it follows; and it
        # is the part's message id, known before the seal (what add_fields(of=) takes).
        run = _run(answer)
        info = replace(checked_part(self.rank, index, key, cost, where), of=commit_id(run))
        return info, self._fetch(main_ref, side_ref, where, commit=run)

    def _check_commit(self, step: int, token: object, where: str) -> None:
        checked_commit(self._commit, step, token, where)
        self._step_commit = (step, token)

    def first_part(self, step: int) -> bytes | None:
        where = f"{self.describe(step)} part 0"
        if self._find() is None:
            return b""
        answer = self._call("first_run", step, self.rank, where=where, action="ask the board")
        return commit_id(answer[2] or answer[1]) if answer[0] == "part" else b""

    def _expect_part(self, step: int, index: int) -> None:
        self._expected, self._expected_part = step, (step, index)

    def read_seal(self, step: int) -> Seal | None:
        if self._find() is None:
            return None
        where = self.describe(step)
        answer = self._call("read_seal", step, where=where, action="ask the board")
        if answer[0] == "none":
            return None
        if answer[0] != "seal":
            raise CorruptFrameError(f"the board answered {answer[0]!r}", where=where)
        self._check_commit(step, answer[3], where)
        return checked_seal(step, answer[1], answer[2], where)

    def _fetch(
        self,
        main_ref: Any,
        side_ref: Any,
        where: str,
        checksums: bytes | None = None,
        commit: object = None,
    ) -> Frame:
        """The frame stored as the objects ``main_ref`` and ``side_ref`` (or ``None``),
        verified against ``checksums`` when the board gave them (else its envelope's),
        its :attr:`~rlwire.Frame.message_id` that of the step's ``commit``."""
        main_ref, side_ref, checksums = checked_refs(main_ref, side_ref, checksums, where)
        with ray_errors(where, "get the step's objects"):
            values = fetch([main_ref] if side_ref is None else [main_ref, side_ref])
        return parse_payload(
            values[0],
            values[1] if side_ref is not None else None,
            verify=self.verify,
            writable=self.writable,
            where=where,
            checksums=checksums,
            message_id=commit_id(commit),
        )

    def mark_consumed(self, next_step: int) -> None:
        if self._find() is not None:
            self._call("mark", self.rank, next_step, where=self.where, action="record consumption")

    def mark_part(self, step: int, next_part: int, of: bytes = b"") -> None:
        if self._find() is not None:
            self._call(
                "mark_part",
                self.rank,
                step,
                next_part,
                of,
                where=self.where,
                action="record consumption",
            )

    def read_part_of(self, step: int) -> bytes:
        if self._find() is None:
            return b""
        of = self._call("part_of", self.rank, step, where=self.where, action="read the marks")
        return of if isinstance(of, bytes) else b""

    def read_consumption(self) -> tuple[int, int] | None:
        if self._find() is None:
            return None  # no sender opened the destination yet: nothing was consumed
        answer = self._call("position", self.rank, where=self.where, action="read the marks")
        if answer is None:
            return None
        step, part = answer
        return int(step), int(part)

    def wait(self, timeout: float | None) -> None:
        self._keep(self._wait(timeout))

    def _wait(self, timeout: float | None) -> tuple[int, int | None, tuple[Any, ...]] | None:
        """Wait on the board (:meth:`wait`); ``(step, index, answer)`` when it answered
        with the objects the next read asks for, which :meth:`_keep` keeps for it."""
        limit = _WAIT_SLICE if timeout is None else max(0.0, min(timeout, _WAIT_SLICE))
        if self._find() is None:
            time.sleep(min(limit, _NO_BOARD_SLEEP))
            return None
        if self._wait_fields(limit):  # a step there, a field asked for not appended yet
            return None
        step, part = self._expected, self._expected_part
        missing_commit(self._commit, step, self.describe(step))
        index = part[1] if part is not None and part[0] == step else None
        answer = self._call(
            "wait",
            step,
            self.rank,
            limit,
            index,
            where=self.where,
            action="wait on the board",
            waits=limit,
        )
        return (step, index, answer)

    def _keep(self, waited: tuple[int, int | None, tuple[Any, ...]] | None) -> None:
        """Keep a wait's answer for the read that follows it (it saves that read a call);
        none after :meth:`close` (a wait under way then ends later)."""
        if waited is not None and not self._closed:
            step, index, answer = waited
            if index is not None and answer[0] == "part":
                self._ready_part = (step, index, answer)
            elif answer[0] == "step":
                self._ready_step = (step, answer)

    async def await_message(self, timeout: float | None) -> None:
        # Ray's references cannot be awaited under trio: a worker thread waits instead,
        # abandoned if cancelled (it returns within _WAIT_SLICE and the board's time to
        # answer), and the next await waits for it, starting no other (_waiting). An
        # abandoned wait's answer is not kept: the next read may come after the step
        # was deleted.
        answers = _actors.BOARD_ANSWER_SECONDS if self._answered else _actors.BOARD_START_SECONDS
        longest = _WAIT_SLICE + answers
        self._keep(await self._waits.run(lambda: self._wait(timeout), longest, timeout))

    def close(self) -> None:
        # A kept answer holds references to its step's objects: they stay in the object
        # store while a reference lives, deleted from the board or not.
        self._board = self._ready_step = self._ready_part = None
        self._closed = True


def _run(answer: tuple[Any, ...]) -> object:
    """The run of a step's parts a board's answer for a part names (its seal's commit,
    from a board that names no runs)."""
    return answer[5] if len(answer) > 5 and answer[5] else answer[4]
