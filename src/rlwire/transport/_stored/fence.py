"""The fence of a stored destination (files, S3 and other fsspec stores): a destination
has one producer, the one that opened it last.

Every open of the destination (whatever its ``on_existing``) writes :data:`FENCE_NAME`,
replacing the one before (a rename into place on files, a plain PUT on S3, each atomic):
a random 16-byte id of that open (docs/format.md, *Marks*). Right before each call that
makes something visible or deletes something (a step's or a part's commit, a seal, the
end mark, ``keep_last``'s prune, the deletions of an overwrite or truncate, and of a
resumed step's leftovers), the sender reads the fence back and, if it is not its own,
refuses with :class:`~rlwire.errors.ClosedError`, what it staged discarded: a producer
still alive after another opened the destination (a hung process that woke up, a
launcher that started a second one) adds nothing to the other's run and deletes none
of its steps. As on ``ray://``, a sender that never opened the destination (fields
appended by ``attach_fields``) is not fenced.

An open with ``"error"`` of a destination that has no fence writes none (that keeps a
new destination as it was, and two such senders race step by step, as before): the
absence is its fence, and any fence written later refuses it.

A store has no compare-and-swap across files: a commit whose read of the fence came
just before another sender's open still lands (docs/reliability.md says how wide that
window is). A missing fence at a check (the sender wrote one when it opened) is refused
too: only something else than a sender of this rlwire (a manual deletion, an rlwire
before fences rewriting the destination) removes it.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable
from typing import Any, Protocol

from rlwire._core.errors import ClosedError, CorruptFrameError
from rlwire.transport._fenced import fenced
from rlwire.transport._stored.layout import check_magic

__all__ = [
    "FENCE_MAGIC",
    "FENCE_NAME",
    "FENCE_VERSION",
    "MODES",
    "Fence",
    "fence_mark",
    "fenced_commit",
    "parse_fence",
]

#: The fence file (object) of a destination: the id of the open that writes it.
FENCE_NAME = "fence.rlw"
FENCE_MAGIC = b"RLWF"
#: 1.7 added the fence.
FENCE_VERSION = (1, 7)
_FENCE = struct.Struct("<4sHH16s")
#: The ``on_existing`` values a fence records (for messages); anything else is unknown.
MODES = ("error", "resume", "overwrite", "truncate")


def fence_mark(token: bytes, on_existing: str) -> bytes:
    """The bytes of a fence: magic, version, the open's 16-byte id ``token``, then its
    ``on_existing`` (ASCII, for messages).

    Example:
        >>> parse_fence(fence_mark(b"0123456789abcdef", "resume"), "doc")
        (b'0123456789abcdef', 'resume')
    """
    return _FENCE.pack(FENCE_MAGIC, *FENCE_VERSION, token) + on_existing.encode("ascii")


def parse_fence(data: bytes | bytearray | memoryview, where: str) -> tuple[bytes, str]:
    """The id and ``on_existing`` a fence (:func:`fence_mark`) records.

    Raises:
        CorruptFrameError: ``data`` is not a fence.
        UnsupportedVersionError: a major version this reader does not know.
    """
    if not _FENCE.size <= len(data) <= _FENCE.size + 16:
        raise CorruptFrameError(
            f"a fence is {_FENCE.size} to {_FENCE.size + 16} bytes, this one {len(data)}",
            where=where,
        )
    found, major, _minor, token = _FENCE.unpack_from(data)
    check_magic(
        found, major, expected=FENCE_MAGIC, known=FENCE_VERSION[0], what="fence", where=where
    )
    return bytes(token), bytes(data[_FENCE.size :]).decode("ascii", "replace")


class _Marks(Protocol):
    def load(self, name: str) -> bytes | bytearray | memoryview | None: ...
    def save(self, name: str, data: bytes) -> None: ...
    def locate(self, name: str | None = None) -> str: ...
    def errors(self, action: str, name: str | None = None) -> Any: ...


class Fence:
    """A sender's fence at ``store``: :meth:`write` when it opens, :meth:`check` before
    each call that changes what readers see. Until written (a sender that never opened
    the destination), :meth:`check` lets everything through."""

    def __init__(self, store: _Marks) -> None:
        self.store = store
        self.token: bytes | None = None

    def write(self, on_existing: str, found: bool) -> None:
        """Fence off every sender that opened the destination before: write a new id.
        An open with ``"error"`` where no fence was ``found`` (a new destination, or one
        only senders of ``"error"`` opened) writes none: this sender then takes the
        fence's absence as its own, and the first fence written refuses it."""
        if on_existing == "error" and not found:
            self.token = b""
            return
        token = os.urandom(16)
        with self.store.errors("fence off the senders before", FENCE_NAME):
            self.store.save(FENCE_NAME, fence_mark(token, on_existing))
        self.token = token

    def check(self, what: str) -> None:
        """Refuse ``what`` if another sender opened the destination since this one did.

        Raises:
            ClosedError: the fence is another open's, or gone; the message says so.
            TransportError: the fence could not be read.
        """
        if self.token is None:
            return
        store = self.store
        with store.errors("read", FENCE_NAME):
            data = store.load(FENCE_NAME)
        if data is None and not self.token:
            return  # none, as when it opened
        if data is not None and bytes(data[:4]) == FENCE_MAGIC and data[8:24] == self.token:
            return
        where = store.locate(FENCE_NAME)
        if data is None:
            raise ClosedError(
                f"cannot {what}: the fence this sender wrote when it opened the destination "
                f"({FENCE_NAME}) is gone: something other than an rlwire sender (a manual "
                "deletion, an rlwire before fences rewriting it) changed the destination, "
                "whose steps may no longer be this run's; nothing of this call was stored; "
                "stop this producer, or open a sender again",
                where=where,
            )
        _token, mode = parse_fence(data, where)
        raise ClosedError(fenced(what, mode if mode in MODES else None), where=where)

    def checking(self, what: str) -> Callable[[], None] | None:
        """What checks the fence for ``what`` (``None`` while nothing is fenced)."""
        if self.token is None:
            return None
        return lambda: self.check(what)


def fenced_commit(commit: Callable[[Any], None]) -> Callable[[Any], None]:
    """``commit`` (a staging's) preceded by the check of its ``fence``, if it has one:
    refused, it discards everything staged and nothing becomes visible."""

    @functools.wraps(commit)
    def checked(self: Any) -> None:
        if self.fence is not None:
            try:
                self.fence()
            except BaseException:
                self.discard()
                raise
        commit(self)

    return checked
