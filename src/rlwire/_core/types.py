"""What a type annotation can hold, decided once per type.

The msgpack codec walks, in Python, only the parts of an object where an out-of-band buffer
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
    (('input_ids', False), ('routed_experts', True))
    >>> child_annotation(Sample, "input_ids", dict)
    list[int]
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import msgspec.inspect as mi

__all__ = ["buffer_fields", "child_annotation", "field_at", "may_hold_buffer"]

_BUFFER_TYPES = (mi.BytesType, mi.ByteArrayType, mi.MemoryViewType, mi.AnyType, mi.CustomType)
_ITEM_TYPES = (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)
_RECORD_TYPES = (mi.StructType, mi.DataclassType, mi.TypedDictType, mi.NamedTupleType)


def _may_hold_buffer(t: mi.Type, seen: set[int]) -> bool:
    """True if a value of type ``t`` can hold bytes-like data or an array at any depth."""
    if isinstance(t, _BUFFER_TYPES):
        return True
    if isinstance(t, mi.Metadata):
        return _may_hold_buffer(t.type, seen)
    if isinstance(t, _ITEM_TYPES):
        return _may_hold_buffer(t.item_type, seen)
    if isinstance(t, mi.TupleType):
        return any(_may_hold_buffer(item, seen) for item in t.item_types)
    if isinstance(t, mi.DictType):
        return _may_hold_buffer(t.key_type, seen) or _may_hold_buffer(t.value_type, seen)
    if isinstance(t, mi.UnionType):
        return any(_may_hold_buffer(member, seen) for member in t.types)
    if isinstance(t, _RECORD_TYPES):
        if id(t) in seen:  # a recursive type: its fields are being looked at already
            return False
        seen.add(id(t))
        return any(_may_hold_buffer(f.type, seen) for f in t.fields)
    return False  # numbers, strings, None, literals, enums, dates, ...


@functools.cache
def buffer_fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, bool], ...]:
    """``(attribute name, may hold a buffer)`` for each field of ``cls``, in order.

    A type msgspec cannot inspect (an unresolvable forward reference, say) is walked in
    full: every field says True.
    """
    names = cls.__struct_fields__
    try:
        info = mi.type_info(cls)
    except Exception:  # msgspec raises several types for annotations it cannot resolve
        return tuple((name, True) for name in names)
    assert isinstance(info, mi.StructType)
    return tuple((f.name, _may_hold_buffer(f.type, set())) for f in info.fields)


@functools.cache
def may_hold_buffer(annotation: Any) -> bool:
    """True if a value annotated ``annotation`` may hold bytes or an array at any depth
    (then a chunk of such values may hold extension values a typed decode refuses)."""
    try:
        return _may_hold_buffer(mi.type_info(annotation), set())
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
