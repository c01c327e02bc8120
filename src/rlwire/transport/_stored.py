"""StoredSource: the reading side shared by stores that keep each step's messages as
named parts (files or objects) in rlwire's layout."""

from __future__ import annotations

import abc

from ..errors import CorruptFrameError
from ..frame import Frame
from ._base import Source
from ._layout import parse_main
from ._names import main_name, sidecar_name

__all__ = ["StoredSource"]


class StoredSource(Source):
    """Reads step ``s`` of :attr:`rank` from the parts named ``main_name(s, rank)`` and,
    when the message has one, ``sidecar_name(s, rank)``, as views over what
    :meth:`load` returns.

    Subclasses set :attr:`rank` and :attr:`verify` and provide :meth:`load` and
    :meth:`locate`.
    """

    rank: int
    verify: bool

    @abc.abstractmethod
    def load(self, name: str) -> memoryview | None:
        """The whole part called ``name``, or ``None`` if it does not exist (yet).

        Raises:
            CorruptFrameError: the part exists but cannot be a message (e.g. empty).
            TransportError: the part cannot be read.
        """

    @abc.abstractmethod
    def locate(self, name: str) -> str:
        """Where the part called ``name`` lives (a path or URL), for error messages."""

    def describe(self, step: int) -> str:
        return self.locate(main_name(step, self.rank))

    def read(self, step: int) -> Frame | None:
        name = main_name(step, self.rank)
        data = self.load(name)
        if data is None:
            return None

        def load_sidecar() -> memoryview:
            side = sidecar_name(step, self.rank)
            view = self.load(side)
            if view is None:
                raise CorruptFrameError(
                    "missing; the main part refers to it", where=self.locate(side)
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
