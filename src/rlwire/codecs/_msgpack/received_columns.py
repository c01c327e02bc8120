"""Ragged arrays and columns met in a received header, checked, then made into rows or
a :class:`~rlwire.Columns` (see :mod:`rlwire.codecs._msgpack.sent_columns` for why
lists of samples are stored this way).

Example:
    >>> import numpy as np
    >>> x = ragged([np.arange(3), np.array([0, 1, 3])])
    >>> found = ColumnsFound(2, ROWS_AS_MAPS, ["x", "n"], [x, [7, 8]])
    >>> from rlwire._core.slicing import SliceTimer, run_sliced
    >>> [(row["x"].tolist(), row["n"]) for row in run_sliced(rows_of(found, SliceTimer()))]
    [([0], 7), ([1, 2], 8)]
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from rlwire._core.columns import Columns
from rlwire._core.errors import CorruptFrameError, FrameTooLargeError
from rlwire._core.ragged import Ragged, offsets_problem
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire.codecs._msgpack.conversion import converted, dec_hook
from rlwire.codecs._msgpack.extensions import ROWS_AS_ARRAYS, ROWS_AS_MAPS
from rlwire.codecs._msgpack.fields import NOT_READ
from rlwire.codecs._msgpack.row_makers import dict_maker, list_maker, struct_maker

__all__ = [
    "ROW_COST",
    "ColumnsFound",
    "columns_of",
    "in_column",
    "parse_columns",
    "ragged",
    "rows_from_columns",
    "rows_of",
    "structs_of",
]

_ROWS_AT_ONCE = 256  # rows made between two looks at the slice timer: ~0.2 ms
#: Bytes of Python objects one row costs at most, per field, made from columns: a slot
#: of its dict (or Struct) and, for a ragged column, a numpy view (about 100 bytes).
ROW_COST = 64 + 128


class ColumnsFound:
    """A columns value (extension 7) from a header, checked, before its rows are made.

    ``columns`` holds, per name, a :class:`~rlwire.Ragged` of ``count`` rows, an array
    of ``count`` values along its first axis, or a list of ``count`` values (which may
    still hold chunked containers or out-of-band bytes to fill: ``inner`` of them)."""

    __slots__ = ("columns", "count", "inner", "layout", "names")

    def __init__(
        self, count: int, layout: int, names: list[str], columns: list[Any], inner: int = 0
    ) -> None:
        self.count = count
        self.layout = layout
        self.names = names
        self.columns = columns
        self.inner = inner


def in_column(name: str, exc: CorruptFrameError) -> CorruptFrameError:
    """``exc``, met reading column ``name`` of a columns value, said of that column."""
    what = exc.message.removeprefix("header: ")
    return type(exc)(f"header: column {name!r}: {what}")


def ragged(payload: Any) -> Ragged:
    """The ragged array (extension 6) whose payload decoded to ``payload``.

    Raises:
        CorruptFrameError: the payload is not two arrays (values of at least one
            dimension, int64 offsets) or the offsets do not cut the values into rows.
    """
    if type(payload) is not list or len(payload) != 2:
        raise CorruptFrameError("header: a ragged array is not [values, offsets]")
    values, offsets = payload
    if not isinstance(values, np.ndarray) or values.ndim < 1:
        raise CorruptFrameError("header: a ragged array's values are not an array of rows")
    if not isinstance(offsets, np.ndarray) or offsets.ndim != 1 or offsets.dtype.kind != "i":
        raise CorruptFrameError("header: a ragged array's offsets are not a 1-D int array")
    if offsets.dtype != np.int64:
        raise CorruptFrameError(f"header: a ragged array's offsets are {offsets.dtype}, not int64")
    problem = offsets_problem(offsets, len(values)) if len(offsets) else "are empty"
    if problem:
        raise CorruptFrameError(f"header: a ragged array's offsets {problem}")
    return Ragged(values, offsets)


def parse_columns(payload: Any, inner: int, fields: frozenset[str] | None = None) -> ColumnsFound:
    """The columns value (extension 7) whose payload decoded to ``payload``; ``inner``:
    the chunked containers and bytes values its columns hold; ``fields``: the names of
    the columns to keep (a partial read; those it holds: another columns value of the
    message may hold the others), or ``None`` for all.

    Raises:
        CorruptFrameError: the payload is not ``[count, layout, names, columns]`` with
            distinct string names, one column per name, each of ``count`` rows, and a
            column at least when ``count`` is above 0; or a
            column kept refers to a buffer that was not read.
    """
    if type(payload) is not list or len(payload) != 4:
        raise CorruptFrameError("header: a columns value is not [count, layout, names, columns]")
    count, layout, names, columns = payload
    if (
        type(count) is not int
        or count < 0
        or type(layout) is not int  # a bool is not a layout, though True == 1
        or layout not in (ROWS_AS_MAPS, ROWS_AS_ARRAYS)
    ):
        raise CorruptFrameError(
            f"header: a columns value has count {count!r} and layout {layout!r}"
        )
    if (
        type(names) is not list
        or type(columns) is not list
        or len(names) != len(columns)
        or any(type(n) is not str for n in names)
        or len(set(names)) != len(names)
    ):
        raise CorruptFrameError("header: a columns value needs one column per distinct name")
    if count and not names:  # rows would be charged nothing: bound them by their columns
        raise CorruptFrameError(f"header: a columns value of {count} rows has no column")
    if fields is not None:
        kept = [i for i, name in enumerate(names) if name in fields]
        names, columns = [names[i] for i in kept], [columns[i] for i in kept]
        if any(
            c is NOT_READ or (type(c) is list and any(x is NOT_READ for x in c)) for c in columns
        ):
            raise CorruptFrameError("header: a column asked for refers to a buffer not read")
    for name, column in zip(names, columns, strict=True):
        if isinstance(column, np.ndarray) and column.ndim == 1 and not _numbers_a_row(column):
            raise CorruptFrameError(
                f"header: column {name!r} of a columns value is a 1-D array of "
                f"{column.dtype}: its rows would not be numbers msgpack holds"
            )
        rows = _rows_in(column)
        if rows != count:
            raise CorruptFrameError(
                f"header: column {name!r} of a columns value has {rows} rows, not {count}"
            )
    return ColumnsFound(count, layout, names, columns, inner)


def _rows_in(column: Any) -> int | None:
    if isinstance(column, Ragged | list):
        return len(column)
    if isinstance(column, np.ndarray):  # an array of one value a row
        return len(column) if column.ndim else None
    count = getattr(getattr(column, "ref", None), "count", None)  # a chunked list
    return count if getattr(column, "is_map", True) is False else None


def _numbers_a_row(column: np.ndarray) -> bool:
    """True if the items of 1-D ``column`` are numbers msgpack holds (bool, int, or a
    float of at most 8 bytes): what writers store a 1-D array column of."""
    return column.dtype.kind in "biuf" and column.dtype.itemsize <= 8


def rows_of(found: ColumnsFound, timer: SliceTimer) -> Sliced[list[Any]]:
    """The rows, as dicts (or lists, for ``array_like`` Structs) of views and values,
    made :data:`_ROWS_AT_ONCE` at a time, yielding when ``timer`` says a slice is over."""
    if found.layout == ROWS_AS_ARRAYS:
        return (yield from _made_rows(found.columns, found.count, timer, list_maker))
    make = dict_maker(tuple(found.names))
    return (yield from _made_rows(found.columns, found.count, timer, make))


def rows_from_columns(columns: Columns, annotation: Any, heap: int) -> Sliced[list[Any]]:
    """The rows of ``columns`` (received, maybe with columns added since) as
    ``annotation`` (a ``list[T]``), made as those of a columns value received into it
    are (:func:`structs_of`, else rows converted), within ``heap`` bytes of Python
    objects (what the messages they came from may build).

    Raises:
        DecodeError: the rows do not match ``annotation``; the path starts at the list.
        FrameTooLargeError: the rows would build more than ``heap`` bytes.
    """
    found = ColumnsFound(len(columns), ROWS_AS_MAPS, list(columns.names), list(columns.values()))
    cells = found.count * max(1, len(found.names))  # a row of no field is an object
    if cells * ROW_COST > heap:
        raise FrameTooLargeError(
            f"rows from columns: {found.count} rows of {len(found.names)} fields would "
            f"build over the {heap // 2**20} MiB of Python objects their messages may"
        )
    timer = SliceTimer()
    made = yield from structs_of(found, annotation, timer)
    if made is None:
        plain = yield from rows_of(found, timer)
        made = yield from converted(plain, annotation, timer)
    return made  # type: ignore[no-any-return]


def _made_rows(
    columns: list[Any], count: int, timer: SliceTimer, make: Callable[..., Any]
) -> Sliced[list[Any]]:
    """``make(*row)`` for each row of ``columns`` (its values, one argument a column,
    ragged rows as views), :data:`_ROWS_AT_ONCE` rows at a time, yielding between groups
    when ``timer`` says a slice is over (making a row is most of the work)."""
    out: list[Any] = []
    for start in range(0, count, _ROWS_AT_ONCE):
        stop = min(start + _ROWS_AT_ONCE, count)
        part = [_values(c, start, stop) for c in columns]
        if any(len(values) != stop - start for values in part):
            raise ValueError("a column holds another number of rows than its columns value")
        out += map(make, *part) if part else (make() for _ in range(start, stop))
        if timer.due():
            yield
            timer.restart()
    return out


def _values(column: Any, start: int, stop: int) -> list[Any]:
    """The values of rows ``start`` to ``stop`` of ``column``: a ragged array's rows and
    the rows of an array of two or more dimensions as views, the numbers of a 1-D array
    as Python numbers (as a list column of numbers holds them)."""
    if isinstance(column, np.ndarray) and column.ndim == 1:
        return column[start:stop].tolist()  # type: ignore[no-any-return]
    return (
        list(column[start:stop]) if isinstance(column, Ragged | np.ndarray) else column[start:stop]
    )


def structs_of(found: ColumnsFound, annotation: Any, timer: SliceTimer) -> Sliced[Any]:
    """The rows as instances of ``T`` when ``annotation`` is ``list[T]`` of a Struct
    type that takes each column as it is (array fields typed ``np.ndarray``, other
    columns converted whole, one msgspec call each, which checks the constraints of an
    ``Annotated`` field as msgspec checks a row's), made by calling ``T`` a few hundred
    rows at a time (which checks no constraint); None when that cannot be told, for the
    general conversion to do (and to word its errors)."""
    kind = _struct_item(annotation)
    plan = _plan(kind, tuple(found.names)) if kind is not None else None
    if (
        kind is None
        or plan is None
        or found.layout != (ROWS_AS_ARRAYS if plan[2] else ROWS_AS_MAPS)
    ):
        return None
    attrs, annotations, _ = plan
    columns: list[Any] = []
    for column, tp in zip(found.columns, annotations, strict=True):
        if isinstance(column, np.ndarray) and column.ndim == 1:
            column = column.tolist()  # numbers, converted below as a list column's
        if isinstance(column, Ragged | np.ndarray):
            if not _takes_arrays(tp):
                return None
        elif tp not in (Any, object):
            try:
                column = msgspec.convert(column, list[tp], dec_hook=dec_hook)  # type: ignore[valid-type]
            except msgspec.ValidationError:
                return None
        columns.append(column)

    try:
        make = struct_maker(kind, tuple(attrs))
        return (yield from _made_rows(columns, found.count, timer, make))
    except (TypeError, ValueError):  # a required field missing, a __post_init__ refusal
        return None


#: The :class:`msgspec.Meta` attributes that constrain a value (the others describe it).
_CONSTRAINTS = frozenset(
    ("gt", "ge", "lt", "le", "multiple_of", "pattern", "min_length", "max_length", "tz")
)


def _takes_arrays(tp: Any) -> bool:
    """True if a field annotated ``tp`` takes a numpy array as it is (a constraint on
    it is msgspec's to check, or to refuse)."""
    if typing.get_origin(tp) is typing.Annotated:
        tp, *extras = typing.get_args(tp)
        if any(_constrains(extra) for extra in extras):
            return False
    return tp in (Any, object, np.ndarray) or (
        typing.get_origin(tp) in (typing.Union, types.UnionType)
        and np.ndarray in typing.get_args(tp)
    )


def _constrains(extra: Any) -> bool:
    """True if ``extra``, met in ``Annotated[T, ...]``, is a constraint msgspec checks."""
    return isinstance(extra, msgspec.Meta) and any(
        getattr(extra, name) is not None for name in _CONSTRAINTS
    )


def _struct_item(annotation: Any) -> type[msgspec.Struct] | None:
    """``T`` of ``list[T]`` when ``T`` is an untagged Struct type that allows no unknown
    field to be dropped silently wrong, else None."""
    if typing.get_origin(annotation) is not list:
        return None
    args = typing.get_args(annotation)
    kind = args[0] if args else None
    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        return None
    config = kind.__struct_config__
    return None if config.tag is not None or config.forbid_unknown_fields else kind


@functools.lru_cache(maxsize=256)
def _plan(
    kind: type[msgspec.Struct], names: tuple[str, ...]
) -> tuple[list[str], list[Any], bool] | None:
    """For columns ``names`` into ``kind``: the attribute each fills, its annotation,
    and whether rows are positional (``array_like``: column ``k`` fills field ``k``,
    whatever its name, as msgspec fills it); None if a name is not a field (the general
    path drops it), an ``array_like`` kind has another number of fields, or an
    annotation cannot be resolved."""
    try:
        ordered = msgspec.structs.fields(kind)
        # With ``Annotated`` kept: its constraints (``Meta(ge=5)``) are checked as a
        # column's values are converted, as msgspec checks a row's.
        hints = typing.get_type_hints(kind, include_extras=True)
    except Exception:  # an unresolvable annotation: leave it to msgspec
        return None
    positional = bool(kind.__struct_config__.array_like)
    if positional:
        if len(ordered) != len(names):
            return None
        chosen = list(ordered)
    else:
        fields = {f.encode_name: f for f in ordered}
        if any(name not in fields for name in names):
            return None
        chosen = [fields[name] for name in names]
    return [f.name for f in chosen], [hints.get(f.name, Any) for f in chosen], positional


def columns_of(found: ColumnsFound) -> Columns:
    """The columns as a :class:`~rlwire.Columns`: an array column as it was sent, a list
    column of per-row numbers of one kind as an array (int64, float64 or bool), any
    other list as it is."""
    return Columns({name: _numbers(c) for name, c in zip(found.names, found.columns, strict=True)})


_NUMBER_DTYPES = {int: np.int64, float: np.float64, bool: np.bool_}


def _numbers(column: Any) -> Any:
    """``column`` as an array if it is a non-empty list of ints, floats or bools (one
    of them; ints that do not fit int64 stay a list); else itself."""
    if type(column) is not list or not column:
        return column
    dtype = _NUMBER_DTYPES.get(type(column[0]))  # strings, None, containers: at once
    if dtype is None or set(map(type, column)) != {type(column[0])}:
        return column
    try:
        return np.array(column, dtype)
    except OverflowError:
        return column
