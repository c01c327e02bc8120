"""What a :class:`~rlwire.abc.Source` offers for consumption marks: where its rank's
receiver records how far it got, which senders' ``keep_last`` and ``max_ahead`` go by
and which a receiver opened with ``resume=True`` starts from.

A rank's position is a step and a part: every step before the step is consumed, and, in
a step filled part by part, every part before the part. A receiver moves past a step
when it asks for the next one, or when ``parts()`` asks for a part after the rank's last
(and finds the seal); it moves past a part when it asks for the next.
"""

from __future__ import annotations

import inspect
from typing import Any

from rlwire._core.errors import ConfigError

__all__ = ["MarksSource"]


class MarksSource:
    """The consumption marks of a source (a base of :class:`~rlwire.abc.Source`). By
    default it records nothing and has nothing to read: stores override all three
    methods."""

    #: True while the last mark this source was asked to write could not be (a store
    #: that skips a mark it cannot take, full or read-only, rather than raise): the
    #: receiver asks for it again before its next read. Sources that raise leave it False.
    mark_skipped: bool = False

    def mark_consumed(self, next_step: int) -> None:
        """Record that this rank's receiver moved past every step before ``next_step``
        (the receiver calls it once per step, when it moves on). Stores write a small
        mark beside the steps; sources that keep no steps do nothing.

        Raises:
            TransportError: the mark cannot be written.
        """

    def mark_part(self, step: int, next_part: int, of: bytes = b"") -> None:
        """Record that this rank's receiver moved past parts ``0`` to ``next_part - 1``
        of ``step``, a step filled part by part (it asked for part ``next_part``), and
        that they followed the part 0 whose :attr:`~rlwire.Frame.message_id` is ``of``
        (their run, as :meth:`~rlwire.abc.Source.first_part` gives it; ``b""`` if not
        known), which :meth:`read_part_of` gives back. The receiver has recorded
        ``step`` with :meth:`mark_consumed` first: a part mark counts only beside a
        consumption mark of its step. Sources that keep no steps do nothing.

        Raises:
            TransportError: the mark cannot be written.
        """

    def read_part_of(self, step: int) -> bytes:
        """The ``of`` this rank's part mark records, if the mark is of ``step``: the
        run of the parts its receiver moved past, which a receiver resumed part way
        through ``step`` checks the step's later parts against (a step sent again
        since is another run). ``b""``: not recorded, or the source cannot tell (the
        default).

        Raises:
            CorruptFrameError: the mark is garbled.
            TransportError: the mark cannot be read.
        """
        del step
        return b""

    def read_consumption(self) -> tuple[int, int] | None:
        """This rank's position as its marks record it: the first step its receiver
        has not moved past, and the first part of that step it has not moved past (0
        unless the step is filled part by part and the part mark is of that step); or
        ``None`` if it recorded nothing. What ``open_receiver(resume=True)`` starts
        from.

        Raises:
            CorruptFrameError: a mark is garbled.
            TransportError: the marks cannot be read.
            ConfigError: the source records no consumption (the default: a socket).
        """
        raise ConfigError(
            f"{type(self).__name__} records no consumption marks: a receiver cannot resume "
            "from one (resume=True needs a store: files, fsspec, ray://)"
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plugin written for an earlier rlwire overrides mark_part(step, next_part): it records
        # no run, and is called as before.
        old = cls.__dict__.get("mark_part")
        if old is not None and "of" not in inspect.signature(old).parameters:

            def mark_part(self: MarksSource, step: int, next_part: int, of: bytes = b"") -> None:
                old(self, step, next_part)

            cls.mark_part = mark_part  # type: ignore[method-assign]
