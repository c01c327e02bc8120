"""fsspec sink and source: any fsspec URL (``s3://bucket/prefix``, ``gs://...``,
``memory://...``).

Objects have the names and bytes of the filesystem sink's files
(``step-00000042.rank-0000.rlw`` and ``.sidecar.rlw``), so ``rlwire inspect`` and the
layout parser read them unchanged. Object stores have no rename, so the main object is
the "ready" marker: every sidecar object is made visible first, the main objects last.

On S3 (s3fs) each large object is a multipart upload whose parts are cut from the
frame's buffers one part at a time (never joining the whole object in memory) and
uploaded several at once while the next part is being cut; the step becomes visible only
when :meth:`Staged.commit` completes the uploads, and a cancelled or failed send aborts
them, so nothing is ever half-visible. Small objects are put whole at commit. On other
filesystems each object is written under a hidden temporary key beside its final one and
moved into place at commit.

The filesystem (and, for S3, a first request checking that the bucket exists) is made
lazily, once, in a worker thread, shared by concurrent first callers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import inspect
import io
import re
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from anyio import CapacityLimiter

from .._args import check_int
from .._once import Once
from .._slicing import Sliced, SliceTimer
from ..errors import (
    ConfigError,
    CorruptFrameError,
    RlwireError,
    StepExistsError,
    TransportError,
    transport_error,
)
from ..frame import Frame
from ._base import (
    OnExisting,
    Sink,
    SinkOptions,
    Source,
    SourceOptions,
    Staged,
    reject_unknown,
)
from ._layout import Layout, checksum_segments, parse_main, plan
from ._names import MAIN_RE, STORED_RE, TEMP_RE, main_name, sidecar_name, start_step, temp_name
from ._url import URL, parse_url

__all__ = ["FsspecSink", "FsspecSource"]

T = TypeVar("T")

#: Default size of one multipart-upload part. Parts are copied out of the frame's buffers
#: (botocore takes bytes, bytearrays or files, not memoryviews), one at a time, so memory
#: use is bounded by (concurrency + 1) parts, whatever the size of the step.
PART_BYTES = 8 << 20
#: S3's smallest part (all but the last), and its largest number of parts per upload.
_MIN_PART = 5 << 20
_MAX_PARTS = 10_000
#: Objects below this are put whole at commit: one request instead of three.
SMALL_BYTES = 1 << 20
#: Bytes copied (GIL held) between checks for the end of a slice of work.
_COPY_BYTES = 2 << 20
#: Bytes per ranged GET when reading large objects, several at once.
READ_BYTES = 8 << 20
#: Bytes handed to a generic fsspec file per write call.
_WRITE_BYTES = 8 << 20
#: Longest wait between two polls of a remote store, however long nothing arrives.
MAX_POLL_INTERVAL = 1.0
#: Packages that serve fsspec protocols rlwire names, checked without importing them.
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs"}
#: Protocols with no bucket, whose filesystems also accept any keyword and ignore the
#: ones they do not know (their ``**kwargs`` end in fsspec's base class): rlwire checks
#: those keys itself. Others reject unknown keys on their own (s3fs when it makes its
#: session).
_LOCAL = frozenset({"memory"})
#: Keys fsspec's base classes take from any filesystem's options.
_FSSPEC_OPTIONS = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths")


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _errors(where: str, action: str) -> Iterator[None]:
    """Turn whatever a backend raises (botocore, aiohttp, OSError, ...) into a
    TransportError; rlwire's own errors and BaseExceptions pass through."""
    try:
        yield
    except RlwireError:
        raise
    except Exception as exc:
        raise transport_error(exc, action, where=where) from exc


