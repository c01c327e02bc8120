"""Columns: a list of samples held field by field, as a trainer packs them.

A receiver opened with ``as_columns=True`` returns each list of samples that was stored
column by column as a Columns: per-token fields as :class:`~rlwire.Ragged` (values plus
``cu_seqlens``-style offsets), per-sample numbers as one array, anything else as a list,
all views over the received memory. A sender given a Columns stores it the same way,
with no work per row.

Example:
    >>> import numpy as np
    >>> from rlwire._core.ragged import Ragged, row_index
    >>> cols = Columns({"ids": Ragged(np.arange(5), [0, 2, 5]), "reward": np.array([1.0, 0.0])})
    >>> len(cols), cols.names, cols.row(1)["ids"].tolist()
    (2, ('ids', 'reward'), [2, 3, 4])
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any

import numpy as np

from rlwire._core.errors import SchemaError
from rlwire._core.ragged import Ragged, row_index

__all__ = ["Column", "Columns"]

#: What one column holds: a Ragged (a variable-length array per row), an array whose
#: first axis is the rows, or a list of one value per row.
Column = Ragged | np.ndarray | list[Any]


class Columns:
    """Rows held as named columns of equal length.

    ``len(columns)`` is the number of rows; ``columns["token_ids"]`` a column;
    ``columns.names`` the field names in order; ``columns.row(i)`` row ``i`` as a dict
    of views. It reads like a mapping of names to columns (``keys``, ``values``,
    ``items``, ``in``, and iterating gives the names), except that ``len`` counts rows.

    Args:
        columns: name -> :class:`~rlwire.Ragged`, numpy array (first axis: rows) or
            list (one value per row).

    Raises:
        SchemaError: ``columns`` is not a mapping, a column is of another kind, or
            columns differ in length; names the column.

    Example:
        >>> import numpy as np
        >>> cols = Columns({"reward": np.array([0.5, 1.0]), "env": ["a", "b"]})
        >>> cols["env"], cols.row(0)
        (['a', 'b'], {'reward': np.float64(0.5), 'env': 'a'})
    """

    __slots__ = ("_columns", "_rows")

    def __init__(self, columns: Mapping[str, Column]) -> None:
        if not isinstance(columns, Mapping):
            raise SchemaError(
                f"Columns: takes a mapping of names to columns, got {type(columns).__name__}"
            )
        rows = None
        for name, column in columns.items():
            if not isinstance(name, str):
                raise SchemaError(f"Columns: names must be str, got {name!r}")
            if isinstance(column, np.ndarray) and column.ndim == 0:
                raise SchemaError(f"Columns[{name!r}]: a 0-d array has no rows")
            if not isinstance(column, Ragged | np.ndarray | list):
                raise SchemaError(
                    f"Columns[{name!r}]: must be a Ragged, a numpy array or a list, got "
                    f"{type(column).__name__}"
                )
            if rows is None:
                rows = len(column)
            elif len(column) != rows:
                raise SchemaError(
                    f"Columns[{name!r}]: has {len(column)} rows, the columns before it {rows}"
                )
        self._columns: dict[str, Column] = dict(columns)
        self._rows = rows or 0

    @property
    def names(self) -> tuple[str, ...]:
        """The columns' names, in order."""
        return tuple(self._columns)

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, name: str) -> Column:
        return self._columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def keys(self) -> KeysView[str]:
        """The names (as ``dict.keys``)."""
        return self._columns.keys()

    def values(self) -> ValuesView[Column]:
        """The columns (as ``dict.values``)."""
        return self._columns.values()

    def items(self) -> ItemsView[str, Column]:
        """``(name, column)`` pairs (as ``dict.items``)."""
        return self._columns.items()

    def row(self, index: int) -> dict[str, Any]:
        """Row ``index`` as ``{name: value}``: a view of each Ragged and array column,
        the item of each list column.

        Raises:
            IndexError: ``index`` is out of range (a negative one counts from the end).
            TypeError: ``index`` is not an int, or is a bool.
        """
        n = self._rows
        index = row_index(index, "Columns")
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"Columns: row {index} out of range for {n} rows")
        return {name: column[i] for name, column in self._columns.items()}

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every row, in order, as :meth:`row` gives them."""
        return (self.row(i) for i in range(self._rows))

    def __repr__(self) -> str:
        kinds = ", ".join(f"{name}: {_kind(c)}" for name, c in self._columns.items())
        return f"Columns({self._rows} rows; {kinds})"


def _kind(column: Column) -> str:
    if isinstance(column, Ragged):
        return "Ragged"
    if isinstance(column, np.ndarray):
        return f"array {column.dtype}"
    return "list"
