"""Transport: moves :class:`~rlwire.Frame` objects. Never imports ``rlwire.codecs``."""

from ._base import OnExisting, Sink, Source, Staged
from .filesystem import FileSink, FileSource

__all__ = ["FileSink", "FileSource", "OnExisting", "Sink", "Source", "Staged"]
