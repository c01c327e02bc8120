"""TrainingBatchReceiver: a source and a codec, with sync and async faces over one core
(the rule for the two faces is in :mod:`rlwire._api.receiver`)."""

from __future__ import annotations

import copy
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from anyio import CancelScope, CapacityLimiter
from typing_extensions import Unpack

from rlwire._api.appending import Appended, FieldPending, read_with_appended
from rlwire._api.decoding import FrameDecoding
from rlwire._api.fields import FieldSelector, check_fields
from rlwire._api.merged_fields import merged_rows, rows_type
from rlwire._api.options import Limits, LimitsKeywords, from_keywords
from rlwire._api.parts import NOTHING as _NOTHING
from rlwire._api.parts import PartsReader
from rlwire._api.release import note_received
from rlwire._api.row_reads import RowReads
from rlwire._api.schema import TrainingBatch, TrainingSample, check_columns_held
from rlwire._api.sealed import SealedStep, read_sealed, where_of
from rlwire._api.stats import ReceiveStats, received
from rlwire._checks.checks import Checks
from rlwire._core.deadlines import deadline_after, time_left
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    DecodeError,
    EndOfStream,
    ReceiveTimeout,
    RlwireError,
)
from rlwire._core.offload import drive_sliced, make_limiter, offload
from rlwire._core.slicing import Held, Sliced, run_sliced
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source

__all__ = ["TrainingBatchReceiver"]

T = TypeVar("T")


