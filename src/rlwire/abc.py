"""What a plugin author implements or calls: codecs, sinks and sources, and the
time-slicing helpers that keep a sender's event loop responsive.

A **codec** turns objects into a :class:`~rlwire.Frame` (a small header plus raw
buffers) and back; it satisfies the :class:`Codec` protocol and registers a factory in
the ``rlwire.codecs`` entry point group. A **sink** moves frames to a destination and
subclasses :class:`Sink`, with a :class:`Source` that reads them back; it registers under
each URL scheme it serves in the ``rlwire.sinks`` group, and is built from the parsed
:class:`URL` and a :class:`SinkOptions` (a :class:`SourceOptions` for its source).
Its :meth:`Sink.stage` takes each rank's frame with :func:`take_frame` as it writes
that rank: the sender encodes a rank only then, so one rank's message is in memory at a
time.
A sink that stores one message per step and rank, as files or objects, lays them out
with :mod:`rlwire.transport.layout`, the byte layout every built-in store shares. The
guide's "Add a sink of your own" walks through a whole plugin, and
:class:`rlwire.testing.SinkContract` is the test suite every sink passes.

Work that takes long is written as a **sliced generator** (:data:`Sliced`): it does a
short slice of work between ``yield`` statements, asking a :class:`SliceTimer` when the
slice is over, and returns its result. The sender runs the slices in worker threads and
lets go of the GIL between them, so the event loop gets it back between slices;
:func:`run_sliced` runs one to the end in the calling thread (in tests, say).

Example:
    >>> from rlwire.abc import SliceTimer, Sliced, run_sliced
    >>> def total(values: list[int]) -> Sliced[int]:
    ...     timer, acc = SliceTimer(), 0
    ...     for v in values:
    ...         acc += v
    ...         if timer.due():
    ...             yield  # end of a slice: the driver may switch threads here
    ...             timer.restart()
    ...     return acc
    >>> run_sliced(total(list(range(1000))))
    499500
"""

from ._slicing import SLICE_SECONDS, Sliced, SliceTimer, run_sliced
from .codecs._registry import Codec
from .errors import transport_error
from .transport._base import (
    OnExisting,
    PendingFrame,
    Sink,
    SinkOptions,
    Source,
    SourceOptions,
    Staged,
    reject_unknown,
    take_frame,
)
from .transport._url import URL, parse_url

__all__ = [
    "SLICE_SECONDS",
    "URL",
    "Codec",
    "OnExisting",
    "PendingFrame",
    "Sink",
    "SinkOptions",
    "SliceTimer",
    "Sliced",
    "Source",
    "SourceOptions",
    "Staged",
    "parse_url",
    "reject_unknown",
    "run_sliced",
    "take_frame",
    "transport_error",
]
