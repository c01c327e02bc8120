"""The parts of a step a sender takes as its own when it opens the step part by part
(``open_step``): those it put itself (an earlier writer of the step, left open by an
error), and, opened with ``on_existing="resume"``, every part of the step its open
went on at (a killed producer's, whose later calls that open fenced off). Any other
part is another producer's, put beside this one after it opened the destination (two
senders opened with ``"error"`` on a new destination are not fenced from each other):
taking it would seal a mix of two producers' parts, so the step is refused
(docs/reliability.md, "Two producers on one store").
"""

from __future__ import annotations

from collections.abc import Sequence

from rlwire._core.errors import ConfigError, StepExistsError
from rlwire.transport._parts import Key, PartInfo

__all__ = ["OwnedParts"]

_Place = tuple[int, int, type, Key]  # rank, index, and the key told apart by its type


def _place(info: PartInfo) -> _Place:
    return (info.rank, info.index, type(info.key), info.key)


class OwnedParts:
    """A sender's record of the parts it may take as its own, for the step it fills."""

    def __init__(self) -> None:
        self._on_existing = "error"
        self._resumed: int | None = None  # the step a sender opened with "resume" went on at
        self._step: int | None = None
        self._places: set[_Place] = set()

    def opened(self, on_existing: str, step: int) -> None:
        """The sender opened the destination with ``on_existing``, to go on at ``step``."""
        self._on_existing = on_existing
        self._resumed = step if on_existing == "resume" else None

    def put(self, step: int, info: PartInfo) -> None:
        """The sender committed ``info`` to ``step``, or may have (a commit left undecided)."""
        if self._step != step:
            self._step, self._places = step, set()
        self._places.add(_place(info))

    def holds(self, step: int) -> bool:
        """Whether something of ``step`` in the store may be this sender's."""
        return step == self._resumed or (step == self._step and bool(self._places))

    def learn(
        self, step: int, ranks: int, found: Sequence[PartInfo], where: object
    ) -> list[PartInfo]:
        """``found`` (the parts of ``step`` in the store) in rank and index order, each
        one this sender may take as its own.

        Raises:
            ConfigError: a part is for a rank beyond ``ranks``.
            StepExistsError: a part is another producer's; the message names it.
        """
        parts = sorted(found, key=lambda p: (p.rank, p.index))
        mine = self._places if step == self._step else set()
        for info in parts:
            if info.rank >= ranks:
                raise ConfigError(
                    f"step {step} holds parts for rank {info.rank}, but it was opened "
                    f"with ranks={ranks}: open it with the ranks it was begun with"
                )
            if step != self._resumed and _place(info) not in mine:
                raise StepExistsError(
                    f"{info.named(step)} was put by another producer, after this sender "
                    f"opened the destination (on_existing={self._on_existing!r}): the step "
                    "is that producer's to fill and seal, and this sender takes none of it "
                    "(rlwire does not coordinate producers: give each its own destination; "
                    "a producer restarted after a crash opens with on_existing='resume')",
                    where=where,
                    step=step,
                )
        return parts
