"""The end mark at a stored sink (docs/format.md, *Marks*): ``finish()`` writes it, and
a sender opened with ``on_existing="resume"`` that finds it leaves it until that sender
makes something new visible (a step's or a part's commit, a seal). The resumed open
deleted it: a sender that closed, or was killed, before sending anything left a finished
run without its end, so receivers short of it waited for ever instead of raising
:class:`~rlwire.EndOfStream`, and the next ``"resume"`` went on after the last stored
step, not at the end the run recorded (a truncate to a far ``start_step``, then
``finish()``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from rlwire.transport._stored import parts as stored_parts
from rlwire.transport._stored.fence import Fence
from rlwire.transport._stored.marks import end_mark
from rlwire.transport._stored.names import END_NAME

__all__ = ["EndedSink"]


class _Store(Protocol):
    unsealed_step: int | None
    fence: Fence

    def save(self, name: str, data: bytes) -> None: ...
    def remove(self, names: Sequence[str]) -> None: ...
    def locate(self, name: str | None = None) -> str: ...
    def errors(
        self, action: str, name: str | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


class EndedSink:
    """The part of a stored sink that writes the end mark, and keeps the one a resumed
    open found until its first commit, seal or ``finish()``."""

    #: Whether the open (``"resume"``) found an end mark, still there.
    end_kept: bool = False

    def finish(self, end: int) -> None:
        store = cast(_Store, self)
        stored_parts.check_end(end, store.unsealed_step, store.locate(END_NAME))
        store.fence.check(f"mark the end of the stream at step {end}")
        with store.errors("mark the end of the stream", END_NAME):
            store.save(END_NAME, end_mark(end))
        self.end_kept = False

    def keep_end(self, names: Sequence[str], resumed: bool) -> Callable[[str], bool]:
        """Note whether a resumed open found the end mark among ``names``; what tells
        the names its deletions skip (the end mark, kept)."""
        self.end_kept = resumed and END_NAME in names
        return lambda name: self.end_kept and name == END_NAME

    def reopen_end(self, what: str) -> None:
        """Delete the end mark kept (:meth:`keep_end`), right before ``what`` makes the
        first new step, part or seal visible: left there, it would end a receiver past
        that step. The caller has checked the fence.

        Raises:
            TransportError: it cannot be deleted; nothing of ``what`` was done.
        """
        if self.end_kept:
            store = cast(_Store, self)
            with store.errors(f"reopen the ended stream to {what}", END_NAME):
                store.remove([END_NAME])
            self.end_kept = False

    def before_commit(self, what: str) -> Callable[[], None] | None:
        """What a staging calls before its commit (``what``): the fence's check, then,
        while the end mark is kept, :meth:`reopen_end`."""
        check = cast(_Store, self).fence.checking(what)
        if check is None or not self.end_kept:
            return check

        def committing() -> None:
            check()
            self.reopen_end(what)

        return committing
