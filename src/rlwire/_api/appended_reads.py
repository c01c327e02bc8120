"""The messages of fields appended to a step, as a receiver reads them
(:func:`~rlwire._api.appending.read_with_appended`), and what it keeps of them while it
waits for a field none of them holds yet.

A receiver opened with ``fields=`` reads whole each appended message that holds some
of its fields, and no further than its head each one that holds none. While it waits
for a field (another stage has not appended it yet), it polls: each poll would read
again, whole, every message holding one of its other fields (a 400 MB field appended
by one stage, read again every poll while the receiver waits for a critic's field).
So the columns read of a step are kept, by the id of their message, while the
receiver waits on that step: a message whose head shows a kept id is read no further
(a message is never written again under its id; a step sent again has messages of
other ids). They go once the step is returned, or another is read.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

from rlwire._api.appended_rows import decode_appended
from rlwire._api.decoding import FrameDecoding
from rlwire._api.fields import AppendedSelector
from rlwire._core.columns import Column
from rlwire.transport._base import Source

__all__ = ["AppendedRead", "forget", "keep", "read_appended"]


class AppendedRead(NamedTuple):
    """What :func:`read_appended` read: how many messages are appended, the columns of
    those it read (or kept), the bytes of those, and each one's columns and bytes by
    its message's id (what :func:`keep` keeps)."""

    messages: int
    columns: dict[str, Column]
    nbytes: int
    by_id: dict[bytes, tuple[dict[str, Column], int]]


#: Per source (a receiver's): the step it waits on, and the columns kept of its
#: messages by id.
_kept: weakref.WeakKeyDictionary[Source, tuple[int, dict[bytes, Any]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def read_appended(
    source: Source, step: int, fields: frozenset[str] | None, decoding: FrameDecoding
) -> AppendedRead:
    """How many messages of fields are appended to ``step``, their columns (with
    ``fields``, those of the messages holding some of them: the others' buffers go
    unread, and so do those of a message kept while the receiver waited on ``step``),
    and the bytes of those that hold columns returned, as read."""
    with _lock:
        held = _kept.get(source)
    kept: dict[bytes, Any] = held[1] if held is not None and held[0] == step else {}
    select = source.select
    if fields is not None:
        source.select = AppendedSelector(decoding, fields, kept)
    try:
        frames = source.read_appended(step)
    finally:
        source.select = select
    appended: dict[str, Column] = {}
    by_id: dict[bytes, tuple[dict[str, Column], int]] = {}
    nbytes = 0
    for frame in frames:
        if frame.message_id in kept:
            columns, size = kept[frame.message_id]
        elif not (fields is not None and frame.missing):  # else a message of other fields
            columns = dict(decode_appended(frame, decoding).items())
            size = frame.nbytes  # (buffers a selection left unread are empty)
        else:
            continue
        appended.update(columns)
        nbytes += size
        if frame.message_id:
            by_id[frame.message_id] = (columns, size)
    return AppendedRead(len(frames), appended, nbytes, by_id)


def keep(source: Source, step: int, read: AppendedRead) -> None:
    """The receiver of ``source`` waits on ``step``: keep what ``read`` read of it, for
    its next poll."""
    with _lock:
        _kept[source] = (step, read.by_id)


def forget(source: Source) -> None:
    """The receiver of ``source`` waits no more: what was kept goes."""
    with _lock:
        _kept.pop(source, None)
