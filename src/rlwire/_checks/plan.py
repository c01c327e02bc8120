"""What :class:`~rlwire.Checks` looks at: the rules of a name, and where an annotation can hold one.

The annotations of msgspec Structs and dataclasses tell which fields cannot hold a named
field (``list[int]``, ``str``, ``bytes``, an ndarray, a Struct whose fields hold no such
name, ...); a :class:`Plan` per type lists the fields worth visiting, and those are all
the walk (:mod:`rlwire._checks.walk`) visits when no rule is in force.

Example:
    >>> import msgspec
    >>> class Sample(msgspec.Struct):
    ...     input_ids: list[int]
    ...     extra: dict[str, object]
    >>> planner = Planner(rules_by_name((), {"input_ids": 9}), (), frozenset({"input_ids"}))
    >>> [(f.name, f.rules is not None, f.shape) for f in planner.plan(Sample).search]
    [('input_ids', True, None), ('extra', False, ('dict', ANY))]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeAlias, cast

import msgspec
import msgspec.inspect as mi
import numpy as np

from rlwire._core.types import PathStep, Step, children, reachable

__all__ = [
    "ANY",
    "RECORD",
    "Field",
    "Kind",
    "Plan",
    "Planner",
    "Rules",
    "Shape",
    "declared",
    "merge_rules",
    "rules_by_name",
]

# -- rules ------------------------------------------------------------------------------


class Rules(NamedTuple):
    """The rules in force inside a named field (and everything it holds)."""

    finite: str | None  # the field name that asks for finite floats
    limit_name: str | None  # the field name whose max_value is in force
    limit: int


def merge_rules(outer: Rules | None, inner: Rules | None) -> Rules | None:
    """Rules of a named field nested inside another: both apply, the tighter max wins."""
    if outer is None or inner is None:
        return outer if inner is None else inner
    finite = inner.finite or outer.finite
    if inner.limit_name is None or (outer.limit_name is not None and outer.limit <= inner.limit):
        return Rules(finite, outer.limit_name, outer.limit)
    return Rules(finite, inner.limit_name, inner.limit)


def rules_by_name(finite: Iterable[str], max_value: Mapping[str, int]) -> dict[str, Rules]:
    """The rules each name turns on: ``finite``, a ``max_value``, or both."""
    out = {name: Rules(name, None, 0) for name in finite}
    for name, limit in max_value.items():
        out[name] = Rules(name if name in out else None, name, limit)
    return out


# -- what an annotation can hold ----------------------------------------------------------


class Kind:
    """A shape marker; instances below are compared by identity."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Unknown (``Any``, ``object``, an unresolvable annotation): searched at run time.
ANY: Final = Kind("ANY")
#: A Struct or dataclass that may hold a named field: planned by its run-time type.
RECORD: Final = Kind("RECORD")

# A shape says where a named field can be inside a value of some annotation: None (nowhere:
# skip the value), ANY, RECORD, ("items", shape) for a list/tuple/set, ("dict", shape)
# for a dict (its string keys are names; its values have that shape).
Shape: TypeAlias = "Kind | tuple[str, Shape] | None"


def _union(shapes: Iterable[Shape]) -> Shape:
    found = {id(s): s for s in shapes if s is not None}
    if not found:
        return None
    if len(found) == 1:
        return next(iter(found.values()))
    if all(s is RECORD for s in found.values()):
        return RECORD
    pairs = [s for s in found.values() if isinstance(s, tuple)]
    if len(pairs) == len(found) and len({kind for kind, _ in pairs}) == 1:
        return (pairs[0][0], _union(inner for _, inner in pairs))  # e.g. list[A] | list[B]
    return ANY


class Field(NamedTuple):
    """One field of a planned type."""

    name: str
    rules: Rules | None  # what this field's own name turns on
    shape: Shape  # where a named field can be inside its value


class Plan(NamedTuple):
    """How to check one Struct or dataclass type."""

    search: tuple[Field, ...]  # the fields to visit when no rule is in force
    every: tuple[Field, ...]  # every field (inside a named field, numbers are checked too)
    # (a same_length group, its names that are fields of this type) when two or more are
    groups: tuple[tuple[Sequence[str], tuple[str, ...]], ...]
    declared: frozenset[str]  # field names of this type and of the types it declares


