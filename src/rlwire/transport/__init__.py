"""Transport: moves :class:`~rlwire.Frame` objects. Never imports ``rlwire.codecs``.

Sinks are found by URL scheme through the ``rlwire.sinks`` entry point group
(:data:`GROUP`) or :func:`register_sink` (in one process): :func:`available_schemes` lists
them, :func:`open_sink` and :func:`open_source` open one for a URL, and :class:`FileSink`
and :class:`FileSource` are the local filesystem's. What a sink author subclasses lives in
:mod:`rlwire.abc`; what a sink calls is here (:func:`parse_url`, :func:`take_frame`,
:func:`reject_unknown`, :func:`transport_error`), and the layout every built-in store
shares is :mod:`rlwire.transport.layout`.
"""

from rlwire._core.errors import transport_error
from rlwire._core.faces import claim
from rlwire.transport._base import take_frame
from rlwire.transport._file.sink import FileSink, FileSource
from rlwire.transport._options import reject_unknown
from rlwire.transport._registry import (
    GROUP,
    available_schemes,
    get_sink_class,
    open_sink,
    open_source,
    register_sink,
)
from rlwire.transport._url import parse_url

__all__ = [
    "GROUP",
    "FileSink",
    "FileSource",
    "available_schemes",
    "get_sink_class",
    "open_sink",
    "open_source",
    "parse_url",
    "register_sink",
    "reject_unknown",
    "take_frame",
    "transport_error",
]

claim(__name__, globals(), __all__)
