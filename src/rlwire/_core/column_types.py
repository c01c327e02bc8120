"""A list received as columns into ``list[S]`` checked against ``S``'s field types, as
its rows would be: once a column, never a row (a dtype, or one ``set(map(type, ...))``
over a list column).

What a column of each field type may be (``X | None`` also lets a list column hold
``None``, which is how a column holds a row's ``None``):

* ``int``: an array of integers, or a list of ints (msgspec takes no bool for an int);
* ``float``: an array of floats or integers, or a list of floats and ints (msgspec takes
  an int for a float, no bool);
* ``bool``: an array of bools, or a list of bools;
* ``str``: a list of str;
* ``np.ndarray``: an :class:`~rlwire.Ragged`, an array of two or more dimensions (a row
  each along its first axis), or a list of arrays.

Fields of other types pass unchecked: ``Any``, nested Structs, dicts, lists, tuples,
bytes, enums, literals, dates, unions of several types but ``None``; and
``Annotated[T, Meta(...)]`` is checked as ``T``, its constraints not. So do columns of
no field of ``S``, and every column when ``S`` is not a Struct type.

Example:
    >>> import msgspec, numpy as np
    >>> from rlwire._core.columns import Columns
    >>> class S(msgspec.Struct):
    ...     n: int
    >>> n = Columns({"n": np.array([1.5])})
    >>> check_column_types(n, list[S], "$")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    rlwire.errors.DecodeError: ...: Expected `int`, got a column of float64 - at `$[0].n`
"""

from __future__ import annotations

import functools
import itertools
import operator
import types
import typing
from typing import Any

import msgspec
import numpy as np

from rlwire._core.built import type_name
from rlwire._core.columns import Columns
from rlwire._core.errors import DecodeError
from rlwire._core.ragged import Ragged

__all__ = ["check_column_types"]

#: A field type checked: the dtype kinds a 1-D array column of it may have, and the
#: types a list column's values may have (``None`` when it takes no list).
_Rule = tuple[str, frozenset[type]]
_NONE = type(None)
_RULES: dict[Any, _Rule] = {
    int: ("iu", frozenset({int})),
    float: ("iuf", frozenset({int, float})),
    bool: ("b", frozenset({bool})),
    str: ("", frozenset({str})),
    np.ndarray: ("", frozenset({np.ndarray})),
}
#: A column's index, name, declared type (as errors name it) and the rule it follows.
_Plan = tuple[tuple[int, str, str, _Rule, bool], ...]


def check_column_types(
    columns: Columns, annotation: Any, where: str, *, positional: bool = False
) -> None:
    """Refuse ``columns`` (received as ``annotation``, at path ``where``) if a column
    holds what its field of ``S`` would refuse in a row; ``annotation`` other than
    ``list[S]`` of a Struct type ``S``: nothing is checked. ``positional``: the rows
    were sent as arrays (an ``array_like`` Struct's), not maps.

    Raises:
        DecodeError: as the row's decode would, naming the first row the column refuses
            (``$.samples[0].score``), the field's type and what the column holds.
    """
    if not len(columns):
        return  # no row to refuse
    kind = _item(annotation)
    if kind is None:
        return
    values = list(columns.values())
    for index, name, declared, rule, optional in _plan(kind, columns.names, positional):
        found = _refused(values[index], rule, optional)
        if found is not None:
            row, held = found
            raise DecodeError(
                f"received data does not match {type_name(annotation)}: Expected "
                f"`{declared}`, got {held} - at `{where}[{row}].{name}`"
            )


def _item(annotation: Any) -> type[msgspec.Struct] | None:
    if typing.get_origin(annotation) is not list:
        return None
    args = typing.get_args(annotation)
    kind = args[0] if args else None
    return kind if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else None


@functools.lru_cache(maxsize=256)
def _plan(kind: type[msgspec.Struct], names: tuple[str, ...], by_position: bool) -> _Plan:
    """The columns of ``names`` to check for ``kind``, with their rules: by name, or,
    for an ``array_like`` kind whose columns are not named by its fields, by position
    (column ``k`` fills field ``k``, as msgspec fills it); none when the rows' layout
    is not the kind's (msgspec refuses each row) or an annotation cannot be resolved."""
    positional = bool(kind.__struct_config__.array_like)
    if by_position != positional:
        return ()
    try:
        fields = msgspec.structs.fields(kind)
        hints = typing.get_type_hints(kind, include_extras=True)
    except Exception:  # an unresolvable annotation: nothing known to check against
        return ()
    by_name = {f.encode_name: f for f in fields}
    # An array_like kind's columns are named by its fields too, and a selection
    # (``fields=``) keeps some of them: by position only when no name is a field's.
    by_index = positional and not any(name in by_name for name in names)
    plan = []
    for index, name in enumerate(names):
        field = by_name.get(name)
        if by_index:
            field = fields[index] if index < len(fields) else None
        if field is None:
            continue
        tp = hints.get(field.name, Any)
        rule, optional = _rule(tp)
        if rule is not None:
            plan.append((index, name, type_name(tp), rule, optional))
    return tuple(plan)


def _rule(tp: Any) -> tuple[_Rule | None, bool]:
    """The rule a field annotated ``tp`` follows (None: unchecked), and whether it
    takes ``None``."""
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(tp) if m is not _NONE]
        optional = len(members) < len(typing.get_args(tp))
        if len(members) != 1:
            return None, optional
        tp = members[0]
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
    return _RULES.get(tp), optional


def _refused(column: Any, rule: _Rule, optional: bool) -> tuple[int, str] | None:
    """The first row ``column`` holds what ``rule`` refuses in, and what the column
    holds; None if it holds none."""
    kinds, allowed = rule
    if isinstance(column, Ragged):
        if np.ndarray in allowed:
            return None
        return 0, f"a column of {column.values.dtype} arrays (a Ragged)"
    if isinstance(column, np.ndarray):
        if column.ndim == 1 and column.dtype.kind in kinds:
            return None
        if column.ndim > 1 and np.ndarray in allowed:
            return None
        rows = "" if column.ndim == 1 else " arrays"
        return 0, f"a column of {column.dtype}{rows}"
    if type(column) is not list:
        return None  # no column rlwire makes: left to the caller's checks
    if optional and not any(map(operator.is_not, column, itertools.repeat(None))):
        return None  # a field no row set (ref_logprobs): identity looks, no == (arrays)
    held = set(map(type, column))
    ok = allowed | {_NONE} if optional else allowed
    if held <= ok:
        return None
    row = next(i for i, value in enumerate(column) if type(value) not in ok)
    return row, f"`{_named(type(column[row]))}` in a column of {_listed(held)}"


def _named(kind: type) -> str:
    return "None" if kind is _NONE else kind.__qualname__


def _listed(held: set[type]) -> str:
    return ", ".join(sorted(map(_named, held)))
