"""The heap one message's decode may build, charged before each msgspec call.

Decoding into plain builtins can build far more than the message's size (see
:mod:`rlwire.codecs._msgpack.cost`). Every decode of a message's header (a whole read,
a ``fields=`` scan, the look of ``add_fields`` and manifests) charges what each call may
build against one :class:`HeapAllowance`, from the message's stored size
(:func:`~rlwire._frame.bounds.heap_allowance`), and a call that would pass it is
refused before it starts.

Example:
    >>> heap = HeapAllowance(1000, stored=10)
    >>> heap.charge(600, "rows")
    >>> heap.charge(600, "rows")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlwire.errors.FrameTooLargeError: header: rows would build over 0 MiB of Python ...
"""

from __future__ import annotations

import msgspec

from rlwire._core.errors import FrameTooLargeError
from rlwire._frame.bounds import HEAP_FLOOR, HEAP_RATIO, heap_allowance
from rlwire._frame.frame import Frame
from rlwire.codecs._msgpack.cost import WORST_RATIO, plain_cost

__all__ = ["HeapAllowance"]

Data = bytes | memoryview | msgspec.Raw


class HeapAllowance:
    """``limit`` bytes of Python objects that decoding a message of ``stored`` bytes
    may build. Data to decode is charged its worst case (:data:`WORST_RATIO` times its
    size) while that fits, its real cost (:func:`plain_cost`, a walk) once it does not."""

    def __init__(self, limit: int, stored: int) -> None:
        self.limit = self.left = limit
        self.stored = stored
        # Data charged its worst case that stays valid, with that charge: walked for
        # its real cost when worst cases no longer fit.
        self.unsettled: list[tuple[Data, int]] = []

    @classmethod
    def of(cls, frame: Frame) -> HeapAllowance:
        """The allowance of a decode of ``frame``, from the bytes it took where it was
        stored."""
        return cls(heap_allowance(frame), frame.stored_nbytes)

    def charge(self, nbytes: int, what: str) -> None:
        """Take ``nbytes`` of Python objects about to be made (``what``), or refuse them.

        Raises:
            FrameTooLargeError: more than what is left.
        """
        self._settle(nbytes)
        if nbytes > self.left:
            raise FrameTooLargeError(f"header: {what} would build over {self._limit_words()}")
        self.left -= nbytes

    def charge_decode(self, data: Data, *, kept: bool = True, hint: str = "") -> int:
        """Take what decoding ``data`` into plain builtins may build, before it is
        decoded; the bytes charged. ``kept``: ``data`` stays valid after the call, so its
        worst case may be settled later. ``hint`` ends the error's message.

        Raises:
            FrameTooLargeError: its real cost is more than what is left.
        """
        worst = WORST_RATIO * memoryview(data).nbytes
        self._settle(worst)
        if worst <= self.left:
            if kept:
                self.unsettled.append((data, worst))
            self.left -= worst
            return worst
        cost = plain_cost(data, self.left)
        if cost > self.left:
            raise FrameTooLargeError(
                f"header: decoding it would build over {self._limit_words()}: it is made "
                f"of tiny values, such as empty lists or maps{hint}"
            )
        self.left -= cost
        return cost

    def refund(self, data: Data, charged: int) -> None:
        """Give back what decoding ``data`` was charged (what it built is gone)."""
        if self.unsettled and self.unsettled[-1][0] is data:
            self.unsettled.pop()
        self.left += charged

    def _settle(self, needed: int) -> None:
        """Charge what was decoded so far its real cost instead of its worst case, the
        oldest first, until ``needed`` bytes are left (or all is settled): a walk of
        each, never all of them in one go (a message's chunks settled at once held the
        GIL for a quarter of a second)."""
        settled = 0
        for earlier, charged in self.unsettled:
            if needed <= self.left:
                break
            self.left += charged - plain_cost(earlier, self.limit)
            settled += 1
        del self.unsettled[:settled]

    def _limit_words(self) -> str:
        return (
            f"{self.limit >> 20} MiB of Python objects from a message of {self.stored} "
            f"stored bytes (the limit is {HEAP_RATIO} times its stored size + "
            f"{HEAP_FLOOR >> 20} MiB)"
        )
