"""Lists of samples stored column by column, and ragged arrays, for the msgspec encoder.

Most steps are a list of thousands of samples with a few small arrays each. Encoded one
array at a time, each costs an extension value, a buffer and a table entry, some 10 µs
of Python per array; stored as columns (each array field one buffer of the rows' bytes
back to back, :class:`~rlwire._frame.pieces.Pieces`, plus int64 offsets), a field costs
that once. A list is stored this way when its items are Structs of one type or dicts
with the same keys, and the first holds an array. A field whose arrays differ in dtype or
trailing shape, or that holds anything else, is a column of one value per row, each
encoded as usual; a list whose items differ in type or keys is left a list, and so is
one with a Struct field left ``UNSET`` in some rows only (see
:mod:`rlwire.codecs._msgpack.row_shape`). Either way the receiver gets the same values
back.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import repeat
from typing import Any, Protocol

import msgspec
import numpy as np

from rlwire._core.chunked import Chunked, chunks_problem
from rlwire._core.columns import Columns
from rlwire._core.errors import EncodeError, SchemaError
from rlwire._core.paths import KeyPath, render_path
from rlwire._core.ragged import Ragged, ragged_problem
from rlwire._core.slicing import Sliced
from rlwire._frame.pieces import Pieces
from rlwire.codecs._msgpack.arrays import PLAIN_DTYPES, byte_view, check_dtype
from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_COLUMNS,
    EXT_RAGGED,
    ROWS_AS_MAPS,
    ArrayRef,
)
from rlwire.codecs._msgpack.joined_rows import joined_rows
from rlwire.codecs._msgpack.row_shape import row_shape
from rlwire.codecs._msgpack.sent_buffers import SentBuffers
from rlwire.codecs._msgpack.weights import SCALARS
from rlwire.codecs._registry import RowArrays

__all__ = ["Walker", "list_as_columns", "packed_value"]

_STR = {str}
_CONTAINERS = frozenset((dict, list))
_NDARRAY = {np.ndarray}
_DTYPE = operator.attrgetter("dtype")
_NDIM = operator.attrgetter("ndim")
_BASE = operator.attrgetter("base")
_NO_BASE = {id(None)}
_C_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")
# Rows this small on average are copied back to back rather than sent where they are.
_SMALL_ROW = 4096
# Rows viewed where they are per slice (some 0.3 µs a row).
_VIEW_ROWS = 512
# Rows of a column each look over them takes in a slice (a few looks, some 0.1 µs a row
# each: 8,000 rows at once held the GIL 1-2 ms).
_LOOK_ROWS = 1024


class Walker(Protocol):
    """What this module needs of the encoder's walk (:class:`Encoding
    <rlwire.codecs._msgpack.encode.Encoding>`)."""

    sent: SentBuffers
    encoder: msgspec.msgpack.Encoder
    check: Callable[[Any, str], None] | None

    def named(self, name: Any, encoded: Any) -> bool: ...

    def value(self, obj: Any, path: KeyPath, side: bool) -> Sliced[tuple[Any, int]]: ...

    def heavy(self, column: list[Any], heft: int, path: KeyPath) -> Sliced[tuple[Any, int]]: ...

    def tick(self) -> Sliced[None]: ...


def packed_value(
    w: Walker, obj: Ragged | Columns | Chunked, path: KeyPath, side: bool
) -> Sliced[Any]:
    """The extension value that stands for a :class:`~rlwire.Ragged` (6), a
    :class:`~rlwire.Columns` (7) or a :class:`~rlwire.Chunked` (an array, 1 or 2)."""
    if isinstance(obj, Ragged):
        return _ragged_value(w, obj, path, side)
    if isinstance(obj, Chunked):
        return _chunked_value(w, obj, path, side)
    return (yield from _columns_value(w, obj, path, side))


def _chunked_value(w: Walker, value: Chunked, path: KeyPath, side: bool) -> msgspec.msgpack.Ext:
    """A Chunked as one array: its chunks are the runs of one buffer (copied into one
    array only when the whole is small enough to go inline).

    Raises:
        SchemaError: its list of chunks was changed directly since (a chunk of another
            dtype or trailing shape: its bytes would be read as the first's).
    """
    # The chunks as they are now, read once: a chunk another thread appends meanwhile
    # must be in both the bytes and the shape, or in neither (it made the shape larger
    # than the bytes: a step every receiver refused).
    chunked = Chunked(None)
    chunked.chunks = list(value.chunks)
    problem = chunks_problem(chunked.chunks)
    if problem:
        raise SchemaError(f"{render_path(path)}: {problem} (the Chunked's chunks were changed)")
    first = chunked.chunks[0] if chunked.chunks else None
    if first is None or (chunked.nbytes < w.sent.inline_threshold and not side):
        return w.sent.array(chunked.to_array(), path, side)
    if first.dtype not in PLAIN_DTYPES:
        check_dtype(first.dtype, path)
    pieces = _pieces_of(chunked.chunks)
    ref = ArrayRef(w.sent.add(pieces, side), first.dtype.str, list(chunked.shape), "C")
    return msgspec.msgpack.Ext(EXT_ARRAY, w.encoder.encode(ref))


def _ragged_value(w: Walker, ragged: Ragged, path: KeyPath, side: bool) -> msgspec.msgpack.Ext:
    """The extension value (6) that stands for ``ragged``: its values and offsets as
    arrays (the values to the sidecar if ``side``).

    Raises:
        SchemaError: its offsets no longer fit its values (the arrays were changed or
            set since it was made: one pass over the offsets, so no step is written
            that no receiver can read).
    """
    problem = ragged_problem(ragged)
    if problem:
        raise SchemaError(f"{render_path(path)}: the Ragged's {problem}")
    values = w.sent.array(ragged.values, (path, "values"), side)
    bounds = w.sent.array(ragged.offsets, (path, "offsets"), False)
    return msgspec.msgpack.Ext(EXT_RAGGED, w.encoder.encode([values, bounds]))


def _columns_value(w: Walker, columns: Columns, path: KeyPath, side: bool) -> Sliced[Any]:
    """The extension value (7) that stands for a :class:`~rlwire.Columns`: rows as maps."""
    names = list(columns.names)
    encoded = []
    for name, column in columns.items():
        where, on_side = (path, name), side or w.named(name, name)
        if len(column) != len(columns):  # changed since the Columns was made
            raise SchemaError(
                f"{render_path(where)}: has {len(column)} rows, the Columns {len(columns)}"
            )
        if isinstance(column, Ragged):
            encoded.append(_ragged_value(w, column, where, on_side))
        elif isinstance(column, np.ndarray) and _one_array(column):
            # One value a row along the first axis, kept with its dtype and shape.
            encoded.append(w.sent.array(column, where, on_side))
        else:
            rows = list(column)  # a list, or an object array's rows
            encoded.append((yield from _column(w, rows, _item_of(where), on_side))[0])
        yield from w.tick()
    payload = [len(columns), ROWS_AS_MAPS, names, encoded]
    paths = [_item_of((path, name)) for name in names]
    return msgspec.msgpack.Ext(EXT_COLUMNS, _encoded(w, payload, paths))


def _one_array(column: np.ndarray) -> bool:
    """True if a Columns' array ``column`` is stored as one array: a 1-D one of numbers a
    row may hold as msgpack numbers (bool, ints, floats of at most 8 bytes), any other
    of a dtype that is not objects; else its rows are stored one by one."""
    if column.ndim == 1:
        return column.dtype.kind in "biuf" and column.dtype.itemsize <= 8
    return column.dtype.kind != "O"


def _encoded(w: Walker, payload: list[Any], paths: list[Callable[[int], KeyPath]]) -> bytes:
    """The columns value's ``payload`` encoded; if msgspec refuses it (an int beyond 64
    bits in a column of per-row values), EncodeError naming the first refused row."""
    try:
        return w.encoder.encode(payload)
    except (TypeError, ValueError, OverflowError) as exc:
        for column, path_of in zip(payload[3], paths, strict=True):
            for i, value in enumerate(column if type(column) is list else ()):
                try:
                    w.encoder.encode(value)
                except (TypeError, ValueError, OverflowError):
                    raise EncodeError(f"{render_path(path_of(i))}: cannot encode: {exc}") from None
        raise EncodeError(f"cannot encode a columns value: {exc}") from None


def list_as_columns(w: Walker, items: list[Any], path: KeyPath, side: bool) -> Sliced[Any]:
    """The extension value (7) that stands for ``items`` stored as columns, or None if
    they are not rows of one shape with an array among their fields."""
    shape = row_shape(items)
    if shape is None:
        return None
    layout, names, keys, getters = shape
    yield from w.tick()  # the look at every item: a fraction of a ms of C for thousands
    stored: Any = None  # where a check of the whole list wants what each field became
    if w.check is not None:
        rows = getattr(w.check, "rows", None)  # a check of the whole list at once
        if rows is not None:
            stored = rows(items, render_path(path))
        else:
            for i, item in enumerate(items):
                w.check(item, render_path((path, i)))
    encoded = []
    for name, key, get in zip(names, keys, getters, strict=True):
        values: list[Any] = []
        for start in range(0, len(items), _LOOK_ROWS):
            values += map(get, items[start : start + _LOOK_ROWS])
            yield from w.tick()
        on_side = side or w.named(key, name)  # a renamed field: either name
        value, held = yield from _column(w, values, _field_of(path, name), on_side)
        encoded.append(value)
        if type(stored) is dict:
            stored[key] = held
        yield from w.tick()
    payload = [len(items), layout, names, encoded]
    paths = [_field_of(path, name) for name in names]
    return msgspec.msgpack.Ext(EXT_COLUMNS, _encoded(w, payload, paths))


def _column(
    w: Walker, values: list[Any], path_of: Callable[[int], KeyPath], side: bool
) -> Sliced[tuple[Any, RowArrays | list[Any]]]:
    """``(what stands for one column, what holds its values)``: a ragged array and its
    :class:`RowArrays` when every row holds an array of one dtype and trailing shape,
    else the rows' values, each encoded as usual (chunked if heavy), and ``values``.
    ``path_of(i)``: the path of row ``i``'s value, for error messages."""
    ragged = yield from _ragged_column(w, values, path_of, side)
    if ragged is not None:
        return ragged
    kinds = set(map(type, values))
    if kinds <= SCALARS:
        if str in kinds:
            strings = values if kinds == _STR else [v for v in values if type(v) is str]
        else:  # a column of None, as ref_logprobs often is: no look at each
            strings = []
        heft = len(values) + sum(map(operator.floordiv, map(len, strings), repeat(64)))
        column = values
    elif kinds <= _CONTAINERS and not any(values):  # e.g. extras={} in every sample
        heft, column = len(values), values
    else:
        column, heft = [], 1
        for i, value in enumerate(values):
            new, weight = yield from w.value(value, path_of(i), side)
            column.append(new)
            heft += weight
            yield from w.tick()
    return (yield from w.heavy(column, heft, path_of(0)))[0], values


def _ragged_column(
    w: Walker, values: list[Any], path_of: Callable[[int], KeyPath], side: bool
) -> Sliced[tuple[msgspec.msgpack.Ext, RowArrays] | None]:
    """The extension value (6) of ``values`` back to back, and the arrays that hold
    their bytes, if they are arrays of one dtype, number of dimensions (at least 1) and
    trailing shape; else None.

    Rows of a few kB are copied back to back, a group of rows per slice (tens of
    nanoseconds a row, where a view each costs a microsecond of Python); larger rows
    are written where they are, as the runs of :class:`~rlwire._frame.pieces.Pieces`,
    so that a large step is never held twice."""
    facts = yield from _row_facts(w, values)
    if facts is None:
        return None
    lengths, one_kind = facts
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    first = values[0]
    dtype, tail = first.dtype, first.shape[1:]
    shape = [int(offsets[-1]), *tail]
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    join = (nbytes < w.sent.inline_threshold and not side) or nbytes <= _SMALL_ROW * len(values)
    if not (join and dtype in PLAIN_DTYPES):
        if not one_kind:
            return None
        if dtype not in PLAIN_DTYPES:
            check_dtype(dtype, path_of(0))
    if join:
        made = yield from joined_rows(w, values, offsets, shape, nbytes, one_kind, path_of(0), side)
        if made is None:
            return None
        column, arrays = made
    else:
        pieces = yield from _pieces_sliced(w, values)
        ref = ArrayRef(w.sent.add(pieces, side), dtype.str, shape, "C")
        column = msgspec.msgpack.Ext(EXT_ARRAY, w.encoder.encode(ref))
        arrays = RowArrays(values, offsets)
    offsets_value = w.sent.array(offsets, path_of(0), False)
    return msgspec.msgpack.Ext(EXT_RAGGED, w.encoder.encode([column, offsets_value])), arrays


def _row_facts(w: Walker, values: list[Any]) -> Sliced[tuple[np.ndarray, bool] | None]:
    """``(lengths, one_kind)`` if ``values`` are numpy arrays of at least one dimension
    (else None): their lengths, and whether they all share the first one's dtype, number
    of dimensions and trailing shape. Each look runs in C over the rows (map, set), not
    a Python loop, :data:`_LOOK_ROWS` rows a slice."""
    if not values:  # no rows: a column of no values, as a list
        return None
    first = values[0]
    if type(first) is not np.ndarray or first.ndim < 1:
        return None
    kind, tail = ({first.dtype}, {first.ndim}), {first.shape[1:]}
    lengths = np.empty(len(values), np.int64)
    one_kind = True
    for start in range(0, len(values), _LOOK_ROWS):
        rows = values[start : start + _LOOK_ROWS]
        if set(map(type, rows)) != _NDARRAY:
            return None
        try:
            lengths[start : start + len(rows)] = np.fromiter(map(len, rows), np.int64, len(rows))
        except TypeError:  # a 0-d row
            return None
        if one_kind:
            one_kind = (set(map(_DTYPE, rows)), set(map(_NDIM, rows))) == kind and (
                first.ndim == 1 or {a.shape[1:] for a in rows} == tail
            )
        yield from w.tick()
    return lengths, one_kind


def _pieces_sliced(w: Walker, arrays: list[np.ndarray]) -> Sliced[Pieces]:
    """:func:`_pieces_of` a group of arrays per slice (a view of each costs some 0.3 µs:
    a dense step's 2,048 rows held the GIL over a ms)."""
    if set(map(id, map(_BASE, arrays))) != _NO_BASE:
        return _pieces_of(arrays)
    yield from w.tick()
    if not all(map(_C_CONTIGUOUS, arrays)):
        return _pieces_of(arrays)
    runs: list[memoryview] = []
    for start in range(0, len(arrays), _VIEW_ROWS):
        runs += map(byte_view, arrays[start : start + _VIEW_ROWS])
        yield from w.tick()
    return Pieces.from_distinct(runs)  # each owns its memory


def _pieces_of(arrays: list[np.ndarray]) -> Pieces:
    """The arrays' bytes as the runs of one buffer, in order (a C-contiguous copy only of
    an array that is not C-contiguous)."""
    if set(map(id, map(_BASE, arrays))) == _NO_BASE and all(map(_C_CONTIGUOUS, arrays)):
        return Pieces.from_distinct(map(byte_view, arrays))  # each owns its memory
    return Pieces(byte_view(a if a.flags.c_contiguous else np.ascontiguousarray(a)) for a in arrays)


def _item_of(column: KeyPath) -> Callable[[int], KeyPath]:
    """The path of item ``i`` of a column given as a list: ``$.columns.name[i]``."""
    return lambda i: (column, i)


def _field_of(items: KeyPath, name: str) -> Callable[[int], KeyPath]:
    """The path of field ``name`` of row ``i`` of a list: ``$.samples[i].name``."""
    return lambda i: ((items, i), name)
