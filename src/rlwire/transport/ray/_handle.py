"""StepHandle: a committed step of a ``ray://`` destination, small enough to pass around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlwire._core.errors import ConfigError

__all__ = ["Commits", "StepHandle"]

#: How many of its latest commits a sink remembers for its handles.
_REMEMBERED = 4096


class Commits:
    """The tokens of the steps a sink committed (or sealed), the latest
    :data:`_REMEMBERED`, for the handles it makes."""

    def __init__(self) -> None:
        self._tokens: dict[int, tuple[str, int]] = {}  # step -> (token, ranks)

    def remember(self, step: int, token: str, ranks: int) -> None:
        self._tokens.pop(step, None)
        self._tokens[step] = (token, ranks)
        if len(self._tokens) > _REMEMBERED:
            del self._tokens[next(iter(self._tokens))]

    def token(self, step: int, rank: int, where: str) -> str:
        """The token of ``step``'s commit, ``""`` when this sink did not make it.

        Raises:
            ConfigError: this sink committed ``step`` with no message for ``rank`` (a
                handle of it would wait for ever); nothing is known of other sinks' steps.
        """
        token, ranks = self._tokens.get(step, ("", None))
        if ranks is not None and not 0 <= rank < ranks:
            raise ConfigError(
                f"step {step} was sent to {ranks} rank(s), 0 to {ranks - 1}: no message "
                f"of rank {rank} to make a handle of",
                where=where,
            )
        return token


@dataclass(frozen=True)
class StepHandle:
    """Names one rank's message of a committed step on a ``ray://NAME`` destination:
    a few plain values that a driver passes in actor calls (Ray pickles them; the step's
    bytes stay in the object store and go straight to the trainer's node). The trainer
    opens it with the receiver API.

    Attributes:
        name: the destination's NAME.
        namespace: the Ray namespace of its board (``None``: the opening job's own);
            a sink's handles name it, also when it is the sending job's own.
        step: the step.
        rank: the rank whose message it names.
        board: the id of the board that holds the step ("": not checked). A receiver
            opened with :meth:`receiver_options` reads that board only: if it died, and
            the step with it, opening raises a ``TransportError``, also when a new board
            holds the name (another run's steps, never this handle's).
        commit: the token of the step's commit (or seal) on that board ("": not
            checked, nor when ``board`` is ""). The step deleted since
            (``"overwrite"``, ``"truncate"``, ``keep_last``), sent again (another
            commit) or not yet, raises a ``TransportError`` (a ``StepGapError`` when a
            later step is kept), never another run's message under the step's number
            nor a wait for one.

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
    commit: str = ""

    @property
    def url(self) -> str:
        """The destination's URL, for ``open_receiver``."""
        return f"ray://{self.name}"

    def receiver_options(self) -> dict[str, Any]:
        """The keyword arguments of ``open_receiver(handle.url, ...)`` that read this
        step first, as this rank, from this board."""
        storage: dict[str, Any] = {} if self.namespace is None else {"namespace": self.namespace}
        if self.board:
            storage["board"] = self.board
            if self.commit:  # a commit of that board: unchecked with the board
                storage["commit"] = (self.step, self.commit)
        return {"rank": self.rank, "start_step": self.step, "storage_options": storage}
