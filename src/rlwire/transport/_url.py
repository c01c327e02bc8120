"""URL: a destination as the registry parsed it, once, for the sink that serves it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import SplitResult, unquote, urlsplit

from rlwire._core.errors import ConfigError

__all__ = ["URL", "local_path", "parse_url"]


@dataclass(frozen=True)
class URL:
    """A URL or plain path given to ``open_sender`` / ``open_receiver``, parsed.

    Attributes:
        text: as the user gave it (a path-like object turned into its string).
        scheme: the scheme that chose the sink; ``"file"`` for a plain path.
        rest: what follows ``scheme://``, untouched (query and fragment included); the
            whole text for a plain path.
        parts: :func:`urllib.parse.urlsplit` of ``text``, for ``hostname``,
            ``port``, ``netloc`` and ``path``.

    Example:
        >>> from rlwire.transport import parse_url
        >>> url = parse_url("zmq+tcp://127.0.0.1:5555")
        >>> url.scheme, url.rest, url.parts.port
        ('zmq+tcp', '127.0.0.1:5555', 5555)
        >>> parse_url("runs/r1").scheme
        'file'
    """

    text: str
    scheme: str
    rest: str
    parts: SplitResult = field(repr=False, compare=False)

    def __str__(self) -> str:
        return self.text


def parse_url(url: str | os.PathLike[str] | URL) -> URL:
    """Parse ``url`` (a URL string, a plain path or a path-like object).

    Raises:
        ConfigError: ``url`` is neither a string nor a path-like object, or a URL whose
            host urllib cannot parse (square brackets around anything but an IPv6
            address, an unclosed bracket).
    """
    if isinstance(url, URL):
        return url
    if not isinstance(url, str):
        try:
            text = os.fspath(url)
        except TypeError:
            raise ConfigError(f"expected a path or URL string, got {type(url).__name__}") from None
        if not isinstance(text, str):
            raise ConfigError(f"expected a str path, got {type(text).__name__}")
        url = text
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # urllib checks a host in brackets is an IPv6 address
        if "://" not in url:  # a plain path such as "//host[1]/run" is still a path
            return URL(url, "file", url, SplitResult("", "", url, "", ""))
        hint = " (square brackets in a host enclose an IPv6 address: [::1])"
        raise ConfigError(
            f"malformed URL: {exc}{hint if '[' in url or ']' in url else ''}", where=url
        ) from None
    # Only "scheme://" names a scheme: "run:1" or "C:\\x" are plain paths.
    if "://" not in url or not parts.scheme:
        return URL(url, "file", url, parts)
    return URL(url, parts.scheme, url.partition("://")[2], parts)


def local_path(url: URL) -> str:
    """The path a plain path or ``file://`` URL names.

    Raises:
        ConfigError: a ``file://`` URL of another host or with a query or fragment (which
            would be dropped), or a URL that names no directory.
    """
    if url.rest == url.text:  # a plain path
        path = url.text
    elif url.parts.netloc not in ("", "localhost") or url.parts.query or url.parts.fragment:
        raise ConfigError(
            f"{url.text!r}: file URLs name a local path (file:///dir, '?' and '#' written "
            "%3F and %23), with no host, query or fragment (options: storage_options=)"
        )
    else:
        path = unquote(url.parts.path)
    if not path:  # "" or "file://": Path("") would be the current directory
        raise ConfigError(f"{url.text!r}: names no directory (a path, or file:///dir)")
    return path
