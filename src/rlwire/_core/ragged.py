"""Ragged: rows of different lengths as one array of values and one of offsets.

The packed form trainers use (``cu_seqlens`` in flash-attention's varlen kernels, the
``offsets`` of a jagged tensor): row ``i`` is ``values[offsets[i]:offsets[i + 1]]``. rlwire
sends a Ragged as two buffers, with no work per row, and receives one as views over the
received memory.

Example:
    >>> import numpy as np
    >>> r = Ragged.from_arrays([np.array([1, 2, 3]), np.array([4])])
    >>> len(r), r.lengths.tolist(), r[0].tolist(), r.offsets.tolist()
    (2, [3, 1], [1, 2, 3], [0, 3, 4])
"""

from __future__ import annotations

import contextlib
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from rlwire._core.errors import SchemaError

__all__ = ["Ragged", "offsets_problem", "ragged_problem", "row_index"]

_BOOLS = frozenset((bool, np.bool_))


class Ragged:
    """A jagged array: ``len(offsets) - 1`` rows, row ``i`` being
    ``values[offsets[i]:offsets[i + 1]]``, a view.

    ``values`` holds the rows back to back along its first axis (any trailing shape:
    ``[tokens]`` or ``[tokens, layers, topk]``); ``offsets`` is int64, starts at 0, never
    decreases and ends at ``len(values)``: what varlen kernels call ``cu_seqlens`` (cast
    it with ``offsets.astype(np.int32)`` where a kernel wants int32).
    ``torch.from_numpy(r.values)`` shares the memory.

    Args:
        values: the rows' items, back to back (at least 1-D).
        offsets: ``n + 1`` row boundaries (any integer dtype; kept as int64).

    Raises:
        SchemaError: ``values`` is not a numpy array of at least one dimension, or
            ``offsets`` is not 1-D, not integers, does not start at 0, decreases, or
            does not end at ``len(values)``; the message says which.

    Example:
        >>> import numpy as np
        >>> r = Ragged(np.arange(5), np.array([0, 2, 5]))
        >>> [row.tolist() for row in r]
        [[0, 1], [2, 3, 4]]
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: np.ndarray, offsets: np.ndarray | Sequence[int]) -> None:
        if not isinstance(values, np.ndarray) or values.ndim < 1:
            raise SchemaError(
                "Ragged: values must be a numpy array of at least one dimension, got "
                + (
                    f"shape {values.shape}"
                    if isinstance(values, np.ndarray)
                    else type(values).__name__
                )
            )
        try:
            offsets = np.asarray(offsets)
        except (TypeError, ValueError):  # nested sequences of different lengths
            offsets = np.asarray(None)  # refused below as not integers
        if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 1:
            raise SchemaError(
                f"Ragged: offsets must be a 1-D integer array of n + 1 boundaries, got "
                f"dtype {offsets.dtype} and shape {offsets.shape}"
            )
        if offsets.dtype.kind == "u" and len(offsets) and offsets.max() > np.iinfo(np.int64).max:
            raise SchemaError(
                f"Ragged: offsets reach {int(offsets.max())}, past the int64 they are kept as"
            )
        offsets = offsets.astype(np.int64, copy=False)
        problem = offsets_problem(offsets, len(values))
        if problem:
            raise SchemaError(f"Ragged: offsets {problem}")
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_arrays(cls, rows: Sequence[np.ndarray]) -> Ragged:
        """A Ragged holding a copy of ``rows`` (arrays of one dtype and one trailing
        shape), concatenated.

        Raises:
            SchemaError: ``rows`` is not iterable, or the rows differ in dtype,
                dimensions or trailing shape, or one is not an array; names the first
                row that differs.
        """
        if not isinstance(rows, Iterable) or isinstance(rows, str | bytes):
            raise SchemaError(
                f"Ragged.from_arrays: rows must be a sequence of arrays, got {type(rows).__name__}"
            )
        arrays = []
        for i, row in enumerate(rows):
            try:
                arrays.append(np.asarray(row))
            except (TypeError, ValueError) as exc:  # nested lists of different lengths
                raise SchemaError(f"Ragged.from_arrays: row {i} is not an array: {exc}") from None
        if not arrays:
            raise SchemaError("Ragged.from_arrays: needs at least one row to know its dtype")
        first = arrays[0]
        for i, row in enumerate(arrays):
            if row.ndim < 1:  # a number or a string: no items to be a row of
                raise SchemaError(
                    f"Ragged.from_arrays: row {i} is a 0-d {row.dtype} array (shape ()); a row "
                    "needs at least one dimension, its items"
                )
            if row.dtype != first.dtype or row.shape[1:] != first.shape[1:]:
                raise SchemaError(
                    f"Ragged.from_arrays: row {i} has dtype {row.dtype} and shape "
                    f"{row.shape}; row 0 has {first.dtype} and {first.shape} (rows must "
                    "share a dtype and every dimension but the first)"
                )
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([len(row) for row in arrays], out=offsets[1:])
        return cls(np.concatenate(arrays, dtype=first.dtype), offsets)  # keeps the byte order

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: np.ndarray | Sequence[int]) -> Ragged:
        """A Ragged over ``values`` (not copied) cut into rows of ``lengths``.

        Raises:
            SchemaError: ``lengths`` is not a 1-D sequence of integers (a float or bool
                length is refused, not truncated or taken as 0 or 1), one is negative,
                they add up past int64 or they do not add up to ``len(values)``.

        Example:
            >>> import numpy as np
            >>> Ragged.from_lengths(np.arange(3), [1, 2]).offsets.tolist()
            [0, 1, 3]
        """
        try:
            given = np.asarray(lengths)
        except (TypeError, ValueError):  # nested sequences of different lengths
            given = np.asarray(None)  # refused below as not integers
        if given.dtype.kind in "fO" and not isinstance(lengths, np.ndarray):
            given = _whole(lengths, given)  # numpy ints of mixed widths promote to float
        # numpy took True as 1 beside ints (an array of bools is refused below).
        bools = given.ndim == 1 and not isinstance(lengths, np.ndarray)
        if bools and not _BOOLS.isdisjoint(map(type, lengths)):
            i = next(i for i, n in enumerate(lengths) if type(n) in _BOOLS)
            raise SchemaError(
                f"Ragged.from_lengths: length of row {i} is a bool ({lengths[i]}); lengths "
                "must be integers"
            )
        if given.ndim != 1 or (given.size and given.dtype.kind not in "iu"):
            raise SchemaError(
                f"Ragged.from_lengths: lengths must be a 1-D sequence of integers, got "
                f"dtype {given.dtype} and shape {given.shape}"
            )
        offsets = np.zeros(len(given) + 1, np.int64)
        np.cumsum(given.astype(np.int64, copy=False), out=offsets[1:])
        try:
            return cls(values, offsets)
        except SchemaError:  # a negative length or a sum past int64 reads as a decrease
            problem = _lengths_problem(given)
            if problem:
                raise SchemaError(f"Ragged.from_lengths: {problem}") from None
            raise

    @property
    def lengths(self) -> np.ndarray:
        """Each row's length (``np.diff(offsets)``)."""
        return np.diff(self.offsets)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The values' dtype."""
        return self.values.dtype

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int | slice) -> Any:
        """Row ``index`` as a view of the values; a slice of rows as a Ragged over the
        same values (offsets rebased)."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("Ragged: only contiguous slices of rows (step 1)")
            stop = max(start, stop)
            base = self.offsets[start]
            return Ragged(
                self.values[base : self.offsets[stop]], self.offsets[start : stop + 1] - base
            )
        n = len(self)
        index = row_index(index, "Ragged")
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"Ragged: row {index} out of range for {n} rows")
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        bounds = self.offsets.tolist()
        values = self.values
        return (values[a:b] for a, b in itertools.pairwise(bounds))

    def __repr__(self) -> str:
        return (
            f"Ragged({len(self)} rows, {len(self.values)} items of {self.values.dtype}"
            + (f" x {list(self.values.shape[1:])}" if self.values.ndim > 1 else "")
            + ")"
        )


def row_index(index: Any, what: str) -> int:
    """``index`` as an int row index: a str or float is a TypeError, as for a list, and
    so is a bool, which numpy would read as a mask (a new axis) where a list reads row 1.

    Raises:
        TypeError: ``index`` is a bool or not an integer.
    """
    if isinstance(index, bool):
        raise TypeError(
            f"{what}: row {index} is a bool; a row index is an int (numpy reads a bool as "
            "a mask, a list as row 0 or 1)"
        )
    return operator.index(index)


def _lengths_problem(given: np.ndarray) -> str:
    """A negative length, or lengths whose sum (the last offset) is past int64 (where
    np.cumsum wraps to a decrease), in integer ``given`` ('' if neither)."""
    if given.size and given.dtype.kind == "i" and given.min() < 0:
        i = int(np.argmax(given < 0))
        return f"length of row {i} is negative ({given[i]})"
    total, top = 0, np.iinfo(np.int64).max
    for i, n in enumerate(given.tolist()):
        total += n
        if total > top:
            return (
                f"the lengths add up to {total} by row {i}, past the int64 the offsets are kept as"
            )
    return ""


def _whole(lengths: Sequence[Any], given: np.ndarray) -> np.ndarray:
    """``lengths`` as int64 if every item is an int (Python's or numpy's), else ``given``."""
    if given.ndim == 1 and all(isinstance(n, int | np.integer) for n in lengths):
        with contextlib.suppress(OverflowError):  # past int64: refused as not integers
            return np.array([int(n) for n in lengths], np.int64)
    return given


def ragged_problem(ragged: Ragged) -> str:
    """What is wrong with ``ragged``, whose attributes may have been set since it was
    made, as rows ('' if nothing): ``values ...`` or ``offsets ...``.

    Example:
        >>> r = Ragged(np.arange(3), [0, 3])
        >>> r.offsets = np.array([1, 3])
        >>> ragged_problem(r)
        'offsets must start at 0, got 1'
    """
    values, offsets = ragged.values, ragged.offsets
    if not isinstance(values, np.ndarray) or values.ndim < 1:
        got = f"shape {values.shape}" if isinstance(values, np.ndarray) else type(values).__name__
        return f"values must be a numpy array of at least one dimension, got {got}"
    if not (
        isinstance(offsets, np.ndarray)
        and offsets.ndim == 1
        and offsets.dtype == np.int64
        and offsets.size
    ):
        return "offsets must be a 1-D int64 array of at least one entry"
    problem = offsets_problem(offsets, len(values))
    return f"offsets {problem}" if problem else ""


def offsets_problem(offsets: np.ndarray, total: int) -> str:
    """What is wrong with ``offsets`` as the boundaries of ``total`` items ('' if none)."""
    if offsets[0] != 0:
        return f"must start at 0, got {int(offsets[0])}"
    if offsets[-1] != total:
        return f"must end at the number of values ({total}), got {int(offsets[-1])}"
    if len(offsets) > 1:
        drops = np.flatnonzero(offsets[1:] < offsets[:-1])
        if drops.size:
            i = int(drops[0])
            return f"decrease at row {i} ({int(offsets[i])} then {int(offsets[i + 1])})"
    return ""
