"""The storage layout every built-in store shares, for authors of sinks that store one
message per step and rank as files or objects (docs/format.md specifies the bytes).

**Names.** Step ``7`` of rank ``0`` is stored as :func:`main_name` ``(7, 0)``,
``step-00000007.rank-0000.rlw``, and its sidecar, if any, as :func:`sidecar_name`. A part
being written goes under :func:`temp_name`, beside its final name, and is renamed or
moved into place: sidecars first, the main part last, because the main part's appearance
is what tells readers the message is there. :data:`MAIN_RE`, :data:`STORED_RE` and
:data:`TEMP_RE` recognise them when listing a destination (:data:`PART_RE` any of them);
:func:`start_step` says where a sender starts given what is listed, its ``on_existing``
and its ``start_step``, and :func:`names_to_delete` what it deletes first.

**Marks.** A finished sender leaves :data:`END_NAME` (:func:`end_mark`); each rank's
receiver records the first step it has not moved past in :func:`consumed_name`
(:func:`consumed_mark`), which :func:`read_consumed` reads back for ``keep_last`` and
``max_ahead``, and :func:`steps_to_prune` orders the deletions; :func:`parse_mark`
reads either mark.

**Bytes.** :func:`checksum_segments` hashes a frame's segments (a sliced generator);
:func:`plan` lays the frame out as the byte chunks of a main and a sidecar part, each
buffer aligned to :data:`ALIGN` bytes; write them in order. :func:`parse_main` turns the
bytes of a main part (and its sidecar) back into a :class:`~rlwire.Frame` of views, and
:func:`verify_segments` checks them against the recorded checksums.

Example:
    >>> from rlwire import Frame
    >>> from rlwire.aio import run_sliced
    >>> frame = Frame(b"header", (memoryview(b"payload"),))
    >>> layout = plan(frame, 7, 0, run_sliced(checksum_segments(frame)))
    >>> main = b"".join(layout.main)
    >>> def no_sidecar() -> memoryview:
    ...     raise AssertionError("this message has none")
    >>> back = parse_main(
    ...     memoryview(main), step=7, rank=0, load_sidecar=no_sidecar, where=main_name(7, 0)
    ... )
    >>> bytes(back.buffers[0])
    b'payload'
"""

from rlwire._core.faces import claim
from rlwire._frame.checksums import (
    CHECKSUM,
    checksum_segments,
    placeholder_checksums,
    verify_segments,
)
from rlwire.transport._stored.layout import (
    ALIGN,
    CONSUMED_MAGIC,
    END_MAGIC,
    FORMAT_VERSION,
    Layout,
    consumed_mark,
    end_mark,
    parse_main,
    parse_mark,
    plan,
)
from rlwire.transport._stored.names import (
    CONSUMED_RE,
    END_NAME,
    MAIN_RE,
    PART_RE,
    STORED_RE,
    TEMP_RE,
    consumed_name,
    main_name,
    names_to_delete,
    sidecar_name,
    start_step,
    temp_name,
)
from rlwire.transport._stored.retention import read_consumed, steps_to_prune

__all__ = [
    "ALIGN",
    "CHECKSUM",
    "CONSUMED_MAGIC",
    "CONSUMED_RE",
    "END_MAGIC",
    "END_NAME",
    "FORMAT_VERSION",
    "MAIN_RE",
    "PART_RE",
    "STORED_RE",
    "TEMP_RE",
    "Layout",
    "checksum_segments",
    "consumed_mark",
    "consumed_name",
    "end_mark",
    "main_name",
    "names_to_delete",
    "parse_main",
    "parse_mark",
    "placeholder_checksums",
    "plan",
    "read_consumed",
    "sidecar_name",
    "start_step",
    "steps_to_prune",
    "temp_name",
    "verify_segments",
]

claim(__name__, globals(), __all__)
