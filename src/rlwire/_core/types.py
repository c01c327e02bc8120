"""What a type annotation can hold, decided once per type.

Both the msgpack codec and :class:`~rlwire.Checks` decide, once per type, where in a value
it is worth looking. They read the annotations through ``msgspec.inspect``, and
:func:`children` and :func:`reachable` are the one walk over those types.

The msgpack codec walks, in Python, only the places in an object where an out-of-band buffer
(a numpy array, a large bytes value) can be: a Struct field annotated ``list[int]`` or
``str`` cannot hold one, so msgspec encodes it in C without the codec looking inside. On
the way back, the decoder needs the annotation found at a path (``$.micro_batches[3]
.input_ids`` is a ``list[int]``) to decode a chunked container straight into its type.

Example:
    >>> import msgspec
    >>> class Sample(msgspec.Struct):
    ...     input_ids: list[int]
    ...     routed_experts: bytes | None = None
    >>> buffer_fields(Sample)
    (('input_ids', 'input_ids', False), ('routed_experts', 'routed_experts', True))
    >>> child_annotation(Sample, "input_ids", dict)
    list[int]
    >>> [(step, type(t).__name__) for step, t in children(mi.type_info(dict[str, list[int]]))]
    [(<Step.KEY: 'key'>, 'StrType'), (<Step.VALUE: 'value'>, 'ListType')]
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import msgspec
import msgspec.inspect as mi

__all__ = [
    "ITEM_TYPES",
    "RECORD_TYPES",
    "PathStep",
    "Step",
    "buffer_fields",
    "child_annotation",
    "children",
    "field_at",
    "may_hold_buffer",
    "reachable",
]

# -- walking msgspec.inspect types --------------------------------------------------------

#: Containers whose items all share one annotation (``item_type``): list, set, frozenset,
#: ``tuple[X, ...]``.
ITEM_TYPES = (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)
#: Types made of named fields (``fields``).
RECORD_TYPES = (mi.StructType, mi.DataclassType, mi.TypedDictType, mi.NamedTupleType)


class Step(enum.Enum):
    """How an inner annotation is reached from the one holding it (besides a field name or a
    position in a fixed-length tuple)."""

    SAME = "same"  # the same value: inside ``Annotated``/``Meta``, or one member of a union
    ITEM = "item"  # any item of a list, set, frozenset or ``tuple[X, ...]``
    KEY = "key"  # any key of a dict
    VALUE = "value"  # any value of a dict


#: A :class:`Step`, a position in a fixed-length tuple (int) or a record's field name (str).
PathStep: TypeAlias = Step | int | str


def children(t: mi.Type) -> Iterator[tuple[PathStep, mi.Type]]:
    """The annotations ``t`` is built from, each with the step that leads to it; none for a
    type that holds no other (numbers, strings, bytes, literals, enums, custom classes...)."""
    if isinstance(t, mi.Metadata):
        yield Step.SAME, t.type
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield Step.SAME, member
    elif isinstance(t, ITEM_TYPES):
        yield Step.ITEM, t.item_type
    elif isinstance(t, mi.TupleType):
        yield from enumerate(t.item_types)
    elif isinstance(t, mi.DictType):
        yield Step.KEY, t.key_type
        yield Step.VALUE, t.value_type
    elif isinstance(t, RECORD_TYPES):
        for field in t.fields:
            yield field.name, field.type


def _always(parent: mi.Type, step: PathStep) -> bool:
    return True


def reachable(
    t: mi.Type, follow: Callable[[mi.Type, PathStep], bool] = _always
) -> Iterator[mi.Type]:
    """``t`` and every annotation inside it, through the steps ``follow`` allows; each record
    type once, so a recursive type ends."""
    seen: set[int] = set()
    pending = [t]
    while pending:
        t = pending.pop()
        if isinstance(t, RECORD_TYPES):
            if id(t) in seen:
                continue
            seen.add(id(t))
        yield t
        pending.extend(reversed([inner for step, inner in children(t) if follow(t, step)]))


# -- where a buffer can be -----------------------------------------------------------------

_BUFFER_TYPES = (mi.BytesType, mi.ByteArrayType, mi.MemoryViewType, mi.AnyType, mi.CustomType)


def _may_hold_buffer(t: mi.Type) -> bool:
    """True if a value of type ``t`` can hold bytes-like data or an array at any depth
    (numbers, strings, None, literals, enums, dates, ... cannot)."""
    return any(isinstance(inner, _BUFFER_TYPES) for inner in reachable(t))


@functools.cache
def buffer_fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, str, bool], ...]:
    """``(attribute name, encoded name, may hold a buffer)`` for each field of ``cls``,
    in order (the two names differ for a field renamed by ``field(name=...)`` or the
    Struct's ``rename=``).

    A type msgspec cannot inspect (an unresolvable forward reference, say) is walked in
    full: every field says True.
    """
    names = zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True)
    try:
        info = mi.type_info(cls)
    except Exception:  # msgspec raises several types for annotations it cannot resolve
        return tuple((name, encoded, True) for name, encoded in names)
    assert isinstance(info, mi.StructType)
    return tuple((f.name, f.encode_name, _may_hold_buffer(f.type)) for f in info.fields)


@functools.cache
def may_hold_buffer(annotation: Any) -> bool:
    """True if a value annotated ``annotation`` may hold bytes or an array at any depth
    (then a chunk of such values may hold extension values a typed decode refuses)."""
    try:
        return _may_hold_buffer(mi.type_info(annotation))
    except Exception:  # an annotation msgspec cannot inspect: assume the worst
        return True


@functools.cache
def _fields(
    cls: type[msgspec.Struct],
) -> tuple[dict[str, msgspec.structs.FieldInfo], tuple[msgspec.structs.FieldInfo, ...], int]:
    """The fields of ``cls`` by encoded name and in order, and how many leading array
    items are not fields (1 for a tagged array-like Struct, whose first item is the tag)."""
    fields = msgspec.structs.fields(cls)
    config = cls.__struct_config__
    tagged = int(config.array_like and config.tag_field is not None)
    return {f.encode_name: f for f in fields}, fields, tagged


def field_at(cls: type[msgspec.Struct], key: Any) -> msgspec.structs.FieldInfo | None:
    """The field of ``cls`` a received key names: an encoded field name (a map-encoded
    Struct) or a position (an array-like one); None if it names none."""
    by_name, fields, tagged = _fields(cls)
    if isinstance(key, str):
        return by_name.get(key)
    index = key - tagged if isinstance(key, int) else -1
    return fields[index] if 0 <= index < len(fields) else None


def _strip(annotation: Any) -> Any:
    """``annotation`` without ``Annotated[...]`` and ``NewType`` wrappers."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif isinstance(annotation, typing.NewType):
            annotation = annotation.__supertype__
        else:
            return annotation


def _pick_member(annotation: Any, container: type) -> Any:
    """The member of a union that a raw value of type ``container`` (dict or list) must be,
    or None when more than one may be (a tagged union, say)."""
    fits = []
    for member in typing.get_args(annotation):
        member = _strip(member)
        if member is type(None):
            continue
        origin = typing.get_origin(member) or member
        if isinstance(origin, type) and issubclass(origin, msgspec.Struct):
            as_array = bool(origin.__struct_config__.array_like)
            if as_array == (container is list):
                fits.append(member)
        elif (container is dict and isinstance(origin, type) and issubclass(origin, Mapping)) or (
            container is list
            and isinstance(origin, type)
            and issubclass(origin, Sequence | set | frozenset)
            and not issubclass(origin, str | bytes)
        ):
            fits.append(member)
    return fits[0] if len(fits) == 1 else None


def child_annotation(annotation: Any, key: Any, container: type) -> Any:
    """The annotation of the item at ``key`` inside a value annotated ``annotation`` that
    was received as a ``container`` (dict or list), or None when it cannot be told.

    Inside ``Any`` everything is ``Any``.
    """
    annotation = _strip(annotation)
    if annotation is Any or annotation is object:
        return Any
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        member = _pick_member(annotation, container)
        return None if member is None else child_annotation(member, key, container)
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        field = field_at(annotation, key)
        return None if field is None else field.type
    args = typing.get_args(annotation)
    if origin in (list, set, frozenset) or (
        isinstance(origin, type) and issubclass(origin, Sequence) and origin is not tuple
    ):
        return args[0] if args else None
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return args[key] if isinstance(key, int) and 0 <= key < len(args) else None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return args[1] if len(args) == 2 else None
    return None
