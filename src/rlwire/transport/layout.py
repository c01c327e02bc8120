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

**Steps filled part by part** (``sender.open_step``) need nothing more: part ``i`` of
rank ``r`` is stored as :func:`part_name` ``(step, r, i)`` (and :func:`part_sidecar_name`),
a message in the same layout, and the step's seal as :func:`seal_name` ``(step)``. A
producer resuming a step reads its parts' envelopes through
:meth:`StoredSink.load_head`, the first bytes of what ``load`` returns unless a store
overrides it to read less.

Example:
    >>> main_name(7, 0), sidecar_name(7, 0)
    ('step-00000007.rank-0000.rlw', 'step-00000007.rank-0000.sidecar.rlw')
    >>> consumed_name(0), len(consumed_mark(8))
    ('consumed.rank-0000.rlw', 16)
"""

from rlwire._core.faces import claim, names_on_demand
from rlwire.transport._stored.marks import consumed_mark, end_mark
from rlwire.transport._stored.names import (
    END_NAME,
    consumed_name,
    main_name,
    part_name,
    part_sidecar_name,
    seal_name,
    sidecar_name,
)
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
    "part_name",
    "part_sidecar_name",
    "seal_name",
    "sidecar_name",
]

claim(__name__, globals(), __all__)

# What a sink built on StoredSink no longer calls itself: private now, still
# importable here with a DeprecationWarning.
__getattr__ = names_on_demand(
    __name__,
    moved={
        "ALIGN": "rlwire.transport._stored.layout:ALIGN",
        "CONSUMED_MAGIC": "rlwire.transport._stored.marks:CONSUMED_MAGIC",
        "END_MAGIC": "rlwire.transport._stored.marks:END_MAGIC",
        "FORMAT_VERSION": "rlwire.transport._stored.layout:FORMAT_VERSION",
        "Layout": "rlwire.transport._stored.layout:Layout",
        "parse_main": "rlwire.transport._stored.layout:parse_main",
        "parse_mark": "rlwire.transport._stored.marks:parse_mark",
        "plan": "rlwire.transport._stored.layout:plan",
        "CHECKSUM": "rlwire._frame.checksums:CHECKSUM",
        "checksum_segments": "rlwire._frame.checksums:checksum_segments",
        "placeholder_checksums": "rlwire._frame.checksums:placeholder_checksums",
        "verify_segments": "rlwire._frame.checksums:verify_segments",
        "CONSUMED_RE": "rlwire.transport._stored.names:CONSUMED_RE",
        "MAIN_RE": "rlwire.transport._stored.names:MAIN_RE",
        "PART_RE": "rlwire.transport._stored.names:FILE_RE",
        "STORED_RE": "rlwire.transport._stored.names:STORED_RE",
        "TEMP_RE": "rlwire.transport._stored.names:TEMP_RE",
        "names_to_delete": "rlwire.transport._stored.names:names_to_delete",
        "start_step": "rlwire.transport._stored.names:start_step",
        "temp_name": "rlwire._core.atomic:temp_name",
        "read_consumed": "rlwire.transport._stored.retention:read_consumed",
        "steps_to_prune": "rlwire.transport._stored.retention:steps_to_prune",
    },
)
