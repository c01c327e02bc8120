"""What ``add_fields`` checks fields against, read from the step as stored: its row
count, and the token counts of its rows (the offsets of its ``token_ids``), told from
its codec header and the offsets alone; and the decoding of a message of appended
fields (:mod:`rlwire._api.appending`)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, NamedTuple

import msgspec
import numpy as np

from rlwire._api.appended_names import check_names, unnamed_sample
from rlwire._api.decoding import FrameDecoding
from rlwire._api.options import Limits
from rlwire._core.columns import Column, Columns
from rlwire._core.errors import ConfigError, CorruptFrameError, SchemaError
from rlwire._core.ragged import Ragged, offsets_problem
from rlwire._core.slicing import Sliced, run_sliced
from rlwire._frame.compression import Compressor, compress_sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selection
from rlwire.codecs._registry import get_codec
from rlwire.transport._base import Sink

__all__ = [
    "LENGTHS_FROM",
    "FieldsEncoding",
    "column_table",
    "decode_appended",
    "none_in_every_row",
    "prepare",
    "samples_of",
]

#: The column the row lengths of an appended Ragged are checked against.
LENGTHS_FROM = "token_ids"


def samples_of(obj: Any) -> Columns | list[Any] | None:
    """The one list of samples in a decoded step (or part): itself, or its one value
    that is a list or a :class:`~rlwire.Columns`."""
    if isinstance(obj, Columns | list):
        return obj
    found = _lists_in(obj)
    return found[0][1] if len(found) == 1 else None


def _lists_in(obj: Any) -> list[tuple[str, Any]]:
    """The fields (or keys) of ``obj`` that hold a list or a :class:`~rlwire.Columns`."""
    items: Any = (
        obj.items()
        if isinstance(obj, dict)
        else (
            [(f, getattr(obj, f)) for f in obj.__struct_fields__]
            if isinstance(obj, msgspec.Struct)
            else []
        )
    )
    return [(k, v) for k, v in items if isinstance(v, Columns | list)]


def _several_lists(names: Any) -> ConfigError:
    """The refusal of a step whose object holds the lists ``names``: receivers merge
    appended fields into a step's one list of samples."""
    named = ", ".join(map(repr, names))
    return ConfigError(
        f"add_fields: the step holds lists {named}: fields are appended to a step whose "
        "object holds one list, its samples"
    )


def column_table(frame: Frame, decoding: FrameDecoding) -> Any:
    """The codec's table of ``frame``'s list of samples stored as columns (what its
    header alone tells; only the header is decompressed), or ``None`` (no such list, or
    a codec that stores no columns: JSON, a plugin's)."""
    describe = getattr(decoding.codec(frame.codec), "describe_columns", None)
    if describe is None:
        return None
    n = len(frame.buffers)
    head = replace(frame, buffers=(memoryview(b""),) * n, missing=frozenset(range(n)))
    return describe(run_sliced(decoding.decompressed(head)))


def none_in_every_row(
    frames: list[Frame], names: frozenset[str], decoding: FrameDecoding
) -> str | None:
    """The first of ``names`` that the step (its ``frames``: one, or its parts) holds
    as ``None`` in every row (a TrainingSample's ``ref_logprobs`` left empty, until it
    is appended), or ``None``. Only columns of values kept in the header are looked at
    (a ragged column holds arrays): their decode reads no buffer. A step of no rows
    leaves no field empty: it has no row to fill."""
    held: dict[str, bool] = {}
    rows = 0
    for frame in frames:
        table = column_table(frame, decoding)
        kept = [
            c.name
            for c in (table.columns if table else ())
            if c.name in names and c.dtype is None and not c.array
        ]
        if not kept:
            return None
        plain = copy.copy(decoding)
        plain.fields = frozenset(kept)
        got = samples_of(
            run_sliced(plain.decode(frame, Any, {"decompress": 0.0, "decode": 0.0}, True))
        )
        if not isinstance(got, Columns):
            return None
        rows += len(got)
        for name in kept:
            held[name] = held.get(name, True) and all(v is None for v in got[name])
    # all() of no rows is True: without a row, nothing is left for an appended field.
    return next((name for name in sorted(held) if held[name]), None) if rows else None


#: Where a sample keeps values of no field of its own, which an appended field would fill.
EXTRAS = "extras"


def _keys(obj: Any) -> list[str]:
    """The keys of ``obj`` (a sample decoded whole, or its extras) that hold a value."""
    return [k for k, v in obj.items() if v is not None] if isinstance(obj, dict) else []


