"""S3 multipart uploads: how one step goes up to S3 without becoming visible.

Each large object is a multipart upload whose upload parts are cut from the frame's buffers one
upload part at a time (never joining the whole object in memory) and uploaded several at once,
on fsspec's I/O loop, while the staging thread cuts the next upload part. The step becomes
visible only when :meth:`S3Staging.commit` completes the uploads, and a cancelled or
failed send aborts them, so nothing is ever half-visible. Small objects are put whole at
commit. A step's files and seals are committed only where no object is
(``If-None-Match: *``, :mod:`~rlwire.transport.fsspec._s3_commit`), and the step's first
object goes alone: of two senders committing one step, one wins and the other gets
``StepExistsError`` having made nothing visible.

Requests whose answer rlwire must have (did a main object land after its request
failed? is an upload aborted?) are retried with backoff (:func:`retried`) on top of
s3fs's own retries; what still cannot be known is reported as such, never guessed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from rlwire._core.errors import RlwireError, transport_error
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire.transport._stored.names import never_replaced
from rlwire.transport.fsspec._s3_bucket import S3Bucket
from rlwire.transport.fsspec._s3_commit import (
    OPTION,
    TOKEN,
    conflict,
    delete,
    in_flight,
    maybe_resent,
    ours,
    reply_is,
    unsupported,
)
from rlwire.transport.fsspec._s3_parts import Uploader, aborted, upload_gone
from rlwire.transport.fsspec._store import Staging

__all__ = [
    "MIN_PART_BYTES",
    "PART_BYTES",
    "RETRY_DELAYS",
    "SMALL_BYTES",
    "S3Staging",
    "retried",
    "settled",
]

T = TypeVar("T")

#: Default size of one upload part. Upload parts are copied out of the frame's buffers
#: (botocore takes bytes, bytearrays or files, not memoryviews), one at a time, so memory
#: use is bounded by (concurrency + 1) upload parts, whatever the size of the step.
PART_BYTES = 8 << 20
#: S3's smallest upload part (all but the last), and its most upload parts per upload.
MIN_PART_BYTES = 5 << 20
_MAX_PARTS = 10_000
#: Objects below this are put whole at commit: one request instead of three.
SMALL_BYTES = 1 << 20
#: Bytes copied (GIL held) between checks for the end of a slice of work.
_COPY_BYTES = 2 << 20
#: Seconds waited before each retry of a request whose answer rlwire needs (see
#: :func:`retried`), on top of s3fs's and botocore's own retries: rides out an outage of
#: a few seconds.
RETRY_DELAYS = (0.1, 0.3, 1.0, 2.0)


async def retried(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, called again after each of :data:`RETRY_DELAYS` while it fails;
    the last failure is raised. ``FileNotFoundError`` and ``PermissionError`` are
    answers, not failures: they are raised at once."""
    for delay in RETRY_DELAYS:
        try:
            return await call()
        except (FileNotFoundError, PermissionError):
            raise
        except Exception:
            await asyncio.sleep(delay)
    return await call()


async def settled(call: Callable[[], Awaitable[object]]) -> bool | None:
    """Whether ``call`` (a request about one key) finds it: True if it succeeds, False
    if S3 answers that the key or upload does not exist, None if no answer came
    (:func:`retried`)."""
    try:
        await retried(call)
    except FileNotFoundError:
        return False
    except Exception:
        return None
    return True


