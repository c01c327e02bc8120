"""What a plugin author implements: codecs, sinks and the sources that read them back.

A **codec** turns objects into a :class:`~rlwire.Frame` (a small header plus raw
buffers) and back; it satisfies the :class:`Codec` protocol and registers a factory in
the ``rlwire.codecs`` entry point group. A **sink** moves frames to a destination and
subclasses :class:`Sink`, with a :class:`Source` that reads them back; it registers under
each URL scheme it serves in the ``rlwire.sinks`` group, and is built from the parsed
:class:`URL` and a :class:`SinkOptions` (a :class:`SourceOptions` for its source).
Its :meth:`Sink.stage` takes each rank's frame with :func:`rlwire.transport.take_frame`
as it writes that rank: the sender encodes a rank only then, so one rank's message is in
memory at a time; the :class:`Staged` step it returns is committed or aborted whole.
A sink that stores one message per step and rank, as files or objects, lays them out
with :mod:`rlwire.transport.layout`, the byte layout every built-in store shares. The
guide's "Add a sink of your own" walks through a whole plugin, and
:class:`rlwire.testing.SinkContract` is the test suite every sink passes; the helpers a
sink calls (:func:`~rlwire.transport.parse_url`, :func:`~rlwire.transport.transport_error`,
...) are in :mod:`rlwire.transport`.

A buffer of a frame to send may be a :class:`Pieces`: runs of bytes (say, one array per
sample) stored back to back as one buffer, with no copy. A sink that writes them itself
(``writev``) sets :attr:`Sink.gathers`; for other sinks the sender joins them first.

A sink that can store a step part by part (``sender.open_step``) sets
:attr:`Sink.stores_parts` and implements ``stage_part``, ``seal`` and
``committed_parts``, naming each part by a :class:`PartInfo` and closing the step with a
:class:`Seal`; its source implements ``read_part`` and ``read_seal`` (and
``moved_to`` if it is handed messages and says a gap once, as ZeroMQ's). The stored sinks
(:mod:`rlwire.transport.layout`) do all of it. A sink that keeps committed steps, so
that fields can be appended to them (``sender.add_fields``), sets
:attr:`Sink.appends_fields` and implements ``attach_fields``, ``read_committed``,
``read_appended`` and ``stage_fields``; its source implements ``read_appended`` (and
``expect_fields`` if it can wait for one without polling, ``appended_still_tied`` if
a step can be written again between that read and the step's). The stored sinks and
``ray://`` do.

Work that takes long is written as a **sliced generator** (:data:`Sliced`): it does a
short slice of work between ``yield`` statements, asking a :class:`SliceTimer` when the
slice is over, and returns its result; :mod:`rlwire.aio` has the tools that run one.

Example:
    >>> from rlwire.abc import SliceTimer, Sliced
    >>> from rlwire.aio import run_sliced
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

from rlwire._core.faces import claim, names_on_demand
from rlwire._frame.pieces import Pieces
from rlwire.aio import Sliced, SliceTimer
from rlwire.codecs._registry import Codec
from rlwire.transport._base import OnExisting, PendingFrame, Sink, Source, Staged
from rlwire.transport._options import SinkOptions, SourceOptions
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._url import URL

__all__ = [
    "URL",
    "Codec",
    "OnExisting",
    "PartInfo",
    "PendingFrame",
    "Pieces",
    "Seal",
    "Sink",
    "SinkOptions",
    "SliceTimer",
    "Sliced",
    "Source",
    "SourceOptions",
    "Staged",
]

claim(__name__, globals(), __all__)

# Helpers that lived here in earlier versions: they are where they belong now.
__getattr__ = names_on_demand(
    __name__,
    moved={
        "SLICE_SECONDS": "rlwire.aio:SLICE_SECONDS",
        "run_sliced": "rlwire.aio:run_sliced",
        "parse_url": "rlwire.transport:parse_url",
        "reject_unknown": "rlwire.transport:reject_unknown",
        "take_frame": "rlwire.transport:take_frame",
        "transport_error": "rlwire.transport:transport_error",
    },
)
