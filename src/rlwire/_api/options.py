"""Option groups of the sender and the receiver: small frozen objects, checked once.

Each group gathers options that only make sense together and is checked as it is made,
so ``open_sender(url, retention=Retention(keep_last=4))`` fails at ``Retention(...)``,
not later. The flat keywords of earlier versions (``open_sender(url, keep_last=4)``)
still work: they build the same group, with the same checks and the same messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypedDict, TypeVar

from rlwire._core.args import check_bool, check_int, check_positive
from rlwire._core.errors import ConfigError
from rlwire._frame.compression import DEFAULT_MAX_DECOMPRESSED, DEFAULT_MAX_RATIO

__all__ = [
    "Integrity",
    "IntegrityKeywords",
    "Limits",
    "LimitsKeywords",
    "Retention",
    "RetentionKeywords",
    "SenderKeywords",
    "from_keywords",
]

G = TypeVar("G", "Retention", "Integrity", "Limits")


@dataclasses.dataclass(frozen=True, slots=True)
class Retention:
    """How many steps a store keeps, and how far a sender may run ahead of its receivers.

    Args:
        keep_last: on a store (files, fsspec), delete a step once every rank's receiver
            has moved past it (asked for a later step, or, reading part by part, for
            a part after its last one; see ``open_receiver(record_consumed=)``) and it
            is not among the newest ``keep_last``. The ranks are those that have files
            of the step (for a step filled part by part, every rank its seal counts),
            not those of the step being sent: after a run goes down to fewer ranks (a
            ``send`` after ``send_ranks``, a sender resumed with fewer ranks), a rank
            left out still keeps each step it has files of, and every later step,
            stored until its receiver moves past it. ``None``: keep every step.
        max_ahead: on a store, make each send wait, with the event loop free, while the
            step to send is more than ``max_ahead`` steps ahead of the slowest rank's
            receiver (a rank that recorded nothing yet counts as being at the sender's
            first step, or at the oldest step stored that went to it when the sender
            resumed; a rank left out of steps this sender sent, to fewer ranks,
            counts as past them: its receiver cannot read them). Bound the wait with
            ``anyio.fail_after``: a cancelled wait sends nothing. ``None``: never wait.

    Raises:
        ConfigError: ``keep_last`` is not an int of at least 1, or ``max_ahead`` not an
            int of at least 0. (A sink that records no consumption, such as ZeroMQ,
            refuses either when the sender is made.)

    Example:
        >>> Retention(keep_last=8, max_ahead=2)
        Retention(keep_last=8, max_ahead=2)
        >>> Retention(keep_last=0)
        Traceback (most recent call last):
        rlwire.errors.ConfigError: keep_last must be an int of at least 1, got 0
    """

    keep_last: int | None = None
    max_ahead: int | None = None

    def __post_init__(self) -> None:
        if self.keep_last is not None:
            check_int(self.keep_last, "keep_last", low=1)
        if self.max_ahead is not None:
            check_int(self.max_ahead, "max_ahead")

    @property
    def active(self) -> bool:
        """Whether either option is set (the sender then reads receivers' marks)."""
        return self.keep_last is not None or self.max_ahead is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Integrity:
    """What a sender does so that a receiver gets exactly what was sent.

    Args:
        checksum: record an xxh3-64 checksum of the header and of every buffer, which
            receivers verify (a pass over the bytes at each end, at memory speed:
            7-8 GB/s a core on a small VM; switch off only to measure its cost).
        fsync: make each step durable before it becomes visible.

    Raises:
        ConfigError: ``checksum`` or ``fsync`` is not True or False.

    Example:
        >>> Integrity(fsync=True)
        Integrity(checksum=True, fsync=True)
    """

    checksum: bool = True
    fsync: bool = False

    def __post_init__(self) -> None:
        check_bool(self.checksum, "checksum")
        check_bool(self.fsync, "fsync")


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """What a receiver refuses to allocate for one message (FrameTooLargeError).

    Args:
        max_decompressed_bytes: refuse a compressed message that declares more than
            this many bytes once decompressed (default 16 GiB), before allocating
            anything.
        max_compression_ratio: refuse a message that may cost more than this many
            times its stored size once decompressed and decoded (default 1024; it may
            decompress to that less the 256 MiB kept for decoding, and any message to
            64 MiB): a stored message under 1 MB can never make a receiver allocate
            more than 1 GiB. Raise it for data that compresses better, such as steps of
            mostly zeros.

    Raises:
        ConfigError: ``max_decompressed_bytes`` is not an int of at least 0, or
            ``max_compression_ratio`` not a positive number.

    Example:
        >>> Limits(max_compression_ratio=4096).max_compression_ratio
        4096
        >>> Limits(max_compression_ratio=0)
        Traceback (most recent call last):
        rlwire.errors.ConfigError: max_compression_ratio must be a positive number, got 0
    """

    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED
    max_compression_ratio: float = DEFAULT_MAX_RATIO

    def __post_init__(self) -> None:
        check_int(self.max_decompressed_bytes, "max_decompressed_bytes")
        check_positive(self.max_compression_ratio, "max_compression_ratio")


class RetentionKeywords(TypedDict, total=False):
    """The flat keywords of :class:`Retention` (``open_sender(url, keep_last=4)``)."""

    keep_last: int | None
    max_ahead: int | None


class IntegrityKeywords(TypedDict, total=False):
    """The flat keywords of :class:`Integrity` (``open_sender(url, fsync=True)``)."""

    checksum: bool
    fsync: bool


class SenderKeywords(RetentionKeywords, IntegrityKeywords, total=False):
    """The flat keywords ``open_sender`` takes besides its own parameters."""


class LimitsKeywords(TypedDict, total=False):
    """The flat keywords of :class:`Limits` (``open_receiver(url, max_compression_ratio=8)``)."""

    max_decompressed_bytes: int
    max_compression_ratio: float


def from_keywords(
    group: type[G],
    given: G | None,
    keywords: Mapping[str, Any],
    *,
    parameter: str,
    function: str,
    others: tuple[type[Any], ...] = (),
) -> G:
    """The ``group`` object: ``given``, or one made from the flat ``keywords`` named by its
    fields. Keywords that belong to none of ``group`` and ``others`` are refused the way
    Python refuses an unknown keyword argument.

    Raises:
        TypeError: a keyword ``function`` does not take.
        ConfigError: ``given`` is not a ``group``, or both it and flat keywords of its
            fields are given.
    """
    known = {f.name for g in (group, *others) for f in dataclasses.fields(g)}
    for key in keywords:
        if key not in known:
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}")
    mine = {f.name: keywords[f.name] for f in dataclasses.fields(group) if f.name in keywords}
    if given is None:
        return group(**mine)
    if not isinstance(given, group):
        raise ConfigError(f"{parameter} must be a rlwire.{group.__name__}, got {given!r}")
    if mine:
        raise ConfigError(
            f"{', '.join(mine)} and {parameter}= given together: set "
            f"{', '.join(mine)} inside {parameter}={group.__name__}(...)"
        )
    return given
