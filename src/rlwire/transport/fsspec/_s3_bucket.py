"""What the S3 store and its uploads share: the bucket, its keys, and requests waited
for on fsspec's I/O loop (through :func:`fsspec.asyn.sync`, which a worker thread can be
interrupted in)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from rlwire._core.offload import Abandoned, abandoned
from rlwire._core.slicing import Sliced
from rlwire.transport.fsspec._store import Store

__all__ = ["S3Bucket"]

T = TypeVar("T")


class S3Bucket(Store):
    """An S3 bucket (or a key prefix in one) through s3fs's async client.

    Requests run on fsspec's I/O loop; blocking methods wait for them from the calling
    worker thread (:meth:`run`).
    """

    #: How many of the newest keys a store keeps that it started multipart uploads
    #: for (a bound on its memory over a long run; older leftovers wait for the next
    #: sender opened to resume, truncate or overwrite, or a bucket lifecycle rule).
    KEPT_UPLOAD_KEYS = 1024
    #: Commit a step's files and seals with ``If-None-Match: *`` (never replacing an
    #: object); the storage option ``conditional_writes`` turns it off.
    conditional = True

    def __init__(self, fs: Any, url: str, root: str) -> None:
        super().__init__(fs, url, root)
        #: The keys a staging here started multipart uploads for (and so may have left
        #: one of, after a lost reply or an abort that failed), newest last: what the
        #: store aborts when its sink closes; never another writer's upload.
        self.upload_keys: dict[str, None] = {}

    def started_upload(self, key: str) -> None:
        """Record that a staging starts a multipart upload of ``key``."""
        keys = self.upload_keys
        keys.pop(key, None)
        keys[key] = None
        if len(keys) > self.KEPT_UPLOAD_KEYS:
            del keys[next(iter(keys))]

    @staticmethod
    def serves(fs: Any) -> bool:
        """True if ``fs`` is an s3fs filesystem whose async client rlwire can call."""
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        return "s3" in protocols and hasattr(fs, "_call_s3")

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """fsspec's I/O loop, where s3fs's requests run."""
        loop: asyncio.AbstractEventLoop = self.fs.loop
        return loop

    @property
    def bucket(self) -> str:
        """The bucket's name."""
        return self.root.partition("/")[0]

    @staticmethod
    def bucket_key(path: str) -> tuple[str, str]:
        """``(bucket, key)`` of a filesystem path."""
        bucket, _, key = path.partition("/")
        return bucket, key

    def concurrency(self, requested: int | None = None) -> int:
        """Requests in flight at once: ``requested``, else s3fs's ``max_concurrency``."""
        return max(1, requested or int(getattr(self.fs, "max_concurrency", 8)))

    def run(self, func: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """``await func(*args, **kwargs)`` on fsspec's I/O loop, from this thread."""
        from fsspec.asyn import sync

        result: T = sync(self.loop, func, *args, **kwargs)
        return result

    def run_read(self, func: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
        """:meth:`run` for a read, which gives up when the receive (or other call) whose
        worker-thread trip it runs in is cancelled (:func:`~rlwire._core.offload.abandoned`,
        asked every 50 ms): a download of a large step, or a GET that hangs, stops at the
        caller's deadline instead of at its end. Nothing a read does needs undoing."""
        fut = asyncio.run_coroutine_threadsafe(func(*args, **kwargs), self.loop)
        try:
            while not fut.done():
                concurrent.futures.wait([fut], timeout=0.05)
                if not fut.done() and abandoned():
                    raise Abandoned(f"a read from {self.url} whose caller was cancelled")
            return fut.result()
        finally:
            fut.cancel()

    def run_in_slices(
        self, func: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any
    ) -> Sliced[T]:
        """:meth:`run`, waited for 50 ms at a time between slices: a send cancelled
        meanwhile (its generator closed) cancels the request instead of waiting for its
        reply, which a stalled connection gives only at botocore's read timeout."""
        fut = asyncio.run_coroutine_threadsafe(func(*args, **kwargs), self.loop)
        try:
            while not fut.done():
                concurrent.futures.wait([fut], timeout=0.05)
                if not fut.done():
                    yield
            return fut.result()
        finally:
            fut.cancel()
