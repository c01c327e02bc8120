"""The door to a stored message's head (:mod:`rlwire.transport._stored.head`) for the
receiver's manifests and row reads: which sources keep messages to be read again, their
store's URL, a message's head, and which message a stored file's name is of; and to a
store's fence (:mod:`rlwire.transport._stored.fence`) for ``rlwire inspect``.
"""

from __future__ import annotations

from typing import NamedTuple

from rlwire._core.errors import ConfigError
from rlwire.transport._base import Source
from rlwire.transport._options import SourceOptions
from rlwire.transport._registry import get_sink_class, open_source
from rlwire.transport._stored.fence import FENCE_NAME, MODES, parse_fence
from rlwire.transport._stored.head import Head, open_head
from rlwire.transport._stored.names import STEP_PART_RE, STORED_RE, main_name
from rlwire.transport._stored.sink import StoredSink
from rlwire.transport._stored.source import StoredSource
from rlwire.transport._url import parse_url

__all__ = [
    "FENCE_NAME",
    "FoundFence",
    "Head",
    "fence_at",
    "message_of",
    "read_head_of",
    "sealed",
    "store_url",
    "stored_steps_at",
]


def _stored(source: Source) -> StoredSource:
    if not isinstance(source, StoredSource):
        raise ConfigError(
            f"manifests name stored messages (a directory, an fsspec URL, S3): "
            f"{source!r} does not keep its messages to be read again"
        )
    return source


def store_url(source: Source) -> str:
    """The URL (or directory) of ``source``'s store, as it names its files.

    Raises:
        ConfigError: ``source`` is not a store.
    """
    name = main_name(0, 0)
    where = str(_stored(source).locate(name))
    return where[: -len(name) - 1] if where.endswith(name) else where


def read_head_of(source: Source, step: int, rank: int, part: int | None) -> Head | None:
    """The :class:`Head` of step ``step`` of ``rank`` (with ``part``, of that part), or
    ``None`` when it is not stored.

    Raises:
        ConfigError: ``source`` is not a store.
        CorruptFrameError, TransportError: as the store's reads.
    """
    return open_head(_stored(source), step, rank, part)


def sealed(source: Source, step: int) -> bool:
    """Whether ``step`` was filled part by part and sealed in ``source``'s store."""
    return _stored(source).read_seal(step) is not None


def message_of(name: str) -> tuple[int, int, int | None] | None:
    """The step, rank and part (``None``: the step sent whole) of the message a stored
    file named ``name`` holds (its main file or sidecar), or ``None`` for another name.

    Example:
        >>> message_of("step-00000012.rank-0001.part-000003.rlw")
        (12, 1, 3)
    """
    found = STORED_RE.fullmatch(name) or STEP_PART_RE.fullmatch(name)
    if found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3]) if found.re is STEP_PART_RE else None


class FoundFence(NamedTuple):
    """What :func:`fence_at` found: where the fence is, and, if there is one, the id and
    ``on_existing`` of the open that wrote it (``on_existing`` ``None`` if it records
    none that rlwire knows)."""

    where: str
    token: bytes | None
    on_existing: str | None


def fence_at(url: str) -> FoundFence | None:
    """The fence of the destination ``url`` (``token`` ``None``: there is none), or
    ``None`` if its sink keeps no fence file (ZeroMQ; ``ray://``, whose board fences):
    then nothing is opened (a ZeroMQ source would announce itself to a sender).

    Raises:
        CorruptFrameError: the fence is damaged (UnsupportedVersionError: of a major
            version this reader does not know).
        TransportError: the store cannot be read.
        ConfigError: ``url`` is not valid.
    """
    parsed = parse_url(url)
    if not issubclass(get_sink_class(parsed.scheme), StoredSink):
        return None
    source = open_source(parsed, SourceOptions())
    try:
        if not isinstance(source, StoredSource):  # a plugin's store of its own
            return None
        where = source.locate(FENCE_NAME)
        data = source.load(FENCE_NAME)
        if data is None:
            return FoundFence(where, None, None)
        token, mode = parse_fence(data, where)
        return FoundFence(where, token, mode if mode in MODES else None)
    finally:
        source.close()


def stored_steps_at(url: str, rank: int) -> list[int] | None:
    """The steps of the destination ``url`` stored for ``rank`` (its main files, and the
    sealed steps), in order; ``None`` if its sink keeps no store or cannot list it.

    Raises:
        TransportError: the store cannot be read.
        ConfigError: ``url`` is not valid.
    """
    parsed = parse_url(url)
    if not issubclass(get_sink_class(parsed.scheme), StoredSink):
        return None
    source = open_source(parsed, SourceOptions(rank=rank))
    try:
        steps = source.stored_steps() if isinstance(source, StoredSource) else None
    finally:
        source.close()
    return None if steps is None else sorted(set(steps))
