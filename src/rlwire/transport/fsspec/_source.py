"""FsspecSource: reads, for one rank, the objects an FsspecSink wrote."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlwire._frame.frame import Frame
from rlwire.transport._parts import PartInfo
from rlwire.transport._stored.marks import too_long
from rlwire.transport._stored.names import part_name
from rlwire.transport._stored.parts import part_zero_id
from rlwire.transport._stored.selected import Ranged, WholeFile
from rlwire.transport._stored.source import StoredSource
from rlwire.transport._url import URL
from rlwire.transport.fsspec._connection import Connection, translate_errors

__all__ = ["MAX_POLL_INTERVAL", "FsspecSource"]

#: Longest wait between two polls of a remote store, however long nothing arrives.
MAX_POLL_INTERVAL = 1.0


class FsspecSource(StoredSource):
    """Reads the objects an :class:`~rlwire.transport.fsspec.FsspecSink` wrote, for one rank.

    Each read is one GET of the main object (S3: ranged GETs, several at once, for
    large objects, straight into one buffer) and, if the message has one, of its
    sidecar; arrays are views over those buffers. While nothing arrives, polls back off
    from ``poll_interval`` to ``max_poll_interval`` (doubling), and return to
    ``poll_interval`` after each message, so idle receivers do not hammer the store.

    Args:
        url: the URL the sink writes to.
        rank: the data-parallel rank to read.
        writable: return writable buffers (bytearrays, never shared).
        verify: check every segment against its recorded checksum.
        poll_interval: seconds before the first re-check after a miss.
        storage_options: keyword arguments for the fsspec filesystem.
        max_poll_interval: the longest wait between checks (in-memory stores: no back-off).

    Raises:
        CorruptFrameError: a stored message is truncated or garbled, or its sidecar is
            missing.
        TransportError: a request fails (the message names the object).

    Example:
        >>> source = FsspecSource("memory://doc-empty")
        >>> source.read(0) is None
        True
    """

    def __init__(
        self,
        url: str | URL,
        *,
        rank: int = 0,
        writable: bool = False,
        verify: bool = True,
        poll_interval: float = 0.01,
        storage_options: Mapping[str, Any] | None = None,
        max_poll_interval: float = MAX_POLL_INTERVAL,
    ) -> None:
        self._conn = Connection(url, storage_options)
        self.url = self._conn.url
        self.rank = rank
        self.writable = writable
        self.verify = verify
        self.poll_interval = poll_interval
        self.max_poll_interval = (
            poll_interval if self._conn.local else max(poll_interval, max_poll_interval)
        )
        self._interval = poll_interval  # the wait after the latest miss
        self._next_interval = poll_interval

    def __repr__(self) -> str:
        return f"FsspecSource({self.url!r}, rank={self.rank})"

    @property
    def interval(self) -> float:
        """The wait before the next check: grows while nothing arrives."""
        return self._interval

    def locate(self, name: str) -> str:
        return f"{self.url}/{name}"

    def save(self, name: str, data: bytes) -> None:
        with translate_errors(self.locate(name), "record what this rank consumed"):
            self._conn.get().save(name, data)

    def listed(self) -> list[str] | None:
        with translate_errors(self.url, "list"):
            return self._conn.get().names()

    def read(self, step: int) -> Frame | None:
        frame = super().read(step)
        self._back_off(frame is None)
        return frame

    def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
        got = super().read_part(step, index)
        self._back_off(got is None)
        return got

    def _back_off(self, missed: bool) -> None:
        """Wait longer after a miss, up to ``max_poll_interval``; not after a hit."""
        if missed:
            self._interval = self._next_interval
            self._next_interval = min(self._next_interval * 2, self.max_poll_interval)
        else:
            self._interval = self._next_interval = self.poll_interval

    def open_ranged(self, name: str) -> Ranged | None:
        if self.writable:  # writable buffers are copies anyway: read whole
            return super().open_ranged(name)
        return self.open_head(name)

    def open_ranged_sidecar(self, name: str, size: int) -> Ranged | None:
        if self.writable:
            view = self.load_sidecar(name, size)
            return None if view is None else WholeFile(view)
        store = self._conn.get()
        with translate_errors(self.locate(name), "read"):
            return store.ranged(store.path(name), size)

    def first_part(self, step: int) -> bytes | None:
        # By its first bytes: a generic store's open_head reads an object whole.
        store, name = self._conn.get(), part_name(step, self.rank, 0)
        with translate_errors(self.locate(name), "read"):
            return part_zero_id(
                lambda size: store.head(store.path(name), size), self.rank, self.locate(name)
            )

    def open_head(self, name: str) -> Ranged | None:
        store = self._conn.get()
        with translate_errors(self.locate(name), "read"):
            return store.ranged(store.path(name))

    def load_mark(self, name: str, limit: int, what: str) -> bytes | None:
        """One ranged read of at most ``limit + 1`` bytes; more is refused, its size
        asked for the message (a HEAD)."""
        store, where = self._conn.get(), self.locate(name)
        with translate_errors(where, "read"):
            data = store.head(store.path(name), limit + 1)
            if data is not None and len(data) > limit:
                raise too_long(what, store.size(store.path(name)), limit, where)
        return data

    def load(self, name: str) -> memoryview | None:
        return self.load_sidecar(name, None)

    def load_sidecar(self, name: str, size: int | None) -> memoryview | None:
        store = self._conn.get()
        with translate_errors(self.locate(name), "read"):
            data = store.get(store.path(name), size)
        if data is None:
            return None
        if self.writable:
            return memoryview(data if isinstance(data, bytearray) else bytearray(data))
        return memoryview(data).toreadonly()