def _split_url(given: str | URL) -> tuple[str, str]:
    """``(protocol, path)`` of an fsspec URL, checked without importing fsspec."""
    parsed = parse_url(given) if isinstance(given, str | URL) else None
    if parsed is None or parsed.rest == parsed.text:
        raise ConfigError(f"{given!r}: not an fsspec URL (expected protocol://path)")
    url = parsed.text
    if "::" in url:
        raise ConfigError(
            f"{url!r}: chained fsspec URLs (a::b) are not supported; give the target URL "
            "and its storage_options"
        )
    protocol, path = url.partition("://")[0], parsed.rest
    if not re.fullmatch(r"[a-z][a-z0-9+.\-]*", protocol):
        raise ConfigError(f"{url!r}: malformed URL protocol {protocol!r}")
    if protocol not in _LOCAL and not path.strip("/"):
        raise ConfigError(f"{url!r}: names no bucket or directory")
    for package in ("fsspec", _PACKAGES.get(protocol)):
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"{url!r}: protocol {protocol!r} needs the {package!r} package "
                "(pip install 'rlwire[fsspec]', 'rlwire[s3]' for s3://, or gcsfs for gs://)"
            )
    return protocol, path


def _on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on fsspec's I/O loop (another thread) and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def _gather_or_cancel(coros: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
    """``asyncio.gather``, cancelling the rest as soon as one fails."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


@dataclass(frozen=True)
class _Conn:
    """A ready filesystem and where under it the messages live."""

    fs: Any
    url: str  # as users wrote it, for messages
    root: str  # the filesystem path of the directory or key prefix, no trailing "/"
    s3: bool

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    @staticmethod
    def bucket_key(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    @property
    def bucket(self) -> str:
        return self.root.partition("/")[0]

    def concurrency(self, requested: int | None = None) -> int:
        """Requests in flight at once: ``requested``, else s3fs's ``max_concurrency``."""
        return max(1, requested or int(getattr(self.fs, "max_concurrency", 8)))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = self.fs.loop
        return loop


def _connect(url: str, protocol: str, storage_options: Mapping[str, Any]) -> _Conn:
    """Import the implementation, make the filesystem and, for S3, check the bucket.

    Runs in a worker thread (through :class:`~rlwire._once.Once`): importing s3fs and
    the first request take long enough to stall an event loop.
    """
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{url!r}: fsspec cannot serve protocol {protocol!r}: {exc}") from exc
    if protocol in _LOCAL:
        reject_unknown(url, storage_options, _named_parameters(cls))
    root = str(cls._strip_protocol(url)).rstrip("/")
    # Options in the URL (e.g. s3's ?versionId) give way to explicit storage options.
    options = {**cls._get_kwargs_from_urls(url), **storage_options}
    try:
        fs = cls(**options)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{url!r}: {cls.__name__} rejects the storage options: {exc}") from exc
    except Exception as exc:
        raise transport_error(exc, "create the filesystem", where=url) from exc
    s3 = "s3" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    conn = _Conn(fs, url, root, s3 and hasattr(fs, "_call_s3"))
    if conn.s3:
        bucket = conn.bucket
        try:
            _on_loop(conn.loop, fs._call_s3("head_bucket", Bucket=bucket))
        except TypeError as exc:  # s3fs hands unknown options to the session it makes now
            raise ConfigError(f"{url!r}: s3fs rejects the storage options: {exc}") from exc
        except FileNotFoundError as exc:
            raise TransportError(f"{url}: bucket {bucket!r} does not exist") from exc
        except Exception as exc:
            raise transport_error(exc, f"reach bucket {bucket!r}", where=url) from exc
    return conn


def _lazy_conn(url: str, protocol: str, storage_options: Mapping[str, Any] | None) -> Once[_Conn]:
    """The connection to ``url``, made on first use, once (see :func:`_connect`)."""
    options = dict(storage_options or {})  # a copy: later changes by the caller do not count
    return Once(lambda: _connect(url, protocol, options))


