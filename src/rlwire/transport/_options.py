"""The options a sink and its sources are built with, and the check of a sink's own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlwire._core.errors import ConfigError

__all__ = ["SinkOptions", "SourceOptions", "reject_unknown"]


@dataclass(frozen=True)
class SinkOptions:
    """What ``open_sender`` passes to :meth:`~rlwire.abc.Sink.from_url` besides the URL.

    Attributes:
        fsync: make each step durable before it becomes visible (where that means
            anything).
        checksum: record an xxh3-64 checksum of every segment for readers to verify.
        storage_options: the sink's own options, e.g. fsspec's storage options or
            ZeroMQ's high-water mark and CURVE keys. Sinks reject keys they do not know.
    """

    fsync: bool = False
    checksum: bool = True
    storage_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceOptions:
    """What ``open_receiver`` passes to :meth:`~rlwire.abc.Sink.open_source` besides the URL.

    Attributes:
        rank: the data-parallel rank to read.
        writable: hand out writable buffers (copy-on-write where possible).
        verify: check every segment against its recorded checksum.
        poll_interval: seconds between checks for a message, for sources that poll.
        storage_options: as for :class:`SinkOptions`.
    """

    rank: int = 0
    writable: bool = False
    verify: bool = True
    poll_interval: float = 0.01
    storage_options: Mapping[str, Any] = field(default_factory=dict)


def reject_unknown(where: object, options: Mapping[str, Any], known: Sequence[str]) -> None:
    """Raise ConfigError naming any key of ``options`` not in ``known``."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown storage option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(known) or 'none'}",
            where=where,
        )
