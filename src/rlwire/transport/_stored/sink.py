"""StoredSink: the writing side shared by stores that keep each step's messages as named
files (objects, rows) in rlwire's layout; :class:`~rlwire.transport._stored.source.StoredSource`
is the reading side."""

from __future__ import annotations

import abc
import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rlwire._core.errors import StepExistsError
from rlwire._core.slicing import Sliced
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.frame import Frame
from rlwire.transport._base import OnExisting, PendingFrame, Sink, Staged, take_frame
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._stored import parts as stored_parts
from rlwire.transport._stored.appended import StoredFieldsSink
from rlwire.transport._stored.ended import EndedSink
from rlwire.transport._stored.fence import FENCE_NAME, Fence, fenced_commit
from rlwire.transport._stored.layout import plan
from rlwire.transport._stored.marks import MARK_BYTES, check_rewrite, ended_at, rewrite_mark
from rlwire.transport._stored.names import (
    END_NAME,
    LEFTOVER_RE,
    MAIN_RE,
    REWRITE_NAME,
    main_name,
    names_to_delete,
    part_name,
    part_sidecar_name,
    seal_name,
    sidecar_name,
)
from rlwire.transport._stored.names import start_step as _start_step  # open's parameter
from rlwire.transport._stored.parts import part_files, read_parts
from rlwire.transport._stored.resumed import ReadSentTo, ResumedSink, orphan_sidecars, stored_widths
from rlwire.transport._stored.retention import RetainedSink, prune_steps
from rlwire.transport._stored.translate import translate_errors

__all__ = ["StoredSink", "StoredStaging", "translate_errors"]


class StoredStaging(Staged):
    """A step being written where readers cannot see it yet, one file at a time: each
    rank's sidecar file (if it has one), then its main file.

    :meth:`commit` makes the files visible, sidecar files first and main files last
    (or all at once, for a store with transactions); :meth:`discard` removes
    everything staged. Every subclass's ``commit`` first checks :attr:`fence`.
    """

    #: What refuses the commit of a sender fenced off (``_stored.fence``); None: none.
    fence: Callable[[], None] | None = None
    #: A whole step's: how many ranks it is sent to, recorded in each message (1.8).
    ranks: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "commit" in cls.__dict__:
            setattr(cls, "commit", fenced_commit(cls.__dict__["commit"]))  # noqa: B010

    @abc.abstractmethod
    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        """Stage the file ``name`` whose bytes are ``chunks``, in order, where readers
        cannot see it. ``main``: a main file (made visible last), else a sidecar file. From
        the first slice on, :meth:`discard` removes whatever this call left behind.
        Backend errors pass through: the sink says what failed where."""

    def drain(self) -> Sliced[None]:
        """Wait for the writes :meth:`add` left in flight; raises the first one's error.
        Stores that write synchronously have nothing to wait for."""
        yield from ()


