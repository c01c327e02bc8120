"""StoredSource: the reading side shared by stores that keep each step's messages as
named files (or objects) in rlwire's layout."""

from __future__ import annotations

import abc
import errno
import time
import warnings
from collections.abc import Callable

from rlwire._core.errors import (
    CorruptFrameError,
    EndOfStream,
    MarkSkippedWarning,
    RlwireError,
    StepGapError,
    TransportError,
    UnsupportedVersionError,
)
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._parts import Key, PartInfo, Seal
from rlwire.transport._stored.appended import StoredFieldsSource
from rlwire.transport._stored.gaps import never_coming
from rlwire.transport._stored.layout import parse_main
from rlwire.transport._stored.marks import (
    CONSUMED_MAGIC,
    END_MAGIC,
    MARK_BYTES,
    MAX_MARK_BYTES,
    consumed_mark,
    parse_mark,
    parse_part_mark,
    part_mark,
    too_long,
)
from rlwire.transport._stored.names import (
    END_NAME,
    MAIN_RE,
    SEAL_RE,
    consumed_name,
    consumed_part_name,
    main_name,
    part_name,
    part_sidecar_name,
    seal_name,
    sidecar_name,
)
from rlwire.transport._stored.parts import MAX_SEAL_FILE_BYTES, parse_part, parse_seal
from rlwire.transport._stored.selected import Ranged, WholeFile, parse_selected, read_envelope

__all__ = ["StoredSource"]

#: Why a consumption mark may not be written while the steps stay readable: a read-only
#: directory or filesystem, no permission, a full disk or quota.
_CANNOT_MARK = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
#: Seconds between two looks, while a step is missing, for whether it was deleted.
_GONE_CHECK_SECONDS = 1.0


