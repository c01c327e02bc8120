"""The board's fence (:class:`FencingBoard`, a base of
:class:`~rlwire.transport.ray._board.Board`'s halves): a destination has one producer,
the one that opened it last.

Every open of the destination (whatever its ``on_existing``: ``"resume"`` too, and
``"error"``) is given the next *epoch*, a counter the sink keeps and names in every
call that stores, commits, seals, resumes a step part by part, appends fields, deletes
steps or marks the end. A call naming an older epoch than the board's newest is
refused (``("fenced", why)``; the sink raises :class:`~rlwire.errors.ClosedError`)
before it changes anything: a producer still alive after another opened the
destination (a hung process that woke up, a launcher that started a second one) never
adds a step, a part, fields or an end to the other's run, nor deletes one of its steps.
A producer resumed after a real crash opened last: it goes on, and the one before, if
it is alive after all, is fenced from that open on.

Calls that name no epoch are not fenced: a stage that only appends fields
(``attach_fields`` opens nothing, and may run beside the producer) and the calls of an
rlwire before epochs. A board made by an rlwire before epochs answers an open with no
epoch: the sink then names none, and nothing is fenced (as before).
"""

from __future__ import annotations

from typing import Any

from rlwire.transport._fenced import fenced

__all__ = ["OPENS", "FencingBoard"]

#: How many opens (their ``on_existing``) the board remembers, for its messages.
OPENS = 1024


class FencingBoard:
    """The epochs of a board's opens, and the check of a caller's."""

    #: the epoch of the newest open (0: none yet)
    epoch: int
    #: epoch -> the ``on_existing`` of that open (the last :data:`OPENS`)
    opens: dict[int, str]

    def _open_epoch(self, on_existing: str) -> int:
        """Record an open of the destination with ``on_existing``; its epoch, from now
        on the only one whose calls are taken."""
        self.epoch += 1
        self.opens[self.epoch] = on_existing
        while len(self.opens) > OPENS:
            del self.opens[next(iter(self.opens))]
        return self.epoch

    def _fenced(self, epoch: int | None, what: str) -> tuple[Any, ...] | None:
        """``("fenced", why)`` when a sender opened at ``epoch`` is fenced off (another
        opened the destination since), for its call to ``what``; ``None`` when the
        call may go on (the newest epoch, or none named).

        Raises:
            ValueError: ``epoch`` is no int >= 0 (another client's call).
        """
        if epoch is None:
            return None
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"an epoch must be an int >= 0, got {epoch!r}")
        if epoch == self.epoch:
            return None
        return ("fenced", fenced(what, self.opens.get(epoch + 1)))
