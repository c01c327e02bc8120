"""Where a receiver records how far its rank got, and where a resumed one starts.

A receiver's position is its next step and, in a step filled part by part, the next
part of it. It writes the position to its rank's marks (:class:`~rlwire.abc.Source`'s
``mark_consumed`` and ``mark_part``) as it moves: past a part when it asks for the next
one, past a step when it asks for the next step or, reading parts, for a part after its
rank's last (``parts()`` ends). One opened at ``start_step=S`` has moved past every step
before ``S``, and says so once it has read step ``S`` (not before: ``S`` may not be sent
yet, and a mark past the steps sent stops the sender's retention). Each mark is written
once per move, before the next step or part is read: a receiver killed after asking for
part ``i + 1`` is never handed part ``i`` again once resumed, and one killed while it
holds part ``i`` is handed it again (it had not moved past it). A mark the store could
not take (full, read-only: the source's ``mark_skipped``) is written again before each
later read, until the store takes it.
"""

from __future__ import annotations

from rlwire.transport._base import Source

__all__ = ["ConsumptionMarks"]


class ConsumptionMarks:
    """The marks half of :class:`~rlwire.TrainingBatchReceiver`."""

    _source: Source
    _next_step: int
    _part_next: int
    _record_consumed: bool
    # The step a receiver opened at a later step says it moved past the ones before, once
    # it has read it (0: nothing to say).
    _start_mark: int

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
        self._recorded, self._start_mark = start_step, start_step
        self._recorded_part, self._step_written = 0, False
        self._next_step, self._part_next = start_step, 0
        if resume:
            try:
                found = self._source.read_consumption()
            except BaseException:
                self._source.close()  # the receiver is not made: nothing else closes it
                raise
            if found is not None:
                self._next_step, self._part_next = found
                self._recorded, self._recorded_part = found
                self._step_written, self._start_mark = True, 0

    def _save_consumed(self, step: int) -> bool:
        """Write the consumption mark ``step``: False if the store could not take it."""
        self._source.mark_consumed(step)
        return not self._source.mark_skipped

    def _started(self) -> None:
        """Record, once the receiver has read a step, that its rank moved past the steps
        before the one it was opened at, if not done yet (the receiver's mutex held)."""
        if not self._start_mark:
            return
        step, self._start_mark = self._start_mark, 0
        if self._record_consumed and not self._step_written and self._save_consumed(step):
            self._step_written = True

    def _record_position(self) -> None:
        """Write the marks the receiver's position moved past since the last write (the
        receiver's mutex held); a write the store could not take is tried again at the
        next call."""
        if not self._record_consumed:
            return
        step, part = self._next_step, self._part_next
        if step > self._recorded:
            if not self._save_consumed(step):
                return
            self._recorded, self._recorded_part, self._step_written = step, 0, True
        if step == self._recorded and part > self._recorded_part:
            if not self._step_written:  # the part mark counts beside its step's mark only
                if not self._save_consumed(step):
                    return
                self._step_written = True
            self._source.mark_part(step, part)
            if not self._source.mark_skipped:
                self._recorded_part = part
