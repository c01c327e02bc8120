"""TrainingBatchSender: a codec and a sink, step bookkeeping, thread offload."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio
from anyio import CapacityLimiter, to_thread

from rlwire._api.schema import check_object
from rlwire._api.stats import SendStats
from rlwire._checks.checks import Checks
from rlwire._core.args import check_int
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    RlwireError,
    StepOrderError,
    TransportError,
)
from rlwire._core.offload import Resumes, drive_sliced, make_limiter, thread_count
from rlwire._core.slicing import Sliced, timed
from rlwire._frame.compression import Compressor, compress_sliced
from rlwire._frame.frame import Frame
from rlwire.codecs import Codec, make_codec
from rlwire.transport import open_sink
from rlwire.transport._base import OnExisting, Sink, SinkOptions

__all__ = ["TrainingBatchSender", "open_sender"]


def open_sender(
    url: str | os.PathLike[str],
    *,
    codec: str | Codec = "msgpack",
    compression: str | Compressor | None = None,
    sidecar: Iterable[str] | str | None = None,
    on_existing: OnExisting = "error",
    start_step: int | None = None,
    keep_last: int | None = None,
    max_ahead: int | None = None,
    fsync: bool = False,
    checksum: bool = True,
    limiter: CapacityLimiter | int | None = None,
    inline_threshold: int | None = None,
    validate: bool | Checks = True,
    storage_options: Mapping[str, Any] | None = None,
    on_stats: Callable[[SendStats], object] | None = None,
) -> TrainingBatchSender:
    """Open a sender that writes one message per step to ``url``.

    Args:
        url: where to send, chosen by scheme: a directory path or ``file://`` URL; any
            fsspec URL (``s3://bucket/prefix``, ``memory://run``, ...); ZeroMQ
            (``zmq+tcp://127.0.0.1:5555``, ``zmq+ipc:///tmp/run.sock``); or a scheme a
            plugin registers in the ``rlwire.sinks`` entry point group.
        codec: the name of an installed codec (``"msgpack"``, the default, or ``"json"``;
            plugins add more through the ``rlwire.codecs`` entry point group), or a codec
            object. Receivers pick the codec from each message, so they need no option.
        compression: ``None`` (default), ``"lz4"``, ``"zstd"`` or ``"zstd:LEVEL"`` (see
            :class:`~rlwire.codecs.Compressor`): compress the header and each
            out-of-band buffer of at least 64 KiB that shrinks by 10 % or more, in
            parallel worker threads.
        sidecar: field names (e.g. ``("routed_experts",)``) whose array and bytes values,
            at any depth, travel raw in a sidecar beside the main message.
        on_existing: what to do when ``url`` already holds steps: ``"error"`` (refuse
            any at or after ``start_step``), ``"resume"`` (continue after the last one,
            or at ``start_step``; refuses a stored sequence with a hole or an incomplete
            step, naming the step and the repair), ``"truncate"`` (delete the steps at
            or after ``start_step`` and keep the earlier ones: a restart from a
            checkpoint) or ``"overwrite"`` (delete them all). Steps are deleted when the
            sender opens, each step's main messages first.
        start_step: the step to send first (default: 0, or after the last stored step
            with ``"resume"``); required by ``"truncate"``. On ZeroMQ, receivers opened
            with the same ``start_step`` accept it.
        keep_last: on a store (files, fsspec), delete a step once every rank's
            receiver has moved past it (asked for a later step; see
            ``open_receiver(record_consumed=)``) and it is not among the newest
            ``keep_last``; a step some rank has not moved past is never deleted. The
            ranks are those of each send (``len(objs)`` for ``send_ranks``, 1 for
            ``send``).
        max_ahead: on a store, make each send wait, with the event loop free, while
            the step to send is more than ``max_ahead`` steps ahead of the slowest
            rank's receiver (a rank that recorded nothing yet counts as being at the
            sender's first step). Bound the wait with ``anyio.fail_after``: a cancelled
            wait sends nothing.
        fsync: make each step durable before it becomes visible.
        checksum: record an xxh3-64 checksum of the header and of every buffer, which
            receivers verify (about 40 GB/s; switch off only to measure its cost).
        limiter: the CapacityLimiter (or its size) that bounds the worker threads doing
            encoding and I/O; share one between senders to bound them together.
        inline_threshold: arrays and bytes smaller than this many bytes stay in the
            header (msgpack codec; default 4096).
        validate: ``True`` (default): rlwire's own rules, which validate every
            :class:`~rlwire.TrainingSample` at any depth before anything is written;
            ``False``: none; or a :class:`~rlwire.Checks` for any type, run on each
            object (per rank) in worker-thread slices before it is encoded, with
            rlwire's own rules for TrainingSample still applied as well.
        storage_options: options for the sink: fsspec's storage options for fsspec URLs
            (credentials, ``endpoint_url``, ...); ZeroMQ's for ``zmq+`` URLs (see the
            guide). A sink rejects keys it does not know.
        on_stats: called in the event loop with the :class:`~rlwire.SendStats` of each
            step once it is sent (also ``sender.last_stats``); what it raises, ``send``
            raises, after the step was sent.

    Raises:
        ConfigError: an unknown codec, compression or URL scheme (the message lists the
            known ones), an option the codec or sink does not take, or a missing
            optional dependency.

    Returns:
        A :class:`TrainingBatchSender`; use it as ``async with``.

    Example:
        >>> import anyio, rlwire, tempfile
        >>> async def main(path: str) -> int:
        ...     async with rlwire.open_sender(path) as sender:
        ...         return await sender.send(rlwire.TrainingBatch(samples=[]))
        >>> anyio.run(main, tempfile.mkdtemp())
        0
    """
    if not isinstance(validate, bool | Checks):
        raise ConfigError(f"validate must be True, False or a rlwire.Checks, got {validate!r}")
    options = {"sidecar": sidecar, "inline_threshold": inline_threshold}
    made = make_codec(
        codec,
        check=check_object if validate is not False else None,
        **{k: v for k, v in options.items() if v is not None},
    )
    return TrainingBatchSender(
        open_sink(
            url,
            SinkOptions(fsync=fsync, checksum=checksum, storage_options=storage_options or {}),
        ),
        made,
        compression=Compressor.parse(compression),
        on_existing=on_existing,
        start_step=start_step,
        keep_last=keep_last,
        max_ahead=max_ahead,
        limiter=limiter,
        checks=validate if isinstance(validate, Checks) else None,
        on_stats=on_stats,
    )


class _SendClock:
    """The figures of one send, gathered as it goes."""

    def __init__(self, ranks: int) -> None:
        self.start = time.perf_counter()
        self.staged = self.start
        self.waited = 0.0
        self.sizes = [0] * ranks
        self.sidecar_bytes = 0
        self.seconds = {"encode": 0.0, "compress": 0.0}
        self.resumes = Resumes()

    def stats(self, step: int) -> SendStats:
        now = time.perf_counter()
        staging = self.staged - self.start - self.waited
        encode, compress = self.seconds["encode"], self.seconds["compress"]
        return SendStats(
            step=step,
            ranks=len(self.sizes),
            bytes_per_rank=tuple(self.sizes),
            sidecar_bytes=self.sidecar_bytes,
            encode_seconds=encode,
            compress_seconds=compress,
            write_seconds=max(0.0, staging - encode - compress),
            commit_seconds=now - self.staged,
            wait_seconds=self.waited,
            total_seconds=now - self.start,
            worst_loop_lag_seconds=self.resumes.worst,
        )


class TrainingBatchSender:
    """Sends one object per step (or one per data-parallel rank) through a sink.

    Each send encodes and writes in worker threads, in slices short enough that the
    event loop stays responsive, and returns once the step is visible to readers. A
    cancelled or failed send leaves nothing visible. Sends are serialized: concurrent
    callers get consecutive steps in the order they acquire the sender.
    """

    def __init__(
        self,
        sink: Sink,
        codec: Codec,
        *,
        compression: Compressor | None = None,
        on_existing: OnExisting = "error",
        start_step: int | None = None,
        keep_last: int | None = None,
        max_ahead: int | None = None,
        limiter: CapacityLimiter | int | None = None,
        checks: Checks | None = None,
        on_stats: Callable[[SendStats], object] | None = None,
    ) -> None:
        if on_existing not in ("error", "resume", "truncate", "overwrite"):
            raise ConfigError(
                "on_existing must be 'error', 'resume', 'truncate' or 'overwrite', "
                f"got {on_existing!r}"
            )
        if start_step is not None:
            check_int(start_step, "start_step", error=ConfigError)
        elif on_existing == "truncate":
            raise ConfigError(
                "on_existing='truncate' needs start_step: the steps at or after it are "
                "deleted (for a restart from a checkpoint at step N, start_step=N)"
            )
        self._start_step = start_step
        if keep_last is not None:
            check_int(keep_last, "keep_last", low=1)
        if max_ahead is not None:
            check_int(max_ahead, "max_ahead")
        if (keep_last is not None or max_ahead is not None) and (
            type(sink).read_consumption is Sink.read_consumption
        ):
            raise ConfigError(
                f"keep_last and max_ahead need a store that records what receivers "
                f"consumed (files, fsspec); {sink!r} does not (ZeroMQ has its own "
                "backpressure: the storage option 'hwm')"
            )
        self._keep_last = keep_last
        self._max_ahead = max_ahead
        self._sink = sink
        self._codec = codec
        self._compressor = compression
        self._on_existing: OnExisting = on_existing
        self._limiter = make_limiter(limiter)
        self._lock = anyio.Lock()
        self._opened = False
        self._closed = False
        self._finished = False
        self._unknown_step: int | None = None  # a step whose commit left it undecided
        self._first_step = 0  # where this sender started: a rank with no mark is there
        self._pruned = 0  # steps before this one are deleted
        self._last_stats: SendStats | None = None
        self._on_stats = on_stats
        self._next_step = 0
        self._last_step: int | None = None
        self._checks = checks
        self._names_checked = False  # Checks names are matched against the first object only

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
            self._first_step = self._next_step
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
                consumption mark is garbled or records steps not sent yet.
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
            if self._finished:
                raise ClosedError(f"{self!r} finished its stream: nothing can be sent after")
            if self._unknown_step is not None:
                raise TransportError(
                    f"whether step {self._unknown_step} became visible is unknown (its "
                    "commit failed and the store could not be asked); open a new sender "
                    "with on_existing='resume', which settles it, to go on",
                    where=self._sink,
                )
            step = self._resolve_step(step)
            # Each rank is validated and encoded when the sink is ready to write it, so
            # only one rank's encoded message is held at a time.
            clock = _SendClock(len(objs))
            if self._keep_last is not None or self._max_ahead is not None:
                await self._make_room(step, len(objs))
                clock.waited = time.perf_counter() - clock.start
            frames = [self._encode(obj, step, rank, clock) for rank, obj in enumerate(objs)]
            try:
                staged = await drive_sliced(
                    self._sink.stage(step, frames), self._limiter, clock.resumes
                )
            except RlwireError as exc:
                exc.add_context(step=step)
                raise
            clock.staged = time.perf_counter()
            try:
                await staged.acommit(self._limiter)
            except BaseException as exc:
                if staged.visible is None:
                    # Neither sending the step again nor going on is safe: a receiver
                    # could get two versions of it, or wait forever for it.
                    self._unknown_step = step
                    if isinstance(exc, RlwireError):
                        exc.add_context(step=step)
                elif not staged.visible:  # e.g. a cancelled async commit
                    with anyio.CancelScope(shield=True):
                        await to_thread.run_sync(staged.discard, limiter=self._limiter)
                raise
            finally:
                if staged.visible:  # even a partly visible step must never be sent again
                    self._last_step = step
                    self._next_step = step + 1
            self._last_stats = stats = clock.stats(step)
        if self._on_stats is not None:
            self._on_stats(stats)
        return step

    async def _make_room(self, step: int, ranks: int) -> None:
        """Wait while ``step`` is more than ``max_ahead`` steps ahead of the slowest
        rank, then delete the steps ``keep_last`` lets go."""
        delay = 0.005
        while True:
            marks = await to_thread.run_sync(
                self._sink.read_consumption, ranks, step, limiter=self._limiter
            )
            slowest = min(self._first_step if m is None else m for m in marks)
            if self._max_ahead is None or step - slowest <= self._max_ahead:
                break
            await anyio.sleep(delay)  # the receivers' marks are polled, not pushed
            delay = min(delay * 2, 0.25)
        if self._keep_last is not None and None not in marks:
            # A rank with no mark has moved past nothing, as far as anyone can tell.
            below = min(slowest, step + 1 - self._keep_last)
            if below > self._pruned:
                await to_thread.run_sync(self._sink.prune, below, limiter=self._limiter)
                self._pruned = below

    def _encode(self, obj: Any, step: int, rank: int, clock: _SendClock) -> Sliced[Frame]:
        """Validate, encode and compress one rank's object, in slices."""
        try:
            if self._checks is not None:
                yield from timed(
                    self._checks.validate_sliced(obj, check_names=not self._names_checked),
                    clock.seconds,
                    "encode",
                )
                self._names_checked = True
            frame = yield from timed(self._codec.encode_sliced(obj), clock.seconds, "encode")
            if self._compressor is not None:
                frame = yield from timed(
                    compress_sliced(frame, self._compressor, threads=thread_count(self._limiter)),
                    clock.seconds,
                    "compress",
                )
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
        if step is None:
            return self._next_step
        check_int(step, "step", error=StepOrderError)
        if step == self._next_step:
            return step
        if step < self._next_step:
            what = "repeats" if step == self._last_step else "goes backwards from"
            last = self._last_step if self._last_step is not None else self._next_step - 1
            raise StepOrderError(
                f"step {step} {what} step {last}; steps must increase by 1 "
                f"(next is {self._next_step})"
            )
        if self._last_step is None and self._next_step == 0:
            return step  # a fresh destination may start anywhere, e.g. after a checkpoint
        raise StepOrderError(
            f"step {step} skips ahead of step {self._next_step}; a receiver "
            "would wait forever for the missing steps"
        )

    async def finish(self) -> None:
        """Mark the end of the stream after the last step sent: receivers then get
        :class:`~rlwire.EndOfStream` from ``receive`` and ``areceive`` (and ``for`` /
        ``async for`` end) instead of waiting for the next step. On ZeroMQ, the
        receivers connected until the sender closes are told. A second call does
        nothing; a send after it is a :class:`~rlwire.ClosedError`. A sender opened
        later on the same URL with ``on_existing="resume"`` continues the stream.

        Raises:
            TransportError: the mark cannot be written.
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
            if not self._finished:
                await self._sink.afinish(self._next_step, self._limiter)
                self._finished = True

    async def aclose(self) -> None:
        """Wait for an in-flight send to finish, then flush what the sink accepted and
        release its files and sockets. Idempotent."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await self._sink.aclose(self._limiter)
