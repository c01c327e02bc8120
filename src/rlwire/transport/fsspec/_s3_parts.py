"""Upload parts of S3 multipart uploads, sent on fsspec's I/O loop several at once while
the staging thread cuts the next ones (:class:`Uploader`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from rlwire._core.slicing import Sliced

if TYPE_CHECKING:
    from rlwire.transport.fsspec._s3_bucket import S3Bucket

__all__ = ["Uploader", "aborted", "upload_gone"]

#: Seconds waited before asking again whether an upload is gone, when S3 gave no answer.
_GONE_DELAYS = (0.1, 0.3, 1.0)


class _Upload(Protocol):
    """What of an object on its way to S3 an upload part needs, and records."""

    bucket: str
    key: str
    upload_id: str | None
    etags: dict[int, str]


async def upload_gone(fs: Any, obj: _Upload, exc: BaseException) -> bool:
    """Whether S3 answers that ``obj``'s multipart upload does not exist, after S3
    refused a request of it with ``exc`` (asked again while S3 gives no answer; False
    when it does not say so, or ``exc`` is no answer of S3's: a connection failed). A
    live upload is aborted by another writer: a sender opened with
    ``on_existing="resume"``, ``"truncate"`` or ``"overwrite"`` aborts the unfinished
    uploads it finds, as a killed writer's."""
    if not _answered(exc):
        return False
    for delay in (*_GONE_DELAYS, None):
        try:
            await fs._call_s3(
                "list_parts", Bucket=obj.bucket, Key=obj.key, UploadId=obj.upload_id, MaxParts=1
            )
        except FileNotFoundError:
            return True
        except PermissionError:  # not allowed to list parts: an answer, not an outage
            return False
        except Exception:
            if delay is not None:
                await asyncio.sleep(delay)
                continue
        return False
    return False


def _answered(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a reply of S3's (botocore's
    ``ClientError``, which s3fs translates into an OSError)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(getattr(cur, "response", None), dict):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def aborted(obj: _Upload) -> FileNotFoundError:
    """The error of a request of ``obj``'s upload that :func:`upload_gone`."""
    name = obj.key.rpartition("/")[2]
    return FileNotFoundError(
        errno.ENOENT,
        f"the multipart upload of {name} was aborted (a sender opened with on_existing="
        "'resume', 'truncate' or 'overwrite' takes unfinished uploads for a killed writer's)",
    )


async def _upload_part(fs: Any, obj: _Upload, number: int, body: io.BytesIO) -> str:
    """Upload one upload part; its ETag.

    The upload part goes as a BytesIO, which aiohttp streams in chunks (a large bytes body
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
        if await upload_gone(fs, obj, exc):
            raise aborted(obj) from exc
        translated = translate_boto_error(exc)
        if translated is exc:
            raise
        raise translated from exc
    return str(out["ETag"])


class Uploader:
    """Uploads upload parts on fsspec's I/O loop, at most ``window`` at a time, while the
    staging thread cuts the next ones."""

    def __init__(self, store: S3Bucket, window: int) -> None:
        self.store = store
        self.window = window
        self.inflight: dict[concurrent.futures.Future[str], tuple[_Upload, int]] = {}
        self.max_in_flight = 0

    def submit(self, obj: _Upload, number: int, body: io.BytesIO) -> None:
        fut = asyncio.run_coroutine_threadsafe(
            _upload_part(self.store.fs, obj, number, body), self.store.loop
        )
        self.inflight[fut] = (obj, number)
        self._reap([f for f in self.inflight if f.done()])
        self.max_in_flight = max(self.max_in_flight, len(self.inflight))

    def room(self) -> Sliced[None]:
        """Wait until another upload part may be submitted."""
        while len(self.inflight) >= self.window:
            self._wait()
            yield

    def drain(self) -> Sliced[None]:
        """Wait until every upload part is uploaded."""
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
