"""Which run of a step the parts a receiver hands out are of: a producer restarted with
``overwrite`` may delete a step and send it again (another run) while a receiver goes
through its parts; the receiver never hands out parts of two runs, nor takes the new
run's seal as the end of the old run's parts, nor waits for ever for a part the new run
does not have (docs/format.md, "Steps filled part by part")."""

from __future__ import annotations

import time

from rlwire._api.sealed import follows, mixed_runs, run_of
from rlwire._core.errors import StepGapError
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._parts import PartInfo

__all__ = ["RunChecks"]

#: Seconds between two looks, while a receiver part way through a step waits for its
#: next part, for whether the rank's part 0 is still the one it yielded.
_RUN_CHECK_SECONDS = 1.0


class RunChecks:
    """The checks of :class:`~rlwire._api.parts.PartsReader` against the part 0 it
    yielded (or that its first part names, for a receiver resumed part way through)."""

    _source: Source
    _next_step: int
    _part_next: int
    _first_part: tuple[int, bytes] = (-1, b"")  # the step and id of the part 0 yielded
    _run_checked: float = -_RUN_CHECK_SECONDS  # when a wait for a part last checked the run

    def _note_run(self) -> None:
        """For a receiver opened part way through a step (``resume=True``): the run
        its rank's part mark records (that of the parts handed out before it stopped,
        read with its position: ``_read_position``) or, where the mark names none
        (written before format 1.6), the rank's part 0 as stored now, is the one the
        step's later parts must follow, and whose seal ends them. Called as the
        receiver is made: on an error, the source is closed.

        Raises:
            CorruptFrameError, TransportError: as :meth:`~rlwire.abc.Source.first_part`.
        """
        if self._part_next and self._first_part[0] != self._next_step:
            step = self._next_step
            try:
                first = self._source.first_part(step)
            except BaseException:
                self._source.close()  # the receiver is not made: nothing else closes it
                raise
            if first:
                self._first_part = (step, first)

    def _check_run(self, step: int, info: PartInfo, frame: Frame) -> None:
        """Remember part 0's id; refuse a later part of another run of the step than
        the part 0 yielded (the step deleted and sent again by a producer restarted
        with ``overwrite`` while this receiver read it).

        Raises:
            StepGapError: the part is of another run of the step.
            CorruptFrameError: it is, while the rank's part 0 is still the one yielded
                (the store mixes runs: no run was sent since).
        """
        if info.index == 0:
            self._first_part = (step, run_of(info, frame))
        elif self._first_part[0] != step:
            # The first part read of the step is not part 0 (a receiver resumed part way
            # through it): the part 0 it names is the one the later parts must follow.
            self._first_part = (step, info.of or b"")
        elif not follows(info, self._first_part[1]):
            if self._source.first_part(step) == self._first_part[1]:
                raise mixed_runs(self._source, step, info.rank, info.index)
            raise StepGapError(
                f"step {step} was deleted and sent again (another run) while this receiver "
                f"read it part by part: part {info.index} is of the new run, the parts "
                f"before it were of the earlier one; open a receiver at start_step={step} "
                "to read the new run's step",
                where=self._source.describe_part(step, info.index),
            )

    def _check_sealed_run(self, step: int) -> None:
        """Refuse a seal of another run of the step than the parts yielded (its part 0
        is another now: the step was deleted and sealed again meanwhile), which would
        end the step at a count of that run's, or call one of its parts missing.

        Raises:
            StepGapError: the step was sent again since its parts were yielded.
        """
        if self._run_moved(step):
            raise StepGapError(
                f"step {step} was deleted and sent again (another run) while this receiver "
                f"read it part by part: its seal is of the new run, the parts it gave "
                f"({self._part_next}) of the earlier one; open a receiver at "
                f"start_step={step} to read the new run's step",
                where=self._source.describe_part(step, 0),  # the part 0 that is no longer it
            )

    def _check_waiting_run(self, step: int) -> None:
        """While the receiver waits for a later part of ``step``, look (on the first
        miss, then at most every second) whether the rank's part 0 is still the one it
        yielded: gone or another, the step was deleted (sent again whole or in other
        parts, or not yet; or retention deleted it), and the part waited for never comes.

        Raises:
            StepGapError: the rank's part 0 is no longer the one yielded.
        """
        now = time.monotonic()
        if now - self._run_checked < _RUN_CHECK_SECONDS:
            return
        self._run_checked = now
        if self._run_moved(step):
            raise StepGapError(
                f"step {step} was deleted (and maybe sent again: another run) while this "
                f"receiver read it part by part: its part 0 is no longer the one it gave, "
                f"so the part after the {self._part_next} it gave never comes; open a "
                f"receiver at start_step={step} to read the step as it is now",
                where=self._source.describe_part(step, 0),  # the part 0 that is no longer it
            )

    def _run_moved(self, step: int) -> bool:
        """Whether the rank's part 0 of ``step`` is no longer the one yielded: another
        run's, or none (``b""``); False when nothing was yielded of ``step`` or the
        source cannot tell (``None``)."""
        if self._first_part[0] != step or not self._first_part[1]:
            return False
        now = self._source.first_part(step)
        return now is not None and now != self._first_part[1]
