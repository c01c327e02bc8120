"""What every sink and source provides. Transport never imports codecs."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Literal

from .._pieces import Pieces
from ..frame import Frame

__all__ = ["OnExisting", "Sink", "Source", "Staged"]

#: What a sink does with steps that already exist at its destination when it opens.
OnExisting = Literal["error", "overwrite", "resume"]


class Staged(abc.ABC):
    """A step written in full but not yet visible to any reader."""

    #: True once any rank's main message may be visible to readers. A sender then counts
    #: the step as used even if :meth:`commit` fails, so a retry never reuses its number.
    visible: bool = False

    @abc.abstractmethod
    def commit(self) -> None:
        """Make the step visible to readers: sidecars first, main messages last, with
        everything that can fail routinely done before the first main message appears.
        Short: safe to run shielded.

        Raises:
            TransportError: the step could not be committed; :attr:`visible` says whether
                some ranks can nevertheless see it.
        """

    @abc.abstractmethod
    def discard(self) -> None:
        """Remove everything staged; the step never becomes visible."""


class Sink(abc.ABC):
    """Moves frames to a destination, one step (one frame per rank) at a time.

    Blocking methods are called from worker threads.
    """

    @abc.abstractmethod
    def open(self, on_existing: OnExisting) -> int:
        """Prepare the destination and return the first step a new sender should use.

        Raises:
            TransportError: the destination cannot be written.
        """

    @abc.abstractmethod
    def stage(self, step: int, frames: Sequence[Frame]) -> Pieces[Staged]:
        """Write ``frames[rank]`` for every rank of ``step`` where readers cannot see
        them yet. If the generator is closed before it returns, nothing is left behind.

        Raises:
            StepExistsError: the step exists at the destination.
            TransportError: the destination cannot be written.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Sinks that hold none need not override this."""


class Source(abc.ABC):
    """Reads the frames a :class:`Sink` wrote, for one rank."""

    @abc.abstractmethod
    def read(self, step: int) -> Frame | None:
        """Return the frame of ``step`` if it is complete, else ``None``; never blocks
        waiting for it.

        Raises:
            CorruptFrameError: the stored data is truncated or garbled.
        """

    def describe(self, step: int) -> str:
        """Names the message of ``step`` in error messages (e.g. its path)."""
        return f"{self!r}: step {step}"

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Sources that hold none need not override this."""
