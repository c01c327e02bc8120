"""Reading an S3 object by byte ranges, for partial reads (``fields=``): one GET of its
first bytes (the prelude, the envelope, usually the codec header, and the object's size
from ``Content-Range``), then only the ranges asked for, neighbours coalesced, large ones
fetched several pieces at once, every GET pinned to the first one's version
(``If-Match``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rlwire._core.errors import CorruptFrameError, RlwireError, transport_error
from rlwire.transport._stored.selected import HEAD_BYTES, Ranged

if TYPE_CHECKING:
    from rlwire.transport.fsspec._s3_bucket import S3Bucket

__all__ = [
    "GAP_BYTES",
    "READ_BYTES",
    "S3Ranged",
    "coalesced",
    "gather_or_cancel",
    "open_ranged",
    "total_size",
]

T = TypeVar("T")
#: Bytes per ranged GET when reading large objects, several at once.
READ_BYTES = 8 << 20
#: Ranges this close are fetched as one: a GET costs more than this many bytes.
GAP_BYTES = 64 << 10


async def gather_or_cancel(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """``asyncio.gather``, cancelling the rest as soon as one fails."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def total_size(content_range: str | None, got: int) -> int:
    """The object size from a ``Content-Range: bytes a-b/size`` header."""
    if content_range and "/" in content_range:
        size = content_range.rpartition("/")[2]
        if size.isdigit():
            return int(size)
    return got


def coalesced(ranges: Sequence[tuple[int, int]], gap: int = GAP_BYTES) -> list[tuple[int, int]]:
    """``ranges`` sorted and merged where they overlap or lie less than ``gap`` apart.

    Example:
        >>> coalesced([(200, 300), (0, 100), (100, 150)], gap=10)
        [(0, 150), (200, 300)]
    """
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class S3Ranged(Ranged):
    """An S3 object whose first bytes were fetched; the rest by ranged GETs."""

    def __init__(self, store: S3Bucket, path: str, first: bytes, size: int, etag: Any) -> None:
        self.store = store
        self.path = path
        self.first = memoryview(first)
        self.size = size
        self.etag = etag

    def head(self) -> memoryview:
        return self.first

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        held = self.first.nbytes
        spans = coalesced([r for r in ranges if r[1] > held])
        try:
            blocks = self.store.run_read(self._fetch_all, spans) if spans else []
        except RlwireError:
            raise
        except Exception as exc:
            raise transport_error(exc, "read", where=self.path) from exc
        out = []
        for start, end in ranges:
            if end <= held:
                out.append(self.first[start:end])
                continue
            for (s, e), block in zip(spans, blocks, strict=True):
                if s <= start and end <= e:
                    out.append(block[start - s : end - s])
                    break
        return out

    async def _fetch_all(self, spans: list[tuple[int, int]]) -> list[memoryview]:
        blocks = [bytearray(end - start) for start, end in spans]
        sem = asyncio.Semaphore(self.store.concurrency())
        jobs = [
            self._fetch(sem, block, s, piece, min(piece + READ_BYTES, e))
            for (s, e), block in zip(spans, blocks, strict=True)
            for piece in range(s, e, READ_BYTES)
        ]
        await gather_or_cancel(jobs)
        return [memoryview(b).toreadonly() for b in blocks]

    async def _fetch(
        self, sem: asyncio.Semaphore, block: bytearray, base: int, start: int, end: int
    ) -> None:
        bucket, key = self.store.bucket_key(self.path)
        extra = {"IfMatch": self.etag} if self.etag else {}
        async with sem:
            resp = await self.store.fs._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
            )
            try:
                data = await resp["Body"].read()
            finally:
                resp["Body"].close()
        if len(data) != end - start:
            name = key.rpartition("/")[2]
            raise CorruptFrameError(f"{self.store.url}/{name}: short read at offset {start}")
        block[start - base : end - base] = data


async def _open(store: S3Bucket, path: str) -> S3Ranged | None:
    bucket, key = store.bucket_key(path)
    try:
        resp = await store.fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{HEAD_BYTES - 1}"
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        if "InvalidRange" in str(exc) or "not satisfiable" in str(exc).lower():
            name = key.rpartition("/")[2]
            raise CorruptFrameError(f"{store.url}/{name}: empty object") from exc
        raise
    try:
        first: bytes = await resp["Body"].read()
    finally:
        resp["Body"].close()
    size = total_size(resp.get("ContentRange"), len(first))
    return S3Ranged(store, path, first, size, resp.get("ETag"))


def open_ranged(store: S3Bucket, path: str) -> S3Ranged | None:
    """The object at ``path``, its first :data:`HEAD_BYTES` fetched; ``None`` if it does
    not exist.

    Raises:
        CorruptFrameError: the object is empty.
    """
    return store.run_read(_open, store, path)
