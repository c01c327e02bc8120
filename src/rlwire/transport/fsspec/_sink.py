"""FsspecSink: writes each step's frames as objects under an fsspec URL."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from anyio import CapacityLimiter

from rlwire._core.args import check_int
from rlwire._core.slicing import Sliced
from rlwire.transport._base import OnExisting
from rlwire.transport._options import SinkOptions, SourceOptions
from rlwire.transport._stored.marks import MAX_MARK_BYTES
from rlwire.transport._stored.sink import StoredSink
from rlwire.transport._url import URL
from rlwire.transport.fsspec._connection import Connection
from rlwire.transport.fsspec._s3_upload import MIN_PART_BYTES, PART_BYTES
from rlwire.transport.fsspec._source import FsspecSource
from rlwire.transport.fsspec._store import Staging

__all__ = ["FsspecSink"]


class FsspecSink(StoredSink):
    """Writes each step's frames as objects under an fsspec URL.

    Works with any fsspec filesystem; S3 (s3fs) gets streamed, concurrent multipart
    uploads. ``storage_options`` go to the filesystem's constructor as fsspec users
    expect (``endpoint_url``, ``key``, ``secret``, ``client_kwargs``, ``anon``, ...);
    s3fs's ``max_concurrency`` also bounds how many upload parts are uploaded at once. On
    S3, rlwire's own ``conditional_writes`` (default True) commits a step's objects and
    seals with ``If-None-Match: *``, never replacing another sender's; False commits
    them unconditionally, for stores that do not implement it. The filesystem is made,
    and the bucket checked, lazily in a worker thread, once.

    Args:
        url: ``protocol://path``, e.g. ``s3://bucket/run-7`` or ``memory://run``.
        storage_options: keyword arguments for the fsspec filesystem.
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
        part_bytes: size of one upload part (at least 5 MiB; grown when an
            object would need more than 10,000 upload parts).
        max_concurrency: upload parts uploaded at once (default: the filesystem's
            ``max_concurrency``, else 8). Memory use is about ``part_bytes`` times this.

    ``fsync`` is meaningless for object stores and ignored: an object is durable once
    the request that makes it visible returns. Every send is committed before it
    returns, so :meth:`close` has nothing to flush; on S3 it aborts the unfinished
    multipart uploads a failed send could not (see :meth:`close`). It does not close
    the filesystem, which fsspec caches and shares within the process.

    Raises:
        ConfigError: a malformed URL, a protocol or package fsspec lacks, or storage
            options the filesystem rejects (when it is first used); a store that does
            not implement conditional writes (501; the message names
            ``conditional_writes``).
        TransportError: the bucket does not exist, or a request fails; the message names
            the URL and what failed. A failed or cancelled send leaves nothing visible.
        StepExistsError: a step exists at the destination, or another sender committed
            the object first (on S3, with conditional writes).

    Example:
        >>> import anyio, rlwire
        >>> async def main() -> int:
        ...     async with rlwire.open_sender("memory://doc-example") as sender:
        ...         return await sender.send(rlwire.TrainingBatch(samples=[]))
        >>> anyio.run(main)
        0
    """

    heads_cheap = True  # resume reads each step's ranks: on S3, many GETs at once

    def __init__(
        self,
        url: str | URL,
        *,
        storage_options: Mapping[str, Any] | None = None,
        checksum: bool = True,
        part_bytes: int = PART_BYTES,
        max_concurrency: int | None = None,
    ) -> None:
        self._conn = Connection(url, storage_options)
        check_int(part_bytes, "part_bytes (S3's minimum part is 5 MiB)", low=MIN_PART_BYTES)
        if max_concurrency is not None:
            check_int(max_concurrency, "max_concurrency", low=1)
        self.url = self._conn.url
        self.checksum = checksum
        self.part_bytes = part_bytes
        self.max_concurrency = max_concurrency

    def __repr__(self) -> str:
        return f"FsspecSink({self.url!r})"

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> FsspecSink:
        return cls(url, storage_options=options.storage_options, checksum=options.checksum)

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> FsspecSource:
        return FsspecSource(
            url,
            rank=options.rank,
            writable=options.writable,
            verify=options.verify,
            poll_interval=options.poll_interval,
            storage_options=options.storage_options,
        )

    async def aopen(
        self, on_existing: OnExisting, limiter: CapacityLimiter, start_step: int | None = None
    ) -> int:
        # Connect in an abandonable thread first: cancelling this open does not wait for
        # a slow first request, and the connection is still made for the next caller.
        await self._conn.aget(limiter)
        return await super().aopen(on_existing, limiter, start_step)

    def close(self) -> None:
        """On S3, if this sink started multipart uploads, list the unfinished ones under
        its root and abort them: a failed send aborts its own, but an outage can keep it
        from doing so, and botocore retrying a request whose reply was lost can start a
        twin that rlwire never hears of. Never raises: what cannot be aborted (S3 still
        out of reach) is reported by a :class:`ResourceWarning`; it is invisible to
        readers, and the next sender opened with ``on_existing="resume"``,
        ``"truncate"`` or ``"overwrite"`` aborts it.
        """
        if not self._conn.connected:
            return
        left = self._conn.get().settle_leftovers()
        if left is not None:
            warnings.warn(
                f"{self.url}: {left}; they are invisible to readers but billed, and the "
                "next sender opened with on_existing='resume', 'truncate' or 'overwrite' "
                "aborts them",
                ResourceWarning,
                stacklevel=2,
            )

    @property
    def stage_verb(self) -> str:
        return self._conn.get().stage_verb

    def locate(self, name: str | None = None) -> str:
        return self.url if name is None else f"{self.url}/{name}"

    def names(self) -> list[str]:
        return self._conn.get().names()

    def load(self, name: str) -> bytes | bytearray | None:
        store = self._conn.get()  # a mark: never more than MAX_MARK_BYTES read
        return store.head(store.path(name), MAX_MARK_BYTES)

    def load_head(self, name: str, size: int) -> bytes | bytearray | None:
        store = self._conn.get()
        return store.head(store.path(name), size)

    def size_of(self, name: str) -> int | None:
        store = self._conn.get()
        return store.size(store.path(name))

    def load_heads(self, names: Sequence[str], size: int) -> list[bytes | Exception | None]:
        store = self._conn.get()
        return store.heads([store.path(name) for name in names], size)

    def save(self, name: str, data: bytes) -> None:
        self._conn.get().save(name, data)

    def remove(self, names: Sequence[str]) -> None:
        self._conn.get().remove(names)

    def existing(self, names: Sequence[str]) -> list[int]:
        store = self._conn.get()
        return store.existing([store.path(name) for name in names])

    def existing_in_slices(self, names: Sequence[str]) -> Sliced[list[int]]:
        store = self._conn.get()
        return (yield from store.existing_in_slices([store.path(name) for name in names]))

    def clean_leftovers(self, names: Sequence[str]) -> None:
        self._conn.get().clean_leftovers(names)

    def staging(self, step: int) -> Staging:
        return self._conn.get().staging(
            part_bytes=self.part_bytes, max_concurrency=self.max_concurrency
        )