# -- plans ------------------------------------------------------------------------------


class Planner:
    """The rules of one :class:`~rlwire.Checks`, and the plans of the types met under them.

    Plans per Struct type and what each annotated type can hold are filled as types are
    met (from worker threads too: each entry is computed whole, then stored in one step).
    """

    def __init__(
        self,
        rules: Mapping[str, Rules],
        groups: Sequence[Sequence[str]],
        names: frozenset[str],
    ) -> None:
        self.rules = rules  # name -> the rules it turns on
        self.groups = groups  # the same_length groups
        self.names = names  # every name the rules mention
        self._plans: dict[type, Plan] = {}
        self._holds: dict[type, bool] = {}

    def plan(self, cls: type) -> Plan:
        """How to check a Struct or dataclass of type ``cls``."""
        plan = self._plans.get(cls)
        if plan is None:
            plan = self._plans[cls] = self._make_plan(cls)
        return plan

    def _make_plan(self, cls: type) -> Plan:
        try:
            info = mi.type_info(cls)
            assert isinstance(info, mi.StructType | mi.DataclassType)
            annotated = [(f.name, self.shape(f.type, set())) for f in info.fields]
            names = declared(info)
        except Exception:  # msgspec raises several types for annotations it cannot resolve
            if issubclass(cls, msgspec.Struct):
                fields = cls.__struct_fields__
            else:
                fields = tuple(f.name for f in dataclasses.fields(cast(Any, cls)))
            annotated = [(name, ANY) for name in fields]
            names = set(fields)
        every = tuple(Field(name, self.rules.get(name), shape) for name, shape in annotated)
        search = tuple(f for f in every if f.rules is not None or f.shape is not None)
        mine = {f.name for f in every}
        groups = tuple(
            (group, present)
            for group in self.groups
            if len(present := tuple(n for n in group if n in mine)) >= 2
        )
        return Plan(search, every, groups, frozenset(names))

    def shape(self, t: mi.Type, seen: set[type]) -> Shape:
        """Where a named field can be inside a value annotated ``t``."""
        if isinstance(t, mi.AnyType):
            return ANY
        if isinstance(t, mi.StructType | mi.DataclassType):
            return RECORD if self.record_holds(t, seen) else None
        if isinstance(t, mi.TypedDictType):
            return ("dict", ANY)
        if isinstance(t, mi.CustomType):
            # numpy arrays hold numbers, never names; any other class is unknown.
            return None if issubclass(t.cls, np.ndarray | np.generic) else ANY
        # a dict's keys are names themselves, found at run time: only its values matter
        inner = _union(self.shape(i, seen) for step, i in children(t) if step is not Step.KEY)
        if isinstance(t, mi.DictType):
            return ("dict", inner)
        if isinstance(t, mi.Metadata | mi.UnionType):
            return inner
        # a list, set, tuple or NamedTuple; or a type holding no other (numbers, strings, ...)
        return None if inner is None else ("items", inner)

    def record_holds(self, t: mi.StructType | mi.DataclassType, seen: set[type]) -> bool:
        """True if a value of the record type ``t`` can hold a named field at any depth."""
        known = self._holds.get(t.cls)
        if known is not None:
            return known
        if t.cls in seen:  # a recursive type: its fields are being looked at already
            return False
        seen.add(t.cls)
        holds = any(f.name in self.names or self.shape(f.type, seen) is not None for f in t.fields)
        if len(seen) == 1:  # only a top-level answer is final (inner ones assumed False)
            self._holds[t.cls] = holds
        seen.discard(t.cls)
        return holds


def declared(t: mi.Type) -> set[str]:
    """Every record field name in the annotation ``t``, at any depth (not inside the keys of
    a dict, nor inside a NamedTuple)."""
    names: set[str] = set()
    for inner in reachable(t, _declares):
        if isinstance(inner, mi.StructType | mi.DataclassType | mi.TypedDictType):
            names.update(f.name for f in inner.fields)
    return names


def _declares(parent: mi.Type, step: PathStep) -> bool:
    return step is not Step.KEY and not isinstance(parent, mi.NamedTupleType)