def _named_parameters(cls: type) -> list[str]:
    """Every keyword the ``__init__`` methods of ``cls`` and its bases name."""
    names = set(_FSSPEC_OPTIONS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        with contextlib.suppress(TypeError, ValueError):  # builtins have no signature
            for param in inspect.signature(init).parameters.values():
                if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                    names.add(param.name)
    names.discard("self")
    return sorted(names)


# --------------------------------------------------------------------------- S3 writes


@dataclass(eq=False)
class _S3Object:
    """One object on its way to S3: bytes to put whole, or a multipart upload."""

    bucket: str
    key: str
    data: bytes | None = None
    upload_id: str | None = None
    etags: dict[int, str] = field(default_factory=dict)
    finished: bool = False

    async def finish(self, fs: Any) -> None:
        if self.data is not None:
            await fs._call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=self.data)
        else:
            parts = [{"PartNumber": n, "ETag": e} for n, e in sorted(self.etags.items())]
            await fs._call_s3(
                "complete_multipart_upload",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": parts},
            )
        self.finished = True
        self.data = None

    async def abort(self, fs: Any) -> None:
        self.data = None
        if self.upload_id is not None and not self.finished:
            await fs._call_s3(
                "abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id
            )


async def _each(
    objs: Sequence[_S3Object], action: Callable[[_S3Object], Coroutine[Any, Any, None]]
) -> list[BaseException | None]:
    """Run ``action`` on every object at once; the exception of each, or None."""
    return await asyncio.gather(*(action(o) for o in objs), return_exceptions=True)


async def _delete(fs: Any, objs: Sequence[_S3Object]) -> None:
    await asyncio.gather(
        *(fs._call_s3("delete_object", Bucket=o.bucket, Key=o.key) for o in objs),
        return_exceptions=True,
    )


