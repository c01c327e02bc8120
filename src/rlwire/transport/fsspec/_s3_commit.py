"""Conditional commits on S3: what a refused or unsupported ``If-None-Match: *`` means.

A step's files (whole, part, appended fields, sidecars) and its seal are committed with
``If-None-Match: *`` (on PUT, and on completing a multipart upload), so that of two
senders committing one name at once exactly one succeeds, as a file sink's move that
never replaces a file. The marks (end, rewrite, consumption, part marks) are written
again in place and stay unconditional
(:func:`~rlwire.transport._stored.names.never_replaced`).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from rlwire._core.errors import ConfigError, StepExistsError
from rlwire.transport._stored.names import FIELDS_RE, SEAL_RE

__all__ = [
    "OPTION",
    "TOKEN",
    "conflict",
    "delete",
    "in_flight",
    "maybe_resent",
    "ours",
    "reply_is",
    "unsupported",
]

#: The storage option that turns conditional commits off (default on).
OPTION = "conditional_writes"
#: The user metadata key (``x-amz-meta-rlwire-commit``) holding a committed object's
#: token: a refused commit whose object holds its own token is its own retry.
TOKEN = "rlwire-commit"


def reply_is(exc: BaseException, status: int, code: str) -> bool:
    """Whether ``exc`` (what s3fs raises: an OSError translated from botocore's
    ``ClientError``, its cause) is S3's reply ``status`` / ``code``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            meta = response.get("ResponseMetadata") or {}
            if error.get("Code") == code or meta.get("HTTPStatusCode") == status:
                return True
        cur = cur.__cause__ or cur.__context__
    if status == 412:  # s3fs turns a failed If-None-Match into FileExistsError
        return isinstance(exc, FileExistsError)
    return status == 501 and isinstance(exc, OSError) and exc.errno == errno.ENOSYS


def maybe_resent(exc: BaseException, *, multipart: bool) -> bool:
    """Whether the refusal ``exc`` of a conditional commit may answer a request sent
    again (by botocore or s3fs) after the reply to the one that made the object was
    lost: 412 (the object is there), or, completing a multipart upload, 404
    ``NoSuchUpload`` (a store that forgets an upload once completed; others answer such
    a resend with the object). The object's token tells."""
    return reply_is(exc, 412, "PreconditionFailed") or (
        multipart and reply_is(exc, 404, "NoSuchUpload")
    )


def in_flight(exc: BaseException, key: str) -> bool:
    """Whether ``exc`` is S3's 409 ``ConditionalRequestConflict`` to a conditional
    commit of appended fields at ``key``: another stage was writing the same
    ``fields-NNN`` at that moment (or this commit's own earlier request: the token
    tells), so ``add_fields`` takes a free number, as after a 412. A step's object so
    refused stays a TransportError: its sender may send it again."""
    name = key.rpartition("/")[2]
    return reply_is(exc, 409, "ConditionalRequestConflict") and bool(FIELDS_RE.fullmatch(name))


def conflict(url: str, key: str, ranks: Sequence[int] = ()) -> StepExistsError:
    """The error of a commit that found another sender's object at ``key``; ``ranks``
    are those of the step this sender made visible before it."""
    name = key.rpartition("/")[2]
    if m := SEAL_RE.fullmatch(name):
        what = f"step {int(m.group(1))} is sealed already (another producer sealed it first)"
    elif FIELDS_RE.fullmatch(name):
        what = "another stage appended these fields first (two stages on one step and rank)"
    else:
        what = "another sender committed this step first (two senders on one destination)"
        if name.endswith(".sidecar.rlw"):  # or a failed commit's, left while S3 was out
            what += ", or a failed commit left this sidecar (on_existing='resume' removes it)"
    mine = f"; ranks {list(ranks)} are this sender's" if ranks else ""
    return StepExistsError(what + mine, where=f"{url}/{name}")


def unsupported(url: str, key: str, exc: BaseException) -> ConfigError:
    """The error of a commit the store refused with 501 (NotImplemented): it does not
    implement ``If-None-Match`` on writes."""
    name = key.rpartition("/")[2]
    return ConfigError(
        f"the store does not implement conditional writes (If-None-Match: * on PUT and on "
        f"completing a multipart upload): {exc}; open the sender with "
        f"storage_options={{{OPTION!r}: False}} to commit unconditionally (then two "
        f"senders committing one step at once can both succeed: one sender per prefix)",
        where=f"{url}/{name}",
    )


class _Object(Protocol):
    """What of an object on its way to S3 :func:`ours` asks."""

    bucket: str
    key: str
    tried: bool
    conditional: bool

    async def exists(self, fs: Any, *, again: bool = False) -> bool | None: ...


ObjT = TypeVar("ObjT", bound=_Object)


async def ours(fs: Any, objs: Sequence[ObjT]) -> list[ObjT]:
    """Those of ``objs`` this commit may have made: every one tried, or, conditional,
    those found with its token."""

    async def mine(obj: ObjT) -> bool:
        # Asked even if committed: a store whose conditions are not atomic (moto) may
        # have let another sender's commit replace it.
        return obj.tried and (not obj.conditional or bool(await obj.exists(fs, again=True)))

    found = await asyncio.gather(*(mine(o) for o in objs))
    return [o for o, hit in zip(objs, found, strict=True) if hit]


async def delete(fs: Any, objs: Sequence[_Object]) -> None:
    """Delete ``objs`` (best effort: failures are ignored)."""
    await asyncio.gather(
        *(fs._call_s3("delete_object", Bucket=o.bucket, Key=o.key) for o in objs),
        return_exceptions=True,
    )
