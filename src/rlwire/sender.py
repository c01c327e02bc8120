"""TrainingBatchSender: a codec and a sink, step bookkeeping, thread offload."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
from anyio import CapacityLimiter, to_thread

from ._aio import make_limiter, offload_sliced, thread_count
from ._args import check_int
from .checks import Checks
from .codecs import Codec, make_codec
from .compression import Compressor, compress_sliced
from .errors import ClosedError, ConfigError, RlwireError, StepOrderError
from .schema import check_object
from .transport import open_sink
from .transport._base import OnExisting, Sink, SinkOptions

__all__ = ["TrainingBatchSender", "open_sender"]


def open_sender(
    url: str | os.PathLike[str],
    *,
    codec: str | Codec = "msgpack",
    compression: str | Compressor | None = None,
    sidecar: Iterable[str] | str | None = None,
    on_existing: OnExisting = "error",
    fsync: bool = False,
    checksum: bool = True,
    limiter: CapacityLimiter | int | None = None,
    inline_threshold: int | None = None,
    validate: bool | Checks = True,
    storage_options: Mapping[str, Any] | None = None,
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
        on_existing: what to do when ``url`` already holds steps: ``"error"`` (refuse),
            ``"overwrite"`` (delete them when the sender opens) or ``"resume"`` (keep
            them and continue with the step after the last one).
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
        limiter=limiter,
        checks=validate if isinstance(validate, Checks) else None,
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
        limiter: CapacityLimiter | int | None = None,
        checks: Checks | None = None,
    ) -> None:
        if on_existing not in ("error", "overwrite", "resume"):
            raise ConfigError(
                f"on_existing must be 'error', 'overwrite' or 'resume', got {on_existing!r}"
            )
        self._sink = sink
        self._codec = codec
        self._compressor = compression
        self._on_existing: OnExisting = on_existing
        self._limiter = make_limiter(limiter)
        self._lock = anyio.Lock()
        self._opened = False
        self._closed = False
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
            self._next_step = await self._sink.aopen(self._on_existing, self._limiter)
            self._opened = True

    async def send(self, obj: Any, *, step: int | None = None) -> int:
        """Send ``obj`` as ``step`` (default: the next step) for rank 0.

        Returns:
            The step number used.

        Raises:
            SchemaError: ``obj`` fails validation (a TrainingSample's own rules, or the
                sender's :class:`~rlwire.Checks`); nothing is written.
            ConfigError: a :class:`~rlwire.Checks` name matches no field of the first
                object sent.
            EncodeError: ``obj`` holds a value the codec cannot carry; names its path.
            StepOrderError: ``step`` repeats, goes backwards or skips ahead.
            StepExistsError: the step already exists at the destination.
            TransportError: the destination cannot be written.
            ClosedError: the sender is closed.
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
            step = self._resolve_step(step)
            frames = []
            for rank, obj in enumerate(objs):
                try:
                    if self._checks is not None:
                        await offload_sliced(
                            self._checks.validate_sliced(obj, check_names=not self._names_checked),
                            self._limiter,
                        )
                        self._names_checked = True
                    frame = await offload_sliced(self._codec.encode_sliced(obj), self._limiter)
                    if self._compressor is not None:
                        frame = await offload_sliced(
                            compress_sliced(
                                frame, self._compressor, threads=thread_count(self._limiter)
                            ),
                            self._limiter,
                        )
                    frames.append(frame)
                except RlwireError as exc:
                    exc.add_context(step=step, rank=rank)
                    raise
            try:
                staged = await offload_sliced(self._sink.stage(step, frames), self._limiter)
            except RlwireError as exc:
                exc.add_context(step=step)
                raise
            try:
                await staged.acommit(self._limiter)
            except BaseException:
                if not staged.visible:  # e.g. a cancelled async commit
                    with anyio.CancelScope(shield=True):
                        await to_thread.run_sync(staged.discard, limiter=self._limiter)
                raise
            finally:
                if staged.visible:  # even a partly visible step must never be sent again
                    self._last_step = step
                    self._next_step = step + 1
        return step

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

    async def aclose(self) -> None:
        """Wait for an in-flight send to finish, then flush what the sink accepted and
        release its files and sockets. Idempotent."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await self._sink.aclose(self._limiter)
