"""From a URL to a sink or source. The one place that knows which transports exist."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from .errors import ConfigError
from .transport import FileSink, FileSource, Sink, Source

__all__ = ["KNOWN_SCHEMES", "make_sink", "make_source"]

KNOWN_SCHEMES = ("file",)


def _local_path(url: str | os.PathLike[str]) -> str:
    if not isinstance(url, str):
        try:
            return os.fspath(url)
        except TypeError:
            raise ConfigError(f"expected a path or URL string, got {type(url).__name__}") from None
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(
                f"{url!r}: file URLs must name a local path (file:///dir), "
                f"not host {parts.netloc!r}"
            )
        return unquote(parts.path)
    if parts.scheme and "://" in url:  # "run:1" or "C:\\x" are plain paths
        raise ConfigError(
            f"{url!r}: unknown URL scheme {parts.scheme!r}; known schemes: "
            f"{', '.join(KNOWN_SCHEMES)} (or a plain path)"
        )
    return url


def make_sink(url: str | os.PathLike[str], *, fsync: bool, checksum: bool) -> Sink:
    """The sink for ``url``: a plain path or ``file://`` URL."""
    return FileSink(_local_path(url), fsync=fsync, checksum=checksum)


def make_source(url: str | os.PathLike[str], *, rank: int, writable: bool, verify: bool) -> Source:
    """The source for ``url`` and ``rank``: a plain path or ``file://`` URL."""
    return FileSource(_local_path(url), rank=rank, writable=writable, verify=verify)
