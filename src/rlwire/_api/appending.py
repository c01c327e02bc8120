"""Fields appended to a committed step: ``await sender.add_fields(step, {...})``.

A later stage (a reference model adding ``ref_logprobs``, a critic adding ``values``)
stores new columns beside a step's samples without rewriting them. The sender checks
them against the step as stored (its row count, and each :class:`~rlwire.Ragged`'s row
lengths against the step's ``token_ids``), encodes them as one
:class:`~rlwire.Columns` and has the sink commit it as a message of its own
(:class:`~rlwire.transport._appended.FieldsSink`: files and S3, ``ray://``). The check
reads of the step only its codec header and the offsets of its ``token_ids`` (a list of
samples not stored as columns is decoded whole). A receiver reads those messages with
the step and hands the fields out with the others (:mod:`rlwire._api.merged_fields`);
one opened with ``fields=`` reads, of the step itself, only the fields not appended, and
waits for a named field that neither the step nor its appended messages hold yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
from anyio import CapacityLimiter, to_thread

from rlwire._api.appended_reads import AppendedRead, forget, keep, read_appended
from rlwire._api.appended_rows import (
    column_table,
    none_in_every_row,
)
from rlwire._api.appending_commit import add_fields
from rlwire._api.decoding import FrameDecoding
from rlwire._api.fields import FieldNames, FieldSelector
from rlwire._api.options import Limits
from rlwire._api.sealed import SealedStep, where_of
from rlwire._core.backends import BackendLock
from rlwire._core.columns import Column
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    FieldNotFoundError,
    RlwireError,
)
from rlwire._frame.compression import Compressor
from rlwire._frame.frame import Frame
from rlwire.codecs._registry import Codec
from rlwire.transport._base import Sink, Source

__all__ = [
    "Appended",
    "AppendingSender",
    "FieldPending",
    "add_fields",
    "read_with_appended",
]


class AppendingSender:
    """The ``add_fields`` of :class:`~rlwire.TrainingBatchSender`."""

    _lock: anyio.Lock
    _sink: Sink
    _limiter: CapacityLimiter
    _opened: bool
    _closed: bool
    _codec: Codec
    _compressor: Compressor | None
    _fields_lock: anyio.Lock | None = None

    async def add_fields(
        self,
        step: int,
        fields: Mapping[str, Column],
        *,
        rows: int | None = None,
        rank: int = 0,
        of: bytes | None = None,
    ) -> None:
        """Store ``fields`` (name -> :class:`~rlwire.Ragged`, array or list, one value
        per sample; an array of two or more dimensions arrives as the Ragged of its
        rows) beside ``rank``'s samples of the committed ``step``, atomically
        (docs/how-to/fields.md, "Add fields to a stored step").

        A sender that has not opened its destination (no ``async with``, nothing sent)
        does not open it to append: nothing is deleted, resumed or truncated, so a stage
        that only appends may run beside the live producer.

        ``of``: the :attr:`~rlwire.ReceiveStats.message_id` of the step the fields were
        computed from (``receiver.last_stats.message_id`` right after it was received).
        Given, the fields are stored only beside that message: if a producer restarted
        with ``overwrite`` (or ``truncate``) has deleted the step and sent it again
        since, the call refuses, even when the new step has the same shape. Without it,
        the fields are tied to the step as this call finds it.

        A field named in the sender's ``sidecar=`` goes to a sidecar, as in a step
        (``sidecar=("values",)`` puts a ``values`` field's bytes there); the names
        match the fields given, and one that matches none is no error here: it is for
        the steps.

        Raises:
            SchemaError: a row count differs from the step's (or ``rows``), a Ragged's
                row from the step's ``token_ids`` (names the field and the first bad
                row), or a field is in the step already (appended by another stage
                meanwhile, too).
            ConfigError: ``step`` or ``rank`` is not an int (a numpy integer is
                taken) of at least 0, the sink keeps no steps (ZeroMQ), the step is
                not committed, ``rank`` is none of its ranks, or the step was deleted
                (and sent again, by a producer restarted with ``overwrite``) during
                the call: the fields are tied to no step a receiver gets.
                With ``of``: the step as stored is another message than ``of``
                (or ``of`` is not bytes).
            StepExistsError: (files, S3) 8 tries in a row found this call's message
                number taken while no other message was appended to the step and rank
                (a sender opening removed the file in the making, say; the step holds
                1000 such messages). A number another stage took is tried again for as
                long as they append (``ray://`` numbers it at the commit).
            TransportError: the destination cannot be read or written.
            ClosedError: the sender is closed.

        Example:
            >>> import numpy as np, rlwire, anyio, tempfile
            >>> path = tempfile.mkdtemp()
            >>> async def main() -> None:
            ...     async with rlwire.open_sender(path) as sender:
            ...         await sender.send({"samples": [{"token_ids": np.arange(3)}]})
            ...         await sender.add_fields(0, {"score": [0.5]})
            >>> anyio.run(main)
            >>> with rlwire.open_receiver(path, type=dict) as receiver:
            ...     float(receiver.receive(timeout=5)["samples"][0]["score"])
            0.5
        """
        sink = self._sink
        if not self._opened:
            # A stage's sender, never opened: attached (again), what its lock guards.
            async with self._lock:
                self._check_appends(sink)
                if not self._opened:
                    await to_thread.run_sync(sink.attach_fields, limiter=self._limiter)
        # Not the send lock: a send (or open_step) holds it while it waits for room
        # (max_ahead), which a receiver waiting for this call's fields may hold back.
        async with self._appending():
            self._check_appends(sink)
            side = _sidecar_names(self._codec)
            await add_fields(
                sink, self._limiter, Limits(), step, fields, rows, rank, of, side, self._compressor
            )

    def _check_appends(self, sink: Sink) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if not sink.appends_fields:
            raise ConfigError(
                f"add_fields needs a destination that keeps steps (files, fsspec/S3, "
                f"ray://); {sink!r} keeps none (a socket hands a step over and forgets it)"
            )

    def _appending(self) -> anyio.Lock:
        """The lock of this sender's ``add_fields`` calls, one at a time, apart from its
        sends: a call touches a committed step (the sink's reads of it, and its staging
        of the fields, which it guards), not the order of the steps sent. ``aclose``
        takes it too, after the send lock, so that the sink is closed after the call."""
        if self._fields_lock is None:
            self._fields_lock = BackendLock()
        return self._fields_lock

    @contextlib.asynccontextmanager
    async def _appends_ended(self) -> AsyncIterator[None]:
        """Held by ``aclose`` (the send lock held): no ``add_fields`` runs. Taken
        without a checkpoint when free, as ``aclose`` takes the send lock."""
        lock = self._appending()
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()


def _sidecar_names(codec: Any) -> frozenset[str]:
    """The sidecar names of a sender's codec (the msgpack codec's ``sidecar``; none for
    a codec that has none, as JSON)."""
    names = getattr(codec, "sidecar", None)
    if isinstance(names, set | frozenset) and all(isinstance(n, str) for n in names):
        return frozenset(names)
    return frozenset()


@dataclass
class Appended:
    """A step as read (a frame, or a sealed step's parts), with the columns appended to
    it, the fields its own read was limited to, and the bytes of the appended messages
    read for those columns."""

    inner: Any
    columns: dict[str, Column]
    fields: frozenset[str] | None
    appended_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """The bytes read: the step's (as its read was limited), and of its fields'."""
        return int(self.inner.nbytes) + self.appended_bytes

    @property
    def message_id(self) -> bytes:
        """The step's :attr:`~rlwire.Frame.message_id` (a step filled part by part:
        its first part's)."""
        return bytes(self.inner.message_id)


class FieldPending(NamedTuple):
    """A step is there and a field asked for is not (yet): why the receiver waits."""

    why: str


def read_with_appended(
    source: Source,
    step: int,
    fields: frozenset[str] | None,
    decoding: FrameDecoding,
    read: Any,
) -> tuple[int, Any] | FieldPending | None:
    """``read()`` (the receiver's read of ``step``) with the appended fields of the
    step: what it returned wrapped in :class:`Appended`, or a ``FieldPending`` while
    a field named in ``fields`` is neither in the step nor appended yet (the source is
    told, so that its next wait waits for another appended message)."""
    if not source.appends_fields:
        return read()  # type: ignore[no-any-return]
    appended = _read_appended(source, step, fields, decoding)
    got = _with_appended(source, step, fields, decoding, read, appended)
    if isinstance(got, FieldPending) and fields is not None:
        keep(source, step, appended)  # read no further while it waits (appended_reads)
    else:
        forget(source)
    return got


def _with_appended(
    source: Source,
    step: int,
    fields: frozenset[str] | None,
    decoding: FrameDecoding,
    read: Any,
    got_appended: AppendedRead,
) -> tuple[int, Any] | FieldPending | None:
    count, appended, nbytes, _ = got_appended
    rest = fields
    select = source.select
    if fields is not None:
        rest = fields - set(appended)
        source.select = FieldSelector(decoding, rest)
    try:
        got = read()
        if got is not None and rest:
            _check_holds(got[1], FieldSelector(decoding, rest))
    except FieldNotFoundError as exc:
        source.expect_fields(step, count)
        return FieldPending(str(exc))  # the step is there, a field is not (yet): wait
    finally:
        source.select = select
    if got is None:
        return None
    if count and not source.appended_still_tied(step):
        return FieldPending(f"step {step} was deleted and written again while it was read")
    try:
        empty = none_in_every_row(_frames(got[1]), rest, decoding) if rest else None
    except RlwireError as exc:  # its header, read again: say whose
        exc.add_context(where=where_of(source, step, got[1]), step=step)
        raise
    if empty is not None:  # a field the step left empty, to be appended: wait for it
        source.expect_fields(step, count)
        return FieldPending(f"field {empty!r} is None in every row of the step")
    if fields is not None:
        appended = {k: v for k, v in appended.items() if k in fields}
    if not appended and rest == fields:
        return got  # type: ignore[no-any-return]
    inner = got[1]
    if rest == frozenset() and isinstance(inner, SealedStep) and len(inner.parts) > 1:
        inner = _place(inner, decoding)
    return got[0], Appended(inner, appended, rest, nbytes)


def _read_appended(
    source: Source, step: int, fields: frozenset[str] | None, decoding: FrameDecoding
) -> AppendedRead:
    """:func:`read_appended`, a field asked for by its attribute name (``fields`` a
    :class:`FieldNames`) read under it too, and named as stored."""
    if not isinstance(fields, FieldNames):
        return read_appended(source, step, fields, decoding)
    got = read_appended(source, step, fields.spellings(), decoding)
    return got._replace(columns=fields.as_stored(got.columns))


def _place(inner: SealedStep, decoding: FrameDecoding) -> SealedStep:
    """What of a sealed step read for appended fields alone is decoded: the step gives
    their place (its samples' list) and no column, which its first part that holds rows
    stored as columns tells (its header says so; its columns are not read: they have no
    row count then). An empty part (``put([])``) holds its samples as a plain empty list,
    which would set the fields' rows to 0. With no such part (a codec that stores no
    columns), every part: they are joined as decoded."""
    for info, frame in inner.parts:
        table = column_table(frame, decoding)
        if table is not None and table.rows:
            return SealedStep(inner.seal, [(info, frame)])
    return inner


def _frames(read: Any) -> list[Frame]:
    """The frames of what a source's read of a step returned: one, or its parts'."""
    frames = [f for _, f in read.parts] if isinstance(read, SealedStep) else [read]
    return [f for f in frames if isinstance(f, Frame)]


def _check_holds(read: Any, select: FieldSelector) -> None:
    """Raise FieldNotFoundError if a message read whole (by a source that does not
    read part of one, as ``ray://``) lacks a field ``select`` names; a partial read
    asked the selector already."""
    for frame in _frames(read):
        if not frame.missing:
            select(frame)
