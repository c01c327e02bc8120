"""The storage layout every built-in store shares, for authors of sinks that store one
message per step and rank as files, objects or rows (docs/format.md specifies the bytes).

**The base classes.** Subclass :class:`StoredSink` and fill in a few primitives over
named files: list the destination's names, load and save a small file (a mark), remove
files, and start a :class:`StoredStaging` that stages a message's files where readers
cannot see them and commits them (sidecar files first, main files last, or all in one
transaction). The base class does the rest as every built-in store does: where a sender
starts and what it deletes (``on_existing``, ``start_step``), the end-of-stream mark, the
consumption marks that ``keep_last`` and ``max_ahead`` go by, retention, checksums and
the byte layout. Readers subclass :class:`StoredSource` and provide ``load``, ``save`` and
``locate``. ``examples/plugin_sink`` is a whole plugin built this way (SQLite).

**Names.** Step ``7`` of rank ``0`` is stored as :func:`main_name` ``(7, 0)``,
``step-00000007.rank-0000.rlw`` (the main file), and its sidecar file, if any, as
:func:`sidecar_name`; a finished sender leaves :data:`END_NAME` (:func:`end_mark`), and
each rank's receiver records the first step it has not moved past in
:func:`consumed_name` (:func:`consumed_mark`).

Example:
    >>> main_name(7, 0), sidecar_name(7, 0)
    ('step-00000007.rank-0000.rlw', 'step-00000007.rank-0000.sidecar.rlw')
    >>> consumed_name(0), len(consumed_mark(8))
    ('consumed.rank-0000.rlw', 16)
"""

from rlwire._core.faces import claim, names_on_demand
from rlwire.transport._stored.marks import consumed_mark, end_mark
from rlwire.transport._stored.names import END_NAME, consumed_name, main_name, sidecar_name
from rlwire.transport._stored.sink import StoredSink, StoredStaging
from rlwire.transport._stored.source import StoredSource

__all__ = [
    "END_NAME",
    "StoredSink",
    "StoredSource",
    "StoredStaging",
    "consumed_mark",
    "consumed_name",
    "end_mark",
    "main_name",
    "sidecar_name",
]

claim(__name__, globals(), __all__)

# What a sink built on StoredSink no longer calls itself: private to rlwire since 0.2.
_LAYOUT = "rlwire.transport._stored.layout"
_NAMES = "rlwire.transport._stored.names"
_MARKS = "rlwire.transport._stored.marks"
_CHECKSUMS = "rlwire._frame.checksums"
__getattr__ = names_on_demand(
    __name__,
    moved={
        "ALIGN": f"{_LAYOUT}:ALIGN",
        "CONSUMED_MAGIC": f"{_MARKS}:CONSUMED_MAGIC",
        "END_MAGIC": f"{_MARKS}:END_MAGIC",
        "FORMAT_VERSION": f"{_LAYOUT}:FORMAT_VERSION",
        "Layout": f"{_LAYOUT}:Layout",
        "parse_main": f"{_LAYOUT}:parse_main",
        "parse_mark": f"{_MARKS}:parse_mark",
        "plan": f"{_LAYOUT}:plan",
        "CHECKSUM": f"{_CHECKSUMS}:CHECKSUM",
        "checksum_segments": f"{_CHECKSUMS}:checksum_segments",
        "placeholder_checksums": f"{_CHECKSUMS}:placeholder_checksums",
        "verify_segments": f"{_CHECKSUMS}:verify_segments",
        "CONSUMED_RE": f"{_NAMES}:CONSUMED_RE",
        "MAIN_RE": f"{_NAMES}:MAIN_RE",
        "PART_RE": f"{_NAMES}:FILE_RE",
        "STORED_RE": f"{_NAMES}:STORED_RE",
        "TEMP_RE": f"{_NAMES}:TEMP_RE",
        "names_to_delete": f"{_NAMES}:names_to_delete",
        "start_step": f"{_NAMES}:start_step",
        "temp_name": "rlwire._core.atomic:temp_name",
        "read_consumed": "rlwire.transport._stored.retention:read_consumed",
        "steps_to_prune": "rlwire.transport._stored.retention:steps_to_prune",
    },
)