class StoredSource(StoredFieldsSource, Source):
    """Reads step ``s`` of ``rank`` from the files named ``main_name(s, rank)`` and,
    when the message has one, ``sidecar_name(s, rank)``, as views over what
    :meth:`load` returns.

    Subclasses set ``rank`` and ``verify`` and provide :meth:`load`,
    :meth:`save` and :meth:`locate`; and :meth:`listed` (or at least
    :meth:`stored_steps`), without which a receiver at a step ``keep_last`` deleted,
    or of a rank a step will never have, waits for it instead of raising
    :class:`~rlwire.StepGapError` (:meth:`check_gone`; the contract's retention test
    checks it).
    """

    rank: int
    verify: bool
    stores_parts = True
    _mark_warned: bool = False
    _gone_checked: tuple[int, float] | None = None  # (step, when)

    @abc.abstractmethod
    def load(self, name: str) -> memoryview | None:
        """The whole file called ``name``, or ``None`` if it does not exist (yet).

        Raises:
            CorruptFrameError: the file exists but cannot be a message (e.g. empty).
            TransportError: the file cannot be read.
        """

    def load_sidecar(self, name: str, size: int) -> memoryview | None:
        """The whole sidecar ``name``, which its main file's envelope says is ``size``
        bytes, as :meth:`load` reads it; stores that learn a file's size before they
        read it all (S3) refuse one of another size unread (``CorruptFrameError``)."""
        return self.load(name)

    def load_mark(self, name: str, limit: int, what: str) -> memoryview | bytes | None:
        """The file called ``name``, a ``what`` (a mark, a seal) of at most ``limit``
        bytes, or ``None`` if it does not exist. By default :meth:`load`, then its size
        checked; stores that can tell a file's size first (files, fsspec) read no more
        than ``limit`` bytes of it.

        Raises:
            CorruptFrameError: it is longer than ``limit`` (named, with its size).
            TransportError: it cannot be read.
        """
        data = self.load(name)
        if data is not None and len(data) > limit:
            raise too_long(what, len(data), limit, self.locate(name))
        return data

    @abc.abstractmethod
    def save(self, name: str, data: bytes) -> None:
        """Write the small file ``name`` so that it appears whole, replacing any.

        Raises:
            TransportError: the file cannot be written.
        """

    def mark_consumed(self, next_step: int) -> None:
        """Write the consumption mark; where the store cannot take it (read-only, full:
        :data:`_CANNOT_MARK`) skip it with one :class:`MarkSkippedWarning` and set
        :attr:`mark_skipped` (the receiver asks again before its next read): stored
        steps stay readable."""
        self._save_mark(consumed_name(self.rank), consumed_mark(next_step))

    def mark_part(self, step: int, next_part: int, of: bytes = b"") -> None:
        """Write the part mark, beside the consumption mark (a file of its own: the
        consumption mark stays the 16 bytes senders before parts read); skipped as
        :meth:`mark_consumed` is where the store cannot take it."""
        self._save_mark(consumed_part_name(self.rank), part_mark(step, next_part, of))

    def _save_mark(self, name: str, data: bytes) -> None:
        self.mark_skipped = False
        try:
            self.save(name, data)
        except TransportError as exc:
            if exc.errno not in _CANNOT_MARK:
                raise
            self.mark_skipped = True
            if not self._mark_warned:
                self._mark_warned = True
                warnings.warn(
                    f"{exc}; this receiver goes on without recording what it consumed, so "
                    "a sender's keep_last and max_ahead do not see it move on",
                    MarkSkippedWarning,
                    stacklevel=3,
                )

    def read_consumption(self) -> tuple[int, int] | None:
        """The consumption mark's step, and the part mark's part when it is of that
        step (a part mark of another step is one left behind: 0)."""
        name = consumed_name(self.rank)
        data = self.load_mark(name, MARK_BYTES, "consumption mark")
        if data is None:
            return None
        step = parse_mark(data, CONSUMED_MAGIC, self.locate(name))
        marked, part, _ = self._part_mark() or (step, 0, b"")
        return step, part if marked == step else 0

    def read_part_of(self, step: int) -> bytes:
        marked, _, of = self._part_mark() or (step, 0, b"")
        return of if marked == step else b""

    def _part_mark(self) -> tuple[int, int, bytes] | None:
        """What the rank's part mark records, or None if it has none."""
        data = self.load_mark(consumed_part_name(self.rank), MAX_MARK_BYTES, "part mark")
        if data is None:
            return None
        return parse_part_mark(data, self.locate(consumed_part_name(self.rank)))

    def listed(self) -> list[str] | None:
        """The names of every file in the destination, or None if the store cannot
        list them. Raises what :meth:`load` raises."""
        return None

    def stored_steps(self) -> list[int] | None:
        """The steps whose main file for this rank is stored, and the sealed steps, or
        None if the store cannot list them. Raises what :meth:`load` raises."""
        names = self.listed()
        return None if names is None else self.steps_among(names)

    def check_gone(self, step: int, end: int | None = None) -> None:
        """Raise :class:`~rlwire.StepGapError` if this rank's message of ``step`` is
        missing for good: a later step is stored, or the end mark (``end``, read before)
        is after ``step``, and ``step`` has no message for the rank (retention deleted
        it, or its commit was cut short: :func:`~rlwire.transport._stored.gaps.never_coming`).
        Looks on the first miss of ``step``, then at most every second."""
        now = time.monotonic()
        if self._gone_checked is not None:
            last_step, when = self._gone_checked
            if last_step == step and now - when < _GONE_CHECK_SECONDS:
                return
        self._gone_checked = (step, now)
        names = self.listed()
        if names is not None:
            why = never_coming(names, step, self.rank, end, lambda: self._sent_to(step))
        else:  # a store that lists only its steps (a plugin's stored_steps)
            steps = self.stored_steps()
            why = None
            if steps and min(steps) > step:
                why = never_coming([main_name(min(steps), self.rank)], step, self.rank, None)
        if why is not None:
            raise StepGapError(why, where=self.describe(step))

    def _sent_to(self, step: int) -> int | None:
        """How many ranks the envelope of rank 0's main file of ``step`` records (None:
        gone, written before 1.8, or damaged: rank 0's receiver is told of that)."""
        name = main_name(step, 0)
        try:
            head = self.open_head(name)
            if head is None:
                return None
            _, env, _ = read_envelope(head, self.locate(name), step=step, rank=0, part=None)
        except (CorruptFrameError, UnsupportedVersionError):
            return None
        return env.ranks

    @abc.abstractmethod
    def locate(self, name: str) -> str:
        """Where the file called ``name`` lives (a path or URL), for error messages."""

    def steps_among(self, names: list[str]) -> list[int]:
        """The steps of this rank's main files among ``names``, and the sealed steps."""
        out = []
        for name in names:
            m = MAIN_RE.fullmatch(name)
            if (m and int(m.group(2)) == self.rank) or (m := SEAL_RE.fullmatch(name)):
                out.append(int(m.group(1)))
        return out

    def check_end(self, step: int) -> int | None:
        """Raise :class:`~rlwire.EndOfStream` if the sender finished before ``step``;
        else the step the end mark gives (after ``step``), or None if there is none.
        Called only when ``step`` is missing: the mark is written after the last step."""
        mark = self.load_mark(END_NAME, MARK_BYTES, "end mark")
        if mark is None:
            return None
        where = self.locate(END_NAME)
        end = parse_mark(mark, END_MAGIC, where)
        if step >= end:
            raise EndOfStream.at(end, where=where)
        return end

    def describe(self, step: int) -> str:
        return self.locate(main_name(step, self.rank))

    def describe_part(self, step: int, index: int) -> str:
        return self.locate(part_name(step, self.rank, index))

    def open_ranged(self, name: str) -> Ranged | None:
        """The file called ``name``, to read by ranges (:meth:`select`'s partial reads),
        or ``None`` if it does not exist (yet). By default, :meth:`load`: the whole
        file; stores that can read a range alone override it.

        Raises:
            CorruptFrameError, TransportError: as :meth:`load`.
        """
        data = self.load(name)
        return None if data is None else WholeFile(data)

    def open_ranged_sidecar(self, name: str, size: int) -> Ranged | None:
        """The sidecar ``name``, ``size`` bytes by its main file's envelope, to read by
        ranges: :meth:`open_ranged`; stores that read it whole refuse one of another
        size unread (``CorruptFrameError``), as :meth:`load_sidecar` does."""
        return self.open_ranged(name)

    def open_head(self, name: str) -> Ranged | None:
        """The file called ``name``, to read its head only (a message's envelope), or
        ``None`` if it does not exist: :meth:`open_ranged` by default; stores that can
        read a range alone read no more than that, even where ``open_ranged`` reads the
        whole file.

        Raises:
            CorruptFrameError, TransportError: as :meth:`load`.
        """
        return self.open_ranged(name)

    def _read_selected(
        self, name: str, side: str, step: int, part: int | None
    ) -> tuple[PartInfo | None, Frame] | None:
        """A partial read of the message ``name`` (:mod:`rlwire._frame.selection`)."""
        assert self.select is not None
        ranged = self.open_ranged(name)
        if ranged is None:
            return None
        try:
            _, info, frame = parse_selected(
                ranged,
                self._sidecar_opener(side),
                step=step,
                rank=self.rank,
                part=part,
                select=self.select,
                where=self.locate(name),
                verify=self.verify,
            )
        except RlwireError as exc:  # a field the step lacks, found by the selector
            exc.add_context(step=step, rank=self.rank)
            raise
        return info, frame

    def read(self, step: int) -> Frame | None:
        name = main_name(step, self.rank)
        if self.select is not None:
            got = self._read_selected(name, sidecar_name(step, self.rank), step, None)
            if got is not None:
                return got[1]
            data = None
        else:
            data = self.load(name)
        try:
            if data is not None:
                return parse_main(
                    data,
                    step=step,
                    rank=self.rank,
                    load_sidecar=self._sidecar_loader(sidecar_name(step, self.rank), name),
                    where=self.locate(name),
                    verify=self.verify,
                )
        except _Deleted:
            pass  # deleted as it was read: as if not found
        self.check_gone(step, self.check_end(step))
        return None

    def _sidecar_opener(self, side: str) -> Callable[[int], Ranged]:
        """What opens the sidecar ``side`` of a message read by ranges, when its reader
        needs it (CorruptFrameError: it is missing, and the main file refers to it)."""

        def open_sidecar(size: int) -> Ranged:
            got = self.open_ranged_sidecar(side, size)
            if got is None:
                raise CorruptFrameError(
                    "missing; the main file refers to it", where=self.locate(side)
                )
            return got

        return open_sidecar

    def _sidecar_loader(self, side: str, main: str | None = None) -> Callable[[int], memoryview]:
        def load_sidecar(size: int) -> memoryview:
            view = self.load_sidecar(side, size)
            if view is None:
                if main is not None and self.open_head(main) is None:
                    # The main file went too, after it was opened: the message was
                    # deleted as it was read (keep_last, a trainer restarted at a step
                    # a prune had just let go), not stored without its sidecar.
                    raise _Deleted
                raise CorruptFrameError(
                    "missing; the main file refers to it", where=self.locate(side)
                )
            return view

        return load_sidecar

    def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
        name = part_name(step, self.rank, index)
        if self.select is not None:
            side = part_sidecar_name(step, self.rank, index)
            got = self._read_selected(name, side, step, index)
            return None if got is None else (got[0], got[1])  # type: ignore[return-value]
        data = self.load(name)
        if data is None:
            return None
        try:
            return parse_part(
                data,
                step=step,
                rank=self.rank,
                index=index,
                load_sidecar=self._sidecar_loader(part_sidecar_name(step, self.rank, index), name),
                where=self.locate(name),
                verify=self.verify,
            )
        except _Deleted:
            return None  # deleted as it was read: as if not found

    def read_seal(self, step: int) -> Seal | None:
        name = seal_name(step)
        data = self.load_mark(name, MAX_SEAL_FILE_BYTES, "seal")
        if data is None:
            return None
        return parse_seal(data, step=step, where=self.locate(name))

    def first_part(self, step: int) -> bytes | None:
        return self._id_of(step, self.rank, 0) or b""

    def part_key(self, step: int, index: int) -> Key | None:
        name = part_name(step, self.rank, index)
        head = self.open_head(name)  # the envelope only, not the part
        if head is None:
            return None
        where = self.locate(name)
        info = read_envelope(head, where, step=step, rank=self.rank, part=index)[2]
        return None if info is None else info.key


class _Deleted(Exception):
    """A message's main file and sidecar were deleted as it was read (after the main
    file was opened, before the sidecar was): the read finds nothing."""
