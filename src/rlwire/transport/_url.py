"""URL: a destination as the registry parsed it, once, for the sink that serves it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import SplitResult, unquote, urlsplit

from rlwire._core.errors import ConfigError

__all__ = ["URL", "local_directory", "local_path", "parse_url", "scheme_problem"]

# RFC 3986, section 3.1: a letter, then letters, digits, "+", "-" or "."; urllib takes
# nothing else for a scheme (it reads "my_scheme://x" as a path), and lowercases it.
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*\Z")
_SCHEME_RULE = "a URL scheme is a letter, then letters, digits, '+', '-' or '.'"


def scheme_problem(scheme: str) -> str | None:
    """What makes ``scheme`` one no URL can carry, or None for a good one: an upper
    case letter is a problem too (a URL's scheme is read in lower case, so a sink
    registered as ``"MyS"`` would never be reached).

    Example:
        >>> scheme_problem("zmq+tcp") is None, scheme_problem("my_scheme")
        (True, "a URL scheme is a letter, then letters, digits, '+', '-' or '.'")
        >>> scheme_problem("MyS")
        "a URL scheme is read in lower case (URLs reach 'mys', never 'MyS')"
    """
    lower = scheme.lower()
    if not _SCHEME.match(lower):
        return _SCHEME_RULE
    if scheme != lower:
        return f"a URL scheme is read in lower case (URLs reach {lower!r}, never {scheme!r})"
    return None


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
            address, an unclosed bracket), or text of the form ``name://...`` whose
            ``name`` is not a URL scheme (such as ``my_scheme://`` or ``s3_://``):
            urllib would read it as a local path; ``./name://...`` is one.
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
    head, sep, _ = url.partition("://")
    if sep and not parts.scheme and "/" not in head and "\\" not in head:
        # urllib found no scheme before "://" (my_scheme, s3_): not a path either.
        raise ConfigError(
            f"not a URL scheme: {head!r} ({_SCHEME_RULE}; for a local directory of "
            f"that name write ./{url})",
            where=url,
        )
    # Only "scheme://" names a scheme: "run:1" or "C:\\x" are plain paths.
    if not sep or not parts.scheme:
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


def local_directory(url: URL) -> str:
    """The directory a plain path or ``file://`` URL names, as a sender or receiver
    takes it (:func:`local_path`; ``rlwire inspect`` takes files too).

    Raises:
        ConfigError: as :func:`local_path`, or a regular file is there (a mistake in the
            configuration, as an fsspec URL naming an object is, not a failure of the
            store; a path under a regular file is one the store cannot write).
    """
    path = local_path(url)
    if os.path.isfile(path):
        raise ConfigError(
            f"{url.text!r}: {path} is a regular file, not a directory: give the directory "
            "the steps go in (made if missing)"
        )
    return path