@dataclass(eq=False)
class _S3Object:
    """One object on its way to S3: bytes to put whole, or a multipart upload.

    A ``conditional`` one is committed with ``If-None-Match: *`` and carries a token of
    its own in its user metadata (:data:`TOKEN`): a refusal (412) is this commit's own
    success when the object there has the token (a retried request whose reply was
    lost), else another sender's object (:attr:`taken`).
    """

    bucket: str
    key: str
    conditional: bool = False
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    data: bytes | None = None
    upload_id: str | None = None
    etags: dict[int, str] = field(default_factory=dict)
    committed: bool = False
    tried: bool = False  # commit() was called: the object may exist
    taken: bool = False  # another sender's object is (or was) at the key
    unsupported: bool = False  # the store answered the condition with 501
    bad_request: bool = False  # ... or with 400: perhaps the condition, perhaps not

    @property
    def metadata(self) -> dict[str, str]:
        """The user metadata to create the object with."""
        return {TOKEN: self.token} if self.conditional else {}

    async def commit(self, fs: Any) -> None:
        """Make the object visible: put it whole, or complete its multipart upload; a
        conditional one only if no object is at its key. An upload another writer
        aborted (and that did not land) raises :func:`aborted`'s FileNotFoundError."""
        try:
            await self._commit(fs)
        except Exception as exc:
            if self.data is None and not self.taken and await upload_gone(fs, self, exc):
                if (mine := await self.exists(fs)) is False and not self.taken:
                    raise aborted(self) from exc
                if mine:
                    return  # completed by this commit, its reply lost
            raise

    async def _commit(self, fs: Any) -> None:
        self.tried = True
        cond = {"IfNoneMatch": "*"} if self.conditional else {}
        try:
            if self.data is not None:
                await fs._call_s3(
                    "put_object",
                    Bucket=self.bucket,
                    Key=self.key,
                    Body=self.data,
                    Metadata=self.metadata,
                    **cond,
                )
            else:
                parts = [{"PartNumber": n, "ETag": e} for n, e in sorted(self.etags.items())]
                await fs._call_s3(
                    "complete_multipart_upload",
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=self.upload_id,
                    MultipartUpload={"Parts": parts},
                    **cond,
                )
        except Exception as exc:
            if not self.conditional:
                raise
            if reply_is(exc, 501, "NotImplemented"):
                self.unsupported = True
                raise
            self.bad_request = reply_is(exc, 400, "InvalidArgument")
            # This commit's own object, if botocore or s3fs sent the request again after
            # losing the reply to the one that made it: the token tells.
            conflicting = in_flight(exc, self.key)
            if not (conflicting or maybe_resent(exc, multipart=self.data is None)):
                raise
            mine = await self.exists(fs)
            if not mine:
                # Refused (412) for an object not found now: another's, since deleted.
                refused = conflicting or reply_is(exc, 412, "PreconditionFailed")
                self.taken = self.taken or (refused and mine is not None)
                raise
        self.committed = True
        self.data = None

    async def abort(self, fs: Any) -> bool:
        """Abort the upload (retried); False if it may still be pending."""
        self.data = None
        if self.upload_id is None or self.committed:
            return True
        upload_id = self.upload_id
        gone = await settled(
            lambda: fs._call_s3(
                "abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=upload_id
            )
        )
        if gone is None:
            return False
        self.upload_id = None  # aborted, or no longer there: nothing to do again
        return True

    async def exists(self, fs: Any, *, again: bool = False) -> bool | None:
        """Whether this object is there (committed, or found; a conditional one found
        with its token, else it is :attr:`taken`), asked with retries (``again``: even
        if committed); None if S3 cannot be asked."""
        if not self.tried or self.taken:
            return False  # never put or completed, or another sender's is there
        if again or not self.committed:
            try:
                head = await retried(
                    lambda: fs._call_s3("head_object", Bucket=self.bucket, Key=self.key)
                )
            except FileNotFoundError:
                return False
            except Exception:
                return None
            if self.conditional and (head.get("Metadata") or {}).get(TOKEN) != self.token:
                self.taken = True
                return False
            self.committed = True  # it landed: its upload is complete, nothing to abort
        return True


async def _each(
    objs: Sequence[_S3Object], action: Callable[[_S3Object], Coroutine[Any, Any, None]]
) -> list[BaseException | None]:
    """Run ``action`` on every object at once; the exception of each, or None."""
    return await asyncio.gather(*(action(o) for o in objs), return_exceptions=True)


