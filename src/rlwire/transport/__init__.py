"""Transport: moves :class:`~rlwire.Frame` objects. Never imports ``rlwire.codecs``.

Sinks are found by URL scheme through the ``rlwire.sinks`` entry point group
(:data:`GROUP`; the guide's "Add a sink of your own" shows a whole plugin). What a sink
author needs is exported here: the base classes, the option objects, the byte layout every
built-in store uses (:func:`checksum_pieces`, :func:`plan`, :func:`parse_main`), the names
of stored messages and where a sender starts among them (:func:`main_name`,
:func:`sidecar_name`, :func:`start_step`), and the piecewise-work helpers
(:data:`Pieces`, :class:`Slicer`, :func:`run_sync`) that keep a sender's event loop
responsive.
"""

from .._pieces import Pieces, Slicer, run_sync
from ._base import (
    OnExisting,
    Sink,
    SinkOptions,
    Source,
    SourceOptions,
    Staged,
    reject_unknown,
)
from ._layout import Layout, checksum_pieces, parse_main, plan
from ._names import main_name, sidecar_name, start_step
from ._registry import GROUP, available_schemes, get_sink_class, open_sink, open_source
from .filesystem import FileSink, FileSource

__all__ = [
    "GROUP",
    "FileSink",
    "FileSource",
    "Layout",
    "OnExisting",
    "Pieces",
    "Sink",
    "SinkOptions",
    "Slicer",
    "Source",
    "SourceOptions",
    "Staged",
    "available_schemes",
    "checksum_pieces",
    "get_sink_class",
    "main_name",
    "open_sink",
    "open_source",
    "parse_main",
    "plan",
    "reject_unknown",
    "run_sync",
    "sidecar_name",
    "start_step",
]
