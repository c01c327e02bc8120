"""Transport: moves :class:`~rlwire.Frame` objects. Never imports ``rlwire.codecs``.

Sinks are found by URL scheme through the ``rlwire.sinks`` entry point group
(:data:`GROUP`): :func:`available_schemes` lists them, :func:`open_sink` and
:func:`open_source` open one for a URL, and :class:`FileSink` / :class:`FileSource` are
the local filesystem's. What a sink author subclasses lives in :mod:`rlwire.abc`, and the
layout every built-in store shares in :mod:`rlwire.transport.layout`.
"""

from ._registry import GROUP, available_schemes, get_sink_class, open_sink, open_source
from .filesystem import FileSink, FileSource

__all__ = [
    "GROUP",
    "FileSink",
    "FileSource",
    "available_schemes",
    "get_sink_class",
    "open_sink",
    "open_source",
]
