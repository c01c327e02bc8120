"""The door to a stored message's head (:mod:`rlwire.transport._stored.head`) for the
receiver's manifests and row reads: which sources keep messages to be read again, their
store's URL, and a message's head.
"""

from __future__ import annotations

from rlwire._core.errors import ConfigError
from rlwire.transport._base import Source
from rlwire.transport._stored.head import Head, open_head
from rlwire.transport._stored.names import main_name
from rlwire.transport._stored.source import StoredSource

__all__ = ["Head", "read_head_of", "sealed", "store_url"]


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
