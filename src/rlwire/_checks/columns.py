"""The walk of :class:`~rlwire.Checks` over a list of records, a column at a time.

A list of Structs, dataclasses or dicts of one type (a step's samples) is checked field by
field over a group of rows: one field of every row is gathered into a column, and the
column is settled by a few calls (its arrays joined and scanned by one ``isfinite`` or
one ``max``, its floats summed, its ints bounded by ``max``, the lengths of a
``same_length`` group compared as lists), not by Python work per array. What a column
cannot settle marks its rows: a value of an unexpected type (a nested record, a list, an
object array), a failed or overflowing column check, an array too big to join. Only those
rows are then visited by the per-object walk of :mod:`rlwire._checks.walk`, field by field
in the order it visits them, so a bad value is named exactly as that walk names it
(``$.samples[17].logprobs[3]``) and nothing is accepted that it would refuse.

Example:
    >>> import numpy as np
    >>> from rlwire._checks.plan import ANY, Planner, rules_by_name
    >>> from rlwire._core.slicing import run_sliced
    >>> planner = Planner(rules_by_name(("x",), {}), (), frozenset({"x"}))
    >>> rows = [{"x": np.zeros(3)} for _ in range(41)]
    >>> rows[17]["x"][2] = np.inf
    >>> run_sliced(ColumnWalk(planner, collect=False).visit(rows, None, None, ANY))
    Traceback (most recent call last):
    ...
    rlwire.errors.SchemaError: $[17].x[2]: inf is not finite ('x' is checked finite)
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import msgspec
import numpy as np

from rlwire._checks.plan import ANY, Rules, Shape, merge_rules
from rlwire._checks.values import same_length
from rlwire._checks.walk import Walk, group_size, nesting, proven
from rlwire._core.paths import KeyPath
from rlwire._core.slicing import Sliced

__all__ = ["ColumnWalk", "Layout", "Slot", "all_finite"]

#: Lists shorter than this are walked object by object (the column set-up costs more).
MIN_ROWS: Final = 4
#: Rows per group: bounds the work of gathering one column and of joining its arrays
#: (about half a microsecond an array), so a group's field takes well under a millisecond.
ROWS: Final = 512
#: Elements joined for one scan: about 0.1 ms of numpy work and a temporary of a few MB at
#: most. A longer array is left to the per-object walk, which scans it in blocks.
BUDGET: Final = 1 << 18

_NONE: Final = type(None)
_UNSET: Final = type(msgspec.UNSET)
#: Values that hold no names: with no rule in force a column of them needs no look.
_PLAIN: Final = frozenset({int, float, bool, str, bytes, complex, _NONE})
_CONTAINERS: Final = frozenset({dict, list, tuple})
_DTYPE: Final = operator.attrgetter("dtype")

#: The values of one field (an attribute or a key) over a group of rows.
Getter = Callable[[Sequence[Any], Any], list[Any]]
#: The value of one field of one row (None where a record lacks it).
Fetcher = Callable[[Any, Any], Any]


class Slot(NamedTuple):
    """One field each row holds, with what the per-object walk would check in it."""

    name: Any  # an attribute name, or a dict key
    rules: Rules | None
    shape: Shape


class Layout(NamedTuple):
    """The fields of every row of a list, in the order the per-object walk visits them."""

    slots: tuple[Slot, ...]
    # (a same_length group, its names that every row holds) when two or more are
    groups: tuple[tuple[Sequence[str], tuple[Any, ...]], ...]
    get: Getter
    fetch: Fetcher


def _attributes(rows: Sequence[Any], name: Any) -> list[Any]:
    try:
        return list(map(operator.attrgetter(name), rows))
    except AttributeError:  # a deleted attribute: the walk reads it as None too
        return [getattr(row, name, None) for row in rows]


def _items(rows: Sequence[Any], key: Any) -> list[Any]:
    return list(map(operator.itemgetter(key), rows))


def _attribute(row: Any, name: Any) -> Any:
    return getattr(row, name, None)


class ColumnWalk(Walk):
    """:class:`~rlwire._checks.walk.Walk` that checks a list of records of one type a
    column at a time, and anything else object by object."""

    def sequence(
        self, seq: list[Any] | tuple[Any, ...], path: KeyPath, rules: Rules | None, shape: Shape
    ) -> Sliced[None]:
        layout = None
        if len(seq) >= MIN_ROWS and _may_be_row(seq[0]):  # a list of numbers is left at once
            layout = self.layout(seq, rules, shape)
        if layout is None:
            yield from super().sequence(seq, path, rules, shape)
            return
        for start in range(0, len(seq), ROWS):
            yield from self.rows(seq[start : start + ROWS], path, start, layout)

    # -- what every row holds ------------------------------------------------------------

    def layout(self, seq: Sequence[Any], rules: Rules | None, shape: Shape) -> Layout | None:
        """The layout of ``seq``'s rows, or None when the column path does not apply: rows
        of several types, not records nor dicts, dicts with different keys, or (with no
        rule in force) an annotation saying no named field can be there."""
        kinds = set(map(type, seq))
        if len(kinds) != 1:
            return None
        cls = kinds.pop()
        item_shape: Shape = ANY
        if rules is None:
            if isinstance(shape, tuple) and shape[0] == "items":
                item_shape = shape[1]
            if item_shape is None:
                return None  # the walk does not look into these rows at all
        if cls is dict:
            return self.dict_layout(seq, rules, item_shape)
        if issubclass(cls, msgspec.Struct) or dataclasses.is_dataclass(cls):
            return self.record_layout(cls, rules)
        return None

    def record_layout(self, cls: type, rules: Rules | None) -> Layout:
        """As :meth:`~rlwire._checks.walk.Walk.record` visits a record of type ``cls``."""
        plan = self.planner.plan(cls)
        if self.collect:
            self.seen |= plan.declared
        fields = plan.search if rules is None else plan.every
        slots = tuple(Slot(f.name, merge_rules(rules, f.rules), f.shape) for f in fields)
        return Layout(slots, plan.groups, _attributes, _attribute)

    def dict_layout(
        self, seq: Sequence[dict[Any, Any]], rules: Rules | None, shape: Shape
    ) -> Layout | None:
        """As :meth:`~rlwire._checks.walk.Walk.mapping` visits each dict, if every dict has
        the same keys in the same order."""
        orders = set(map(tuple, seq))
        if len(orders) != 1:
            return None
        order = orders.pop()
        hits = set(order) & self.names
        if self.collect:
            self.note_keys(seq[0], hits)
        if rules is None:
            inner = shape[1] if isinstance(shape, tuple) and shape[0] == "dict" else ANY
            slots = [Slot(k, self.rules.get(k), inner) for k in self.ordered if k in hits]
            if inner is not None:
                slots += [Slot(k, None, inner) for k in order if k not in hits]
        else:
            slots = [
                Slot(k, merge_rules(rules, self.rules.get(k)) if k in hits else rules, ANY)
                for k in order
            ]
        groups = tuple(
            (group, present)
            for group in self.groups
            if len(present := tuple(n for n in group if n in hits)) >= 2
        )
        return Layout(tuple(slots), groups, _items, operator.getitem)

    # -- a group of rows -----------------------------------------------------------------

    def rows(self, rows: Sequence[Any], path: KeyPath, start: int, layout: Layout) -> Sliced[None]:
        """Settle each field of ``rows`` as a column; then visit, in the per-object walk's
        order, only the fields and groups of the rows a column left unsettled (row ``i``
        is ``(path, start + i)``): the settled ones are known to pass, so the first error
        raised is the one the per-object walk would raise."""
        fields: list[set[int]] = []
        for slot in layout.slots:
            fields.append((yield from self.column(layout.get(rows, slot.name), slot.rules)))
            yield from self.tick()
        groups: list[set[int]] = []
        for _, mine in layout.groups:
            groups.append(_lengths(rows, layout.get, mine))
            yield from self.tick()
        marked = set().union(*fields, *groups)
        for i in sorted(marked):
            row, at = rows[i], (path, start + i)
            for slot, rows_of_slot in zip(layout.slots, fields, strict=True):
                value = layout.fetch(row, slot.name) if i in rows_of_slot else None
                if value is not None:
                    yield from self.visit(value, (at, slot.name), slot.rules, slot.shape)
            for (group, mine), rows_of_group in zip(layout.groups, groups, strict=True):
                if i in rows_of_group:
                    same_length(at, group, [(name, layout.fetch(row, name)) for name in mine])
            yield from self.tick()

    # -- one column ------------------------------------------------------------------------

    def column(self, values: list[Any], rules: Rules | None) -> Sliced[set[int]]:
        """The rows of ``values`` (one field over the rows) that the column checks cannot
        show to pass ``rules`` (None: to hold no named field)."""
        kinds = set(map(type, values))
        if kinds <= _PLAIN and rules is None:
            return set()
        parts: dict[type, Sequence[int]]
        if len(kinds) == 1:
            parts = {kinds.pop(): range(len(values))}
        else:
            split: dict[type, list[int]] = {}
            for i, value in enumerate(values):
                split.setdefault(type(value), []).append(i)
            parts = dict(split)
        marked: set[int] = set()
        for kind, rows in parts.items():
            some = values if len(rows) == len(values) else [values[i] for i in rows]
            if kind is np.ndarray:
                marked |= yield from self.arrays(some, rows, rules)
            elif rules is not None and (kind is list or kind is tuple):
                marked |= yield from self.lists(some, rows, rules)
            elif not _settled(kind, some, rules):
                marked.update(rows)
        return marked

    def arrays(
        self, arrays: list[np.ndarray], rows: Sequence[int], rules: Rules | None
    ) -> Sliced[set[int]]:
        """The rows of ``arrays`` not shown to pass ``rules``: object arrays (checked
        like the lists they hold), and the rows of a failing scan."""
        dtypes = set(map(_DTYPE, arrays))
        parts: dict[np.dtype[Any], tuple[list[np.ndarray], Sequence[int]]]
        if len(dtypes) == 1:  # one dtype per scan: joining several would cast
            parts = {dtypes.pop(): (arrays, rows)}
        else:
            split: dict[np.dtype[Any], tuple[list[np.ndarray], list[int]]] = {}
            for a, i in zip(arrays, rows, strict=True):
                of_dtype, at = split.setdefault(a.dtype, ([], []))
                of_dtype.append(a)
                at.append(i)
            parts = dict(split)
        marked: set[int] = set()
        for dtype, (some, where) in parts.items():
            if dtype.kind == "O":
                marked.update(where)
                continue
            test = _test(dtype, rules)
            if test is not None:
                marked |= yield from self.scan(some, where, test)
        return marked

    def scan(
        self, arrays: list[np.ndarray], rows: Sequence[int], test: Callable[[np.ndarray], bool]
    ) -> Sliced[set[int]]:
        """Join ``arrays`` (of one dtype) in runs of at most :data:`BUDGET` elements and
        ``test`` each run; the rows of a failing run, and of an array longer than the
        budget, are returned."""
        ends = list(itertools.accumulate(map(operator.attrgetter("size"), arrays)))
        marked: set[int] = set()
        first = done = 0
        while first < len(arrays):
            last = bisect.bisect_right(ends, done + BUDGET, lo=first)
            if last == first:  # longer than the budget alone: the walk scans it in blocks
                marked.add(rows[first])
                last = first + 1
            elif not test(_flat(arrays[first:last])):
                marked.update(rows[first:last])
            done = ends[last - 1]
            first = last
            yield from self.tick()
        return marked

    def lists(
        self, lists: list[Sequence[Any]], rows: Sequence[int], rules: Rules
    ) -> Sliced[set[int]]:
        """The rows of ``lists`` (of numbers, or nested lists of them) not shown to pass
        ``rules`` by the walk's own C-speed test (:func:`~rlwire._checks.walk.proven`),
        run over a group's worth of items of several rows joined."""
        first = next((items for items in lists if items), None)
        if first is None:
            return set()  # all empty
        depth, cost, numeric = nesting(first[0])
        if not numeric:
            return set(rows)  # records, strings, dicts...: row by row
        size = group_size(rules, cost)
        ends = list(itertools.accumulate(map(len, lists)))
        # Long lists are tested one by one: joining them would cost as much as the test.
        alone = ends[-1] >= len(lists) * (size // 8)
        marked: set[int] = set()
        start = done = 0
        while start < len(lists):
            last = start + 1 if alone else bisect.bisect_right(ends, done + size, lo=start)
            if last == start or ends[start] - done > size:
                marked.add(rows[start])  # longer than a group: the walk checks it in groups
                last = start + 1
            elif last == start + 1:
                if not proven(lists[start], rules, depth):
                    marked.add(rows[start])
            elif ends[last - 1] > done:
                joined = list(itertools.chain.from_iterable(lists[start:last]))
                if not proven(joined, rules, depth):
                    marked.update(rows[start:last])
            done = ends[last - 1]
            start = last
            yield from self.tick()
        return marked


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    """The elements of ``arrays`` (of one dtype) back to back, as one 1-D array: their
    bytes joined (``bytes.join``, a few times faster than numpy's concatenate for small
    arrays), or, if one is not C-contiguous, numpy's copy."""
    try:
        # ndarrays export their buffer, which numpy's stubs do not say
        return np.frombuffer(b"".join(arrays), arrays[0].dtype)  # type: ignore[arg-type]
    except TypeError:  # a strided array: its bytes are not one run
        return np.concatenate(arrays, axis=None)


def _may_be_row(item: Any) -> bool:
    """True if ``item`` is a dict, a Struct or a dataclass instance."""
    return (
        type(item) is dict
        or isinstance(item, msgspec.Struct)
        or (dataclasses.is_dataclass(item) and not isinstance(item, type))
    )


def _test(dtype: np.dtype[Any], rules: Rules | None) -> Callable[[np.ndarray], bool] | None:
    """What a scan of arrays of ``dtype`` under ``rules`` must show (None: nothing), as
    :meth:`~rlwire._checks.walk.Walk.array` checks one array."""
    if rules is None:
        return None
    if rules.finite is not None and dtype.kind in "fc":
        return all_finite
    if rules.limit_name is not None and dtype.kind in "iub":
        limit = rules.limit
        return lambda joined: not joined.size or int(joined.max()) <= limit
    return None


def all_finite(values: np.ndarray) -> bool:
    """True if every value of ``values`` (floats, real or complex) is finite, told
    without a temporary: for real floats by their least and greatest value (a NaN
    propagates into both; two passes some 4x quicker than a sum, which finite values
    may also overflow), for complex ones by their sum (false where finite values
    overflow it: the caller then looks value by value). Without numpy's RuntimeWarning
    (an error under ``-W error``).

    Example:
        >>> all_finite(np.array([1.0, 3e38], np.float32)), all_finite(np.array([1.0, np.nan]))
        (True, False)
    """
    if not values.size:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        if values.dtype.kind != "f":
            return bool(np.isfinite(np.add.reduce(values, axis=None)))
        least = np.minimum.reduce(values, axis=None)
        return bool(np.isfinite(least) and np.isfinite(np.maximum.reduce(values, axis=None)))


def _settled(kind: type, values: list[Any], rules: Rules | None) -> bool:
    """True if ``values``, all of type ``kind`` (not an array), are shown to pass
    ``rules`` (None: to hold no named field), as the walk would check each."""
    if kind is _NONE or kind is _UNSET:
        return True  # a record skips None; None and UNSET hold nothing
    if kind in _CONTAINERS and not any(values):
        return True  # empty, as a sample's extras={} mostly is: nothing to check or find
    if rules is None:
        return kind in _PLAIN or issubclass(kind, np.generic)
    if kind is str or kind is bytes:
        return True
    if kind is float:
        # NaN or Inf makes the sum non-finite; so can overflow, which the walk then clears
        return rules.finite is None or math.isfinite(sum(values))
    if kind is int or kind is bool:
        return rules.limit_name is None or max(values) <= rules.limit
    return False  # complex, numpy scalars, containers, records: one by one


def _lengths(rows: Sequence[Any], get: Getter, names: tuple[Any, ...]) -> set[int]:
    """The rows whose fields ``names`` (a same_length group) are not shown to have equal
    lengths: every row if a value has no length (None is left out only row by row)."""
    try:
        lengths = [list(map(len, get(rows, name))) for name in names]
    except Exception:
        return set(range(len(rows)))
    first = lengths[0]
    if all(other == first for other in lengths[1:]):
        return set()
    return {i for i, row in enumerate(zip(*lengths, strict=True)) if len(set(row)) > 1}