class TrainingBatchReceiver(PartsReader[T], RowReads, Generic[T]):
    """Receives the objects of consecutive steps for one rank.

    Synchronous (``receive``, ``poll``, ``for``, ``with``) for trainer processes and
    asynchronous (``areceive``, ``async for``, ``async with``) for event-loop code, over one
    core, so they can be mixed. Each message is decoded by the codec it names, decompressed
    segment by segment in parallel threads; ``fields`` reads some (:mod:`rlwire._api.fields`).
    """

    def __init__(  # noqa: PLR0913 (the options open_receiver resolved, one each)
        self,
        source: Source,
        type: Any,
        *,
        start_step: int = 0,
        rank: int | None = None,
        validate: bool | Checks = False,
        writable: bool = False,
        limits: Limits | None = None,
        limiter: CapacityLimiter | int | None = None,
        record_consumed: bool = True,
        as_columns: bool = False,
        fields: Iterable[str] | None = None,
        resume: bool = False,
        **keywords: Unpack[LimitsKeywords],
    ) -> None:
        self._source = source
        self._rank = rank
        self._limits = from_keywords(
            Limits, limits, keywords, parameter="limits", function="TrainingBatchReceiver"
        )
        self._type = type
        self._step: int | None = None
        if not isinstance(validate, bool | Checks):
            raise ConfigError(f"validate must be True, False or a rlwire.Checks, got {validate!r}")
        self._validate = validate
        self._names_checked = False  # Checks names are matched against the first object only
        self._writable = writable
        self._limiter = make_limiter(limiter)
        self._fields = check_fields(fields, type)
        if self._fields is not None and validate is True:
            raise ConfigError(
                "validate=True checks whole TrainingSamples, and fields= reads only some of "
                "their fields: receive with validate=False, or read every field"
            )
        self._as_columns = as_columns or self._fields is not None  # fields: columns, always
        self._decoding = FrameDecoding(
            self._limits, self._limiter, writable=writable, fields=self._fields
        )
        if self._fields is not None:  # the source reads only what the fields need
            source.select = FieldSelector(self._decoding, self._fields)
        self._mutex = threading.Lock()
        self._closed = False
        self._peeked: tuple[int, Frame | SealedStep] | None = None  # read by wait_next()
        self._pending: str | None = None  # why the step is not there yet, when known
        self._read_span = (0.0, 0.0)  # when the last read began and ended
        self._record_consumed = record_consumed
        self._start_marks(start_step, resume)  # where it starts: start_step, or the marks
        self._note_run()  # resumed part way through a step: which run it is of
        self._last_stats: ReceiveStats | None = None

    def __repr__(self) -> str:
        return f"TrainingBatchReceiver({self._source!r}, next_step={self._next_step})"

    @property
    def last_step(self) -> int | None:
        """The step of the object last returned, or ``None`` before the first (as the
        sender's ``last_step`` is the step it last sent)."""
        return self._step

    @property
    def step(self) -> int | None:
        """Deprecated: :attr:`last_step`."""
        message = "receiver.step is deprecated: use receiver.last_step"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return self._step

    @property
    def next_step(self) -> int:
        """The step the next receive returns."""
        return self._next_step

    @property
    def last_stats(self) -> ReceiveStats | None:
        """The figures of the last step received, or ``None`` before the first."""
        return self._last_stats

    def _take(self, started: float, as_columns: bool | None = None) -> Sliced[Any]:
        """The core, a sliced generator: the next step's object, or ``_NOTHING`` if it
        is not there yet. The sync faces run it in the calling thread; the async ones
        run its slices in worker threads, letting go of the GIL between them, so that
        decoding a large message never keeps the event loop from the GIL for long. The
        mutex is held across slices, which may run in different threads (a
        ``threading.Lock`` may be released by any thread), and waited for in slices."""
        held = Held(self._mutex)
        try:
            yield from held.take()
            got = self._peeked or self._read()
            self._peeked = None
            if got is None:
                return _NOTHING
            step, frame = got
            began, ended = self._read_span  # its part in this call (wait_next read before)
            seconds = dict.fromkeys(("decompress", "decode"), 0.0)
            seconds["read"] = max(0.0, ended - max(began, started))
            try:
                columns = self._as_columns if as_columns is None else as_columns
                obj = yield from self._decode(frame, seconds, columns or self._fields is not None)
                yield from self._check(obj, step)
            except RlwireError as exc:
                # A stored message can be read again, or skipped; one a socket has handed
                # over is gone, and waiting for it again would only report a gap.
                if self._source.reads_once:
                    self._next_step = step + 1
                where = isinstance(exc, DecodeError) and where_of(self._source, step, frame)
                exc.add_context(where=where or None, step=step, rank=self._rank)
                raise
            self._take_from_here()
            self._step, self._next_step, self._part_next = step, step + 1, 0
            rank, nbytes, message_id = self._rank or 0, frame.nbytes, frame.message_id
            self._last_stats = received(step, rank, nbytes, message_id, seconds, started)
            if type(obj) is TrainingBatch:
                note_received(obj)
            return obj
        finally:
            held.release()

    def _check(self, obj: Any, step: int) -> Sliced[None]:
        """Validate ``obj`` as ``validate=`` asks, in slices; a TrainingBatch received
        as columns (of every field: ``fields=`` asks for some) holds those it requires."""
        if self._fields is None and isinstance(obj, TrainingBatch):
            check_columns_held(obj)
        if isinstance(self._validate, Checks):
            yield from self._validate.validate_sliced(obj, check_names=not self._names_checked)
            self._names_checked = True
        if self._validate is not False and isinstance(obj, TrainingBatch | TrainingSample):
            obj.validate(f"step {step}")

    def _read(self) -> tuple[int, Frame | SealedStep] | None:
        """The next step's frame (or sealed parts) if it has arrived (the mutex held)."""
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        began = time.perf_counter()
        try:
            self._record_position()
            got = read_with_appended(
                self._source, self._next_step, self._fields, self._decoding, self._read_step
            )
            self._pending = got.why if isinstance(got, FieldPending) else None
            self._found(got is not None)  # (a step waiting for a field was sent)
            if got is None or isinstance(got, FieldPending):
                return None
            self._started()  # it moved past the steps before this one: say so if not yet
            return got
        except RlwireError as exc:
            self._read_failed(exc)  # a step found deleted: the mark lowered goes back
            exc.add_context(rank=self._rank)
            raise
        finally:
            self._read_span = (began, time.perf_counter())

    def _read_step(self) -> tuple[int, Frame | SealedStep] | None:
        got = self._source.read_next(self._next_step)
        if got is None and self._source.stores_parts:
            return read_sealed(self._source, self._next_step, self._rank or 0)
        return got

    def _peek(self) -> Sliced[bool]:
        """Read the next step's frame, if it has arrived, and keep it for the next
        receive: True if there is one."""
        held = Held(self._mutex)
        try:
            yield from held.take()
            if self._peeked is None:
                self._peeked = self._read()
            return self._peeked is not None
        finally:
            held.release()

    def _decode(
        self,
        frame: Frame | SealedStep,
        seconds: dict[str, float],
        as_columns: bool,
        type_: Any = _NOTHING,
    ) -> Sliced[Any]:
        type_ = self._type if type_ is _NOTHING else type_
        if isinstance(frame, Appended):  # add_fields; as columns if made rows after (rows_type)
            rows = None if as_columns else rows_type(type_, frame, self._decoding)
            decoding, self._decoding = self._decoding, copy.copy(self._decoding)
            self._decoding.fields = frame.fields
            try:
                obj = yield from self._decode(frame.inner, seconds, as_columns or bool(rows), type_)
            finally:
                self._decoding = decoding
            return (yield from merged_rows(obj, frame, rows, seconds, type_))
        if isinstance(frame, SealedStep):
            return (yield from self._decode_sealed(frame, seconds, as_columns))
        return (yield from self._decoding.decode(frame, type_, seconds, as_columns))

    def poll(self, *, as_columns: bool | None = None) -> T | None:
        """Return the next step's object if it has arrived, else ``None`` at once.

        ``as_columns`` overrides the receiver's choice for this step (see
        :func:`~rlwire.open_receiver`).

        Raises:
            CorruptFrameError: the stored message is truncated or garbled.
            DecodeError: the message does not match ``type``.
            SchemaError: ``validate`` is on and the object breaks a rule.
            ConfigError: a :class:`~rlwire.Checks` name matches no field of the first
                object received.
            EndOfStream: the sender finished the stream before the next step.
            StepGapError: ZeroMQ lost a message (the next call returns the one after), or
                ``keep_last`` deleted the step unread (each call says: reopen where named).
            TransportError: the source cannot be read (a network or disk failure).
            ClosedError: the receiver is closed.
        """
        obj = run_sliced(self._take(time.perf_counter(), as_columns))
        return None if obj is _NOTHING else obj

    def receive(self, timeout: float | None = None, *, as_columns: bool | None = None) -> T:
        """Wait for the next step and return its object (``as_columns``: see :meth:`poll`).

        Raises:
            ReceiveTimeout: nothing arrived within ``timeout`` seconds.
            ConfigError: ``timeout`` is neither None nor a number.
            RlwireError: the others of :meth:`poll` (``EndOfStream``,
                ``CorruptFrameError``, ``DecodeError``, ``SchemaError``, ``StepGapError``,
                ``TransportError``, ``ClosedError``), for the same reasons.
        """
        started = time.perf_counter()
        deadline = deadline_after(timeout)
        while True:
            obj = run_sliced(self._take(started, as_columns))
            if obj is not _NOTHING:
                return obj  # type: ignore[no-any-return]
            self._source.wait(self._left(deadline, timeout))

    async def areceive(self, timeout: float | None = None, *, as_columns: bool | None = None) -> T:
        """Like :meth:`receive`, without blocking the event loop: reads and decoding run
        in worker threads. A cancelled call (by anyio, trio or asyncio's own
        ``asyncio.timeout``) leaves the step it was taking to the next receive.
        """
        started = time.perf_counter()
        deadline = deadline_after(timeout)
        while True:
            obj = await drive_sliced(
                self._take(started, as_columns), self._limiter, dropped=self._give_back
            )
            if obj is not _NOTHING:
                return obj  # type: ignore[no-any-return]
            await self._source.await_message(self._left(deadline, timeout))

    def wait_next(self, timeout: float | None = None) -> bool:
        """Wait until the next step can be received, without receiving it.

        Returns:
            True once the next step has arrived (the next :meth:`receive` returns it at
            once, without reading it again); False if ``timeout`` seconds pass first.

        Raises:
            EndOfStream: the sender finished before the next step.
            CorruptFrameError, TransportError, ClosedError: as :meth:`poll`.

        Example:
            >>> import rlwire, tempfile
            >>> with rlwire.open_receiver(tempfile.mkdtemp()) as receiver:
            ...     receiver.wait_next(timeout=0.01)
            False
        """
        deadline = deadline_after(timeout)
        while not run_sliced(self._peek()):
            remaining = time_left(deadline)
            if remaining is not None and remaining <= 0:
                return False
            self._source.wait(remaining)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Deprecated: :meth:`wait_next`."""
        message = "receiver.wait() is deprecated: use receiver.wait_next()"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return self.wait_next(timeout)

    async def await_next(self, timeout: float | None = None) -> bool:
        """:meth:`wait_next` without blocking the event loop: the peek runs in a worker
        thread."""
        deadline = deadline_after(timeout)
        while not await drive_sliced(self._peek(), self._limiter):
            remaining = time_left(deadline)
            if remaining is not None and remaining <= 0:
                return False
            await self._source.await_message(remaining)
        return True

    def _left(
        self, deadline: float | None, timeout: float | None, part: bool = False
    ) -> float | None:
        remaining = time_left(deadline)
        if remaining is not None and remaining <= 0:
            what = "no new part of step {} came" if part else "step {} did not arrive"
            raise ReceiveTimeout(
                f"{self._source!r}: {what.format(self._next_step)} within {timeout} s"
                + (f" (waiting for a field: {self._pending})" if self._pending else "")
            )
        return remaining

    def __iter__(self) -> TrainingBatchReceiver[T]:
        return self

    def __next__(self) -> T:
        try:
            return self.receive()
        except EndOfStream:
            raise StopIteration from None

    def __aiter__(self) -> TrainingBatchReceiver[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.areceive()
        except EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop receiving; objects already returned stay valid. Idempotent."""
        with self._mutex:
            if not self._closed:
                self._closed = True
                self._source.close()

    async def aclose(self) -> None:
        """Async :meth:`close`; shielded: a receiver left by a cancellation (an ``async
        with`` block cancelled) is closed all the same."""
        # A ZeroMQ context left open blocks forever the thread whose collection finds it.
        # Not under the receiver's limiter: waiting there for the mutex would hold a
        # token that a take under way in another task may need to go on.
        with CancelScope(shield=True):
            await offload(self.close)

    def __enter__(self) -> TrainingBatchReceiver[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> TrainingBatchReceiver[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
