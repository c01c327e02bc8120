"""StoredSource: the reading side shared by stores that keep each step's messages as
named files (or objects) in rlwire's layout."""

from __future__ import annotations

import abc

from rlwire._core.errors import CorruptFrameError, EndOfStream
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._stored.layout import parse_main
from rlwire.transport._stored.marks import END_MAGIC, consumed_mark, parse_mark
from rlwire.transport._stored.names import END_NAME, consumed_name, main_name, sidecar_name

__all__ = ["StoredSource"]


class StoredSource(Source):
    """Reads step ``s`` of ``rank`` from the files named ``main_name(s, rank)`` and,
    when the message has one, ``sidecar_name(s, rank)``, as views over what
    :meth:`load` returns.

    Subclasses set ``rank`` and ``verify`` and provide :meth:`load`,
    :meth:`save` and :meth:`locate`.
    """

    rank: int
    verify: bool

    @abc.abstractmethod
    def load(self, name: str) -> memoryview | None:
        """The whole file called ``name``, or ``None`` if it does not exist (yet).

        Raises:
            CorruptFrameError: the file exists but cannot be a message (e.g. empty).
            TransportError: the file cannot be read.
        """

    @abc.abstractmethod
    def save(self, name: str, data: bytes) -> None:
        """Write the small file ``name`` so that it appears whole, replacing any.

        Raises:
            TransportError: the file cannot be written.
        """

    def mark_consumed(self, next_step: int) -> None:
        self.save(consumed_name(self.rank), consumed_mark(next_step))

    @abc.abstractmethod
    def locate(self, name: str) -> str:
        """Where the file called ``name`` lives (a path or URL), for error messages."""

    def check_end(self, step: int) -> None:
        """Raise :class:`~rlwire.EndOfStream` if the sender finished before ``step``.
        Called only when ``step`` is missing: the mark is written after the last step."""
        mark = self.load(END_NAME)
        if mark is None:
            return
        where = self.locate(END_NAME)
        end = parse_mark(mark, END_MAGIC, where)
        if step >= end:
            raise EndOfStream.at(end, where=where)

    def describe(self, step: int) -> str:
        return self.locate(main_name(step, self.rank))

    def read(self, step: int) -> Frame | None:
        name = main_name(step, self.rank)
        data = self.load(name)
        if data is None:
            self.check_end(step)
            return None

        def load_sidecar() -> memoryview:
            side = sidecar_name(step, self.rank)
            view = self.load(side)
            if view is None:
                raise CorruptFrameError(
                    "missing; the main file refers to it", where=self.locate(side)
                )
            return view

        return parse_main(
            data,
            step=step,
            rank=self.rank,
            load_sidecar=load_sidecar,
            where=self.locate(name),
            verify=self.verify,
        )
