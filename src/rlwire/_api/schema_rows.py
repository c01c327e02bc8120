"""The checks of a list of :class:`~rlwire.TrainingSample` that the codec stores as
columns: :meth:`TrainingSample.validate`'s rules a column at a time, over the arrays the
codec joined where it says which (a few numpy calls a field, not a few per sample).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import Any

import numpy as np

from rlwire._api.schema import (
    _MUST_BE_FINITE,
    _PER_TOKEN_FLOATS,
    TrainingSample,
    check_object,
)
from rlwire._checks.columns import all_finite
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire.codecs._registry import RowArrays

__all__ = ["check_rows_sliced"]


def check_rows_sliced(
    items: list[Any], path: str, stored: Mapping[str, Any] | None = None
) -> Sliced[None]:
    """Validate a list the codec stores as columns, as :func:`check_object` would each
    item (``path[i]``), with a few numpy calls per field rather than per sample: types,
    dtypes, dimensions and lengths compared over the column, finiteness in one
    ``isfinite`` over the rows back to back; a slice per field. ``stored``: what the
    codec stored for each field, by name (a
    :class:`~rlwire.codecs._registry.RowArrays`, or the items' values), read instead of
    the items where given: the arrays the codec joined, not every row again. Anything it
    does not settle at once (an item that is not a TrainingSample, a bad value) is
    checked item by item, which names the sample, field and token."""
    if (
        items
        and set(map(type, items)) == {TrainingSample}
        and (yield from _rows_pass(items, stored or {}))
    ):
        return
    slicer = SliceTimer()
    for i, item in enumerate(items):
        check_object(item, f"{path}[{i}]")
        if slicer.due():
            yield
            slicer.restart()


def _rows_pass(samples: list[TrainingSample], stored: Mapping[str, Any]) -> Sliced[bool]:
    """True if every sample is valid; False if one may not be (then it is checked on
    its own, to say what is wrong)."""
    ids = _token_arrays(samples, "token_ids", stored, "iu")
    if ids is None:
        return False
    offsets = ids[1]
    names = ["mask", *_PER_TOKEN_FLOATS]
    refs = _types(samples, "ref_logprobs", stored)
    if refs != _NONE:
        if type(None) in refs:
            return False
        names.append("ref_logprobs")
    for name in names:
        yield
        column = _token_arrays(samples, name, stored, "b" if name == "mask" else "f")
        if column is None or not np.array_equal(column[1], offsets):
            return False
        if name in _MUST_BE_FINITE and not (yield from _all_finite(column[0], column[2])):
            return False
    if _types(samples, "routed_experts", stored) != _NONE:
        return False  # rare beside a list this long: checked sample by sample
    if _types(samples, "env_name", stored) != {str}:
        return False
    extras = _values(samples, "extras", stored)
    return type(extras) is list and set(map(type, extras)) == {dict} and not any(extras)


_NONE = {type(None)}


def _values(samples: list[TrainingSample], name: str, stored: Mapping[str, Any]) -> Any:
    """The samples' values of field ``name``: the codec's list of them if it kept one,
    its :class:`~rlwire.codecs._registry.RowArrays` if it stored them so, else read."""
    held = stored.get(name)
    if type(held) is list or type(held) is RowArrays:
        return held
    return list(map(attrgetter(name), samples))


def _types(samples: list[TrainingSample], name: str, stored: Mapping[str, Any]) -> set[type]:
    """The types of the samples' values of field ``name``."""
    values = _values(samples, name, stored)
    return {np.ndarray} if type(values) is RowArrays else set(map(type, values))


def _token_arrays(
    samples: list[TrainingSample], name: str, stored: Mapping[str, Any], kinds: str
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray] | None:
    """``(arrays, offsets, ends)`` if every sample's field ``name`` is a 1-D numpy array,
    all of one dtype of a kind in ``kinds`` (mask: exactly bool): ``arrays`` hold the
    values back to back (the samples' own, or the column the codec joined), sample
    ``i``'s being values ``offsets[i]:offsets[i + 1]``, array ``j`` ending at value
    ``ends[j]``; else None."""
    values = _values(samples, name, stored)
    if type(values) is RowArrays:
        arrays, offsets = values
        if arrays[0].ndim != 1 or arrays[0].dtype.kind not in kinds:
            return None  # the codec checked that every row is of the first one's kind
    else:
        if not _column_of(values, 1, kinds):
            return None
        arrays, offsets = values, np.zeros(len(values) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
    if len(arrays) == len(offsets) - 1:  # one array a sample
        return arrays, offsets, offsets[1:]
    return arrays, offsets, np.cumsum(np.fromiter(map(len, arrays), np.int64, len(arrays)))


def _column_of(arrays: list[Any], ndim: int, kinds: str) -> bool:
    """True if ``arrays`` are numpy arrays of ``ndim`` dimensions, all of one dtype of
    a kind in ``kinds`` (mask: exactly bool)."""
    if set(map(type, arrays)) != {np.ndarray} or set(map(_NDIM, arrays)) != {ndim}:
        return False
    dtypes = set(map(_DTYPE, arrays))
    return len(dtypes) == 1 and next(iter(dtypes)).kind in kinds


_NDIM = attrgetter("ndim")
_DTYPE = attrgetter("dtype")


def _all_finite(arrays: list[np.ndarray], ends: np.ndarray) -> Sliced[bool]:
    """True if every value of ``arrays`` (1-D, array ``i`` ending at value ``ends[i]``
    of their concatenation) is finite, told by :func:`~rlwire._checks.columns.all_finite`
    of about a MiB of values at a time, a slice each: views of arrays of a quarter MiB
    or more on average (the groups the codec joined), else groups of arrays joined."""
    per = max(1, _GROUP_BYTES // arrays[0].dtype.itemsize)
    if len(arrays) * per <= 4 * int(ends[-1]) or len(arrays) == 1:
        for values in arrays:
            for start in range(0, max(len(values), 1), per):
                if not all_finite(values[start : start + per]):
                    return False
                yield
        return True
    cuts = np.searchsorted(ends, np.arange(per, int(ends[-1]), per), side="right").tolist()
    start = 0
    for stop in [*dict.fromkeys(cuts), len(arrays)]:
        if stop > start:
            if not all_finite(np.concatenate(arrays[start:stop])):
                return False
            start = stop
            yield
    return True


_GROUP_BYTES = 1 << 20
