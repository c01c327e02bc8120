"""TrainingBatchReceiver: a source and a codec, with sync and async faces over one core.

The rule for sync and async faces, everywhere in rlwire:

* The awaitable twin of a blocking method has the same name with an ``a`` prefix:
  ``receive`` / ``areceive``, ``close`` / ``aclose``; ``wait_next`` / ``await_next``
  (the ``a`` of ``await``). Iteration and context managers come in both forms too
  (``for`` / ``async for``, ``with`` / ``async with``).
* One object offers both faces where it can: a receiver owns no event loop, its work is
  a sliced generator that the blocking methods run in the calling thread and the
  awaitable ones in worker threads, so both share one core and can be mixed.
* A sender owns its event loop's resources (its sink, its lock, the tasks of a send), so
  its blocking face is a separate object with the same method names, made by
  ``open_sync_sender`` and running the async sender on a thread of its own, as httpx
  has ``Client`` beside ``AsyncClient``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, overload

import msgspec
from anyio import CapacityLimiter
from typing_extensions import Unpack

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.options import Limits, LimitsKeywords, from_keywords
from rlwire._api.schema import TrainingBatch
from rlwire._checks.checks import Checks
from rlwire._core.args import check_bool, check_int, check_positive
from rlwire._core.errors import ConfigError
from rlwire.transport._options import SourceOptions
from rlwire.transport._registry import open_source

__all__ = ["ReceiverOptions", "TrainingBatchReceiver", "open_receiver"]

T = TypeVar("T")


class ReceiverOptions(LimitsKeywords, total=False):
    """The keyword options of :func:`open_receiver` besides ``type``, for its overloads."""

    start_step: int
    rank: int
    poll_interval: float
    writable: bool
    validate: bool | Checks
    verify: bool
    limits: Limits | None
    limiter: CapacityLimiter | int | None
    record_consumed: bool
    resume: bool
    as_columns: bool
    fields: Iterable[str] | None
    storage_options: Mapping[str, Any] | None


@overload
def open_receiver(
    url: str | os.PathLike[str], *, type: type[T], **options: Unpack[ReceiverOptions]
) -> TrainingBatchReceiver[T]: ...
@overload
def open_receiver(
    url: str | os.PathLike[str], **options: Unpack[ReceiverOptions]
) -> TrainingBatchReceiver[TrainingBatch]: ...
def open_receiver(  # noqa: PLR0913 (the public keywords; the rest are grouped in Limits)
    url: str | os.PathLike[str],
    *,
    type: Any = TrainingBatch,
    start_step: int = 0,
    rank: int = 0,
    poll_interval: float = 0.01,
    writable: bool = False,
    validate: bool | Checks = False,
    verify: bool = True,
    limits: Limits | None = None,
    limiter: CapacityLimiter | int | None = None,
    record_consumed: bool = True,
    resume: bool = False,
    as_columns: bool = False,
    fields: Iterable[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **keywords: Unpack[LimitsKeywords],
) -> TrainingBatchReceiver[Any]:
    """Open a receiver for one data-parallel rank, reading steps in order.

    Args:
        url: the URL (or directory path) the sender writes to; see :func:`open_sender`.
        type: what to decode each message into: a msgspec Struct type, ``dict``, ...;
            ``typing.Any`` gives plain dicts and lists.
        start_step: the first step to receive.
        rank: the data-parallel rank whose messages to read.
        poll_interval: seconds between checks while waiting for a step (object stores
            back off from this up to a second; sockets are woken, not polled; a
            directory also wakes the receiver as a file appears, on Linux).
        writable: return writable arrays (copy-on-write mappings, still no copy).
        validate: checks of the received values, as the sender's ``validate``:
            ``False`` (default): none; ``True``: rlwire's own rules for a received
            :class:`~rlwire.TrainingBatch` or :class:`~rlwire.TrainingSample`; or a
            :class:`~rlwire.Checks` for any type, run on each object as it is decoded
            (in the same slices), with rlwire's own rules still applied as well.
        verify: check the header and every buffer against the checksums the sender
            recorded; a mismatch raises CorruptFrameError naming step, rank and buffer.
        limits: the :class:`~rlwire.Limits` of what one message may make the receiver
            allocate (``max_decompressed_bytes``, default 16 GiB, and
            ``max_compression_ratio``, default 1024); beyond them, FrameTooLargeError.
        limiter: bounds the worker threads of the async methods, and the number of
            segments decompressed in parallel: a CapacityLimiter, or its size (which
            serves asyncio and trio in turn; a limiter given serves the backend it is
            bound to, and another raises ConfigError).
        record_consumed: on a store (files, fsspec, ``ray://``), write this rank's
            consumption mark beside the steps each time the receiver moves past a step
            (asks for the next, or, reading parts, for a part after the rank's last),
            which senders with ``keep_last`` or ``max_ahead`` go by, and its part mark
            each time it moves past a part (asks for the next), which ``resume`` goes
            by. ``False`` for a reader that must not hold the producer back (e.g. an
            evaluation job reading rank 0 beside the trainer).
        resume: start where this rank's marks say its receiver stopped (a receiver
            restarted after a crash): at the first step it had not moved past, and in
            a step filled part by part at the first part it had not moved past, where
            ``parts()`` / ``aparts()`` begin (``receive()`` still returns the whole
            step). Without marks, at ``start_step``. For consumers whose work on a part
            is done once they ask for the next (a stage that appends fields, a trainer
            that checkpoints per part); a trainer that restores a checkpoint opens at
            its step with ``start_step`` instead. docs/how-to/streaming.md.
        as_columns: return each list of samples that was stored column by column (a
            list of Structs or dicts holding arrays, as senders store them) as an
            :class:`~rlwire.Columns`: per-token fields as :class:`~rlwire.Ragged`,
            other fields as lists, all views over the received memory and no object
            per sample, in the place of the list (``batch.samples`` of a
            :class:`~rlwire.TrainingBatch`). A step filled part by part: one Columns
            of its parts' rows (their columns copied into one when there are
            several). ``receive(as_columns=...)`` overrides it for one step. Of the
            default type, the Columns must hold every field TrainingSample requires
            (a DecodeError names the first missing, as for the step received as
            samples); ``type=dict`` takes columns of any fields.
        fields: read only these fields of the samples (names, e.g. ``("token_ids",
            "advantages")``): each step and each part comes back as with
            ``as_columns=True``, each list of samples stored column by column as a
            :class:`~rlwire.Columns` of those columns only, and only their bytes are
            read: on files only their pages are touched, on S3 only their byte ranges
            fetched, over ZeroMQ the other buffers are dropped as they arrive (Ray reads
            whole, and keeps those columns). A name the step's samples do not hold
            raises FieldNotFoundError over ZeroMQ; on a store the receiver waits for
            it to be appended (up to the receive's ``timeout``). See docs/how-to/fields.md.
        storage_options: options for the source, as for :func:`open_sender`.
        keywords: ``max_decompressed_bytes`` and ``max_compression_ratio`` may also be
            given flat, as in earlier versions.

    Raises:
        ConfigError: an invalid option or URL (a ``type`` msgspec cannot decode
            into, ``fields`` not a collection of names, or
            beside ``validate=True``), a flat keyword beside ``limits=``, or ``resume``
            on a source that records no marks (ZeroMQ).
        CorruptFrameError: with ``resume``, a mark is garbled.
        TransportError: with ``resume``, the marks cannot be read.

    Example:
        >>> import rlwire, tempfile
        >>> with rlwire.open_receiver(tempfile.mkdtemp()) as receiver:
        ...     receiver.poll() is None
        True
    """
    check_int(start_step, "start_step")
    check_int(rank, "rank")
    try:
        msgspec.inspect.type_info(type)
    except TypeError as exc:  # else each receive raised it, untyped
        raise ConfigError(
            f"type must be what to decode each message into (a msgspec Struct, dict, "
            f"list[...], typing.Any, ...), got {type!r}: {exc}"
        ) from None
    limits = from_keywords(Limits, limits, keywords, parameter="limits", function="open_receiver")
    check_positive(poll_interval, "poll_interval")
    flags = {"writable": writable, "verify": verify, "record_consumed": record_consumed}
    for name, value in {**flags, "resume": resume, "as_columns": as_columns}.items():
        check_bool(value, name)
    source = open_source(
        url,
        SourceOptions(
            rank=rank,
            writable=writable,
            verify=verify,
            poll_interval=poll_interval,
            storage_options=storage_options or {},
        ),
    )
    try:
        return TrainingBatchReceiver(
            source,
            type,
            start_step=start_step,
            rank=rank,
            validate=validate,
            writable=writable,
            limits=limits,
            limiter=limiter,
            record_consumed=record_consumed,
            resume=resume,
            as_columns=as_columns,
            fields=fields,
        )
    except BaseException:
        source.close()  # a ZeroMQ source is connected already
        raise
