"""The walk of :class:`~rlwire.Checks`: one pass over one object, as a sliced generator.

Per-token lists of millions of numbers are never walked item by item in Python on the
happy path: a group of a list's floats is proven finite by ``math.isfinite(sum(group))``
(a sum of finite floats is non-finite only on overflow, and then an exact check follows),
a group of ints is bounded by ``max(group)``, and arrays are checked by numpy, a block of
elements at a time. Only a failing group is looked at item by item, to name the first
offending index. Where no rule is in force, the walk only searches for named fields, where
the plans of :mod:`rlwire._checks.plan` say one can be.

Example:
    >>> from rlwire._checks.plan import ANY, Planner, rules_by_name
    >>> from rlwire._core.slicing import run_sliced
    >>> planner = Planner(rules_by_name(("x",), {}), (), frozenset({"x"}))
    >>> run_sliced(Walk(planner, collect=False).visit({"x": [0.5, float("inf")]}, None, None, ANY))
    Traceback (most recent call last):
    ...
    rlwire.errors.SchemaError: $.x[1]: inf is not finite ('x' is checked finite)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
import numpy as np

from rlwire._checks.plan import ANY, Planner, Rules, Shape, merge_rules
from rlwire._checks.values import (
    SCALARS,
    by_row,
    check_scalar,
    first_differing,
    refuse_changed,
    row_lengths,
    same_length,
    scan_array,
    shifted,
    under,
)
from rlwire._core.chunked import Chunked
from rlwire._core.columns import Columns
from rlwire._core.paths import KeyPath
from rlwire._core.ragged import Ragged
from rlwire._core.slicing import Sliced, SliceTimer

__all__ = ["Walk", "group_size", "nesting", "proven"]

# -- values, groups and blocks ----------------------------------------------------------

#: Values that hold no names and need no look when no rule is in force.
_PLAIN: Final = frozenset({int, float, bool, str, bytes, type(None), complex})
#: Element types for which ``sum`` / ``max`` prove a whole group at C speed.
_NUMBERS: Final = frozenset({int, float, bool})
#: Items that mark an untyped list as a list of leaves (None does not: ``[None, {...}]``).
_LEAVES: Final = frozenset({int, float, bool, str, bytes, complex})
_LISTS: Final = frozenset({list, tuple})
#: Rows of a list or object column looked at between two looks at the slice timer.
_ROWS_AT_ONCE: Final = 1_024
#: Levels of nested lists flattened at C speed (e.g. [seq_len][layers][topk] is 3).
_MAX_DEPTH: Final = 6

#: Numbers per group of a list's items: ``sum`` takes about 5 ns a number, ``max`` 15 ns (the
#: copy a few ns), so a group takes well under 0.1 ms and a slice ends soon after its time is up.
_SUM_GROUP: Final = 8_192
_MAX_GROUP: Final = 4_096
#: What a nested list costs to flatten, in numbers.
_LIST_COST: Final = 4


class Walk:
    """One pass over one object, under the rules and plans of ``planner``; with
    ``collect``, the field names met are gathered in ``seen``."""

    def __init__(self, planner: Planner, *, collect: bool) -> None:
        self.planner = planner
        self.names = planner.names
        self.ordered = sorted(self.names)
        self.rules = planner.rules
        self.groups = planner.groups
        self.collect = collect
        self.seen: set[str] = set()  # field names met (collected for the first object only)
        self.slicer = SliceTimer()

    def tick(self) -> Sliced[None]:
        if self.slicer.due():
            yield
            self.slicer.restart()

    def visit(self, value: Any, path: KeyPath, rules: Rules | None, shape: Shape) -> Sliced[None]:
        """Check ``value`` under ``rules`` (None: only search it for named fields, where
        ``shape`` says one can be)."""
        kind = type(value)
        if kind in _PLAIN:
            if rules is not None:
                check_scalar(value, path, rules)
            return
        if rules is None and shape is None:
            return
        if kind is list or kind is tuple:
            yield from self.sequence(value, path, rules, shape)
        elif kind is dict:
            yield from self.mapping(value, path, rules, shape)
        elif isinstance(value, np.ndarray):
            yield from self.array(value, path, rules)
        elif isinstance(value, msgspec.Struct) or (
            dataclasses.is_dataclass(value) and not isinstance(value, type)
        ):
            yield from self.record(value, path, rules)
        elif isinstance(value, SCALARS):  # numpy's, Decimals, subclasses of int, float
            if rules is not None:
                check_scalar(value, path, rules)
        elif isinstance(value, dict):
            yield from self.mapping(value, path, rules, shape)
        elif isinstance(value, list | tuple | set | frozenset):
            yield from self.sequence(list(value), path, rules, shape)
        else:
            yield from self.packed(value, path, rules)

    # -- values held packed: each array scanned whole, a bad value named by its row -----

    def packed(self, value: Any, path: KeyPath, rules: Rules | None) -> Sliced[None]:
        """Check ``value`` if it is a Ragged, a Chunked or a Columns (anything else holds
        nothing the checks know how to look into)."""
        refuse_changed(value, path)  # one changed since it was made, as the encoder does
        if isinstance(value, Ragged):
            yield from self.ragged(value, path, rules)
        elif isinstance(value, Chunked):
            yield from self.chunked(value, path, rules)
        elif isinstance(value, Columns):
            yield from self.columns(value, path, rules)

    def ragged(self, ragged: Ragged, path: KeyPath, rules: Rules | None) -> Sliced[None]:
        """Check ``ragged`` as the list of its rows (``$.x[3][17]``: row 3, token 17), its
        values in one scan."""
        if ragged.values.dtype.kind == "O":
            for i, row in enumerate(ragged):
                yield from self.visit(row, (path, i), rules, ANY)
                yield from self.tick()
        elif rules is not None:
            yield from scan_array(ragged.values, rules, by_row(ragged, path, None), self.tick)

    def chunked(self, chunked: Chunked, path: KeyPath, rules: Rules | None) -> Sliced[None]:
        """Check ``chunked`` as the one array it is sent as (a bad value is named by its
        row in that array), a chunk at a time."""
        if chunked.dtype is not None and chunked.dtype.kind == "O":  # not sendable
            yield from self.visit(chunked.to_array(), path, rules, ANY)
            return
        start = 0
        for chunk in chunked.chunks:
            if rules is not None:
                yield from scan_array(chunk, rules, shifted(path, start), self.tick)
            start += len(chunk)

    def columns(self, cols: Columns, path: KeyPath, rules: Rules | None) -> Sliced[None]:
        """Check ``cols`` as the list of its rows, a column at a time: a bad value is named
        by its row, then its column (``$.samples[3].logprobs[17]``), the first of the first
        column that holds one; same_length groups are compared after every column."""
        if self.collect:
            self.seen.update(cols.names)
        for name in cols.names:
            inner = merge_rules(rules, self.rules.get(name))
            column = cols[name]
            if not isinstance(column, list) and column.dtype.kind != "O":
                if inner is not None:
                    values = column.values if isinstance(column, Ragged) else column
                    place = by_row(column, path, name)
                    yield from scan_array(values, inner, place, self.tick)
                continue
            yield from self.column_rows(column, path, name, inner)
        for group in self.groups:
            present = [name for name in group if name in cols]
            if len(present) >= 2:
                yield from self.column_lengths(cols, path, group, present)
        yield from self.tick()

    def column_rows(
        self, column: Any, path: KeyPath, name: str, rules: Rules | None
    ) -> Sliced[None]:
        """A column of values (a list, or an object array) a group of rows at a time: a
        group shown to pass at C speed, else row by row."""
        size = _ROWS_AT_ONCE  # rows of lists: as many as sum or max takes quickly
        if type(column) is list and column and rules is not None:
            size = min(size, group_size(rules, nesting(column[0])[1]))
        for start in range(0, len(column), size):
            rows = column[start : start + size]
            if isinstance(rows, np.ndarray) and rows.ndim == 1:
                rows = rows.tolist()  # the same objects, a list settled at C speed
            if not _settled(rows, rules):  # else no row needs a look
                for i, item in enumerate(rows, start):
                    yield from self.visit(item, ((path, i), name), rules, ANY)
                    if i & 255 == 255:
                        yield from self.tick()
            yield from self.tick()

    def column_lengths(
        self, cols: Columns, path: KeyPath, group: Sequence[str], present: list[str]
    ) -> Sliced[None]:
        """A same_length group over rows held as columns: compared in numpy where every
        column is a Ragged or an array of two or more dimensions, row by row otherwise."""
        lengths = [row_lengths(cols[name]) for name in present]
        rows: Iterable[int] = range(len(cols))
        if all(n is not None for n in lengths):
            rows = first_differing(lengths, len(cols))  # type: ignore[arg-type]  # no None
        for i in rows:
            same_length((path, i), group, [(name, cols[name][i]) for name in present])
            if i & 255 == 255:
                yield from self.tick()

    # -- containers -------------------------------------------------------------------

    def record(self, obj: Any, path: KeyPath, rules: Rules | None) -> Sliced[None]:
        plan = self.planner.plan(type(obj))
        if self.collect:
            self.seen |= plan.declared
        for field in plan.search if rules is None else plan.every:
            value = getattr(obj, field.name, None)
            if value is None:
                continue
            inner = merge_rules(rules, field.rules)
            if inner is None and type(value) in _PLAIN:
                continue
            yield from self.visit(value, (path, field.name), inner, field.shape)
        for group, mine in plan.groups:
            same_length(path, group, [(name, getattr(obj, name, None)) for name in mine])
        yield from self.tick()

    def mapping(
        self, obj: dict[Any, Any], path: KeyPath, rules: Rules | None, shape: Shape
    ) -> Sliced[None]:
        hits = obj.keys() & self.names  # the named fields, found at C speed
        if self.collect:
            self.note_keys(obj, hits)
        if rules is None:
            yield from self.search_entries(obj, path, hits, shape)
        else:
            yield from self.check_entries(obj, path, hits, rules)
        for group in self.groups:
            present = [name for name in group if name in hits]
            if len(present) >= 2:
                same_length(path, group, [(name, obj[name]) for name in present])
        yield from self.tick()

    def note_keys(self, obj: dict[Any, Any], hits: set[Any]) -> None:
        """Gather the field names of ``obj`` in ``seen``."""
        self.seen |= hits
        if len(obj) <= 1024:  # other keys only serve to suggest a misspelt name
            self.seen.update(k for k in obj if isinstance(k, str))

    def search_entries(
        self, obj: dict[Any, Any], path: KeyPath, hits: set[Any], shape: Shape
    ) -> Sliced[None]:
        """With no rule in force: check the named fields ``hits`` under their own rules,
        and search the other values for named fields where ``shape`` says one can be."""
        inner_shape = shape[1] if isinstance(shape, tuple) and shape[0] == "dict" else ANY
        for key in self.ordered:  # in a fixed order: the same object fails the same way
            if key not in hits:
                continue
            yield from self.visit(obj[key], (path, key), self.rules.get(key), inner_shape)
        if inner_shape is None:
            return
        for i, (key, value) in enumerate(obj.items()):
            if key in hits or type(value) in _PLAIN:
                continue
            yield from self.visit(value, (path, key), None, inner_shape)
            if i & 255 == 255:
                yield from self.tick()

    def check_entries(
        self, obj: dict[Any, Any], path: KeyPath, hits: set[Any], rules: Rules
    ) -> Sliced[None]:
        """Under ``rules``: check every value, a named field's under its own rules too."""
        for i, (key, value) in enumerate(obj.items()):
            inner = merge_rules(rules, self.rules.get(key)) if key in hits else rules
            yield from self.visit(value, (path, key), inner, ANY)
            if i & 255 == 255:
                yield from self.tick()

    def sequence(
        self, seq: list[Any] | tuple[Any, ...], path: KeyPath, rules: Rules | None, shape: Shape
    ) -> Sliced[None]:
        if not seq:
            return
        if rules is None:
            if isinstance(shape, tuple) and shape[0] == "items":
                item_shape = shape[1]
            else:
                # Untyped: a list whose ends are numbers or strings is taken to hold no
                # named fields (looking at every item would cost a Python loop).
                if type(seq[0]) in _LEAVES and type(seq[-1]) in _LEAVES:
                    return
                item_shape = ANY
            for i, item in enumerate(seq):
                if type(item) not in _PLAIN:
                    yield from self.visit(item, (path, i), None, item_shape)
                if i & 63 == 63:
                    yield from self.tick()
            return
        depth, cost, numeric = nesting(seq[0])
        # Groups of about the same cost, however deeply the lists nest.
        size = group_size(rules, cost)
        for start in range(0, len(seq), size):
            group = seq if len(seq) <= size else seq[start : start + size]
            if not (numeric and proven(group, rules, depth)):
                yield from self.items(group, path, rules, start)
            yield from self.tick()

    def items(self, group: Sequence[Any], path: KeyPath, rules: Rules, start: int) -> Sliced[None]:
        """Check a group of items one by one: nested containers, mixed items, or a failure to
        place (the first offending item raises)."""
        for i, item in enumerate(group):
            if type(item) in _PLAIN:
                check_scalar(item, (path, start + i), rules)
            else:
                yield from self.visit(item, (path, start + i), rules, ANY)
            if i & 1023 == 1023:
                yield from self.tick()

    def array(self, arr: np.ndarray, path: KeyPath, rules: Rules | None) -> Sliced[None]:
        if arr.dtype.kind == "O":  # objects: checked like the nested lists they are
            yield from self.visit(arr.tolist(), path, rules, ANY)
        elif rules is not None:
            yield from scan_array(arr, rules, under(path), self.tick)


