"""The parts of a step filled part by part, joined as one :class:`~rlwire.Columns`: what
``receive()`` returns for such a step to a receiver opened with ``fields=`` (or
``as_columns=True``), as it does for a step sent whole.

Each part was decoded as columns on its own, as views over its own message. Joined, a
column's rows are the parts' rows in index order: a :class:`~rlwire.Ragged` whose
values are the parts' values back to back (a copy, made in slices) and whose offsets
are the parts' moved along; an array whose first axis is the rows, the parts' arrays
back to back (a copy); a list, the parts' lists. A column whose parts do not agree (a
Ragged in one part and a list in another, or arrays of two dtypes) is joined as the
codec stores such a field within one message: a list of each row's value (views; a
number as a Python int, float or bool). A
single part is returned as it is, with no copy.

Example:
    >>> import numpy as np
    >>> from rlwire._core.slicing import run_sliced
    >>> a = Columns({"ids": Ragged(np.arange(3), [0, 1, 3])})
    >>> b = Columns({"ids": Ragged(np.arange(3, 5), [0, 2])})
    >>> joined = run_sliced(joined_columns([a, b], writable=False))
    >>> joined["ids"].offsets.tolist(), joined["ids"].values.tolist()
    ([0, 1, 3, 5], [0, 1, 2, 3, 4])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlwire._core.columns import Column, Columns
from rlwire._core.copying import copied_into
from rlwire._core.errors import ConfigError
from rlwire._core.ragged import Ragged
from rlwire._core.slicing import Sliced

__all__ = ["joined_columns"]


def joined_columns(parts: list[Any], *, writable: bool) -> Sliced[Any]:
    """The samples of ``parts`` (each part's as decoded with columns: a Columns, or a
    list when its samples were not stored as columns, as a part of none) as one value:
    a Columns of every row, in order, or the parts' lists joined when none is a Columns.

    Arrays copied are read-only unless ``writable``, as received arrays are.

    Raises:
        ConfigError: a part's samples are a Columns and another's a list of samples
            (stored whole: items of different types), or two parts' Columns hold
            different fields; names the parts (read them with ``parts()``).
    """
    full = [(i, p) for i, p in enumerate(parts) if len(p)]
    if not full:
        return parts[0] if parts else []
    if len(full) == 1:
        return full[0][1]
    lists = [i for i, p in full if not isinstance(p, Columns)]
    if len(lists) == len(full):
        return [sample for _, p in full for sample in p]
    if lists:
        first = next(i for i, p in full if isinstance(p, Columns))
        raise ConfigError(
            f"part {first}'s samples were stored as columns and part {lists[0]}'s were "
            "not (items of different types, kept as a list): they cannot be joined as one "
            "Columns; read the step's parts with parts()"
        )
    (first, names), *rest = [(i, p.names) for i, p in full]
    for i, other in rest:
        if set(other) != set(names):
            raise ConfigError(
                f"part {first} holds the fields {list(names)} and part {i} "
                f"{list(other)}: they cannot be joined as one Columns; read the step's "
                "parts with parts()"
            )
    out: dict[str, Column] = {}
    for name in names:
        out[name] = yield from _joined([p[name] for _, p in full], writable)
    return Columns(out)


def _joined(columns: list[Column], writable: bool) -> Sliced[Column]:
    """One column of the parts' ``columns``, rows in order."""
    if all(isinstance(c, Ragged) for c in columns):
        raggeds: list[Ragged] = columns  # type: ignore[assignment]
        values = [r.values for r in raggeds]
        if _alike(values):
            joined = yield from _arrays(values, writable)
            return Ragged(joined, _offsets([r.offsets for r in raggeds], writable))
    elif all(isinstance(c, np.ndarray) for c in columns):
        arrays: list[np.ndarray] = columns  # type: ignore[assignment]
        if _alike(arrays):
            return (yield from _arrays(arrays, writable))
    # Lists, or parts that disagree: a value a row, as one message stores such a field.
    # A part's 1-D array held plain numbers (one message keeps a 0-d array row as a
    # list item, never in an array), which one message's list keeps as Python values.
    return [row for column in columns for row in _rows(column)]


def _rows(column: Column) -> list[Any] | Column:
    """The rows of a part's ``column`` as one message lists them."""
    if isinstance(column, np.ndarray) and column.ndim == 1:
        return column.tolist()  # type: ignore[no-any-return]
    return column


def _alike(arrays: list[np.ndarray]) -> bool:
    """True if ``arrays`` share their dtype and every dimension but the first."""
    first = arrays[0]
    return all(a.dtype == first.dtype and a.shape[1:] == first.shape[1:] for a in arrays)


def _arrays(arrays: list[np.ndarray], writable: bool) -> Sliced[np.ndarray]:
    """``arrays`` back to back along their first axis, in a new array, copied in slices
    with the GIL let go."""
    first = arrays[0]
    out = np.empty((sum(len(a) for a in arrays), *first.shape[1:]), first.dtype)
    if out.nbytes:
        flat = out.reshape(-1).view(np.uint8)
        runs = [np.ascontiguousarray(a).reshape(-1).view(np.uint8).data for a in arrays]
        yield from copied_into(runs, flat)  # type: ignore[arg-type]
    out.flags.writeable = writable
    return out


def _offsets(offsets: list[np.ndarray], writable: bool) -> np.ndarray:
    """The parts' row boundaries as the joined column's: each part's moved along by the
    values before it."""
    moved = [offsets[0]]
    base = int(offsets[0][-1])
    for bounds in offsets[1:]:
        moved.append(bounds[1:] + base)
        base += int(bounds[-1])
    joined = np.concatenate(moved)
    joined.flags.writeable = writable
    return joined