async def _gather_results(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run every coroutine at once (each handles its own errors); their results."""
    return list(await asyncio.gather(*coros))


class S3Staging(Staging):
    """Multipart uploads with every upload part uploaded, and small objects held in memory.

    Args:
        store: where the objects go.
        part_bytes: size of one upload part (grown when an object would need more than
            10,000 upload parts).
        window: upload parts uploaded at once.
    """

    def __init__(self, store: S3Bucket, part_bytes: int, window: int) -> None:
        self.store = store
        self.part_bytes = part_bytes
        self.sidecars: list[_S3Object] = []
        self.mains: list[_S3Object] = []
        self._uploader = Uploader(store, window)

    @property
    def max_parts_in_flight(self) -> int:
        """The most part uploads that were in flight at once while staging (diagnostic)."""
        return self._uploader.max_in_flight

    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        """Hold a small object for a put at commit; start a multipart upload of a large
        one, whose upload parts are copied out one at a time and uploaded concurrently."""
        views = [memoryview(c).cast("B") for c in chunks]
        size = sum(v.nbytes for v in views)
        bucket, key = self.store.bucket_key(self.store.path(name))
        obj = _S3Object(bucket, key, self.store.conditional and never_replaced(name))
        into = self.mains if main else self.sidecars
        if size < SMALL_BYTES:
            obj.data = b"".join(views)
            into.append(obj)
            return
        # Whatever happens next (a lost reply that botocore answers by asking again, an
        # abort that fails), an upload may be left: the sink lists them when it closes.
        self.store.started_upload(key)
        out = yield from self.store.run_in_slices(
            self.store.fs._call_s3,
            "create_multipart_upload",
            Bucket=bucket,
            Key=key,
            Metadata=obj.metadata,
        )
        obj.upload_id = str(out["UploadId"])
        into.append(obj)  # from here on, discard() aborts it
        part = max(self.part_bytes, -(-size // _MAX_PARTS))
        uploader = self._uploader
        timer = SliceTimer()
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
                if timer.due():
                    yield
                    timer.restart()

    def drain(self) -> Sliced[None]:
        return self._uploader.drain()

    def commit(self) -> None:
        fs, run = self.store.fs, self.store.run

        def commit(obj: _S3Object) -> Coroutine[Any, Any, None]:
            return obj.commit(fs)

        # With conditional commits the step's first object goes alone: of two senders
        # committing one step at once, the one whose first object lands goes on and the
        # other stops there, having made nothing visible (its sidecars are deleted).
        first = 1 if self.store.conditional else len(self.sidecars)
        errs = run(_each, self.sidecars[:first], commit)
        if not any(errs):
            errs += run(_each, self.sidecars[first:], commit)
        failed = [e for e in errs if e is not None]
        if failed:
            self.discard()
            with contextlib.suppress(Exception):  # sidecars without a main are garbage
                run(delete, fs, run(ours, fs, self.sidecars))
            self._fail(failed[0], "commit the step (nothing was made visible)")
        # Rank 0's main object first, then the others at once: a commit cut short leaves
        # the step visible from rank 0 up, which resume tells apart from the oldest step
        # cut short by retention (that one goes rank 0 first).
        errs = run(_each, self.mains[:1], commit)
        if errs[0] is None or run(self.mains[0].exists, fs):
            errs += run(_each, self.mains[1:], commit)
        failed = [e for e in errs if e is not None]
        if not failed:
            self.visible = True
            return
        # A request that failed may still have landed (a lost reply): ask which main
        # objects are there, retrying while S3 cannot be reached. A step is never guessed
        # visible or not: the sender must neither reuse its number nor skip it.
        states = run(_gather_results, [o.exists(fs) for o in self.mains])
        ranks = [rank for rank, state in enumerate(states) if state]
        unknown = [rank for rank, state in enumerate(states) if state is None]
        if len(ranks) == len(self.mains):
            self.visible = True  # every request that failed had landed: committed
            return
        self.visible = True if ranks else None if unknown else False
        self.discard()
        if self.visible:
            unsure = f"; whether ranks {unknown} are too is unknown" if unknown else ""
            what = f"commit the step in full (visible for ranks {ranks} only{unsure})"
            self._fail(failed[0], what, ranks)
        if self.visible is None:
            # Sidecars stay: deleting them could tear a step that did become visible.
            self._fail(
                failed[0],
                "commit the step, and whether it became visible is unknown (S3 could not be "
                "asked); a sender opened with on_existing='resume' settles it",
            )
        with contextlib.suppress(Exception):
            run(delete, fs, run(ours, fs, self.sidecars))
        self._fail(failed[0], "commit the step (nothing was made visible)")

    def _fail(self, exc: BaseException, action: str, ranks: Sequence[int] = ()) -> NoReturn:
        """Raise the error of a failed commit, from ``exc``: ``StepExistsError`` naming
        the object when another sender's was there, ``ConfigError`` when the store does
        not implement conditional writes, else a TransportError saying that ``action``
        failed."""
        objs = (*self.sidecars, *self.mains)
        if any(o.bad_request for o in objs):
            # A store without the header may refuse it with 400 (not 501): only a hint.
            action += (
                f" (the store answered a write with If-None-Match: * with 400: if it does "
                f"not implement conditional writes, open the sender with "
                f"storage_options={{{OPTION!r}: False}})"
            )
        err: RlwireError = transport_error(exc, action, where=self.store.url)
        if taken := [o for o in objs if o.taken]:
            err = conflict(self.store.url, taken[0].key, ranks)
        elif refused := [o for o in objs if o.unsupported]:
            err = unsupported(self.store.url, refused[0].key, exc)
        raise err from exc

    def discard(self) -> None:
        # Best effort: a failure here must not hide the error that led to it. Each abort
        # is retried; an upload that still cannot be aborted is invisible to readers,
        # and the sink lists and aborts such uploads when it closes (as does the next
        # on_existing="resume", "truncate" or "overwrite").
        self._uploader.cancel()
        fs = self.store.fs
        with contextlib.suppress(Exception):
            self.store.run(_gather_results, [o.abort(fs) for o in (*self.mains, *self.sidecars)])
