"""StepHandle: a committed step of a ``ray://`` destination, small enough to pass around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["StepHandle"]


@dataclass(frozen=True)
class StepHandle:
    """Names one rank's message of a committed step on a ``ray://NAME`` destination:
    a few plain values that a driver passes in actor calls (Ray pickles them; the step's
    bytes stay in the object store and go straight to the trainer's node). The trainer
    opens it with the receiver API.

    Attributes:
        name: the destination's NAME.
        namespace: the Ray namespace of its board (``None``: the job's own).
        step: the step.
        rank: the rank whose message it names.
        board: the id of the board that holds the step ("": not checked). A receiver
            opened with :meth:`receiver_options` reads that board only: if it died, and
            the step with it, opening raises a ``TransportError``, also when a new board
            holds the name (another run's steps, never this handle's).

    Example:
        >>> handle = StepHandle("rollouts", None, step=7, rank=1)
        >>> handle.url, handle.receiver_options()["start_step"]
        ('ray://rollouts', 7)

        and in the trainer actor::

            with rlwire.open_receiver(handle.url, **handle.receiver_options()) as rx:
                batch = await rx.areceive()
    """

    name: str
    namespace: str | None
    step: int
    rank: int = 0
    board: str = ""

    @property
    def url(self) -> str:
        """The destination's URL, for ``open_receiver``."""
        return f"ray://{self.name}"

    def receiver_options(self) -> dict[str, Any]:
        """The keyword arguments of ``open_receiver(handle.url, ...)`` that read this
        step first, as this rank, from this board."""
        storage: dict[str, str] = {} if self.namespace is None else {"namespace": self.namespace}
        if self.board:
            storage["board"] = self.board
        return {"rank": self.rank, "start_step": self.step, "storage_options": storage}
