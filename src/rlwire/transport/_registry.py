"""Sinks by URL scheme, found through the ``rlwire.sinks`` entry point group.

A package adds a transport by registering its :class:`~rlwire.abc.Sink` subclass
under each URL scheme it serves::

    [project.entry-points."rlwire.sinks"]
    myscheme = "mypackage.sink:MySink"

(or, in one program, ``register_sink("myscheme", MySink)``)

``open_sender("myscheme://...")`` then calls ``MySink.from_url`` with the parsed
:class:`~rlwire.abc.URL`, and ``open_receiver``
calls ``MySink.open_source``. rlwire's own sinks are registered the same way. A plain
path (no ``scheme://``) is a local directory. Any other scheme that fsspec knows goes to
the fsspec sink when fsspec is installed.
"""

from __future__ import annotations

import os

from rlwire._core.errors import ConfigError
from rlwire._core.registry import Registry
from rlwire.transport._base import Sink, Source
from rlwire.transport._guarded import serves
from rlwire.transport._options import SinkOptions, SourceOptions
from rlwire.transport._url import URL, parse_url, scheme_problem

__all__ = [
    "GROUP",
    "available_schemes",
    "get_sink_class",
    "open_sink",
    "open_source",
    "register_sink",
]

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
    "ray": "rlwire.transport.ray:RaySink",
}
# The fsspec sink imports fsspec only when used, and names the missing package itself.
_HINTS = {
    "s3": "pip install 'rlwire[s3]'",
    "zmq+tcp": "pip install 'rlwire[zmq]'",
    "zmq+ipc": "pip install 'rlwire[zmq]'",
    "ray": "pip install 'rlwire[ray]'",
}


def _is_sink_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Sink)


_REGISTRY = Registry(
    GROUP,
    label="sink for {name!r}",
    unknown="unknown URL scheme {name!r}; installed sinks serve: {available}, plain paths",
    builtin=_BUILTIN,
    hints=_HINTS,
    accepts=_is_sink_class,
    expected="a subclass of rlwire.abc.Sink",
    check_name=scheme_problem,
)


def available_schemes() -> list[str]:
    """The URL schemes of the registered sinks, sorted: rlwire's own (also those whose
    package is not installed, which opening one then names), installed plugins' and
    :func:`register_sink`'s.

    Example:
        >>> {"file", "memory", "s3", "zmq+tcp"} <= set(available_schemes())
        True
    """
    return _REGISTRY.names()


def _fsspec_protocols() -> list[str]:
    """The protocols fsspec knows, or none without fsspec."""
    try:
        import fsspec
    except ImportError:
        return []
    return list(fsspec.available_protocols())


def get_sink_class(scheme: str) -> type[Sink]:
    """The sink class registered for ``scheme`` (``"file"`` for plain paths), imported
    on first use; any other protocol fsspec knows goes to the fsspec sink.

    Raises:
        ConfigError: no installed sink serves the scheme (the message lists those that
            are installed), or its module cannot be imported.
    """
    if scheme not in _REGISTRY:
        protocols = _fsspec_protocols()
        if scheme not in protocols:
            raise _REGISTRY.unknown(
                scheme, also=", and any other fsspec protocol" * bool(protocols)
            )
        cls: type[Sink] = _REGISTRY.resolve(scheme, _FSSPEC)
        return cls
    found: type[Sink] = _REGISTRY.load(scheme)
    serves(found, scheme)  # errors of its plugin calls name the scheme
    return found


def register_sink(scheme: str, sink: type[Sink] | str, *, clobber: bool = False) -> None:
    """Make ``sink`` serve URLs of ``scheme`` in this process, as an entry point in the
    ``rlwire.sinks`` group does for every process.

    ``sink`` is a :class:`~rlwire.abc.Sink` subclass, or a ``"module:attr"`` string
    naming one, imported on first use. ``open_sender("scheme://...")`` then calls its
    ``from_url``, and ``open_receiver`` its ``open_source``.

    Raises:
        ConfigError: the scheme is taken (by a built-in, an entry point or an earlier
            call) and ``clobber`` is false, ``sink`` is not a Sink subclass, or the
            scheme is one no URL can carry (RFC 3986: a lowercase letter, then
            lowercase letters, digits, ``+ - .``). An entry point under such a scheme
            is ignored, and named by the error of a URL that tries it.

    Example:
        >>> from rlwire.transport import FileSink
        >>> class MirrorSink(FileSink): ...
        >>> register_sink("mirror", MirrorSink)
        >>> get_sink_class("mirror") is MirrorSink
        True
        >>> register_sink("s3", MirrorSink)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        rlwire.errors.ConfigError: sink for 's3' is already registered (...); ...
    """
    _REGISTRY.register(scheme, sink, clobber=clobber)


def _parse(url: str | os.PathLike[str] | URL) -> URL:
    """``parse_url(url)``; its error for ``name://`` names an installed package whose
    entry point registers ``name``, a scheme no URL can carry."""
    try:
        return parse_url(url)
    except ConfigError as exc:
        text = url if isinstance(url, str) else ""
        head, sep, _ = text.partition("://")
        why = _REGISTRY.refused(head) if sep else None
        if why:
            raise ConfigError(f"{exc.message}; {why}", where=exc.where) from None
        raise


def open_sink(url: str | os.PathLike[str] | URL, options: SinkOptions) -> Sink:
    """The sink for ``url``, chosen by its scheme; the URL is parsed here, once.

    Raises:
        ConfigError: unknown scheme, malformed URL or unknown storage option.
    """
    parsed = _parse(url)
    return get_sink_class(parsed.scheme).from_url(parsed, options)


def open_source(url: str | os.PathLike[str] | URL, options: SourceOptions) -> Source:
    """The source reading what the sink for ``url`` writes, chosen by its scheme.

    Raises:
        ConfigError: unknown scheme, malformed URL or unknown storage option.
    """
    parsed = _parse(url)
    return get_sink_class(parsed.scheme).open_source(parsed, options)
