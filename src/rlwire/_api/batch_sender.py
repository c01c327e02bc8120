"""TrainingBatchSender: a codec and a sink, step bookkeeping, thread offload."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio
from anyio import CapacityLimiter
from typing_extensions import Unpack

from rlwire._api.appending import AppendingSender
from rlwire._api.options import Retention, RetentionKeywords, from_keywords
from rlwire._api.owned_parts import OwnedParts
from rlwire._api.room import Room
from rlwire._api.stats import SendClock, SendStats
from rlwire._api.step_order import resolve_step
from rlwire._api.step_writer import StepWriter
from rlwire._api.validation import ChecksBeside, Validation
from rlwire._checks.checks import Checks
from rlwire._core.args import check_step
from rlwire._core.backends import BackendLock
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    RlwireError,
    StepOrderError,
    TransportError,
)
from rlwire._core.offload import make_limiter, thread_count
from rlwire._core.slicing import Sliced, timed
from rlwire._frame.compression import Compressor, compress_sliced
from rlwire._frame.frame import Frame, joined_pieces
from rlwire.codecs._registry import Codec, encoding
from rlwire.transport._base import OnExisting, Sink, Staged

__all__ = ["TrainingBatchSender"]


class TrainingBatchSender(AppendingSender):
    """Sends one object per step (or one per data-parallel rank) through a sink.

    Each send encodes and writes in worker threads, in slices short enough that the
    event loop stays responsive, and returns once the step is visible to readers. A
    failed or cancelled send (also by ``asyncio.timeout``) leaves nothing visible, or,
    cancelled during its commit, the whole step, counted. Sends are serialized.
    """

    def __init__(  # noqa: PLR0913 (the options open_sender resolved, one each)
        self,
        sink: Sink,
        codec: Codec,
        *,
        compression: Compressor | None = None,
        on_existing: OnExisting = "error",
        start_step: int | None = None,
        retention: Retention | None = None,
        limiter: CapacityLimiter | int | None = None,
        checks: Checks | None = None,
        on_stats: Callable[[SendStats], object] | None = None,
        **keywords: Unpack[RetentionKeywords],
    ) -> None:
        if on_existing not in ("error", "resume", "truncate", "overwrite"):
            raise ConfigError(
                "on_existing must be 'error', 'resume', 'truncate' or 'overwrite', "
                f"got {on_existing!r}"
            )
        if start_step is not None:
            check_step(start_step, "start_step")
        elif on_existing == "truncate":
            raise ConfigError(
                "on_existing='truncate' needs start_step: the steps at or after it are "
                "deleted (for a restart from a checkpoint at step N, start_step=N)"
            )
        self._start_step = start_step
        self._retention = from_keywords(
            Retention, retention, keywords, parameter="retention", function="TrainingBatchSender"
        )
        if self._retention.active and type(sink).read_consumption is Sink.read_consumption:
            raise ConfigError(
                f"keep_last and max_ahead need a store that records what receivers "
                f"consumed (files, fsspec); {sink!r} does not (ZeroMQ has its own "
                "backpressure: the storage option 'hwm')"
            )
        if self._retention.keep_last is not None and type(sink).prune is Sink.prune:
            raise ConfigError(
                f"keep_last needs a sink that deletes steps: {sink!r} records what receivers "
                "consumed but implements no prune() (max_ahead alone works with it)"
            )
        sink.check_retention(self._retention.keep_last, self._retention.max_ahead)
        self._sink = sink
        self._codec = codec
        self._compressor = compression
        self._on_existing: OnExisting = on_existing
        self._limiter = make_limiter(limiter)
        self._lock: anyio.Lock = BackendLock()
        self._opened = False
        self._closed = False
        self._finished = False
        self._ending = False  # a finish() cancelled or failed: the end may be marked
        self._unknown_step: int | None = None  # a step whose commit left it undecided
        self._room = Room(sink, self._retention)  # keep_last and max_ahead at work
        self._last_stats: SendStats | None = None
        self._on_stats = on_stats
        self._next_step = 0
        self._last_step: int | None = None
        self._checks = checks
        # A sender opened by open_sender gives its codec a hook of its own that queues the
        # checks of column-stored lists, to run beside the write.
        hook = getattr(codec, "check", None)
        self._beside = hook if isinstance(hook, ChecksBeside) else None
        self._names_checked = False  # Checks names are matched against the first object only
        self._filling: int | None = None  # the step a StepWriter is filling
        self._unsealed: int | None = None  # a step left open by a StepWriter's error
        self._owned = OwnedParts()  # the parts an open_step may take as this sender's

    def __repr__(self) -> str:
        return f"TrainingBatchSender({self._sink!r}, next_step={self._next_step})"

    @property
    def next_step(self) -> int:
        """The step ``send(obj)`` without ``step=`` will use."""
        return self._next_step

    @property
    def last_step(self) -> int | None:
        """The last step sent by this sender, or ``None``."""
        return self._last_step

    @property
    def sink(self) -> Sink:
        """The sink this sender writes to; for example, once open, ``sender.sink.url``
        is the address a ``zmq+tcp://host:0`` sender actually bound."""
        return self._sink

    async def __aenter__(self) -> TrainingBatchSender:
        await self.aopen()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aopen(self) -> None:
        """Prepare the destination (``async with`` and the first send do this).

        Raises:
            StepExistsError: the destination holds steps and ``on_existing="error"``.
            TransportError: the destination cannot be written.
        """
        async with self._lock:
            await self._open_locked()

    async def _open_locked(self) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if not self._opened:
            self._next_step = await self._sink.aopen(
                self._on_existing, self._limiter, self._start_step
            )
            self._room.first_step = self._next_step
            self._owned.opened(self._on_existing, self._next_step)
            self._opened = True

    async def send(self, obj: Any, *, step: int | None = None) -> int:
        """Send ``obj`` as ``step`` (default: the next step) for rank 0.

        Returns:
            The step number used; :attr:`last_stats` then holds the step's figures.

        Raises:
            SchemaError: ``obj`` fails validation (a TrainingSample's own rules, or the
                sender's :class:`~rlwire.Checks`); nothing is written.
            ConfigError: a :class:`~rlwire.Checks` name matches no field of the first
                object sent.
            EncodeError: ``obj`` holds a value the codec cannot carry; names its path.
            StepOrderError: ``step`` repeats, goes backwards or skips ahead.
            StepExistsError: the step already exists at the destination.
            TransportError: the destination cannot be written; or an earlier commit
                failed without knowing whether its step became visible (reopen with
                ``on_existing="resume"``).
            CorruptFrameError: with ``keep_last`` or ``max_ahead``, a receiver's
                consumption mark is garbled.
            ClosedError: the sender is closed, or finished its stream.
        """
        return await self.send_ranks([obj], step=step)

    async def send_ranks(self, objs: Sequence[Any], *, step: int | None = None) -> int:
        """Send ``objs[r]`` to data-parallel rank ``r``, all as one step.

        Every rank's message is written before any becomes visible; the commit is then a
        quick burst of renames, main messages last. If one of those renames fails, the
        step is reported as partial (``TransportError``) and its number is used up, so a
        retry can never give two ranks different data for one step. Errors are those
        of :meth:`send`; messages name the rank.
        """
        if isinstance(objs, str | bytes) or not isinstance(objs, Sequence) or not objs:
            raise ConfigError("send_ranks needs a non-empty sequence with one object per rank")
        async with self._lock:
            await self._open_locked()
            self._check_no_open_step()
            self._check_not_finished()
            if self._unknown_step is not None:
                raise TransportError(
                    f"whether step {self._unknown_step} became visible is unknown (its "
                    "commit failed and did not say); open a new sender "
                    "with on_existing='resume', which settles it, to go on",
                    where=self._sink,
                )
            step = self._resolve_step(step)
            self._sink.check_ranks(step, len(objs))  # before a wait for room it refuses
            # Each rank is validated and encoded when the sink is ready to write it, so
            # only one rank's encoded message is held at a time.
            clock = SendClock(len(objs))
            if self._retention.active:
                await self._room.make(step, len(objs), self._limiter)
                clock.waited = time.perf_counter() - clock.start
            validation = Validation()
            frames = [
                self._encode(obj, step, rank, clock, validation) for rank, obj in enumerate(objs)
            ]
            staged: Staged | None = None
            try:
                staged = await validation.stage(
                    self._sink.stage(step, frames), step, self._limiter, clock.resumes
                )
                self._names_checked = True
                clock.staged = time.perf_counter() - validation.commit_seconds
                await validation.commit(staged, self._limiter)
            except BaseException as exc:
                staged = await validation.settle_failed(staged)
                if staged is not None and staged.visible is None:
                    # Neither sending the step again nor going on is safe: a receiver
                    # could get two versions of it, or wait forever for it.
                    self._unknown_step = step
                    if isinstance(exc, RlwireError):
                        exc.add_context(step=step)
                raise
            finally:
                # Even a partly visible step must never be sent again.
                if staged is not None and staged.visible:
                    self._last_step = step
                    self._next_step = step + 1
            self._last_stats = stats = clock.stats(step)
        if self._on_stats is not None:
            self._on_stats(stats)
        return step

    def open_step(
        self,
        step: int | None = None,
        *,
        ranks: int = 1,
        cost: Callable[[Any], float] | None = None,
        balance: Literal["cost", "count"] = "cost",
    ) -> StepWriter:
        """Fill ``step`` (default: the next) part by part, ``async with`` it: see
        :class:`~rlwire.StepWriter` for what a part is, how it is assigned to one of
        ``ranks`` by ``cost`` (a callable of the samples; default: their tokens) and
        ``balance``, and what an error inside the block leaves.

        Raises:
            ConfigError: the sink cannot store parts (ZeroMQ's ``shared`` pattern), or a bad
                option; when entered, :meth:`send`'s errors about the step.
        """
        return StepWriter(self, step, ranks=ranks, cost=cost, balance=balance)

    async def _begin_parts(self, step: int | None, ranks: int) -> int:
        """Start filling ``step`` (default: the next), the lock held: its number."""
        await self._open_locked()
        self._check_no_open_step(but=step)
        self._check_not_finished()
        step = self._resolve_step(step)
        self._sink.check_ranks(step, ranks)  # before a wait for room it refuses
        if self._retention.active:
            await self._room.make(step, ranks, self._limiter, parts=True)
        self._filling = step
        return step

    def _end_parts(self, step: int, *, sealed: bool) -> None:
        self._filling, self._unsealed = None, None if sealed else step  # sealed, or left open
        if sealed:
            self._last_step, self._next_step = step, step + 1

    def _check_not_finished(self) -> None:
        if self._finished:
            raise ClosedError(f"{self!r} finished its stream: nothing can be sent after")
        if self._ending:
            raise ClosedError(
                f"{self!r}: finish() was cancelled or failed, and the end of the stream may "
                f"be marked at step {self._next_step}: call finish() again; nothing can be sent"
            )

    def _check_no_open_step(self, but: int | None = -1) -> None:
        """Refuse while a step is open part by part (but the one re-opened, ``but``)."""
        step = self._filling if self._filling is not None else self._unsealed
        if step is not None and (self._filling is not None or but not in (None, step)):
            raise StepOrderError(f"step {step} is open part by part: open_step({step}), seal it")

    def _encode(
        self, obj: Any, step: int, rank: int, clock: SendClock, validation: Validation
    ) -> Sliced[Frame]:
        """Encode and compress one rank's object, in slices, starting its checks beside."""
        try:
            try:
                frame = yield from timed(encoding(self._codec, obj), clock.seconds, "encode")
            finally:  # even if encoding failed: the checks' error is the one to raise
                # Started now, not beside the encoding: both hold the GIL, and passing it
                # back and forth slowed both; the write lets go of it.
                if self._checks is not None:
                    names = not self._names_checked
                    validation.start(rank, self._checks.validate_sliced(obj, check_names=names))
                queued = self._beside.take() if self._beside is not None else None
                if queued is not None:
                    validation.start(rank, queued)
            if self._compressor is not None:
                frame = yield from timed(
                    compress_sliced(frame, self._compressor, threads=thread_count(self._limiter)),
                    clock.seconds,
                    "compress",
                )
            if not self._sink.gathers:  # a plugin that writes memoryviews only
                frame = yield from timed(joined_pieces(frame), clock.seconds, "encode")
        except RlwireError as exc:
            exc.add_context(step=step, rank=rank)
            raise
        clock.sizes[rank] = frame.nbytes
        clock.sidecar_bytes += sum(frame.buffers[i].nbytes for i in frame.sidecar)
        return frame

    @property
    def last_stats(self) -> SendStats | None:
        """The figures of the last step sent, or ``None`` before the first."""
        return self._last_stats

    def _resolve_step(self, step: int | None) -> int:
        return resolve_step(step, self._next_step, self._last_step)

    async def finish(self) -> None:
        """Mark the end of the stream after the last step sent: receivers then get
        :class:`~rlwire.EndOfStream` from ``receive`` and ``areceive`` (and ``for`` /
        ``async for`` end) instead of waiting for the next step. On ZeroMQ, the
        receivers connected until the sender closes are told; this waits (up to the
        ``linger`` storage option) for room in a receiver's full queue. A second call
        does nothing; a send after it is a :class:`~rlwire.ClosedError`. A sender opened
        later on the same URL with ``on_existing="resume"`` continues the stream. After
        a ``finish()`` cancelled or failed part way, sends raise ``ClosedError`` (the
        end may be marked): call it again.

        Raises:
            TransportError: the mark cannot be written (on ZeroMQ: a receiver's queue
                stayed full for ``linger`` seconds).
            ConfigError: the sink cannot mark the end of a stream (a plugin's).
            ClosedError: the sender is closed.

        Example:
            >>> import anyio, rlwire, tempfile
            >>> async def main(path: str) -> None:
            ...     async with rlwire.open_sender(path) as sender:
            ...         await sender.send(rlwire.TrainingBatch(samples=[]))
            ...         await sender.finish()
            ...     with rlwire.open_receiver(path) as receiver:
            ...         print([len(batch.samples) for batch in receiver])
            >>> anyio.run(main, tempfile.mkdtemp())
            [0]
        """
        async with self._lock:
            await self._open_locked()
            self._check_no_open_step()
            if not self._finished:
                try:
                    await self._sink.afinish(self._next_step, self._limiter)
                except (StepOrderError, ConfigError, ClosedError):
                    raise  # refused before anything was marked
                except BaseException:
                    # Cancelled (asyncio's own cancellation passes the shield) or failed
                    # part way: receivers may have the end. Sends stop; finish() again.
                    self._ending = True
                    raise
                self._finished = True

    async def aclose(self) -> None:
        """Wait for an in-flight send to finish, then flush what the sink accepted and
        release its files and sockets. Idempotent. Called in a cancelled scope (an
        ``async with`` block left by a cancellation), it still closes, unless a send in
        another task holds the sender: the cancellation then ends the wait for it."""
        # Taken without a checkpoint when free, which a cancelled scope would refuse:
        # a ZeroMQ context left open blocks forever the thread whose garbage
        # collection finds it (its sockets, in the same garbage, are not closed first).
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            await self._lock.acquire()
        try:
            async with self._appends_ended():  # and for an add_fields in flight
                if not self._closed:
                    self._closed = True
                    await self._sink.aclose(self._limiter)
        finally:
            self._lock.release()