class _StoredRows:
    """What ``add_fields`` checks against, read from a step's header: its rows and the
    offsets of its ``token_ids``. :meth:`select` (the sink's selector) asks for the
    offsets' buffer alone; :meth:`of` then tells a frame's rows and their token counts."""

    def __init__(self, decoding: FrameDecoding) -> None:
        self.decoding = decoding
        #: The names of the step's columns that hold data (arrays, or values not all
        #: None: what an appended field never replaces), as :meth:`of` found them.
        self.held: set[str] = set()
        #: Why the step's samples keep no names (a plain list of lists), or ``None``.
        self.unnamed: str | None = None

    def _table(self, frame: Frame) -> Any:
        return column_table(frame, self.decoding)

    def select(self, frame: Frame) -> Selection | None:
        table = self._table(frame)
        if table is None:
            return None  # decoded whole, to count its samples
        col = next((c for c in table.columns if c.name == LENGTHS_FROM), None)
        wanted = {col.offsets} if col is not None and isinstance(col.offsets, int) else set()
        return Selection(frozenset(wanted))

    def of(self, frame: Frame) -> tuple[int, np.ndarray | None]:
        """``frame``'s rows, and its rows' token counts (``None`` without ``token_ids``)."""
        table = self._table(frame)
        if table is None:
            seconds = {"decompress": 0.0, "decode": 0.0}
            decoded = run_sliced(self.decoding.decode(frame, Any, seconds, True))
            samples = samples_of(decoded)
            if samples is None and len(lists := _lists_in(decoded)) > 1:
                raise _several_lists(k for k, _ in lists)
            if samples is None:
                raise ConfigError("add_fields: the step holds no list of samples to add fields to")
            self.unnamed = self.unnamed or unnamed_sample(samples)
            for sample in samples if isinstance(samples, list) else ():
                self.held.update(_keys(sample))
                self.held.update(_keys(sample.get(EXTRAS) if isinstance(sample, dict) else None))
            return len(samples), None
        if len(table.lists) > 1:
            raise _several_lists(table.lists)
        self.held.update(c.name for c in table.columns if not c.empty)
        # A sample's extras are filled by a field of no column of the step: their keys
        # hold the step's data too.
        self.held.update(k for c in table.columns if c.name == EXTRAS for k in c.keys)
        col = next((c for c in table.columns if c.name == LENGTHS_FROM), None)
        if col is None or col.dtype is None:
            return table.rows, None
        offsets = col.offsets
        if not isinstance(offsets, np.ndarray):
            # Only that buffer decompressed (a source that read the step whole has all).
            others = frozenset(range(len(frame.buffers))) - {offsets}
            alone = replace(frame, missing=frame.missing | others)
            view = run_sliced(self.decoding.decompressed(alone)).buffers[offsets]
            nbytes = memoryview(view).nbytes
            if nbytes != 8 * (table.rows + 1):
                raise CorruptFrameError(
                    f"the offsets of {LENGTHS_FROM!r} ({table.rows} rows): shape "
                    f"[{table.rows + 1}] of <i8 needs {8 * (table.rows + 1)} bytes but "
                    f"its buffer has {nbytes}"
                )
            offsets = np.frombuffer(memoryview(view), "<i8")
        if len(offsets) != table.rows + 1:
            raise CorruptFrameError(
                f"the {len(offsets)} offsets of {LENGTHS_FROM!r} do not fit its "
                f"{table.rows} rows (it needs {table.rows + 1})"
            )
        problem = offsets_problem(offsets, col.length)
        if problem:
            raise CorruptFrameError(f"the offsets of {LENGTHS_FROM!r} {problem}")
        return table.rows, np.diff(offsets)


def _stored_rows(frames: list[Frame], rows: _StoredRows) -> tuple[int, np.ndarray | None]:
    """The step's row count and its rows' token counts (``None`` when some rows have no
    ``token_ids``)."""
    count, lengths = 0, []
    for frame in frames:
        n, got = rows.of(frame)
        count += n
        if got is None and n:
            return count + sum(rows.of(f)[0] for f in frames[frames.index(frame) + 1 :]), None
        lengths.append(np.zeros(0, np.int64) if got is None else got)
    return count, (np.concatenate(lengths) if lengths else np.zeros(0, np.int64))


def _check_against(
    columns: Columns, names: list[str], count: int, lengths: np.ndarray | None, rows: _StoredRows
) -> None:
    """Refuse ``columns`` unless they fit the step: ``count`` rows, each Ragged's rows
    as long as ``lengths`` (the step's token counts), names not appended already nor
    of the step's columns that hold data (``rows.held``), under any spelling
    (:mod:`rlwire._api.appended_names`)."""
    if len(columns) != count:
        raise SchemaError(f"add_fields: the columns hold {len(columns)} rows, the step {count}")
    for name, column in columns.items():
        check_names(name, names, rows.held, rows.unnamed)
        held = _row_lengths(column) if lengths is not None else None
        if held is not None and lengths is not None:
            bad = np.flatnonzero(held != lengths)
            if bad.size:
                row = int(bad[0])
                raise SchemaError(
                    f"add_fields: field {name!r} row {row} holds {int(held[row])} values, "
                    f"its {LENGTHS_FROM} {int(lengths[row])}"
                )


