"""Small rows of a column copied back to back for the msgspec encoder
(:mod:`rlwire.codecs._msgpack.sent_columns`): joined as bytes a group at a time, the
groups kept as the runs of one buffer.

Rows of a few kB each cost more to send where they are (a view and a run each, some
microseconds of Python) than to copy. Copied into one new array, a column is fresh memory
faulted in a page at a time; joined in groups of about :data:`_JOIN_BYTES`, it reuses
the memory the step before freed (the last groups are kept alive a while for that:
:data:`_KEPT`), and each group is a slice's worth of C.
"""

from __future__ import annotations

import collections
from typing import Protocol

import msgspec
import numpy as np

from rlwire._core.paths import KeyPath
from rlwire._core.slicing import Sliced
from rlwire._frame.pieces import Pieces
from rlwire.codecs._msgpack.extensions import EXT_ARRAY, ArrayRef
from rlwire.codecs._msgpack.sent_buffers import SentBuffers
from rlwire.codecs._registry import RowArrays

__all__ = ["Joining", "joined_rows"]

# Bytes of small rows joined per call, a slice's worth (0.3-0.4 ms), each group a run of
# the column's buffer: memory the step before freed is used again, where one array of a
# column is fresh memory faulted in a page at a time (2,400 faults an 8,000-sample step,
# more than the copy), and runs this large Ray stores as they are (256 KiB or more).
_JOIN_BYTES = 1 << 19
# Each group but the last ends at a multiple of this many bytes where it can: Ray lays
# out-of-band buffers at multiples of 64, so such runs land back to back (one block).
_RUN_ALIGN = 64
# The groups joined last, kept alive a while after their frames are gone (about 48 MiB:
# some two steps of 8,000 small samples), whatever sender joined them. Freed at once,
# a step's groups leave the top of malloc's heap free, and glibc's thresholds may give
# the memory back to the system, so the next step faults every page in again: a step
# of 8,000 small samples sent to 2 ranks took 40-49 ms where 1 rank or 4 took 28-30
# (benchmarks/bench_send_ranks.py). Kept, the groups the next steps join are above
# them, and those freed in between are reused where they lie. Never written to: only
# freed later. Larger groups (a few huge rows) are not kept.
_KEPT: collections.deque[bytes] = collections.deque(maxlen=96)


class Joining(Protocol):
    """What joining needs of the encoder's walk (a
    :class:`~rlwire.codecs._msgpack.sent_columns.Walker`)."""

    sent: SentBuffers
    encoder: msgspec.msgpack.Encoder

    def tick(self) -> Sliced[None]: ...


def joined_rows(
    w: Joining,
    rows: list[np.ndarray],
    offsets: np.ndarray,
    shape: list[int],
    nbytes: int,
    one_kind: bool,
    path: KeyPath,
    side: bool,
) -> Sliced[tuple[msgspec.msgpack.Ext, RowArrays] | None]:
    """The extension value of small ``rows`` (``shape`` and ``nbytes`` back to back)
    copied, and the :class:`RowArrays` of the copy; None if they differ in dtype, number
    of dimensions or trailing shape. Rows shown to be of one kind (``one_kind``) are
    joined as bytes (``bytes.join`` reads their buffers and nothing else: some 3x faster
    than numpy's concatenate), :data:`_JOIN_BYTES` a call and slice, the groups being
    the runs of the column's buffer. A row that is not C-contiguous refuses; then numpy
    copies every row into one array, and with casting="no" refuses a row of another kind."""
    dtype, tail = rows[0].dtype, shape[1:]
    apart = side or nbytes >= w.sent.inline_threshold  # out of band: the runs as they are
    if one_kind:
        stops = _group_stops(offsets, nbytes // shape[0]) if apart and nbytes else [len(rows)]
        runs = yield from _joined_runs(w, rows, stops)
        if runs is not None and len(runs) == 1:  # inline, or out of band as one view
            one = np.frombuffer(runs[0], dtype).reshape(shape)
            return w.sent.array(one, path, side), RowArrays([one], offsets)
        if runs is not None:  # several: of rows that hold values (row_bytes > 0)
            groups = [np.frombuffer(run, dtype).reshape(-1, *tail) for run in runs]
            pieces = Pieces.from_distinct(map(memoryview, runs))
            ref = ArrayRef(w.sent.add(pieces, side), dtype.str, shape, "C")
            return msgspec.msgpack.Ext(EXT_ARRAY, w.encoder.encode(ref)), RowArrays(groups, offsets)
    joined = np.empty(shape, dtype)  # the same byte order as the rows
    per = max(1, _JOIN_BYTES * len(rows) // max(nbytes, 1))  # rows per group
    for start in range(0, len(rows), per):
        stop = min(start + per, len(rows))
        part = joined[offsets[start] : offsets[stop]]
        try:
            np.concatenate(rows[start:stop], out=part, casting="no")
        except (TypeError, ValueError):  # rows of more than one kind
            return None
        yield from w.tick()
    return w.sent.array(joined, path, side), RowArrays([joined], offsets)


def _group_stops(offsets: np.ndarray, row_bytes: int) -> list[int]:
    """Where the groups of rows joined one call each end (row indices, the last
    ``len(offsets) - 1``): about :data:`_JOIN_BYTES` each, each but the last ending at a
    multiple of :data:`_RUN_ALIGN` bytes if one comes within another :data:`_JOIN_BYTES`.
    ``row_bytes``: the bytes of one item along the rows' first axis."""
    ends = offsets[1:] * row_bytes  # the column's length after each row
    targets = np.arange(_JOIN_BYTES, int(ends[-1]), _JOIN_BYTES)
    plain = np.searchsorted(ends, targets)  # the first row that reaches each target
    aligned = np.flatnonzero(ends % _RUN_ALIGN == 0)
    if len(aligned):
        at = aligned[np.minimum(np.searchsorted(ends[aligned], targets), len(aligned) - 1)]
        near = (ends[at] >= targets) & (ends[at] <= targets + _JOIN_BYTES)
        plain = np.where(near, at, plain)
    return [*dict.fromkeys((plain + 1).tolist()), len(ends)]


def _joined_runs(
    w: Joining, rows: list[np.ndarray], stops: list[int]
) -> Sliced[list[bytes] | None]:
    """The rows' bytes joined, a group of rows (up to each of ``stops``) per call and
    slice; None if a row is not C-contiguous."""
    runs = []
    start = 0
    for stop in stops:
        if stop > start:
            try:
                # ndarrays export their buffer, which numpy's stubs do not say
                run = b"".join(rows[start:stop])  # type: ignore[arg-type]
            except TypeError:  # a row whose bytes are not one C-contiguous run
                return None
            runs.append(run)
            if len(run) <= 2 * _JOIN_BYTES:
                _KEPT.append(run)  # (atomic, as deque appends are: joins in many threads)
            start = stop
            yield from w.tick()
    return runs
