"""Where a receiver records how far its rank got, and where a resumed one starts.

A receiver's position is its next step and, in a step filled part by part, the next
part of it. It writes the position to its rank's marks (:class:`~rlwire.abc.Source`'s
``mark_consumed`` and ``mark_part``) as it moves: past a part when it asks for the next
one, past a step when it asks for the next step or, reading parts, for a part after its
rank's last (``parts()`` ends). A mark never says the rank moved past a step not sent
yet (a sender takes such a mark for a receiver of another run's, which holds nothing
back from ``keep_last``, and prunes nothing while it is ahead):

- One opened at ``start_step=S`` has moved past every step before ``S``. Where its
  rank's mark already says so (a trainer restarted from a checkpoint), the mark is
  lowered to ``S`` before the receiver first reads, so that no sender deletes ``S``, or
  with ``recycle`` writes a later step into its files, while the receiver reads it;
  where the read finds ``S`` already deleted (``StepGapError``), the mark is put back.
  Elsewhere the receiver says so once it has read step ``S`` (not before: ``S`` may
  not be sent yet).
- One that skips a step it has not found (``skip()`` after ``ReceiveTimeout``) says it
  moved past that step once it has read a later one.

Each mark is written once per move, before the next step or part is read: a receiver
killed after asking for part ``i + 1`` is never handed part ``i`` again once resumed,
and one killed while it holds part ``i`` is handed it again (it had not moved past it).
A part mark also names the run of the parts moved past (their part 0's id), so that a
resumed receiver never goes on with parts of another run of the step.
A mark the store could not take (full, read-only: the source's ``mark_skipped``) is
written again before each later read, until the store takes it. A mark gone while the
receiver waits at the position it records (a producer's ``overwrite`` or ``truncate``
deleted the ranks' marks) is written again, looked for at most every second: else a
sender with ``max_ahead`` would count the rank at its first step, and wait for ever for
a receiver that writes nothing until it moves.
"""

from __future__ import annotations

import threading
import time

from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    CorruptFrameError,
    RlwireError,
    StepGapError,
)
from rlwire._core.offload import runs_event_loop
from rlwire._core.slicing import Held, run_sliced
from rlwire.transport._base import Source
from rlwire.transport._marks import MarksSource

__all__ = ["ConsumptionMarks"]

#: Seconds between two looks, while a receiver waits at the position it recorded, for
#: whether its rank's marks are still there.
_MARK_CHECK_SECONDS = 1.0


