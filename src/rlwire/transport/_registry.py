"""Sinks by URL scheme, found through the ``rlwire.sinks`` entry point group.

A package adds a transport by registering its :class:`~rlwire.transport.Sink` subclass
under each URL scheme it serves::

    [project.entry-points."rlwire.sinks"]
    myscheme = "mypackage.sink:MySink"

``open_sender("myscheme://...")`` then calls ``MySink.from_url`` with the parsed
:class:`~rlwire.abc.URL`, and ``open_receiver``
calls ``MySink.open_source``. rlwire's own sinks are registered the same way. A plain
path (no ``scheme://``) is a local directory. Any other scheme that fsspec knows goes to
the fsspec sink when fsspec is installed.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from rlwire._core.errors import ConfigError
from rlwire._core.registry import load_target, registered
from rlwire.transport._base import Sink, SinkOptions, Source, SourceOptions
from rlwire.transport._url import URL, parse_url

__all__ = ["GROUP", "available_schemes", "get_sink_class", "open_sink", "open_source"]

#: The entry point group sinks register in, keyed by URL scheme.
GROUP = "rlwire.sinks"
_FSSPEC = "rlwire.transport.fsspec:FsspecSink"
_ZMQ = "rlwire.transport.zmq:ZmqSink"
# Used only when rlwire's own entry points are missing (e.g. run from a source tree).
_BUILTIN = {
    "file": "rlwire.transport._file.sink:FileSink",
    "memory": _FSSPEC,
    "s3": _FSSPEC,
    "gs": _FSSPEC,
    "gcs": _FSSPEC,
    "zmq+tcp": _ZMQ,
    "zmq+ipc": _ZMQ,
}
# The fsspec sink imports fsspec only when used, and names the missing package itself.
_HINTS = {_ZMQ: "pip install 'rlwire[zmq]'"}


@functools.cache
def _entry_points() -> dict[str, str]:
    return registered(GROUP, _BUILTIN)


def available_schemes() -> list[str]:
    """The URL schemes of the installed sinks, sorted.

    Example:
        >>> {"file", "memory", "s3", "zmq+tcp"} <= set(available_schemes())
        True
    """
    return sorted(_entry_points())


def _fsspec_protocols() -> list[str]:
    """The protocols fsspec knows, or none without fsspec."""
    try:
        import fsspec
    except ImportError:
        return []
    return list(fsspec.available_protocols())


@functools.cache
def get_sink_class(scheme: str) -> type[Sink]:
    """The sink class registered for ``scheme`` (``"file"`` for plain paths).

    Raises:
        ConfigError: no installed sink serves the scheme (the message lists those that
            are installed), or its module cannot be imported.
    """
    target = _entry_points().get(scheme)
    if target is None:
        protocols = _fsspec_protocols()
        if scheme not in protocols:
            raise ConfigError(
                f"unknown URL scheme {scheme!r}; installed sinks serve: "
                f"{', '.join(available_schemes())}, plain paths"
                + (", and any other fsspec protocol" if protocols else "")
            )
        target = _FSSPEC
    try:
        cls: Any = load_target(target)
    except ImportError as exc:
        hint = f" ({_HINTS[target]})" if target in _HINTS else ""
        raise ConfigError(f"sink for {scheme!r} ({target}) cannot be loaded: {exc}{hint}") from exc
    except AttributeError as exc:
        raise ConfigError(f"sink for {scheme!r}: {target} does not exist: {exc}") from exc
    except Exception as exc:  # a plugin whose module fails as it is imported
        raise ConfigError(
            f"sink for {scheme!r} ({target}) cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise ConfigError(f"sink for {scheme!r}: {target} is not a rlwire.transport.Sink")
    return cls


def open_sink(url: str | os.PathLike[str] | URL, options: SinkOptions) -> Sink:
    """The sink for ``url``, chosen by its scheme; the URL is parsed here, once.

    Raises:
        ConfigError: unknown scheme, malformed URL or unknown storage option.
    """
    parsed = parse_url(url)
    return get_sink_class(parsed.scheme).from_url(parsed, options)


def open_source(url: str | os.PathLike[str] | URL, options: SourceOptions) -> Source:
    """The source reading what the sink for ``url`` writes, chosen by its scheme.

    Raises:
        ConfigError: unknown scheme, malformed URL or unknown storage option.
    """
    parsed = parse_url(url)
    return get_sink_class(parsed.scheme).open_source(parsed, options)