class StoredSink(StoredFieldsSink, ResumedSink, RetainedSink, EndedSink, Sink):
    """A sink that stores step ``s`` of rank ``r`` as the files ``main_name(s, r)`` and,
    when the message has one, ``sidecar_name(s, r)``, beside an end mark and the ranks'
    consumption marks, in the byte layout every built-in store shares.

    It implements :meth:`open` (``on_existing``, ``start_step``), :meth:`stage`,
    :meth:`finish`, :meth:`read_consumption` (:class:`RetainedSink`) and :meth:`prune`
    over a few primitives that a subclass provides: :meth:`names` lists the
    destination, :meth:`load` reads a small file, :meth:`save` writes one,
    :meth:`remove` deletes files, :meth:`staging` starts a step's
    :class:`StoredStaging`, and :meth:`locate` names a file in errors.
    Primitives raise what their backend raises; the sink turns it into a
    :class:`~rlwire.errors.TransportError` saying what failed where (:meth:`errors`).

    It :attr:`gathers`: the layout lays a :class:`~rlwire.abc.Pieces` buffer out as its
    runs, consecutive chunks of one file, so :meth:`StoredStaging.add` gets byte chunks
    only. A subclass that overrides :meth:`stage` or :meth:`write_message` does not
    gather unless it says so (sets ``gathers = True`` itself).

    Attributes:
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
    """

    checksum: bool = True
    gathers: ClassVar[bool] = True
    stores_parts: ClassVar[bool] = True
    #: The step :meth:`open` found filled part by part and not sealed (``"resume"``
    #: continues at it): a whole message for it is refused until it is sealed.
    unsealed_step: int | None = None

    @functools.cached_property
    def _first_parts(self) -> stored_parts.FirstParts:
        return stored_parts.FirstParts()

    @functools.cached_property
    def fence(self) -> Fence:
        """This sender's fence: written when it opens, checked before each commit."""
        return Fence(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Its own stage or write_message may read frame.buffers as memoryviews.
        overrides = "stage" in cls.__dict__ or "write_message" in cls.__dict__
        if overrides and "gathers" not in cls.__dict__:
            cls.gathers = False

    @property
    def stage_verb(self) -> str:
        """The verb naming what :meth:`stage` does, in error messages."""
        return "write"

    @abc.abstractmethod
    def names(self) -> list[str]:
        """The names of every file directly in the destination (none if it is missing)."""

    @abc.abstractmethod
    def load(self, name: str) -> bytes | bytearray | memoryview | None:
        """The whole small file ``name`` (a mark), or ``None`` if it does not exist."""

    @abc.abstractmethod
    def save(self, name: str, data: bytes) -> None:
        """Write the small file ``name`` so that it appears whole, replacing any; one
        :func:`~rlwire.transport._stored.names.never_replaced` (a seal) raises
        ``FileExistsError`` (or a ``StepExistsError``) where the store can refuse."""

    @abc.abstractmethod
    def remove(self, names: Sequence[str]) -> None:
        """Delete the files ``names``, in order; missing ones are no error."""

    @abc.abstractmethod
    def staging(self, step: int) -> StoredStaging:
        """A new, empty :class:`StoredStaging` for ``step``."""

    @abc.abstractmethod
    def locate(self, name: str | None = None) -> str:
        """Where the file ``name`` lives (a path or URL), or the destination itself when
        ``name`` is ``None``: for error messages."""

    def prepare(self) -> None:
        """Make sure the destination exists and can be written; :meth:`open` calls it
        first. Raises what the backend raises."""

    def load_head(self, name: str, size: int) -> bytes | bytearray | memoryview | None:
        """At most the first ``size`` bytes of the file ``name`` (``None``: none), how a
        producer resuming a step reads its parts' envelopes: by default from :meth:`load`."""
        data = self.load(name)
        return None if data is None else memoryview(data)[:size]

    def existing(self, names: Sequence[str]) -> list[int]:
        """Indices of ``names`` that exist (by default, found in :meth:`names`)."""
        stored = set(self.names())
        return [i for i, name in enumerate(names) if name in stored]

    def existing_in_slices(self, names: Sequence[str]) -> Sliced[list[int]]:
        yield from ()  # a network store's waits in slices: a cancelled send stops it
        return self.existing(names)

    def clean_leftovers(self, names: Sequence[str]) -> None:
        """Remove what killed writers left behind, invisible to readers: the temporary
        files among ``names`` (the destination's listing), of steps, marks and probes
        (:data:`~rlwire.transport._stored.names.LEFTOVER_RE`)."""
        self.remove([n for n in names if LEFTOVER_RE.fullmatch(n)])

    def errors(
        self, action: str, name: str | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """A context in which backend errors become a TransportError saying that
        ``action`` failed at :meth:`locate` ``(name)``."""
        return translate_errors(self.locate(name), action)

    def step_exists(self, step: int, rank: int) -> StepExistsError:
        """The error for a step found at the destination (rank ``rank`` of it)."""
        return StepExistsError(
            f"{self.locate(main_name(step, rank))}: step {step} rank {rank} already exists "
            "at the destination"
        )

    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        with self.errors("write to the destination"):
            self.prepare()
        sent_to = self.reading_sent_to()
        step, names = self._listed(on_existing, start_step, sent_to)
        self.fence.write(on_existing, FENCE_NAME in names)  # the senders before: no more
        if on_existing != "error":  # what they committed until then is the earlier run
            step, names = self._listed(on_existing, start_step, sent_to)
        rewriting = on_existing in ("overwrite", "truncate")
        first = 0 if on_existing == "overwrite" else start_step
        self.unsealed_step = self.resumed_after = None
        resumed = on_existing == "resume"
        widths = stored_widths(names, step, self.sealed_for, self.locate) if resumed else ()
        self.resumed_widths = widths
        if on_existing == "resume":
            self.resuming(names, step, sent_to)
        if on_existing == "error":
            return step
        parted = any(stored_parts.is_part_of(name, step) for name in names)
        if on_existing == "resume" and parted and seal_name(step) not in names:
            self.unsealed_step = step
        # Leftovers of killed writers (temporary files, unfinished uploads) are
        # invisible to readers, but take space.
        with self.errors("clean up after an earlier run"):
            self.clean_leftovers(names)
        self.fence.check("delete earlier steps")  # another open since: they are its own
        if rewriting:
            # Written before the first deletion, removed after the last: a sender killed
            # in between leaves it, and "resume" refuses to go on after the old steps.
            with self.errors("mark the start of the deletion", REWRITE_NAME):
                self.save(REWRITE_NAME, rewrite_mark(first or 0))
        kept = self.keep_end(names, on_existing == "resume")  # until the first commit
        with self.errors("delete earlier steps"):
            for doomed in names_to_delete(names, on_existing, start_step):  # in order
                self.remove([name for name in doomed if not kept(name)])
            if on_existing == "resume":  # a killed commit's sidecars, which block the step
                self.remove(orphan_sidecars(names, step))
        if rewriting:
            with self.errors("mark the end of the deletion", REWRITE_NAME):
                self.remove([REWRITE_NAME])
        return step

    def _listed(
        self, on_existing: OnExisting, start_step: int | None, sent_to: ReadSentTo
    ) -> tuple[int, list[str]]:
        """The first step to send and the destination's names, the open checked."""
        with self.errors("list the destination"):
            names = self.names()
        if REWRITE_NAME in names:
            self.check_rewrite(on_existing, 0 if on_existing == "overwrite" else start_step)
        every = sent_to.every(names, on_existing)  # read ahead, many at once
        step = _start_step(self.locate(), names, on_existing, start_step, sent_to, every)
        if on_existing == "resume" and start_step is None and END_NAME in names:
            with self.errors("read", END_NAME):  # a stream may have ended past its last step
                step = max(step, ended_at(self.load(END_NAME), self.locate(END_NAME)))
        return step, names

    def check_rewrite(self, on_existing: OnExisting, first: int | None) -> None:
        """Refuse to open over an unfinished overwrite or truncate (its mark,
        :data:`REWRITE_NAME`) as :func:`~rlwire.transport._stored.marks.check_rewrite` says."""
        data = self.load_mark(REWRITE_NAME, MARK_BYTES, "rewrite mark")  # refused by its size
        if data is not None:
            check_rewrite(data, on_existing, first, self.locate(REWRITE_NAME))

    def prune(self, below: int) -> int:
        def check(below: int) -> None:
            self.fence.check(f"delete the steps before step {below}")

        with self.errors("delete steps every rank consumed"):
            names = self.names()  # no step some rank holding files of it may still read
            return prune_steps(
                names, below, self.read_consumption, self.sealed_for, self.remove, check
            )

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        if step == self.unsealed_step:
            raise StepExistsError(
                f"step {step} was being filled part by part and is not sealed: finish it "
                f"with open_step({step}), or truncate it",
                where=self.locate(),
            )
        self.check_ranks(step, len(frames))
        mains = [main_name(step, rank) for rank in range(len(frames))]
        with self.errors(f"check whether step {step} exists"):
            found = yield from self.existing_in_slices(mains)
        if found:
            raise self.step_exists(step, found[0])

        def write(staging: StoredStaging) -> Sliced[None]:
            staging.ranks = len(frames)
            for rank, pending in enumerate(frames):
                frame = yield from take_frame(pending)  # the codec's errors stay its own
                yield from self.write_message(staging, step, rank, frame)

        return (yield from self._staged(step, write))

    def _staged(
        self, step: int, write: Callable[[StoredStaging], Sliced[None]], fields: str = ""
    ) -> Sliced[StoredStaging]:
        """``step``'s staging, filled by ``write`` and drained; discarded on failure.
        ``fields``: what a commit of appended fields does; it makes nothing new visible
        to a receiver at the end, so it leaves an end mark a resumed open kept."""
        staging = self.staging(step)
        what = fields or f"commit step {step}"
        staging.fence = self.fence.checking(what) if fields else self.before_commit(what)
        try:
            yield from write(staging)
            with self.errors(f"{self.stage_verb} step {step}"):
                yield from staging.drain()
        except BaseException:
            staging.discard()
            raise
        return staging

    def write_message(
        self, staging: StoredStaging, step: int, rank: int, frame: Frame
    ) -> Sliced[None]:
        """Stage the files of one rank's message: checksums first (in slices), then the
        sidecar file, then the main file. Stores that hash while they write override it.
        """
        names = (main_name(step, rank), sidecar_name(step, rank))
        yield from self._write(staging, step, rank, frame, names, None)

    def write_part(
        self, staging: StoredStaging, step: int, part: PartInfo, frame: Frame
    ) -> Sliced[None]:
        """Stage the files of one part, as :meth:`write_message` stages a rank's
        message, under the part's names and with its index, key and cost recorded."""
        names = (
            part_name(step, part.rank, part.index),
            part_sidecar_name(step, part.rank, part.index),
        )
        yield from self._write(staging, step, part.rank, frame, names, part)

    def _write(
        self,
        staging: StoredStaging,
        step: int,
        rank: int,
        frame: Frame,
        names: tuple[str, str],
        part: PartInfo | None,
    ) -> Sliced[None]:
        with self.errors(f"{self.stage_verb} step {step}"):
            sums = (yield from checksum_segments(frame)) if self.checksum else None
            ranks = staging.ranks if part is None else None
            layout = plan(frame, step, rank, sums, part=part, ranks=ranks)
            if layout.sidecar:
                yield from staging.add(names[1], layout.sidecar, main=False)
            yield from staging.add(names[0], layout.main, main=True)

    def stage_part(self, step: int, part: PartInfo, frame: PendingFrame) -> Sliced[Staged]:
        name = part_name(step, part.rank, part.index)
        with self.errors(f"check whether part {part.index} of rank {part.rank} exists", name):
            found = yield from self.existing_in_slices([name])
        if found:
            raise StepExistsError(
                f"part {part.index} of rank {part.rank} of step {step} already exists",
                where=self.locate(name),
            )

        part = self._first_parts.follows(step, part, lambda: self._id_of(step, part.rank, 0))

        def write(staging: StoredStaging) -> Sliced[None]:
            taken = yield from take_frame(frame)
            yield from self.write_part(staging, step, part, taken)

        return (yield from self._staged(step, write))

    def committed_parts(self, step: int, ranks: int | None = None) -> list[PartInfo]:
        if ranks is not None:  # an open_step (not a question after an error)
            self.check_ranks(step, ranks)
            self.fence.check(f"fill step {step} part by part")  # fenced: ClosedError, at once
        with self.errors(f"list the parts of step {step}"):
            names = self.names()
        if seal_name(step) in names or any(
            (m := MAIN_RE.fullmatch(n)) and int(m.group(1)) == step for n in names
        ):
            raise StepExistsError(
                f"step {step} is {'sealed' if seal_name(step) in names else 'sent whole'} already",
                where=self.locate(),
            )
        mains, orphans = part_files(names, step)
        # A sender killed while committing a part left its sidecar: its index is free.
        if orphans:
            self.fence.check(f"clean up after an earlier run of step {step}")
        with self.errors(f"clean up after an earlier run of step {step}"):
            self.remove(orphans)

        def load_head(name: str, size: int) -> bytes | bytearray | memoryview | None:
            with self.errors("read", name):
                return self.load_head(name, size)

        return read_parts(mains, load_head, self.locate)

    def seal(self, seal: Seal) -> None:
        name = seal_name(seal.step)
        self.fence.check(f"seal step {seal.step}")
        self.reopen_end(f"seal step {seal.step}")
        with self.errors(f"seal step {seal.step}", name):
            found = self.existing([name, *stored_parts.after_seal(seal)])
            stored_parts.write_seal(self.save, seal, found, self.locate(name))
        if self.unsealed_step == seal.step:
            self.unsealed_step = None