def _settled(rows: Any, rules: Rules | None) -> bool:
    """True if the values ``rows`` of a list column are shown to pass at C speed: with no
    rule in force they are numbers, strings and the like (no names); under rules, numbers
    that pass them."""
    if not isinstance(rows, list):
        return False  # an object array's (or Ragged's) rows are visited
    if not rows:
        return True
    if rules is None:
        return set(map(type, rows)) <= _PLAIN
    depth, _, numeric = nesting(rows[0])
    return numeric and proven(rows, rules, depth)


def group_size(rules: Rules, cost: int) -> int:
    """Items per group of a list whose items cost ``cost`` numbers each (see :func:`nesting`)."""
    return max(1, (_SUM_GROUP if rules.limit_name is None else _MAX_GROUP) // cost)


def nesting(first: Any) -> tuple[int, int, bool]:
    """How deeply lists nest below a list whose first item is ``first``, judged by first
    items: (levels of lists, the cost of one item in numbers, whether numbers seem to be
    at the bottom). Each nested list costs about as much as four numbers."""
    lengths: list[int] = []
    while type(first) in _LISTS and len(lengths) < _MAX_DEPTH:
        lengths.append(len(first))
        if not first:
            break
        first = first[0]
    cost = 1
    for n in reversed(lengths):
        cost = n * cost + _LIST_COST
    numeric = (
        not first
        if type(first) in _LISTS
        else (type(first) in _NUMBERS or isinstance(first, np.number | np.bool_))
    )  # an empty list: let the C-speed test find out
    return len(lengths), cost, numeric


def proven(group: Sequence[Any], rules: Rules, depth: int = 0) -> bool:
    """True if ``group`` is shown to pass ``rules`` by a few C-speed calls; False when
    they cannot tell (the caller then checks it item by item).

    ``depth`` levels of nested lists are flattened first, in C; each level is first
    checked to hold only lists and tuples (a dict would flatten to its keys).
    """
    for _ in range(depth):
        if not set(map(type, group)) <= _LISTS:
            return False
        group = list(itertools.chain.from_iterable(group))
        if not group:
            return True
    try:
        if rules.finite is not None:
            total = sum(group)
            # NaN or Inf anywhere makes the sum non-finite; so can overflow of finite
            # floats, which the exact check then clears. A sum of ints is an int.
            if type(total) is not int and not math.isfinite(total):
                return False
        if rules.limit_name is not None:
            top = max(group)
            # An int maximum bounds every int in the group; a float maximum (floats are not
            # compared, or a NaN came first) needs the exact check.
            if type(top) is not int and not isinstance(top, np.integer | bool | np.bool_):
                return False
            if top > rules.limit:
                return False
    except (TypeError, ValueError, OverflowError):
        return False  # mixed items (None, strings, containers): check them one by one
    return True
