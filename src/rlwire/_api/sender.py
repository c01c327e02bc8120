"""TrainingBatchSender: a codec and a sink, step bookkeeping, thread offload."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from anyio import CapacityLimiter
from typing_extensions import Unpack

from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.options import (
    Integrity,
    Retention,
    SenderKeywords,
    from_keywords,
)
from rlwire._api.stats import SendStats
from rlwire._api.validation import ChecksBeside
from rlwire._checks.checks import Checks
from rlwire._core.args import check_step
from rlwire._core.errors import (
    ConfigError,
)
from rlwire._frame.compression import Compressor
from rlwire.codecs._registry import Codec, make_codec
from rlwire.transport._base import OnExisting
from rlwire.transport._options import SinkOptions
from rlwire.transport._registry import open_sink

__all__ = ["TrainingBatchSender", "open_sender"]


def open_sender(  # noqa: PLR0913 (the public keywords; the rest are grouped in Retention, Integrity)
    url: str | os.PathLike[str],
    *,
    codec: str | Codec = "msgpack",
    compression: str | Compressor | None = None,
    sidecar: Iterable[str] | str | None = None,
    on_existing: OnExisting = "error",
    start_step: int | None = None,
    retention: Retention | None = None,
    integrity: Integrity | None = None,
    limiter: CapacityLimiter | int | None = None,
    inline_threshold: int | None = None,
    validate: bool | Checks = True,
    storage_options: Mapping[str, Any] | None = None,
    on_stats: Callable[[SendStats], object] | None = None,
    **keywords: Unpack[SenderKeywords],
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
            :class:`~rlwire.Compressor`): compress the header and each
            out-of-band buffer of at least 64 KiB that shrinks by 10 % or more, in
            parallel worker threads.
        sidecar: field names (e.g. ``("routed_experts",)``) whose array and bytes values,
            at any depth, travel raw in a sidecar beside the main message (and beside
            the fields ``add_fields`` appends). A name no field of the message's types
            holds, where no dict's keys could, makes the first send raise ConfigError
            before anything is written; one a dict's keys could still hold in a later
            step is warned about once (:class:`~rlwire.SidecarWarning`).
        on_existing: what to do when ``url`` already holds steps: ``"error"`` (refuse
            any at or after ``start_step``), ``"resume"`` (continue after the last one,
            or at ``start_step``; refuses a stored sequence with a hole or an incomplete
            step, naming the step and the repair), ``"truncate"`` (delete the steps at
            or after ``start_step`` and keep the earlier ones: a restart from a
            checkpoint) or ``"overwrite"`` (delete them all). Steps are deleted when the
            sender opens, each step's main messages first.
        start_step: the step to send first, an int from 0 to 2**64 - 2 (the format
            stores steps as u64, and the end mark as the step after the last; default:
            0, or after the last stored step with ``"resume"``); required by
            ``"truncate"``. On ZeroMQ, receivers opened with the same ``start_step``
            accept it.
        retention: a :class:`~rlwire.Retention`: on a store (files, fsspec), delete
            steps every rank's receiver has moved past beyond the newest ``keep_last``,
            and make sends wait while more than ``max_ahead`` steps ahead of the
            slowest rank. Default: keep everything, never wait.
        integrity: an :class:`~rlwire.Integrity`: record checksums (``checksum``,
            default on) and make each step durable before it is visible (``fsync``,
            default off).
        limiter: the CapacityLimiter (or its size) that bounds the worker threads doing
            encoding and I/O; share one between senders to bound them together. A
            process forked while tasks of the parent held tokens of a limiter keeps
            those tokens borrowed: in a forked child, pass a new limiter (or a size).
            A size serves asyncio and trio in turn; a limiter given serves the backend
            it is bound to (another raises ConfigError).
        inline_threshold: arrays and bytes smaller than this many bytes stay in the
            header (msgpack codec; default 4096).
        validate: ``True`` (default): rlwire's own rules, which validate every
            :class:`~rlwire.TrainingSample` at any depth before anything is visible;
            ``False``: none; or a :class:`~rlwire.Checks` for any type, run on each
            object (per rank) in worker-thread slices beside the write of the step,
            which is committed only once the checks pass, with rlwire's own rules for
            TrainingSample still applied as well.
        storage_options: options for the sink: fsspec's storage options for fsspec URLs
            (credentials, ``endpoint_url``, ...); ZeroMQ's for ``zmq+`` URLs (see the
            guide). A sink rejects keys it does not know.
        on_stats: called in the event loop with the :class:`~rlwire.SendStats` of each
            step once it is sent (also ``sender.last_stats``; a step filled part by part
            has one, once sealed); what it raises, ``send`` (or the seal) raises, after
            the step was sent.
        keywords: ``keep_last``, ``max_ahead``, ``checksum`` and ``fsync`` may also be
            given flat, as in earlier versions: ``open_sender(url, keep_last=4)`` is
            ``open_sender(url, retention=Retention(keep_last=4))``.

    Raises:
        ConfigError: an unknown codec, compression or URL scheme (the message lists the
            known ones), an option the codec or sink does not take, a missing optional
            dependency, a flat keyword given beside the group it belongs to, a
            ``start_step`` out of range, or an ``on_stats`` that is not callable.

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
    if start_step is not None:
        check_step(start_step, "start_step")
    group = functools.partial(from_keywords, keywords=keywords, function="open_sender")
    retention = group(Retention, retention, parameter="retention", others=(Integrity,))
    integrity = group(Integrity, integrity, parameter="integrity", others=(Retention,))
    if not isinstance(validate, bool | Checks):
        raise ConfigError(f"validate must be True, False or a rlwire.Checks, got {validate!r}")
    if on_stats is not None and not callable(on_stats):
        raise ConfigError(f"on_stats must be a callable of a SendStats, or None, got {on_stats!r}")
    options = {"sidecar": sidecar, "inline_threshold": inline_threshold}
    made = make_codec(
        codec,
        check=ChecksBeside() if validate is not False else None,
        **{k: v for k, v in options.items() if v is not None},
    )
    return TrainingBatchSender(
        open_sink(
            url,
            SinkOptions(
                fsync=integrity.fsync,
                checksum=integrity.checksum,
                storage_options=storage_options or {},
            ),
        ),
        made,
        compression=Compressor.parse(compression),
        on_existing=on_existing,
        start_step=start_step,
        retention=retention,
        limiter=limiter,
        checks=validate if isinstance(validate, Checks) else None,
        on_stats=on_stats,
    )