class ConsumptionMarks:
    """The marks half of :class:`~rlwire.TrainingBatchReceiver`."""

    _source: Source
    _mutex: threading.Lock
    _closed: bool
    _next_step: int
    _part_next: int
    _record_consumed: bool
    _first_part: tuple[int, bytes]  # the step and run of the parts yielded (RunChecks)
    _resumed_at: tuple[int, int] = (-1, 0)  # where resume=True started (parts: the seal)
    _peeked: object  # a step read by wait_next() for the next receive, or None

    def _start_marks(self, start_step: int, resume: bool) -> None:
        """Start at ``start_step``, or, with ``resume``, where the rank's marks say
        (``start_step`` if they say nothing)."""
        # The step last written to this rank's consumption mark, and the part to its part
        # mark: nothing to write until the receiver reads (the store may not even exist
        # yet), and a part mark only once the consumption mark holds its step. A receiver
        # opened at a later step has moved past the ones before it (the receiver of a
        # StepHandle, opened for each step): it records that once it has read that step
        # (_started), else a rank read step by step that way would hold every step back
        # from keep_last.
        self._recorded = start_step
        self._recorded_part, self._step_written = 0, False
        self._next_step, self._part_next = start_step, 0
        # Before the first read, look whether the rank's mark is past the start, to lower it.
        self._check_start = self._record_consumed
        self._restore: int | None = None  # the mark lowered from, while its step is unread
        self._restore_part: tuple[int, bytes] = (0, b"")  # and its part, its run
        self._looked: tuple[int, bool] = (-1, False)  # the last read's step, and if found
        self._hold: int | None = None  # a step skipped unfound: the mark stays at it
        self._hold_unsure = False  # skipped without a look: the store may list it
        self._mark_checked = time.monotonic()  # the last write or look at the marks
        if resume:
            try:
                found, of = self._read_position()
            except BaseException:
                self._source.close()  # the receiver is not made: nothing else closes it
                raise
            self._check_start = False  # the marks say where it is, or nothing at all
            if found is not None:
                self._next_step, self._part_next = found
                self._recorded, self._recorded_part = found
                self._resumed_at = found  # the parts before were handed out: at the seal
                self._step_written = True
                if of:
                    self._first_part = (found[0], of)  # the run its later parts must follow

    def _read_position(self) -> tuple[tuple[int, int] | None, bytes]:
        """The rank's position as its marks record it and, part way through a step, the
        run its part mark names (``b""``: none), read so that the two agree: a producer's
        ``overwrite`` or ``truncate`` deleting the marks between the reads would leave the
        position of the parts handed out beside no run, and the receiver would take the
        step as stored now (the new run's) for theirs (resumed here, or resumed at the
        position a restart from a checkpoint put back: ``_lower_to_start``). The marks
        have one writer, this rank's receiver, and a rewrite only deletes them: the
        reads settle at once."""
        found = self._source.read_consumption()
        while found is not None and found[1]:
            of = self._source.read_part_of(found[0])
            again = self._source.read_consumption()
            if again == found:
                return found, of
            found = again
        return found, b""

    def skip(self) -> int:
        """Give up on the next step (for example after a CorruptFrameError) and move on to
        the one after it. Returns the step skipped.

        A step skipped before it was sent (after a ``ReceiveTimeout``, or never looked
        for and not stored) is skipped all the same, but the rank's consumption mark says
        it moved past that step only once this receiver has read a later one: a mark
        must not run ahead of the steps sent (a sender takes it for another run's);
        until then it says the rank moved past the steps before it. Meanwhile a
        sender's ``keep_last`` keeps the skipped step, and one with ``max_ahead=0``
        waits for the rank (give it 1 or more, as for a receiver opened at a later
        ``start_step``), unless that sender sent the step without this rank (then it
        counts the rank as past it).

        Raises:
            ConfigError: called on an event loop while another task's ``areceive`` (or
                ``aparts``, ``await_next``) on this receiver is reading a step: waiting
                for it here would block the loop that call needs to finish. (Beside one
                that is only waiting for the step, ``skip()`` takes effect at once, and
                that call returns the step after.)
            ClosedError: the receiver is closed.
        """
        held = Held(self._mutex)
        try:
            if not held.take_now():
                if runs_event_loop():
                    raise ConfigError(
                        f"skip() while another task's receive on {self!r} is under way: it "
                        "needs this event loop to finish, so skip() cannot wait for it here; "
                        "await that receive (or cancel it) first"
                    )
                run_sliced(held.take())  # another thread's call: it ends without this one
            if self._closed:
                raise ClosedError(f"{self!r} is closed")
            step = self._next_step
            if self._looked != (step, True) and not self._part_next and self._hold is None:
                self._hold = step  # not found: it may not be sent yet
                # Never looked for: the next read asks the store (not here, in the loop).
                self._hold_unsure = self._looked != (step, False)
            self._peeked = None  # a look (wait_next) read it: it is skipped all the same
            self._next_step, self._part_next = step + 1, 0
            return step
        finally:
            held.release()

    def _stored(self, step: int) -> bool:
        """For a step skipped without a look at it: whether the store lists it or a
        later step (it was sent); True where the source cannot list (as before), False
        where the listing fails (the mark then waits for a later step's read)."""
        listed = getattr(self._source, "stored_steps", None)
        try:
            steps = None if listed is None else listed()
        except RlwireError:
            return False
        return steps is None or any(s >= step for s in steps)

    def _save_consumed(self, step: int) -> bool:
        """Write the consumption mark ``step``: False if the store could not take it."""
        self._source.mark_consumed(step)
        self._mark_checked = time.monotonic()
        return not self._source.mark_skipped

    def _keeps_marks(self) -> bool:
        """Whether the source keeps marks to read (not a socket's, which records none)."""
        return type(self._source).read_consumption is not MarksSource.read_consumption

    def _lower_to_start(self) -> None:
        """Before the receiver first reads: if its rank's mark says the rank moved past
        the step it starts at (a trainer restarted from a checkpoint), lower the mark to
        that step, so that no sender deletes the step while the receiver reads it."""
        self._check_start = False
        if not self._keeps_marks():
            return
        try:
            # Position and run read so that they agree: a rewrite deleting the marks
            # between two reads would have the position put back beside no run after a
            # StepGapError (_read_failed), and a receiver resumed there would take the
            # step as stored now (the new run's) for the run of the parts handed out.
            found, of = self._read_position()
        except CorruptFrameError:
            return  # a garbled mark is written over once the step is read, as before
        step = self._next_step
        if found is None or found[0] < step:
            return  # it says less: the receiver says more once it has read the step
        if found[0] > step or found[1]:
            # The part mark may say how far an earlier receiver got into this step or a
            # later one: beside the lowered mark, or the mark of that later step once
            # this receiver gets there, it would make a receiver resumed while it holds
            # an earlier part of that step skip those parts. Reset first: a kill before
            # the mark is lowered costs a repeat of the parts of found[0], not a skip.
            of = of if found[0] > step else b""
            self._source.mark_part(step, 0)
            if self._source.mark_skipped:
                self._check_start = True
                return
            self._restore_part = (found[1], of)
        # found[0] was checked against the steps sent (by the sender that read it), so
        # the lowered mark is too. Written before the read, so a sender reading the marks
        # from now on keeps the step; if the store cannot take it, it is tried again
        # before the next read, and said once the step is read, as before.
        if found[0] > step and not self._save_consumed(step):
            self._check_start = True
            return
        self._restore = found[0] if found[0] > step else None
        self._recorded, self._recorded_part = step, 0
        self._step_written = True

    def _read_failed(self, exc: RlwireError) -> None:
        """After a read of the next step failed: a step found deleted puts back the mark
        lowered from (as it was before this receiver), and the next read lowers it again
        (the receiver's mutex held)."""
        mark = self._restore
        if isinstance(exc, StepGapError) and mark is not None and self._save_consumed(mark):
            self._recorded, self._restore, self._check_start = mark, None, True
            part, of = self._restore_part
            if part:
                self._source.mark_part(mark, part, of)

    def _found(self, found: bool) -> None:
        """Note whether the read of the next step found it (the receiver's mutex held)."""
        self._looked = (self._next_step, found)

    def _started(self) -> None:
        """Record, once the receiver has read a step, that its rank moved past the steps
        before it, if its mark does not say so yet (the receiver's mutex held): those
        before the step it was opened at, or one it skipped before it was sent. Steps are
        sent in order, so reading a step shows that every one before it was sent."""
        step, self._restore, self._hold = self._next_step, None, None
        behind = self._recorded < step or (step > 0 and not self._step_written)
        if self._record_consumed and behind and self._save_consumed(step):
            self._recorded, self._recorded_part, self._step_written = step, 0, True

    def _held(self, step: int, part: int) -> int:
        """The step the consumption mark may go up to for a receiver at ``step`` and
        ``part``: a step skipped unfound holds it there until it is known to be sent."""
        if self._hold is not None and self._hold_unsure and step > self._hold:
            self._hold_unsure = False
            if self._stored(self._hold):  # it was sent: passed at once
                self._hold = None
        if self._hold is None or step <= self._hold:
            return step
        if part:  # a part of a later step was read: the skipped one was sent
            self._hold = None
            return step
        return self._hold  # nothing found past it yet: the mark goes up to it, not past

    def _record_position(self) -> None:
        """Write the marks the receiver's position moved past since the last write (the
        receiver's mutex held); a write the store could not take is tried again at the
        next call."""
        if not self._record_consumed:
            return
        if self._check_start:
            self._lower_to_start()
        step, part = self._next_step, self._part_next
        if step != self._recorded or part:
            self._restore = None  # it read the step lowered to (parts() reads no _started)
        step = self._held(step, part)
        if step > self._recorded:
            if not self._save_consumed(step):
                return
            self._recorded, self._recorded_part, self._step_written = step, 0, True
        if step == self._recorded and part > self._recorded_part:
            if not self._step_written:  # the part mark counts beside its step's mark only
                if not self._save_consumed(step):
                    return
                self._step_written = True
            self._save_part(step, part)
        elif (step, part) == (self._recorded, self._recorded_part):
            self._check_marks()

    def _save_part(self, step: int, part: int) -> None:
        """Write the part mark ``(step, part)``, with the run of the parts moved past."""
        first, of = self._first_part
        self._source.mark_part(step, part, of if first == step else b"")
        if not self._source.mark_skipped:
            self._recorded_part = part

    def _check_marks(self) -> None:
        """While the receiver waits at the position it recorded (the receiver's mutex
        held): look, a second after its last write or look, whether its rank's marks are
        still there; gone, write them again as it recorded them.

        A producer's ``overwrite`` or ``truncate`` deletes the ranks' marks, and a
        receiver of the run before, waiting for a later step, writes none until it
        moves: a sender with ``max_ahead`` counted its rank at the sender's first step,
        and waited for ever for the rank to move past it. The mark written again is
        ahead of the new run's steps, which a sender takes for another run's: it holds
        ``max_ahead`` back no more, and nothing is deleted on its account, as for a
        receiver that reads on across the rewrite.

        Raises:
            TransportError: the marks cannot be read or written.
        """
        now = time.monotonic()
        if not self._step_written or now - self._mark_checked < _MARK_CHECK_SECONDS:
            return
        if not self._keeps_marks():
            return
        self._mark_checked = now
        try:
            if self._source.read_consumption() is not None:
                return  # there (another writer's, maybe: it is left alone)
        except CorruptFrameError:
            return  # garbled: a sender says so, naming it
        step, part = self._recorded, self._recorded_part
        if self._save_consumed(step) and part:
            self._recorded_part = 0
            self._save_part(step, part)
