"""Whether a list is stored as columns (:mod:`rlwire.codecs._msgpack.sent_columns`), and
by which fields: its rows' shape, told from a look at every item in C.

A Struct field left ``msgspec.UNSET`` is left out of the row msgspec encodes, and a
receiver gets it back as ``UNSET`` (or its default). A column holds a value for every
row and has nothing that says "left out", so such a field is not a column: left unset
in every row, it is left out of the columns (each row lacks it, as msgspec would have
encoded it); left unset in some rows only, the list stays a list of rows, each encoded
as msgspec encodes it. Only fields whose type allows ``UNSET`` (or whose default is
``UNSET``) are looked at: a field of another type holds it only against its type.

Example:
    >>> import msgspec, numpy as np
    >>> class S(msgspec.Struct):
    ...     x: np.ndarray
    ...     r: float | msgspec.UnsetType = msgspec.UNSET
    >>> row_shape([S(np.arange(2)), S(np.arange(1))])[1]  # r: unset in every row
    ['x']
    >>> row_shape([S(np.arange(2), 1.0), S(np.arange(1))]) is None  # in some rows
    True
"""

from __future__ import annotations

import functools
import operator
import types
import typing
from collections.abc import Callable
from itertools import repeat
from typing import Any

import msgspec
import numpy as np

from rlwire._core.chunked import Chunked
from rlwire._core.ragged import Ragged
from rlwire.codecs._msgpack.extensions import ROWS_AS_ARRAYS, ROWS_AS_MAPS

__all__ = ["RowShape", "row_shape"]

#: ``(layout, encoded names, attribute names or keys, a getter per field)``.
RowShape = tuple[int, list[str], list[str], list[Callable[[Any], Any]]]


def row_shape(items: list[Any]) -> RowShape | None:
    """The shape of ``items``' rows if they are Structs of one (untagged) type or dicts
    with the same string keys, with an array among the first one's fields (fields left
    ``UNSET`` in every row left out); None if they are not, or a field is left
    ``UNSET`` in some rows only."""
    first = items[0]
    kind = type(first)
    getters: list[Callable[[Any], Any]]
    if isinstance(first, msgspec.Struct):
        config = first.__struct_config__
        if config.tag is not None or set(map(type, items)) != {kind}:
            return None
        fields = msgspec.structs.fields(first)
        names = [f.encode_name for f in fields]
        keys = [f.name for f in fields]
        getters = [operator.attrgetter(key) for key in keys]
        layout = ROWS_AS_ARRAYS if config.array_like else ROWS_AS_MAPS
        if layout == ROWS_AS_MAPS:  # array_like rows cannot leave a field out
            counts = {i: _unset_rows(items, getters[i]) for i in _may_be_unset(type(first))}
            unset = [i for i, n in counts.items() if n]
            if any(counts[i] != len(items) for i in unset):
                return None
            kept = [i for i in range(len(names)) if i not in unset]
            names, keys = [names[i] for i in kept], [keys[i] for i in kept]
            getters = [getters[i] for i in kept]
    elif kind is dict:
        given = first.keys()
        if any(type(k) is not str for k in given):
            return None
        if not any(isinstance(v, np.ndarray | Ragged | Chunked) for v in first.values()):
            return None  # told before the look at every row, which can take long
        if any(type(item) is not dict or item.keys() != given for item in items):
            return None
        names = keys = list(given)
        getters = [operator.itemgetter(k) for k in names]
        layout = ROWS_AS_MAPS
    else:
        return None
    if not any(isinstance(get(first), np.ndarray | Ragged | Chunked) for get in getters):
        return None
    return layout, names, keys, getters


def _unset_rows(items: list[Any], get: Callable[[Any], Any]) -> int:
    """How many of ``items`` have the field ``get`` reads left ``UNSET`` (identity
    looks in C: no ``==``, which an array answers row by row)."""
    return sum(map(operator.is_, map(get, items), repeat(msgspec.UNSET)))


@functools.lru_cache(maxsize=256)
def _may_be_unset(kind: type[msgspec.Struct]) -> tuple[int, ...]:
    """The indices of ``kind``'s fields whose type allows ``UNSET`` or whose default
    is ``UNSET``."""
    return tuple(
        i
        for i, f in enumerate(msgspec.structs.fields(kind))
        if f.default is msgspec.UNSET or _allows_unset(f.type)
    )


def _allows_unset(tp: Any) -> bool:
    """True if ``tp`` is ``UnsetType``, or a union or ``Annotated`` of it."""
    if tp is msgspec.UnsetType:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _allows_unset(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return any(map(_allows_unset, typing.get_args(tp)))
    return False
