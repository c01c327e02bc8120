"""The columns of a message's list of samples, told from its codec header alone: what a
manifest lists, and where a read of some rows of a column finds their bytes.

A message's list of samples is a columns value (extension 7) at the top of the header (a
part) or as one field of the object at the top (a whole step: ``samples``). Each column
is either ragged (extension 6: a values array and an offsets array, each out-of-band or
inline) or a list of values kept in the header. No buffer is read.

Example:
    >>> import numpy as np, rlwire
    >>> from rlwire.codecs._msgpack.codec import MsgpackCodec
    >>> cols = rlwire.Columns({"a": rlwire.Ragged.from_arrays([np.arange(5000)] * 2)})
    >>> table = describe_columns(MsgpackCodec().encode({"samples": cols, "step": 1}))
    >>> table.field, table.rows, [(c.name, c.dtype, c.values) for c in table.columns]
    ('samples', 2, [('a', '<i8', 0)])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec
import numpy as np

from rlwire._core.errors import CorruptFrameError, RlwireError
from rlwire._frame.frame import Frame
from rlwire.codecs._msgpack.allowance import HeapAllowance
from rlwire.codecs._msgpack.arrays import make_array
from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_CHUNKED_ARRAY,
    EXT_COLUMNS,
    EXT_INLINE_ARRAY,
    EXT_RAGGED,
    ROWS_AS_ARRAYS,
    ROWS_AS_MAPS,
    ArrayRef,
    InlineArray,
    weak_hook_decoder,
)

__all__ = ["ColumnTable", "StoredColumn", "describe_columns", "values_array"]

_array_ref = msgspec.msgpack.Decoder(ArrayRef)
_inline = msgspec.msgpack.Decoder(InlineArray)


class _Other:
    """An extension value this scan does not look into."""


_OTHER = _Other()
#: A chunked list (extension 4), which a decode makes a list.
_LIST = _Other()


@dataclass(frozen=True)
class StoredColumn:
    """One column of a list of samples stored column by column.

    Attributes:
        name: the field's name.
        dtype: a ragged column's numpy dtype string; ``None`` for a column of values
            kept in the header (or a chunked container).
        row_shape: a ragged column's trailing shape (``()`` for rows of scalars).
        values: where a ragged column's values are: an out-of-band buffer's index, or
            the array itself when inline (small).
        offsets: likewise for its ``n + 1`` offsets.
        order: the values' memory order (``C`` or ``F``; rows are contiguous in ``C``).
        length: a ragged column's values along their first axis (its tokens).
        empty: a column of values in the header that holds ``None`` in every row (a
            ``ref_logprobs`` left unset), or no row (a field appended to a step of no
            rows replaces no data); whether a reader waits for it is told apart by
            the row count.
        array: a column of one value a row stored as one array (a numpy column of a
            :class:`~rlwire.Columns`): ``values`` says where, ``row_shape`` its shape
            past the rows; it has no ``dtype`` here, which marks ragged columns.
        keys: a column of maps kept in the header (a TrainingSample's ``extras``): the
            keys that hold a value (not ``None``) in some row.
    """

    name: str
    dtype: str | None = None
    row_shape: tuple[int, ...] = ()
    values: int | np.ndarray | None = None
    offsets: int | np.ndarray | None = None
    order: str = "C"
    length: int = 0
    empty: bool = False
    array: bool = False
    keys: frozenset[str] = frozenset()

    @property
    def buffers(self) -> tuple[int, ...]:
        """The out-of-band buffers it refers to: values, then offsets."""
        return tuple(b for b in (self.values, self.offsets) if isinstance(b, int))


@dataclass(frozen=True)
class ColumnTable:
    """A message's list of samples stored as columns.

    Attributes:
        field: where it is: ``None`` at the top of the header (a part's samples), a
            field name (``samples``) or an index (of an ``array_like`` object).
        rows: its number of rows (samples).
        columns: its columns, in stored order.
        lists: the fields of the object at the top that hold a list (this one, and
            any other a decode makes a list or columns), in stored order; ``()`` when
            it is at the top.
    """

    field: str | int | None
    rows: int
    columns: tuple[StoredColumn, ...]
    lists: tuple[str | int, ...] = ()


class _Scan:
    """One decode of a header, each extension payload charged to ``allowance``."""

    def __init__(self, allowance: HeapAllowance) -> None:
        self.allowance = allowance
        self.decoder = weak_hook_decoder(self.hook)  # no cycle: see there

    def hook(self, code: int, data: memoryview) -> Any:
        if code == EXT_ARRAY:
            return _array_ref.decode(data)
        if code == EXT_INLINE_ARRAY:
            return _inline.decode(data)
        if code in (EXT_RAGGED, EXT_COLUMNS):
            self.allowance.charge_decode(data, kept=False)
            return (code, self.decoder.decode(data))
        return _LIST if code == EXT_CHUNKED_ARRAY else _OTHER


def _where(ref: Any) -> tuple[int | np.ndarray, str, list[int], str]:
    if isinstance(ref, ArrayRef):
        return ref.index, ref.dtype, ref.shape, ref.order
    if isinstance(ref, InlineArray):
        data = memoryview(ref.data)
        return make_array(data, ref.dtype, ref.shape, ref.order, False), ref.dtype, ref.shape, "C"
    raise CorruptFrameError("a ragged array's values or offsets are not an array")


def _checked(name: str, ref: Any) -> tuple[int | np.ndarray, str, list[int], str]:
    """:func:`_where` of column ``name``'s array ``ref``, its dtype, shape and order
    checked as a decode checks them (not its bytes, which are not read here)."""
    try:
        values, dtype, shape, order = _where(ref)
        if shape and shape[0] < 0:
            raise CorruptFrameError(f"array descriptor: invalid shape {shape}")
        make_array(memoryview(b""), dtype, [0, *shape[1:]], order, False)
    except CorruptFrameError as exc:
        raise CorruptFrameError(f"column {name!r}: {exc.message}") from None
    return values, dtype, shape, order


def _column(name: str, value: Any) -> StoredColumn:
    if isinstance(value, ArrayRef | InlineArray):  # one value a row, as one array
        values, _, shape, _ = _checked(name, value)
        return StoredColumn(name, row_shape=tuple(shape[1:]), values=values, array=True)
    if not (type(value) is tuple and value[0] == EXT_RAGGED):
        rows = value if type(value) is list else []
        return StoredColumn(
            name,
            empty=type(value) is list and all(v is None for v in value),
            keys=frozenset(
                k for v in rows if type(v) is dict for k, x in v.items() if x is not None
            ),
        )
    payload = value[1]
    if type(payload) is not list or len(payload) != 2:
        raise CorruptFrameError(f"column {name!r}: a malformed ragged array")
    values, dtype, shape, order = _checked(name, payload[0])
    offsets, offsets_dtype, offsets_shape, _ = _checked(name, payload[1])
    if not shape or len(offsets_shape) != 1 or offsets_dtype != "<i8":
        raise CorruptFrameError(
            f"column {name!r}: ragged values of shape {shape} with offsets {offsets_dtype} "
            f"{offsets_shape}: expected values of at least 1 dimension and 1-D <i8 offsets"
        )
    return StoredColumn(name, dtype, tuple(shape[1:]), values, offsets, order, shape[0])


def _table(field: str | int | None, value: Any) -> ColumnTable | None:
    if not (type(value) is tuple and value[0] == EXT_COLUMNS):
        return None
    payload = value[1]
    if not (type(payload) is list and len(payload) == 4 and type(payload[0]) is int):
        raise CorruptFrameError("a malformed columns value")
    count, layout, names, columns = payload
    if count < 0 or type(layout) is not int or layout not in (ROWS_AS_MAPS, ROWS_AS_ARRAYS):
        raise CorruptFrameError(f"a columns value with count {count!r} and layout {layout!r}")
    if type(names) is not list or type(columns) is not list or len(names) != len(columns):
        raise CorruptFrameError("a columns value whose names and columns do not match")
    if not all(type(n) is str for n in names) or len(set(names)) != len(names):
        raise CorruptFrameError(f"a columns value with names {names!r}: not distinct strings")
    if count and not names:
        raise CorruptFrameError(f"a columns value of {count} rows has no column")
    table = ColumnTable(field, count, tuple(map(_column, names, columns)))
    taken: dict[int, str] = {}  # as the decode refuses a buffer taken twice
    for column in table.columns:
        for index in column.buffers:
            if index in taken:
                raise CorruptFrameError(
                    f"column {column.name!r} refers to buffer {index}, as column "
                    f"{taken[index]!r} does (a buffer may be referred to once)"
                )
            taken[index] = column.name
    for name, value in zip(names, columns, strict=True):
        rows = _rows_in(value)
        if rows is not _OTHER and rows != count:  # as the decode refuses it
            raise CorruptFrameError(
                f"column {name!r} of a columns value has {rows} rows, not {count}"
            )
    return table


def _rows_in(value: Any) -> Any:
    """The rows of a column that :func:`_column` read (None: a 0-d array, no rows);
    :data:`_OTHER` for a chunked list, whose count this scan does not read."""
    if type(value) is list:
        return len(value)
    if isinstance(value, ArrayRef | InlineArray):
        return value.shape[0] if value.shape else None
    if type(value) is tuple and value[0] == EXT_RAGGED:  # its offsets are 1-D (_column)
        return value[1][1].shape[0] - 1
    return _OTHER


def describe_columns(frame: Frame) -> ColumnTable | None:
    """The list of samples stored as columns in ``frame``'s (decompressed) header, at its
    top or in a field of the object at its top (the first one); ``None`` when there is
    none there.

    Raises:
        CorruptFrameError: the header cannot be read, or its columns value is malformed.
        FrameTooLargeError: decoding the header could build more Python objects than a
            plain decode of the frame may (its :class:`HeapAllowance`).
    """
    allowance = HeapAllowance.of(frame)
    try:
        allowance.charge_decode(frame.header)
        scan = _Scan(allowance)  # held while it decodes: its decoder holds it weakly
        top = scan.decoder.decode(frame.header)
    except RlwireError:
        raise
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
        raise CorruptFrameError(f"the codec header cannot be read: {exc}") from None
    found = _table(None, top)
    if found is not None:
        return found
    items: Any = top.items() if type(top) is dict else enumerate(top) if type(top) is list else ()
    items = list(items)
    for key, value in items:
        found = _table(key, value)
        if found is not None:
            lists = tuple(k for k, v in items if _a_list(v))
            return replace(found, lists=lists)
    return None


def _a_list(value: Any) -> bool:
    """True if ``value`` (a value of the header's top object, as scanned) decodes to a
    list or columns."""
    return (
        type(value) is list or value is _LIST or (type(value) is tuple and value[0] == EXT_COLUMNS)
    )


def values_array(view: memoryview, column: StoredColumn, count: int, writable: bool) -> np.ndarray:
    """``count`` items of ragged ``column``'s values (rows back to back), a view over
    ``view`` (a copy if ``writable`` and ``view`` is read-only).

    Raises:
        CorruptFrameError: ``view`` does not hold exactly that many, or the column's dtype
            is not a plain numeric one.
    """
    assert column.dtype is not None
    return make_array(view, column.dtype, [count, *column.row_shape], column.order, writable)
