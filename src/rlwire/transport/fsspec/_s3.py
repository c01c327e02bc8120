"""S3 through s3fs: the store that stages steps as multipart uploads
(``_s3_upload``) and reads large objects with concurrent ranged GETs.

Every request runs on fsspec's I/O loop. Unfinished uploads are invisible to readers but
billed. A failed send aborts its own (retrying); those an outage kept from aborting, and
twins made when botocore retried a "create upload" request whose reply was lost, are
listed and aborted when the sink closes (:meth:`S3Store.settle_leftovers`). A killed sender's
are aborted by the next ``on_existing="resume"``, ``"truncate"`` or ``"overwrite"``.

A step's objects (every rank's main and sidecar objects, parts, appended fields) and its
seal are committed with S3's conditional writes (``If-None-Match: *`` on PUT and on
completing a multipart upload), so none ever replaces an object: of two senders
committing one step at the same moment one wins and the other gets ``StepExistsError``
naming the object, as on files; of two ``add_fields`` stages, the second takes the next
``fields-NNN``; of two producers sealing one step, one seal stands. A request botocore
or s3fs sent again after losing the reply finds its own object (412, or 404
``NoSuchUpload`` completing an upload): the object's metadata holds a token of this
commit's (``x-amz-meta-rlwire-commit``), so that counts as success. The marks (end,
rewrite, consumption, part marks) are written again in place, unconditionally. A store
that does not implement conditional writes and says so (501) gets a ``ConfigError``
naming the storage option ``conditional_writes`` (answered 400, which may mean something
else, the ``TransportError`` names it as what to try); set it to False there (and for one
that ignores the header): commits are then unconditional, and two senders committing
one step at once can both succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from typing import TypeVar

from rlwire._core.errors import ConfigError, CorruptFrameError, TransportError, transport_error
from rlwire._core.slicing import Sliced, run_sliced
from rlwire.transport._stored.layout import MAIN_MAGIC
from rlwire.transport._stored.names import FIELDS_RE, STEP_PART_RE, STORED_RE
from rlwire.transport._stored.parts import head_envelope
from rlwire.transport.fsspec._s3_bucket import S3Bucket
from rlwire.transport.fsspec._s3_ranges import (
    READ_BYTES,
    S3Ranged,
    gather_or_cancel,
    open_ranged,
    total_size,
)
from rlwire.transport.fsspec._s3_upload import S3Staging, retried

__all__ = ["READ_BYTES", "S3Store"]

T = TypeVar("T")


class S3Store(S3Bucket):
    """The S3 store: stages steps as multipart uploads (:class:`S3Staging`), reads
    large objects with concurrent ranged GETs, and aborts the uploads left behind."""

    stage_verb = "upload"

    def check(self) -> None:
        bucket = self.bucket
        try:
            self.run(self.fs._call_s3, "head_bucket", Bucket=bucket)
        except TypeError as exc:  # s3fs hands unknown options to the session it makes now
            raise ConfigError(f"{self.url!r}: s3fs rejects the storage options: {exc}") from exc
        except FileNotFoundError as exc:
            raise TransportError(f"{self.url}: bucket {bucket!r} does not exist") from exc
        except Exception as exc:
            raise transport_error(exc, f"reach bucket {bucket!r}", where=self.url) from exc

    def names_an_object(self) -> bool:
        # One HEAD of the key (s3fs's isfile lists the prefix too when there is none).
        bucket, key = self.bucket_key(self.root)
        if not key:
            return False
        try:
            self.run(self.fs._call_s3, "head_object", Bucket=bucket, Key=key)
        except Exception:  # none (404), or not to be asked (403): a prefix, then
            return False
        return True

    def existing(self, paths: Sequence[str]) -> list[int]:
        return run_sliced(self.existing_in_slices(paths))

    def existing_in_slices(self, paths: Sequence[str]) -> Sliced[list[int]]:
        async def exists(path: str) -> bool:
            bucket, key = self.bucket_key(path)
            try:
                await self.fs._call_s3("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return False
            return True

        found = yield from self.run_in_slices(gather_or_cancel, [exists(p) for p in paths])
        return [i for i, hit in enumerate(found) if hit]

    def clean_leftovers(self, names: Sequence[str]) -> None:
        """Remove temporary keys (see :class:`~rlwire.transport.fsspec._store.Store`) and
        abort every unfinished multipart upload of an rlwire object directly under the
        root."""
        super().clean_leftovers(names)
        uploads = self._pending_uploads()
        if uploads:
            self.run(self._abort_uploads, uploads)

    def settle_leftovers(self) -> str | None:
        """If a staging started multipart uploads here, list the unfinished uploads of
        the objects it uploaded (``upload_keys``) and abort them (the sink is
        closing: none of them belongs to a send in progress; another writer's, a live
        producer's beside a stage, are left alone). Requests are retried.

        Returns:
            None, or what is left behind and why, if S3 could not be reached.
        """
        if not self.upload_keys:
            return None
        try:
            uploads = self._own_pending_uploads()
        except Exception as exc:
            return f"unfinished multipart uploads could not be listed ({exc})"
        try:
            self.run(self._abort_uploads, uploads)
        except Exception as exc:
            try:
                left = len(self._own_pending_uploads())
            except Exception:
                left = len(uploads)
            return f"{left} unfinished multipart upload(s) could not be aborted ({exc})"
        self.upload_keys.clear()
        return None

    def _own_pending_uploads(self) -> list[tuple[str, str]]:
        return [u for u in self._pending_uploads() if u[0] in self.upload_keys]

    def _pending_uploads(self) -> list[tuple[str, str]]:
        """``(key, upload id)`` of every unfinished multipart upload of an rlwire object
        (a step's, a part's, appended fields') directly under the root."""
        bucket, prefix = self.bucket_key(self.root + "/")
        out: list[tuple[str, str]] = []
        marker: dict[str, str] = {}
        while True:
            page = self.run(
                retried,
                functools.partial(
                    self.fs._call_s3,
                    "list_multipart_uploads",
                    Bucket=bucket,
                    Prefix=prefix,
                    **marker,
                ),
            )
            for upload in page.get("Uploads", []) or []:
                key = str(upload["Key"])
                name = key[len(prefix) :]
                if any(r.fullmatch(name) for r in (STORED_RE, STEP_PART_RE, FIELDS_RE)):
                    out.append((key, str(upload["UploadId"])))
            if not page.get("IsTruncated"):
                return out
            marker = {
                "KeyMarker": page["NextKeyMarker"],
                "UploadIdMarker": page["NextUploadIdMarker"],
            }

    async def _abort_uploads(self, uploads: Sequence[tuple[str, str]]) -> None:
        """Abort each upload, retrying; one that is gone already counts as aborted.
        Raises the first failure, once every abort has been tried."""
        bucket = self.bucket

        async def abort(key: str, upload_id: str) -> None:
            with contextlib.suppress(FileNotFoundError):
                await retried(
                    lambda: self.fs._call_s3(
                        "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id
                    )
                )

        errs = await asyncio.gather(*(abort(k, u) for k, u in uploads), return_exceptions=True)
        for err in errs:
            if isinstance(err, BaseException):
                raise err

    # Reads: one that hangs gives up when its caller (a send waiting under max_ahead,
    # an add_fields) is cancelled.

    def list_root(self) -> list[str]:
        return list(self.run_read(self.fs._ls, self.root, detail=False))

    def head(self, path: str, limit: int) -> bytes | None:
        try:
            data: bytes = self.run_read(self.fs._cat_file, path, start=0, end=limit)
        except FileNotFoundError:
            return None
        return data

    def size(self, path: str) -> int | None:
        try:
            info = self.run_read(self.fs._info, path, refresh=True)
        except FileNotFoundError:
            return None
        return int(info["size"])

    def heads(self, paths: Sequence[str], limit: int) -> list[bytes | Exception | None]:
        # As many GETs in flight as s3fs's max_concurrency (10, as its connection pool):
        # more would only wait there for a connection.
        got = self.run_read(
            self.fs._cat_ranges,
            list(paths),
            0,
            limit,
            on_error="return",
            batch_size=self.concurrency(),
        )
        return [None if isinstance(g, FileNotFoundError) else g for g in got]

    def staging(self, *, part_bytes: int, max_concurrency: int | None) -> S3Staging:
        return S3Staging(self, part_bytes, self.concurrency(max_concurrency))

    def get(self, path: str, size: int | None = None) -> bytes | bytearray | None:
        return self.run_read(self._get, path, self.concurrency(), size)

    def ranged(self, path: str, size: int | None = None) -> S3Ranged | None:
        # Its first ranged GET learns the size; a sidecar's is checked against ``size``
        # then (open_checked_sidecar), before anything past that GET is read.
        return open_ranged(self, path)

    async def _get(self, path: str, window: int, size: int | None) -> bytes | bytearray | None:
        """One ranged GET answers small objects and tells the size of large ones, whose
        other ranges are then fetched ``window`` at a time straight into one buffer: no
        HEAD request, and no joining of chunks afterwards. An object that is not the
        ``size`` given (a sidecar's, by its envelope), or a main object not the size its
        envelope says, is refused then, before the buffer is made."""
        fs = self.fs
        bucket, key = self.bucket_key(path)
        try:
            resp = await fs._call_s3(
                "get_object", Bucket=bucket, Key=key, Range=f"bytes=0-{READ_BYTES - 1}"
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if "InvalidRange" in str(exc) or "not satisfiable" in str(exc).lower():
                name = key.rpartition("/")[2]
                raise CorruptFrameError(f"{self.url}/{name}: empty object") from exc
            raise
        try:
            first: bytes = await resp["Body"].read()
        finally:
            resp["Body"].close()
        total = total_size(resp.get("ContentRange"), len(first))
        if total == len(first):
            return first
        name = key.rpartition("/")[2]  # the key repeats the URL's prefix
        _check_message_size(first, total, f"{self.url}/{name}")
        if size is not None and total != size:
            raise CorruptFrameError(
                f"sidecar truncated or extended: expected {size} bytes, the object is "
                f"{total} (Content-Range); not read further",
                where=f"{self.url}/{name}",
            )
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
                raise CorruptFrameError(f"{self.url}/{name}: short read at offset {start}")
            buf[start:end] = data

        await gather_or_cancel([fetch(s) for s in range(len(first), total, READ_BYTES)])
        return buf


class _Longer(Exception):
    """The envelope is longer than an object's first read."""


def _check_message_size(first: bytes, total: int, where: str) -> None:
    """Refuse a message's object (a main file: a whole step's, a part's, appended
    fields') whose size, ``total`` (as ``Content-Range`` says), is not the size its
    envelope, read from the object's ``first`` bytes, says: before a byte more is
    allocated or fetched (junk appended to the object, or a proxy's lie, would be read
    whole first). Another object, or an envelope longer than ``first``, is not checked
    here (its reader checks the whole).

    Raises:
        CorruptFrameError: the sizes differ, or the envelope is garbled.
        UnsupportedVersionError: a major version this reader does not know.
    """
    if not first.startswith(MAIN_MAGIC):
        return

    calls: list[int] = []

    def load(size: int) -> bytes:  # all there is; asked again for more: the envelope's
        calls.append(size)
        if len(calls) > 1 and size > len(first):
            raise _Longer
        return first

    try:
        env = head_envelope(load, where)
    except _Longer:
        return
    if env is not None and env.size != total:
        raise CorruptFrameError(
            f"truncated or extended: the envelope says {env.size} bytes, the object is "
            f"{total} (Content-Range); not read further",
            where=where,
        )
