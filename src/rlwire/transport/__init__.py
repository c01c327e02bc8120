"""Transport: moves :class:`~rlwire.Frame` objects. Never imports ``rlwire.codecs``.

Sinks are found by URL scheme through the ``rlwire.sinks`` entry point group; see
:mod:`rlwire.transport._registry`.
"""

from ._base import OnExisting, Sink, SinkOptions, Source, SourceOptions, Staged
from ._registry import GROUP, available_schemes, get_sink_class, open_sink, open_source
from .filesystem import FileSink, FileSource

__all__ = [
    "GROUP",
    "FileSink",
    "FileSource",
    "OnExisting",
    "Sink",
    "SinkOptions",
    "Source",
    "SourceOptions",
    "Staged",
    "available_schemes",
    "get_sink_class",
    "open_sink",
    "open_source",
]