def _row_lengths(column: Column) -> np.ndarray | None:
    """The lengths of ``column``'s rows when they are arrays of one or more dimensions
    (a Ragged's, or a list of arrays, which is stored as a Ragged): what is checked
    against the step's token counts. ``None`` for any other column (numbers, a 2-D
    array: a vector a row, of its own width on purpose)."""
    if isinstance(column, Ragged):
        return np.diff(column.offsets)
    rows = column if isinstance(column, list) else None
    if isinstance(column, np.ndarray) and column.dtype.kind == "O" and column.ndim == 1:
        rows = list(column)
    if not rows or not all(type(r) is np.ndarray and r.ndim >= 1 for r in rows):
        return None
    return np.fromiter(map(len, rows), np.int64, len(rows))


class FieldsEncoding(NamedTuple):
    """How a message of appended fields is encoded: the fields named in ``sidecar`` go
    to the sidecar, and it is compressed with ``compression`` (the sender's)."""

    sidecar: frozenset[str] = frozenset()
    compression: Compressor | None = None


#: Appended fields encoded with no sidecar, uncompressed.
PLAIN = FieldsEncoding()


def prepare(
    sink: Sink,
    step: int,
    rank: int,
    columns: Columns,
    limits: Limits,
    again: bool,
    of: bytes | None = None,
    encoding: FieldsEncoding = PLAIN,
) -> Sliced[tuple[Frame, int]]:
    """Read and check the step as stored (``again``: as it was at the first try of the
    same call, :meth:`~rlwire.abc.Sink.read_committed`; ``of``: the message the
    caller computed the fields from, or None) and the messages appended to it, then
    encode ``columns`` as ``encoding`` says (the sender's sidecar names and compression,
    as its steps are): in slices, in worker
    threads (a read that hangs gives up when the caller is cancelled). Returns the
    encoded frame and how many messages were appended (the ones checked against)."""
    decoding = FrameDecoding(limits, None, writable=False)
    rows = _StoredRows(decoding)
    frames = sink.read_committed(step, rank, rows.select, again=again)
    if frames is None:
        raise ConfigError(f"add_fields: step {step} is not committed (sent whole, or sealed)")
    if of is not None and (frames[0].message_id if frames else b"") != of:
        ids = [frame.message_id for frame in frames]
        if of in ids:  # a later part's: the step is the one computed from
            raise ConfigError(
                f"add_fields: of= is the message_id of part {ids.index(of)} of step {step} "
                f"rank {rank}: a step filled part by part is named by its part 0's (the "
                "part whose index is 0)"
            )
        raise ConfigError(
            f"add_fields: step {step} rank {rank} as stored is not the message the fields "
            "were computed from (of=): that one was deleted and the step sent again, by a "
            "producer restarted with overwrite or truncate"
        )
    count, lengths = _stored_rows(frames, rows)
    # A field the step holds may be appended (TrainingSample.ref_logprobs, left None):
    # it takes the place of the step's. Twice appended, it is refused.
    messages = sink.read_appended(step, rank)
    appended = [n for f in messages for n in decode_appended(f, decoding).names]
    _check_against(columns, appended, count, lengths, rows)
    # Only the names of fields given: the sender's others are its steps' business.
    codec = get_codec("msgpack")(sidecar=encoding.sidecar & set(columns.names))
    frame = yield from codec.encode_sliced({"fields": _stored(columns)})
    if encoding.compression is not None:
        frame = yield from compress_sliced(frame, encoding.compression)
    return frame, len(messages)


def _stored(columns: Columns) -> Columns:
    """``columns`` as add_fields stores them: an array of two or more dimensions as the
    Ragged of its rows, which receivers get as they get a step's own per-token columns
    (a TrainingBatch's must be Ragged)."""
    out: dict[str, Any] = {}
    for name, column in columns.items():
        if isinstance(column, np.ndarray):
            # A subclass (np.matrix) may keep its own shape rules: reshape would keep it 2-D.
            column = np.asarray(column)
        if isinstance(column, np.ndarray) and column.ndim >= 2 and column.dtype.kind != "O":
            rows, width = column.shape[:2]
            flat = column.reshape(rows * width, *column.shape[2:])
            column = Ragged.from_lengths(flat, np.full(rows, width))
        out[name] = column
    return Columns(out)


def decode_appended(frame: Frame, decoding: FrameDecoding) -> Columns:
    plain = copy.copy(decoding)
    plain.fields = None
    got = run_sliced(plain.decode(frame, Any, {"decompress": 0.0, "decode": 0.0}, True))
    columns = got.get("fields") if isinstance(got, dict) else None
    if not isinstance(columns, Columns):
        raise CorruptFrameError("a message of appended fields holds no columns")
    return columns