class _S3Staged(Staged):
    """Multipart uploads with every part uploaded, and small objects held in memory."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.sidecars: list[_S3Object] = []
        self.mains: list[_S3Object] = []
        #: The most part uploads that were in flight at once while staging (diagnostic).
        self.max_parts_in_flight = 0

    def commit(self) -> None:
        fs, url = self.conn.fs, self.conn.url
        errs = _on_loop(self.conn.loop, _each(self.sidecars, lambda o: o.finish(fs)))
        failed = [e for e in errs if e is not None]
        if failed:
            self.discard()
            with contextlib.suppress(Exception):  # sidecars without a main are garbage
                _on_loop(self.conn.loop, _delete(fs, [o for o in self.sidecars if o.finished]))
            raise transport_error(
                failed[0], "commit the step (nothing was made visible)", where=url
            )
        errs = _on_loop(self.conn.loop, _each(self.mains, lambda o: o.finish(fs)))
        ranks = [rank for rank, e in enumerate(errs) if e is None]
        failed = [e for e in errs if e is not None]
        if not failed:
            self.visible = True
            return
        # A request that failed may still have landed (a lost reply): ask, and count the
        # step as visible when unsure, so the sender never reuses its number.
        self.visible = bool(ranks) or self._any_main_exists()
        self.discard()
        if self.visible:
            raise transport_error(
                failed[0], f"commit the step in full (visible for ranks {ranks} only)", where=url
            )
        with contextlib.suppress(Exception):
            _on_loop(self.conn.loop, _delete(fs, self.sidecars))
        raise transport_error(failed[0], "commit the step (nothing was made visible)", where=url)

    def _any_main_exists(self) -> bool:
        async def exists(o: _S3Object) -> None:
            await self.conn.fs._call_s3("head_object", Bucket=o.bucket, Key=o.key)

        try:
            errs = _on_loop(
                self.conn.loop, _each([o for o in self.mains if not o.finished], exists)
            )
        except Exception:
            return True
        return any(e is None or not isinstance(e, FileNotFoundError) for e in errs)

    def discard(self) -> None:
        # Best effort: a failure here must not hide the error that led to it, and a
        # multipart upload left behind is invisible to readers (the next
        # on_existing="overwrite" or "resume" aborts it).
        fs = self.conn.fs
        with contextlib.suppress(Exception):
            _on_loop(self.conn.loop, _each([*self.mains, *self.sidecars], lambda o: o.abort(fs)))


async def _upload_part(fs: Any, obj: _S3Object, number: int, body: io.BytesIO) -> str:
    """Upload one part; its ETag.

    The part goes as a BytesIO, which aiohttp streams in chunks (a large bytes body
    would be written in one go, and aiohttp warns about it). A stream is consumed by a
    try, so this calls the client directly: botocore's own retries rewind the stream,
    where a retry around the call (s3fs's) would resend it from its end.
    """
    from s3fs.errors import translate_boto_error

    await fs.set_session()
    client = await fs.get_s3(obj.bucket)
    kwargs = fs._get_s3_method_kwargs(
        client.upload_part,
        Bucket=obj.bucket,
        Key=obj.key,
        UploadId=obj.upload_id,
        PartNumber=number,
        Body=body,
    )
    try:
        out = await client.upload_part(**kwargs)
    except Exception as exc:  # S3's error codes as OSErrors (NoSuchUpload, ...), like s3fs
        translated = translate_boto_error(exc)
        if translated is exc:
            raise
        raise translated from exc
    return str(out["ETag"])


class _Uploader:
    """Uploads parts on fsspec's I/O loop, at most ``window`` at a time, while the
    staging thread cuts the next ones."""

    def __init__(self, conn: _Conn, window: int) -> None:
        self.conn = conn
        self.window = window
        self.inflight: dict[concurrent.futures.Future[str], tuple[_S3Object, int]] = {}
        self.max_in_flight = 0

    def submit(self, obj: _S3Object, number: int, body: io.BytesIO) -> None:
        fut = asyncio.run_coroutine_threadsafe(
            _upload_part(self.conn.fs, obj, number, body), self.conn.loop
        )
        self.inflight[fut] = (obj, number)
        self._reap([f for f in self.inflight if f.done()])
        self.max_in_flight = max(self.max_in_flight, len(self.inflight))

    def room(self) -> Sliced[None]:
        """Wait until another part may be submitted."""
        while len(self.inflight) >= self.window:
            self._wait()
            yield

    def drain(self) -> Sliced[None]:
        """Wait until every part is uploaded."""
        while self.inflight:
            self._wait()
            yield

    def _wait(self) -> None:
        # A short timeout bounds how long a cancelled send takes to notice.
        done, _ = concurrent.futures.wait(
            self.inflight, timeout=0.05, return_when=concurrent.futures.FIRST_COMPLETED
        )
        self._reap(done)

    def _reap(self, done: Iterable[concurrent.futures.Future[str]]) -> None:
        for fut in list(done):
            obj, number = self.inflight.pop(fut)
            obj.etags[number] = fut.result()  # raises the upload's error

    def cancel(self) -> None:
        for fut in self.inflight:
            fut.cancel()
        self.inflight.clear()


# --------------------------------------------------------------------------- other writes


class _TempStaged(Staged):
    """Objects written under hidden temporary keys, moved into place at commit."""

    def __init__(self, conn: _Conn) -> None:
        self.conn = conn
        self.sidecars: list[tuple[str, str]] = []  # (temporary, final)
        self.mains: list[tuple[str, str]] = []

    def commit(self) -> None:
        fs, url = self.conn.fs, self.conn.url
        ranks: list[int] = []
        moved: list[str] = []
        try:
            for tmp, final in self.sidecars:
                fs.mv(tmp, final)
                moved.append(final)
            for rank, (tmp, final) in enumerate(self.mains):
                fs.mv(tmp, final)
                ranks.append(rank)
                self.visible = True
        except Exception as exc:
            self.discard()
            if ranks:
                raise transport_error(
                    exc, f"commit the step in full (visible for ranks {ranks} only)", where=url
                ) from exc
            _remove(fs, moved)
            raise transport_error(
                exc, "commit the step (nothing was made visible)", where=url
            ) from exc
        finally:
            fs.invalidate_cache(self.conn.root)

    def discard(self) -> None:
        _remove(self.conn.fs, [tmp for tmp, _ in (*self.mains, *self.sidecars)])


def _remove(fs: Any, paths: Sequence[str]) -> None:
    """Delete ``paths``, best effort: missing ones and failures are ignored."""
    for path in paths:
        with contextlib.suppress(Exception):
            fs.rm_file(path)


# --------------------------------------------------------------------------- the sink


class FsspecSink(Sink):
    """Writes each step's frames as objects under an fsspec URL.

    Works with any fsspec filesystem; S3 (s3fs) gets streamed, concurrent multipart
    uploads. ``storage_options`` go to the filesystem's constructor as fsspec users
    expect (``endpoint_url``, ``key``, ``secret``, ``client_kwargs``, ``anon``, ...);
    s3fs's ``max_concurrency`` also bounds how many parts are uploaded at once. The
    filesystem is made, and the bucket checked, lazily in a worker thread, once.

    Args:
        url: ``protocol://path``, e.g. ``s3://bucket/run-7`` or ``memory://run``.
        storage_options: keyword arguments for the fsspec filesystem.
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
        part_bytes: size of one multipart-upload part (at least 5 MiB; grown when an
            object would need more than 10,000 parts).
        max_concurrency: parts uploaded at once (default: the filesystem's
            ``max_concurrency``, else 8). Memory use is about ``part_bytes`` times this.

    ``fsync`` is meaningless for object stores and ignored: an object is durable once
    the request that makes it visible returns. Every send is committed before it
    returns, so :meth:`close` has nothing to flush; it does not close the filesystem,
    which fsspec caches and shares within the process.

    Raises:
        ConfigError: a malformed URL, a protocol or package fsspec lacks, or storage
            options the filesystem rejects (when it is first used).
        TransportError: the bucket does not exist, or a request fails; the message names
            the URL and what failed. A failed or cancelled send leaves nothing visible.
        StepExistsError: a step exists at the destination.

    Example:
        >>> import anyio, rlwire
        >>> async def main() -> int:
        ...     async with rlwire.open_sender("memory://doc-example") as sender:
        ...         return await sender.send(rlwire.TrainingBatch(samples=[]))
        >>> anyio.run(main)
        0
    """

    def __init__(
        self,
        url: str | URL,
        *,
        storage_options: Mapping[str, Any] | None = None,
        checksum: bool = True,
        part_bytes: int = PART_BYTES,
        max_concurrency: int | None = None,
    ) -> None:
        protocol, path = _split_url(url)
        check_int(part_bytes, "part_bytes (S3's minimum part is 5 MiB)", low=_MIN_PART)
        if max_concurrency is not None:
            check_int(max_concurrency, "max_concurrency", low=1)
        self.url = f"{protocol}://{path.rstrip('/')}"
        self.checksum = checksum
        self.part_bytes = part_bytes
        self.max_concurrency = max_concurrency
        self._conn = _lazy_conn(str(url), protocol, storage_options)

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

    async def aopen(self, on_existing: OnExisting, limiter: CapacityLimiter) -> int:
        # Connect in an abandonable thread first: cancelling this open does not wait for
        # a slow first request, and the connection is still made for the next caller.
        await self._conn.aget(limiter)
        return await super().aopen(on_existing, limiter)

    # ------------------------------------------------------------------ open

    def open(self, on_existing: OnExisting) -> int:
        conn = self._conn.get()
        with _errors(self.url, "list the destination"):
            names = _list(conn)
        step = start_step(self.url, names, on_existing)
        if on_existing == "error":
            return step
        # Leftovers of a killed sender: temporary keys and unfinished multipart uploads
        # (invisible to readers, but billed).
        with _errors(self.url, "clean up after an earlier run"):
            _rm(conn, [n for n in names if TEMP_RE.fullmatch(n)])
            uploads = _pending_uploads(conn) if conn.s3 else []
            if uploads:
                _on_loop(conn.loop, _abort_uploads(conn, uploads))
        if on_existing == "overwrite":
            with _errors(self.url, "delete earlier steps"):
                # Main objects first, so no reader meets a main object without its sidecar.
                _rm(conn, [n for n in names if MAIN_RE.fullmatch(n)])
                _rm(conn, [n for n in names if STORED_RE.fullmatch(n) and not MAIN_RE.fullmatch(n)])
        return step

    # ------------------------------------------------------------------ stage

    def stage(self, step: int, frames: Sequence[Frame]) -> Sliced[Staged]:
        conn = self._conn.get()
        with _errors(self.url, f"check whether step {step} exists"):
            existing = _existing(conn, [conn.path(main_name(step, r)) for r in range(len(frames))])
        if existing:
            raise StepExistsError(
                f"{self.url}/{main_name(step, existing[0])}: step {step} rank {existing[0]} "
                "already exists at the destination"
            )
        if conn.s3:
            return (yield from self._stage_s3(conn, step, frames))
        return (yield from self._stage_temp(conn, step, frames))

    def _layout(self, step: int, rank: int, frame: Frame) -> Sliced[Layout]:
        sums = (yield from checksum_segments(frame)) if self.checksum else None
        return plan(frame, step, rank, sums)

    def _stage_s3(self, conn: _Conn, step: int, frames: Sequence[Frame]) -> Sliced[Staged]:
        staged = _S3Staged(conn)
        uploader = _Uploader(conn, conn.concurrency(self.max_concurrency))
        try:
            with _errors(self.url, f"upload step {step}"):
                for rank, frame in enumerate(frames):
                    layout = yield from self._layout(step, rank, frame)
                    if layout.sidecar:
                        path = conn.path(sidecar_name(step, rank))
                        yield from self._s3_object(
                            conn, uploader, path, layout.sidecar, staged.sidecars
                        )
                    path = conn.path(main_name(step, rank))
                    yield from self._s3_object(conn, uploader, path, layout.main, staged.mains)
                yield from uploader.drain()
        except BaseException:
            uploader.cancel()
            staged.discard()
            raise
        staged.max_parts_in_flight = uploader.max_in_flight
        return staged

    def _s3_object(
        self,
        conn: _Conn,
        uploader: _Uploader,
        path: str,
        chunks: Sequence[bytes | memoryview],
        into: list[_S3Object],
    ) -> Sliced[None]:
        """Stage one object: held for a put at commit when small, else a multipart
        upload whose parts are copied out one at a time and uploaded concurrently."""
        views = [memoryview(p).cast("B") for p in chunks]
        size = sum(v.nbytes for v in views)
        bucket, key = conn.bucket_key(path)
        obj = _S3Object(bucket, key)
        if size < SMALL_BYTES:
            obj.data = b"".join(views)
            into.append(obj)
            return
        out = _on_loop(
            conn.loop, conn.fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key)
        )
        obj.upload_id = str(out["UploadId"])
        into.append(obj)  # from here on, discard() aborts it
        part = max(self.part_bytes, -(-size // _MAX_PARTS))
        slicer = SliceTimer()
        buf: io.BytesIO | None = None
        filled = length = number = 0
        left = size
        for view in views:
            pos = 0
            while pos < view.nbytes:
                if buf is None:
                    yield from uploader.room()
                    buf, filled, length = io.BytesIO(), 0, min(part, left)
                n = min(view.nbytes - pos, length - filled, _COPY_BYTES)
                buf.write(view[pos : pos + n])
                pos += n
                filled += n
                if filled == length:
                    number += 1
                    left -= length
                    buf.seek(0)
                    uploader.submit(obj, number, buf)
                    buf = None
                if slicer.due():
                    yield
                    slicer.restart()

    # ------------------------------------------------------------------ other filesystems

    def _stage_temp(self, conn: _Conn, step: int, frames: Sequence[Frame]) -> Sliced[Staged]:
        staged = _TempStaged(conn)
        try:
            with _errors(self.url, f"write step {step}"):
                for rank, frame in enumerate(frames):
                    layout = yield from self._layout(step, rank, frame)
                    if layout.sidecar:
                        final = conn.path(sidecar_name(step, rank))
                        yield from _write_temp(conn, final, layout.sidecar, staged.sidecars)
                    final = conn.path(main_name(step, rank))
                    yield from _write_temp(conn, final, layout.main, staged.mains)
        except BaseException:
            staged.discard()
            raise
        return staged


def _write_temp(
    conn: _Conn, final: str, chunks: Sequence[bytes | memoryview], into: list[tuple[str, str]]
) -> Sliced[None]:
    head, _, name = final.rpartition("/")
    tmp = f"{head}/{temp_name(name)}"
    into.append((tmp, final))  # from here on, discard() removes it
    f = conn.fs.open(tmp, "wb")
    try:
        slicer = SliceTimer()
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            for start in range(0, view.nbytes, _WRITE_BYTES):
                f.write(view[start : start + _WRITE_BYTES])
                if slicer.due():
                    yield
                    slicer.restart()
    except BaseException:
        # Do not let close() publish a partial temporary object if it can be avoided.
        with contextlib.suppress(Exception):
            (f.discard if hasattr(f, "discard") else f.close)()
        raise
    f.close()


# --------------------------------------------------------------------------- listing


def _list(conn: _Conn) -> list[str]:
    """Names directly under the root, fresh from the store (not fsspec's listing cache)."""
    conn.fs.invalidate_cache(conn.root)
    try:
        paths = conn.fs.ls(conn.root, detail=False)
    except FileNotFoundError:
        return []
    return [str(p).rstrip("/").rpartition("/")[2] for p in paths]


def _existing(conn: _Conn, paths: Sequence[str]) -> list[int]:
    """Indices of ``paths`` that exist."""
    if conn.s3:

        async def exists(path: str) -> bool:
            bucket, key = conn.bucket_key(path)
            try:
                await conn.fs._call_s3("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return False
            return True

        found = _on_loop(conn.loop, _gather_or_cancel([exists(p) for p in paths]))
        return [i for i, hit in enumerate(found) if hit]
    conn.fs.invalidate_cache(conn.root)
    return [i for i, p in enumerate(paths) if conn.fs.exists(p)]


def _rm(conn: _Conn, names: Sequence[str]) -> None:
    if names:
        conn.fs.rm([conn.path(n) for n in names])
        conn.fs.invalidate_cache(conn.root)


def _pending_uploads(conn: _Conn) -> list[tuple[str, str]]:
    """``(key, upload id)`` of every unfinished multipart upload of an rlwire object
    directly under the root."""
    bucket, prefix = conn.bucket_key(conn.root + "/")
    out: list[tuple[str, str]] = []
    marker: dict[str, str] = {}
    while True:
        page = _on_loop(
            conn.loop,
            conn.fs._call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker),
        )
        for upload in page.get("Uploads", []) or []:
            key = str(upload["Key"])
            if STORED_RE.fullmatch(key[len(prefix) :]):
                out.append((key, str(upload["UploadId"])))
        if not page.get("IsTruncated"):
            return out
        marker = {
            "KeyMarker": page["NextKeyMarker"],
            "UploadIdMarker": page["NextUploadIdMarker"],
        }


async def _abort_uploads(conn: _Conn, uploads: Sequence[tuple[str, str]]) -> None:
    bucket = conn.bucket
    await _gather_or_cancel(
        [
            conn.fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=k, UploadId=u)
            for k, u in uploads
        ]
    )


# --------------------------------------------------------------------------- the source


async def _get_s3(conn: _Conn, path: str, window: int) -> bytes | bytearray | None:
    """The whole object at ``path``, or None if it does not exist.

    One ranged GET answers small objects and tells the size of large ones, whose other
    ranges are then fetched concurrently straight into one buffer: no HEAD request, and
    no joining of chunks afterwards.
    """
    fs = conn.fs
    bucket, key = conn.bucket_key(path)
    try:
        resp = await fs._call_s3(
            "get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{READ_BYTES - 1}"
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        if "InvalidRange" in str(exc) or "not satisfiable" in str(exc).lower():
            raise CorruptFrameError(f"{conn.url}/{key.rpartition('/')[2]}: empty object") from exc
        raise
    try:
        first: bytes = await resp["Body"].read()
    finally:
        resp["Body"].close()
    total = _total_size(resp.get("ContentRange"), len(first))
    if total == len(first):
        return first
    buf = bytearray(total)
    buf[: len(first)] = first
    etag = resp.get("ETag")
    sem = asyncio.Semaphore(window)

    async def fetch(start: int) -> None:
        end = min(start + READ_BYTES, total)
        async with sem:
            # If-Match: a range of another version of the object must not be mixed in.
            extra = {"IfMatch": etag} if etag else {}
            r = await fs._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
            )
            try:
                data = await r["Body"].read()
            finally:
                r["Body"].close()
        if len(data) != end - start:
            raise CorruptFrameError(f"{conn.url}/{key}: short read at offset {start}")
        buf[start:end] = data

    await _gather_or_cancel([fetch(s) for s in range(len(first), total, READ_BYTES)])
    return buf


def _total_size(content_range: str | None, got: int) -> int:
    """The object size from a ``Content-Range: bytes a-b/size`` header."""
    if content_range and "/" in content_range:
        size = content_range.rpartition("/")[2]
        if size.isdigit():
            return int(size)
    return got


class FsspecSource(Source):
    """Reads the objects an :class:`FsspecSink` wrote, for one rank.

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
        protocol, path = _split_url(url)
        self.url = f"{protocol}://{path.rstrip('/')}"
        self.rank = rank
        self.writable = writable
        self.verify = verify
        self.poll_interval = poll_interval
        self.max_poll_interval = (
            poll_interval if protocol in _LOCAL else max(poll_interval, max_poll_interval)
        )
        self._interval = poll_interval  # the wait after the latest miss
        self._next_interval = poll_interval
        self._conn = _lazy_conn(str(url), protocol, storage_options)

    def __repr__(self) -> str:
        return f"FsspecSource({self.url!r}, rank={self.rank})"

    @property
    def interval(self) -> float:
        """The wait before the next check: grows while nothing arrives."""
        return self._interval

    def describe(self, step: int) -> str:
        return f"{self.url}/{main_name(step, self.rank)}: step {step} rank {self.rank}"

    def read(self, step: int) -> Frame | None:
        conn = self._conn.get()
        name = main_name(step, self.rank)
        data = self._fetch(conn, name)
        if data is None:
            self._interval = self._next_interval
            self._next_interval = min(self._next_interval * 2, self.max_poll_interval)
            return None
        self._interval = self._next_interval = self.poll_interval

        def load_sidecar() -> memoryview:
            side = sidecar_name(step, self.rank)
            view = self._fetch(conn, side)
            if view is None:
                raise CorruptFrameError(f"{self.url}/{side}: missing; the main object refers to it")
            return view

        return parse_main(
            data,
            step=step,
            rank=self.rank,
            load_sidecar=load_sidecar,
            where=f"{self.url}/{name}",
            verify=self.verify,
        )

    def _fetch(self, conn: _Conn, name: str) -> memoryview | None:
        path = conn.path(name)
        with _errors(f"{self.url}/{name}", "read"):
            if conn.s3:
                data = _on_loop(conn.loop, _get_s3(conn, path, conn.concurrency()))
            else:
                try:
                    data = conn.fs.cat_file(path)
                except FileNotFoundError:
                    return None
        if data is None:
            return None
        if self.writable:
            return memoryview(data if isinstance(data, bytearray) else bytearray(data))
        return memoryview(data).toreadonly()
