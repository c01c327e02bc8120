"""Per-step figures of a send or a receive, for logging beside a training step.

A sender fills a :class:`SendStats` for every step (``sender.last_stats``, and the
``on_stats=`` callback of :func:`~rlwire.open_sender`), one for a step filled part by part
too, when it is sealed (:class:`PartsClock`); a receiver a :class:`ReceiveStats`
for every object it returns (``receiver.last_stats``). They are taken from clocks read
around work done anyway, so collecting them costs nothing measurable.
"""

from __future__ import annotations

import builtins
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from rlwire._core.offload import Resumes

__all__ = [
    "PartsClock",
    "ReceiveStats",
    "SendClock",
    "SendStats",
    "parts_added",
    "parts_ended",
    "received",
]


@dataclass(frozen=True, slots=True)
class SendStats:
    """What one step's send cost.

    A step filled part by part (``sender.open_step()``) has one, made when it is sealed:
    the sums over the parts its writer put (their bytes per rank, and the seconds of
    each phase), the wait for ``max_ahead`` when the step was opened, and the seal's
    time in ``commit_seconds``; ``total_seconds`` is the sum of those calls, not the
    time from opening to sealing, in which the producer made its parts. Parts skipped
    as put by an earlier run (``on_existing="resume"``) count nothing.

    Attributes:
        step: the step sent.
        ranks: how many ranks it was sent to.
        bytes_per_rank: bytes of each rank's message as encoded (and compressed): the
            header and every buffer, sidecar included.
        sidecar_bytes: of those, the bytes of buffers sent in sidecars, all ranks.
        encode_seconds: time in worker threads encoding (and checking each Struct met
            on the way; the checks of a column-stored list and ``rlwire.Checks`` run
            beside the write, so their time is in ``write_seconds`` if it is longer).
        compress_seconds: time compressing (with ``compression=``).
        write_seconds: time writing, uploading or queueing the messages where readers
            cannot see them yet, between the encoding of ranks, and waiting for the
            checks that run beside.
        commit_seconds: time making the step visible (renames, the last upload, or
            handing the messages to ZeroMQ).
        wait_seconds: time waiting for slow trainers (``max_ahead``) before sending.
        total_seconds: the whole ``send`` / ``send_ranks`` call.
        worst_loop_lag_seconds: the longest the event loop took to resume the send
            after a trip of its work to a worker thread (up to 20 ms of slices): a
            reading of the loop's responsiveness during the send, taken at no cost (a
            loop blocked by other work shows up here too).

    Example:
        >>> stats = SendStats(step=3, ranks=1, bytes_per_rank=(100,))
        >>> stats.bytes, stats.as_dict()["step"]
        (100, 3)
    """

    step: int
    ranks: int
    bytes_per_rank: tuple[int, ...]
    sidecar_bytes: int = 0
    encode_seconds: float = 0.0
    compress_seconds: float = 0.0
    write_seconds: float = 0.0
    commit_seconds: float = 0.0
    wait_seconds: float = 0.0
    total_seconds: float = 0.0
    worst_loop_lag_seconds: float = 0.0

    @property
    def bytes(self) -> int:
        """Bytes sent, all ranks."""
        return sum(self.bytes_per_rank)

    def as_dict(self) -> dict[str, Any]:
        """The fields and :attr:`bytes` as a dict, ready for a metrics logger."""
        return {**asdict(self), "bytes_per_rank": list(self.bytes_per_rank), "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class ReceiveStats:
    """What receiving one step cost a receiver.

    ``parts()`` / ``aparts()`` leave one for each part they yield (its step, its
    bytes, its ``message_id`` and the seconds taken to find, read and decode it), and,
    once they end at a step's seal, one for the step: the sums over the parts this
    receiver yielded of it, the wait for the seal counted, with the ``message_id`` of
    the step's part 0 (``b""`` if this receiver did not yield it). Call
    ``Metrics.observe_receive`` after the loop to count steps, inside it to count parts.

    Attributes:
        step: the step received.
        rank: the rank received.
        bytes: the message's size as received (compressed, if it was), with the
            messages of fields appended to it (``add_fields``) that were read; with
            ``fields=``, only the buffers read are counted.
        wait_seconds: time waiting for the step to arrive.
        read_seconds: time reading it: opening and mapping files, or downloading, and
            checking checksums (``verify=True``), in this call (a step that
            ``wait_next`` read was read before it: 0).
        decompress_seconds: time decompressing.
        decode_seconds: time decoding into objects (and validating, with
            ``validate=True``).
        total_seconds: the whole ``receive`` / ``areceive`` call (for ``poll``, the
            call that returned the object).
        message_id: what tells the message received from any other sent as this
            step and rank (after a producer restarted with ``overwrite``): pass it to
            :meth:`~rlwire.TrainingBatchSender.add_fields` as ``of=``, so that fields
            computed from it are never stored beside another. ``b""`` where the
            destination keeps no steps (ZeroMQ).

    Example:
        >>> ReceiveStats(step=0, rank=0, bytes=10).as_dict()["bytes"]
        10
    """

    step: int
    rank: int
    bytes: int
    wait_seconds: float = 0.0
    read_seconds: float = 0.0
    decompress_seconds: float = 0.0
    decode_seconds: float = 0.0
    total_seconds: float = 0.0
    message_id: builtins.bytes = b""  # the field "bytes" hides the type here

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict, ready for a metrics logger."""
        return asdict(self)


class SendClock:
    """The figures of one send (or one part), gathered as it goes."""

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


class PartsClock:
    """The figures of a step filled part by part, gathered as its parts are put."""

    def __init__(self, ranks: int, waited: float) -> None:
        self.sums = SendStats(-1, ranks, (0,) * ranks, wait_seconds=waited, total_seconds=waited)

    def add(self, part: SendStats) -> None:
        """Add one part's send (its :meth:`SendClock.stats`)."""
        sums = self.sums
        sizes = zip(sums.bytes_per_rank, part.bytes_per_rank, strict=True)
        added = {
            field.name: getattr(sums, field.name) + getattr(part, field.name)
            for field in fields(SendStats)
            if field.name.endswith(("_seconds", "_bytes")) and "lag" not in field.name
        }
        self.sums = replace(
            sums,
            bytes_per_rank=tuple(a + b for a, b in sizes),
            worst_loop_lag_seconds=max(sums.worst_loop_lag_seconds, part.worst_loop_lag_seconds),
            **added,
        )

    def sealed(self, step: int, seconds: float) -> SendStats:
        """The step's :class:`SendStats`, once its seal took ``seconds`` to write."""
        sums = self.sums
        return replace(
            sums,
            step=step,
            commit_seconds=sums.commit_seconds + seconds,
            total_seconds=sums.total_seconds + seconds,
        )


def received(
    step: int, rank: int, nbytes: int, message_id: bytes, seconds: dict[str, float], started: float
) -> ReceiveStats:
    """The :class:`ReceiveStats` of ``step``, received whole by now: ``seconds`` holds
    the time its read, decompression and decode took (the rest since ``started``, a
    :func:`time.perf_counter`, was waiting for it)."""
    total = time.perf_counter() - started
    return ReceiveStats(
        step=step,
        rank=rank,
        bytes=nbytes,
        wait_seconds=max(0.0, total - sum(seconds.values())),
        read_seconds=seconds["read"],
        decompress_seconds=seconds["decompress"],
        decode_seconds=seconds["decode"],
        total_seconds=total,
        message_id=message_id,
    )


def parts_added(sums: ReceiveStats | None, part: ReceiveStats, index: int) -> ReceiveStats:
    """The figures of ``part``'s step so far (``sums``, if of that step), with those
    of ``part``, its part ``index``, added; the step's ``message_id`` is its part 0's."""
    if sums is None or sums.step != part.step:
        return part if index == 0 else replace(part, message_id=b"")
    return _added(sums, part)


def parts_ended(sums: ReceiveStats | None, step: int, rank: int, started: float) -> ReceiveStats:
    """The figures of ``step``, whose seal a receiver's ``parts()`` reached in a take
    that began at ``started``: those of its parts yielded (``sums``), and that wait."""
    zero = {"read": 0.0, "decompress": 0.0, "decode": 0.0}
    return parts_added(sums, received(step, rank, 0, b"", zero, started), -1)


def _added(first: ReceiveStats, then: ReceiveStats) -> ReceiveStats:
    """``first``'s step and ``message_id``, with the bytes and seconds of both."""
    return replace(
        first,
        **{
            field.name: getattr(first, field.name) + getattr(then, field.name)
            for field in fields(ReceiveStats)
            if field.name == "bytes" or field.name.endswith("_seconds")
        },
    )
