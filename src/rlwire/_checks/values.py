"""The rules of :class:`~rlwire.Checks` applied to one value, and the errors they raise.

A number is checked against its field's rules, an array is scanned a block of elements at
a time (numpy lets go of the GIL while it scans), the fields of a ``same_length`` group
are compared. The :class:`~rlwire.errors.SchemaError` names the first value that breaks a
rule by its path, as :func:`~rlwire._core.paths.render_path` writes it.

Example:
    >>> from rlwire._checks.plan import Rules
    >>> check_scalar(float("nan"), (None, "x"), Rules("x", None, 0))
    Traceback (most recent call last):
    ...
    rlwire.errors.SchemaError: $.x: nan is not finite ('x' is checked finite)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any, Final

import msgspec
import numpy as np

from rlwire._checks.plan import Rules
from rlwire._core.chunked import Chunked, chunks_problem
from rlwire._core.columns import Columns
from rlwire._core.errors import SchemaError
from rlwire._core.paths import KeyPath, render_path
from rlwire._core.ragged import Ragged, ragged_problem
from rlwire._core.slicing import Sliced

__all__ = [
    "SCALARS",
    "Place",
    "at",
    "by_row",
    "check_scalar",
    "first_differing",
    "refuse_changed",
    "row_lengths",
    "same_length",
    "scan_array",
    "shifted",
    "under",
]

#: Elements per block of an array (numpy releases the GIL while it scans); bounds the
#: temporary bool array too.
_ARRAY_BLOCK: Final = 1 << 18

#: The scalars :func:`check_scalar` looks at besides Python's own numbers: numpy's, Decimals
#: (which msgspec sends as strings, read back as Decimals), subclasses of int, float, complex.
SCALARS: Final = (np.generic, int, float, complex, Decimal)

#: Where an element of a scanned array is, given its index in that array.
Place = Callable[[tuple[int, ...]], KeyPath]


def under(path: KeyPath) -> Place:
    """The :data:`Place` of an array that sits at ``path`` itself."""
    return lambda index: at(path, index)


def by_row(column: Ragged | np.ndarray, path: KeyPath, name: str | None) -> Place:
    """Where an element of ``column``'s values is, named by its row first (then ``name``,
    for a column of a Columns, then its index in the row)."""

    def place(index: tuple[int, ...]) -> KeyPath:
        row, rest = index[0], index[1:]
        if isinstance(column, Ragged):
            row = int(np.searchsorted(column.offsets, row, "right")) - 1
            rest = (index[0] - int(column.offsets[row]), *rest)
        return at((path, row) if name is None else ((path, row), name), rest)

    return place


def refuse_changed(value: Any, path: KeyPath) -> None:
    """Refuse a Ragged, Chunked or Columns at ``path`` that was changed since it was made
    so that it no longer holds rows (offsets that do not fit the values, a chunk of
    another kind, a list column grown), with the encoder's message: the checks' error
    is the one a send raises, and a scan of it would name rows it does not hold."""
    if isinstance(value, Ragged):
        problem = ragged_problem(value)
        if problem:
            raise SchemaError(f"{render_path(path)}: the Ragged's {problem}")
    elif isinstance(value, Chunked):
        problem = chunks_problem(value.chunks)
        if problem:
            raise SchemaError(f"{render_path(path)}: {problem} (the Chunked's chunks were changed)")
    elif isinstance(value, Columns):
        for name, column in value.items():
            if len(column) != len(value):
                raise SchemaError(
                    f"{render_path((path, name))}: has {len(column)} rows, the Columns {len(value)}"
                )
            refuse_changed(column, (path, name))


def shifted(path: KeyPath, start: int) -> Place:
    """Where an element of a chunk whose first row is row ``start`` of the whole is."""
    return lambda index: at(path, (start + index[0], *index[1:]))


def scan_array(
    arr: np.ndarray, rules: Rules, place: Place, tick: Callable[[], Sliced[None]]
) -> Sliced[None]:
    """Check the numbers of ``arr`` (not an object array) under ``rules``, a block at a
    time with ``tick`` between blocks; the first bad element (in C order) is named by
    ``place``."""
    finite = rules.finite is not None and arr.dtype.kind in "fc"
    bounded = rules.limit_name is not None and arr.dtype.kind in "iub"
    if not (finite or bounded):
        return
    # Bools are compared as bools, 0 or 1 (a byte 2 read as a bool is True: never 2).
    numbers = arr
    # A contiguous array is scanned in blocks of a flat view, any other in one go. In a
    # C-order view, a bad element is then found in its block.
    c_order = numbers.flags.c_contiguous
    blocked = c_order or numbers.flags.f_contiguous
    flat = numbers.reshape(-1) if c_order else numbers.T.reshape(-1) if blocked else numbers
    for start in range(0, max(flat.size, 1), _ARRAY_BLOCK) if blocked else (0,):
        block = flat[start : start + _ARRAY_BLOCK] if blocked else flat
        found = block if c_order else None
        if finite and not np.isfinite(block).all():
            index = _first(numbers, found, start, _not_finite)
            _fail_finite(place(index), arr[index], rules)
        if bounded and block.size and int(block.max()) > rules.limit:
            index = _first(numbers, found, start, _above(rules.limit))
            _fail_max(place(index), arr[index], rules)
        yield from tick()


def _not_finite(values: np.ndarray) -> np.ndarray:
    return np.asarray(np.logical_not(np.isfinite(values)))


def _above(limit: int) -> Callable[[np.ndarray], np.ndarray]:
    def above(values: np.ndarray) -> np.ndarray:
        return np.asarray(values > limit)

    return above


def _first(
    arr: np.ndarray, block: np.ndarray | None, start: int, bad: Callable[[np.ndarray], np.ndarray]
) -> tuple[int, ...]:
    """The index in ``arr`` of its first element (in C order) that ``bad`` marks: looked
    for in ``block``, the slice of ``arr``'s flat view from ``start``, if given; else in
    a mask of the whole array (a byte an element, not an index per bad element)."""
    if block is not None:
        flat = start + int(np.argmax(bad(block)))
    else:
        flat = int(np.argmax(bad(arr).ravel()))  # ravel: C order, as the rows are read
    return tuple(int(i) for i in np.unravel_index(flat, arr.shape))


def check_scalar(value: Any, path: KeyPath, rules: Rules) -> None:
    """Refuse the number ``value`` at ``path`` if it breaks ``rules`` (other values pass)."""
    kind = type(value)
    if kind is float:
        if rules.finite is not None and not math.isfinite(value):
            _fail_finite(path, value, rules)
    elif kind is int or kind is bool:
        if rules.limit_name is not None and value > rules.limit:
            _fail_max(path, value, rules)
    elif isinstance(value, np.generic) and not isinstance(value, np.inexact):
        check_scalar(value.item(), path, rules)
    else:
        _check_number(value, path, rules)


def _check_number(value: Any, path: KeyPath, rules: Rules) -> None:
    """:func:`check_scalar` of a complex, a numpy float (``.item()`` of a long double is
    itself), a subclass of int or float (an IntEnum or a float Enum, which msgspec sends
    as the number it is), or a Decimal: ``finite`` refuses a NaN or infinite one (it
    arrives as a Decimal NaN where the field is typed so); ``max_value`` does not compare
    it, as it compares no floats."""
    if isinstance(value, int):
        if rules.limit_name is not None and value > rules.limit:
            _fail_max(path, value, rules)
    elif isinstance(value, Decimal):
        if rules.finite is not None and not value.is_finite():
            _fail_finite(path, value, rules)
    elif (
        rules.finite is not None
        and isinstance(value, float | complex | np.inexact)
        and not np.isfinite(value)
    ):
        _fail_finite(path, value, rules)


def _fail_finite(path: KeyPath, value: Any, rules: Rules) -> None:
    raise SchemaError(
        f"{render_path(path)}: {_show(value)} is not finite ({rules.finite!r} is checked finite)"
    )


def _fail_max(path: KeyPath, value: Any, rules: Rules) -> None:
    raise SchemaError(
        f"{render_path(path)}: {_show(value)} is above {rules.limit}, "
        f"the max_value of {rules.limit_name!r}"
    )


def same_length(path: KeyPath, group: Sequence[str], fields: list[tuple[str, Any]]) -> None:
    """Refuse the record or dict at ``path`` if its ``fields`` of a same_length ``group``
    (name, value) differ in length; None and UNSET values are left out."""
    lengths: list[tuple[str, int]] = []
    for name, value in fields:
        if value is None or value is msgspec.UNSET:
            continue
        try:
            lengths.append((name, len(value)))
        except TypeError:
            raise SchemaError(
                f"{render_path((path, name))}: has no length ({type(value).__name__}), but "
                f"same_length group {tuple(group)!r} compares it"
            ) from None
    if len({n for _, n in lengths}) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths)
        raise SchemaError(
            f"{render_path(path)}: same_length group {tuple(group)!r} disagrees: {listed}"
        )


def _show(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def at(path: KeyPath, index: Iterable[int]) -> KeyPath:
    """``path`` followed by the indices ``index``."""
    for i in index:
        path = (path, int(i))
    return path


def row_lengths(column: Any) -> np.ndarray | int | None:
    """Each row's length in ``column`` if numpy can tell it without a Python loop: an
    array of them, or one for every row (an array of two or more dimensions)."""
    if isinstance(column, Ragged):
        return column.lengths
    if isinstance(column, np.ndarray) and column.ndim >= 2 and column.dtype.kind != "O":
        return int(column.shape[1])
    return None


def first_differing(lengths: list[np.ndarray | int], count: int) -> list[int]:
    """``[i]``, ``i`` the first of ``count`` rows whose ``lengths`` (per column: an array
    of them, or one for every row) differ; ``[]`` if none. One length for every row
    costs no memory: 2-D columns of millions of rows are compared as two numbers."""
    differ: np.ndarray | bool = False
    for other in lengths[1:]:
        differ = differ | (np.asarray(other) != lengths[0])
    if isinstance(differ, np.ndarray) and differ.ndim:
        return np.flatnonzero(differ)[:1].tolist()  # type: ignore[no-any-return]
    return [0] if differ and count else []
