"""Where each message a receiver gets stands against the one it expects next: the sender's
session, the sequence number and the step (docs/format.md, "ZeroMQ messages")."""

from __future__ import annotations

from rlwire._core.errors import CorruptFrameError, EndOfStream, StepGapError, StepOrderError
from rlwire.transport._stored.gaps import fewer
from rlwire.transport.zmq._protocol import Head

__all__ = ["Ordering", "span"]


class Ordering:
    """The session and sequence number a receiver expects next, and whether it has
    returned anything yet.

    Example:
        >>> from rlwire.transport.zmq._protocol import Head
        >>> head = Head(b"S" * 8, 0, 4, 0, False, "msgpack", [], b"", [], None, 1, 0, 1)
        >>> Ordering("ipc:///run", rank=0).place(head, step=4)
        ''
    """

    def __init__(self, endpoint: str, *, rank: int) -> None:
        self.endpoint = endpoint
        self.rank = rank
        # The session of the last message taken in order, and the seq to follow it.
        self._session: bytes | None = None
        self._next_seq = 0
        self._received = False  # True once a message was returned (or a gap reported)
        # A new session that started behind: its steps below the expected one are
        # discarded without a word (it was reported once).
        self._behind: bytes | None = None
        # The steps said never to come to this receiver, one after another from the one
        # expected (first, last): by ``absent`` packets, or by the message after a gap.
        # Each was reported then; a receive of any of them goes on with the step after.
        self._said: tuple[int, int] | None = None

    def place(self, head: Head, step: int) -> str | None:
        """Where ``head``'s message stands when ``step`` is expected: ``""`` if it is the
        next one, what was expected instead if it comes after a gap (it is returned
        after a StepGapError), or ``None`` to discard it without a word. The state moves
        on past it.

        Raises:
            StepOrderError: it repeats or goes back: discarded (it moves the state on only
                if it is the next in the sequence, with a step already past).
        """
        step = self.moved_to(step)
        new = head.session != self._session
        expected_seq = 0 if new else self._next_seq
        sender = "a new sender session" if new else "this sender"
        ordinal = f"message {head.seq} of {sender}"
        if not new and head.seq < expected_seq:
            raise StepOrderError(
                f"{ordinal} (step {head.step}) repeats or goes back: expected message "
                f"{expected_seq}; discarded",
                where=self.endpoint,
                rank=self.rank,
            )
        if head.step < step:
            if new or head.session == self._behind:
                report = new and self._received
                self._session, self._next_seq = head.session, head.seq + 1
                self._behind = head.session
                if not report:
                    return None  # older than the step this receiver starts at
                raise StepOrderError(
                    f"a new sender session started at step {head.step}, behind step "
                    f"{step}: steps {span(head.step, step)} would repeat; discarded "
                    f"until step {step}",
                    where=self.endpoint,
                    rank=self.rank,
                )
            if head.seq == expected_seq:
                self._next_seq += 1  # the next in the sequence, with a wrong step
            again = head.step == step - 1
            what = f"step {head.step} again" if again else f"step {head.step}, behind step {step}"
            raise StepOrderError(
                f"{ordinal} holds {what}: already past it; discarded",
                where=self.endpoint,
                rank=self.rank,
            )
        self._session, self._next_seq, self._behind = head.session, head.seq + 1, None
        self._received = True
        if not head.shared and head.step != step:
            # Said once: the parts and seal of a step filled part by part come as
            # messages of their own, each of which would say it again.
            self._say(step, head.step - 1)
            return f"expected step {step}, got step {head.step}"
        if head.seq != expected_seq:
            return f"expected message {expected_seq} of {sender}, got {head.seq}"
        return ""

    def absent(self, absent: int, ranks: int, step: int) -> None:
        """Note an ``absent`` packet: step ``absent`` went to ``ranks`` ranks, not this
        receiver's. Said only when it is ``step``, the one expected (or the one after the
        steps said absent from ``step`` on, not skipped): a step passed is
        discarded, and one after a gap is left to the next message, which reports the
        gap with it. Said once: the step after it then follows on (whole, or filled part by
        part), skipped to or not.

        Raises:
            StepGapError: ``absent`` is ``step``.
            CorruptFrameError: the packet does not leave this receiver's rank out.
        """
        if ranks > self.rank:  # this receiver's rank is among those it went to
            sent = f"ranks 0..{ranks - 1}" if ranks > 1 else "rank 0"
            raise CorruptFrameError(
                f"malformed 'absent' packet: step {absent} went to {sent}, rank "
                f"{self.rank} among them; discarded",
                where=self.endpoint,
                rank=self.rank,
            )
        if absent != self.moved_to(step):
            return
        self._say(absent, absent)
        self._received = True
        raise StepGapError(
            f"{fewer(absent, ranks, self.rank)} (else the next receive goes on with the "
            "next step sent)",
            where=self.endpoint,
            rank=self.rank,
        )

    def moved_to(self, step: int) -> int:
        """The step expected next when ``step`` is: the one after the steps from it on
        said never to come to this receiver (reported then, not again by what follows),
        skipped or not.

        Example:
            >>> ordering = Ordering("ipc:///run", rank=1)
            >>> ordering.absent(4, 1, 4)
            Traceback (most recent call last):
            ...
            rlwire.errors.StepGapError: ipc:///run: step 4 was sent to rank 0 only: ...
            >>> ordering.moved_to(4), ordering.moved_to(5)
            (5, 5)
        """
        if self._said is not None and self._said[0] <= step <= self._said[1]:
            return self._said[1] + 1
        return step

    def _say(self, first: int, last: int) -> None:
        """Record steps ``first`` to ``last`` as said never to come."""
        if self._said is not None and self._said[0] <= first <= self._said[1] + 1:
            first = self._said[0]  # they follow on from those said before
        self._said = (first, last)

    def ended(self, end: int, step: int, *, per_rank: bool) -> StepGapError | EndOfStream:
        """What a receiver that expects ``step`` raises when the sender's ``end`` comes:
        in the ``ranks`` pattern (``per_rank``), an end beyond ``step`` first reports the
        steps lost (the next receive raises :meth:`end_of_stream`)."""
        step = self.moved_to(step)
        if per_rank and end > step:
            return StepGapError(
                f"expected step {step}, but the sender finished the stream at step {end}: "
                f"steps {span(step, end)} were lost; the next receive raises EndOfStream",
                where=self.endpoint,
                rank=self.rank,
            )
        return self.end_of_stream(end, step)

    def end_of_stream(self, end: int, step: int) -> EndOfStream:
        """The :class:`~rlwire.EndOfStream` for a sender that finished at ``end`` when
        ``step`` is expected. An end behind ``step`` says nothing of what the sender
        sent: a socket keeps nothing, so a sender restarted without ``start_step`` (or
        with ``on_existing="resume"``, which starts afresh) ends where it started, behind
        the steps this receiver had from the one before.

        Example:
            >>> message = str(Ordering("ipc:///run", rank=0).end_of_stream(0, 3))
            >>> message.removeprefix("ipc:///run: the sender finished the stream ")
            'at step 0, behind step 3 that this receiver expects; no step will come'
        """
        step = self.moved_to(step)
        if end >= step:
            return EndOfStream.at(end, where=self.endpoint)
        why = (
            ": a sender restarted behind the steps it had (open a restarted sender with "
            f"start_step={step} to go on from there)"
            if self._received
            else ""
        )
        return EndOfStream(
            f"the sender finished the stream at step {end}, behind step {step} that this "
            f"receiver expects{why}; no step will come",
            where=self.endpoint,
        )


def span(first: int, end: int) -> str:
    """Steps ``first`` up to ``end`` (excluded), in words: ``"3"`` or ``"3-7"``.

    Example:
        >>> span(3, 4), span(3, 8)
        ('3', '3-7')
    """
    return str(first) if end - first == 1 else f"{first}-{end - 1}"
