"""SyncStepWriter: the blocking face of a :class:`~rlwire.StepWriter`, as
:class:`~rlwire.SyncSender` is of a sender."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from rlwire._api.step_writer import StepWriter
from rlwire._core.columns import Columns
from rlwire.transport._parts import Key

__all__ = ["SyncStepWriter"]


class SyncStepWriter:
    """A :class:`StepWriter` for synchronous code, made by
    :meth:`~rlwire.SyncSender.open_step` and used as ``with``; each method runs the
    async writer's on the sender's event-loop thread and waits for it.

    Example:
        >>> import rlwire, tempfile
        >>> with rlwire.open_sync_sender(tempfile.mkdtemp()) as sender:
        ...     with sender.open_step() as writer:
        ...         writer.put([], key=1)
        False
    """

    def __init__(self, writer: StepWriter, call: Callable[..., Any]) -> None:
        self._writer = writer
        self._call = call

    def __repr__(self) -> str:
        return f"Sync{self._writer!r}"

    @property
    def step(self) -> int:
        """The step being filled (known once entered)."""
        return self._writer.step

    @property
    def assignment(self) -> tuple[tuple[Key, ...], ...]:
        """As :attr:`StepWriter.assignment`."""
        return self._writer.assignment

    @property
    def resumed(self) -> frozenset[Key]:
        """As :attr:`StepWriter.resumed`."""
        return self._writer.resumed

    def __enter__(self) -> SyncStepWriter:
        self._call(self._writer.__aenter__)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._call(self._writer.__aexit__, exc_type, exc, tb)

    def put(self, samples: Sequence[Any] | Columns, *, key: Key, rank: int | None = None) -> bool:
        """As :meth:`StepWriter.put`, blocking."""
        return bool(self._call(self._writer.put, samples, key=key, rank=rank))

    def seal(self) -> None:
        """As :meth:`StepWriter.seal`, blocking."""
        self._call(self._writer.seal)
