"""The value rules shared by :class:`~rlwire.codecs._json.codec.JsonCodec` and
:mod:`rlwire.codecs.jsonl`, written once (the rules themselves are listed in
:mod:`rlwire.codecs._json.codec`).

Encoding: :func:`dumps` runs orjson with a ``default`` hook for what orjson does not write
natively (msgspec Structs through a cached :class:`StructPlan`, arrays of non-native byte
order, bytes, sets, NamedTuples) and, when orjson refuses a value, walks the object to raise
an :class:`~rlwire.errors.EncodeError` naming the refused value's path. Decoding:
:func:`convert` turns what orjson parsed into a requested type, rebuilding numpy arrays.

Example:
    >>> dumps({"x": (1, 2)}, OPTION, None)
    b'{"x":[1,2]}'
    >>> convert([1, 2], tuple[int, int])
    (1, 2)
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import typing
from collections.abc import Iterable
from typing import Any

import msgspec
import numpy as np
import orjson

from rlwire._core.errors import ConfigError, EncodeError
from rlwire._core.paths import KeyPath, render_path
from rlwire.codecs._json.numpy_text import array_problem, array_text, hollow_problem, scalar_text

__all__ = [
    "OPTION",
    "StructPlan",
    "bad_key",
    "child_items",
    "convert",
    "dumps",
    "key_error",
    "qualname",
    "struct_plan",
    "type_name",
]

#: orjson options for one JSON document: none (numpy values go through the hook).
OPTION = 0
_ORJSON_DEPTH = 254  # orjson's nesting limit when encoding


def type_name(tp: Any) -> str:
    """A type annotation as error messages show it: its name, or its repr if generic."""
    name = getattr(tp, "__qualname__", None)
    if name is None or typing.get_args(tp):
        return repr(tp)
    return str(name)


def qualname(obj: Any) -> str:
    """The qualified name of ``obj``'s type, without ``builtins.``."""
    kind = type(obj)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def key_error(path: KeyPath, key: Any) -> str:
    """The message for a dict key JSON cannot carry, at the dict's path."""
    hint = "; send str(key)" if isinstance(key, str) else ""
    return f"{render_path(path)}: dict keys must be str, got {qualname(key)} key {key!r}{hint}"


def bad_key(key: Any) -> bool:
    """Whether orjson refuses ``key`` as a dict key: anything but a str, a subclass of str
    (a StrEnum) too."""
    return type(key) is not str


# -- Structs --------------------------------------------------------------------------


class StructPlan:
    """How one Struct type is written: JSON keys, attribute names, tag, layout."""

    __slots__ = ("array_like", "keys", "names", "omit", "tag")

    def __init__(self, cls: type[msgspec.Struct]) -> None:
        fields = msgspec.structs.fields(cls)
        config = cls.__struct_config__
        self.names = tuple(f.name for f in fields)
        self.keys = tuple(f.encode_name for f in fields)
        self.array_like = bool(config.array_like)
        self.tag: tuple[str, str | int] | None = None
        if config.tag_field is not None and config.tag is not None:
            self.tag = (config.tag_field, config.tag)
        # With omit_defaults, a field is left out when its value is its default object
        # itself, or an empty list/dict/set from a default_factory of that type.
        self.omit: tuple[tuple[Any, Any], ...] | None = None
        if config.omit_defaults and not self.array_like:
            self.omit = tuple((f.default, f.default_factory) for f in fields)

    def entries(self, obj: Any) -> list[tuple[str | None, str, Any]]:
        """``(JSON key or None for array_like, attribute name, value)`` in output order."""
        out: list[tuple[str | None, str, Any]] = []
        if self.tag is not None:
            out.append((None if self.array_like else self.tag[0], self.tag[0], self.tag[1]))
        for i, name in enumerate(self.names):
            value = getattr(obj, name)
            if self.omit is not None and _is_default(value, *self.omit[i]):
                continue
            out.append((None if self.array_like else self.keys[i], name, value))
        return out

    def builtin(self, obj: Any) -> dict[str, Any] | list[Any]:
        """``obj`` as the dict (or list, for array_like) that JSON writes."""
        if self.array_like:
            values = [getattr(obj, name) for name in self.names]
            return values if self.tag is None else [self.tag[1], *values]
        if self.tag is None and self.omit is None:
            return {
                key: getattr(obj, name) for key, name in zip(self.keys, self.names, strict=True)
            }
        return {key: value for key, _, value in self.entries(obj)}  # type: ignore[misc]


def _is_default(value: Any, default: Any, factory: Any) -> bool:
    if default is not msgspec.NODEFAULT:
        return value is default
    return factory in (list, dict, set) and type(value) is factory and not value


_PLANS: dict[type, StructPlan] = {}


def struct_plan(cls: type[msgspec.Struct]) -> StructPlan:
    """The (cached) plan for writing Structs of type ``cls``."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = StructPlan(cls)
    return plan


# -- values orjson does not write natively --------------------------------------------


def _default(obj: Any) -> Any:
    """orjson's ``default=`` hook: called for values orjson does not write itself."""
    if isinstance(obj, msgspec.Struct):
        return struct_plan(type(obj)).builtin(obj)
    if isinstance(obj, np.ndarray):  # every array: see rlwire.codecs._json.numpy_text
        problem = array_problem(obj) or hollow_problem(obj)
        if problem is not None:
            raise TypeError(problem)
        return obj[()] if obj.ndim == 0 else array_text(obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, set | frozenset | tuple):  # tuple: subclasses such as NamedTuple
        return list(obj)
    if isinstance(obj, np.generic):
        return scalar_text(obj)
    raise TypeError(f"cannot encode value of type {qualname(obj)}")


def _native(obj: Any, depth: int = 0, memo: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """``obj`` with arrays orjson refuses outright (non-native byte order) replaced by
    native ones; ``obj`` itself when there are none. The slow path, taken only after
    orjson failed. Each container is looked at once (``memo``: by id, the container
    kept alive beside its answer): a value that holds one list twice at every level,
    or that contains itself, took time exponential in its depth."""
    if depth > _ORJSON_DEPTH:
        return obj
    if isinstance(obj, np.ndarray):
        return obj if obj.dtype.isnative or array_problem(obj) else _default(obj)
    memo = {} if memo is None else memo
    seen = memo.get(id(obj))
    if seen is not None:
        return seen[1]
    memo[id(obj)] = (obj, obj)  # while it is looked at: itself, where it contains itself
    new = _native_of(obj, depth, memo)
    memo[id(obj)] = (obj, new)
    return new


def _native_of(obj: Any, depth: int, memo: dict[int, tuple[Any, Any]]) -> Any:
    """:func:`_native` of ``obj``, not an array, once."""
    if isinstance(obj, msgspec.Struct):
        built = struct_plan(type(obj)).builtin(obj)
        new = _native(built, depth + 1, memo)
        return obj if new is built else new
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = dict(child_items(obj) or ())
        new = _native(fields, depth + 1, memo)
        return obj if new is fields else new
    if isinstance(obj, dict):
        out = {k: _native(v, depth + 1, memo) for k, v in obj.items()}
        changed = any(out[k] is not v for k, v in obj.items())
        return out if changed else obj
    if isinstance(obj, list | tuple):
        items = [_native(v, depth + 1, memo) for v in obj]
        return items if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
    return obj


def child_items(obj: Any) -> Iterable[tuple[str | int, Any]] | None:
    """The ``(key, value)`` pairs of a container, named as error paths name them."""
    if isinstance(obj, msgspec.Struct):
        return ((name, getattr(obj, name)) for name in obj.__struct_fields__)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # A field never set (field(init=False) left unassigned) is left out, as orjson does.
        fields = dataclasses.fields(obj)
        return ((f.name, getattr(obj, f.name)) for f in fields if hasattr(obj, f.name))
    if isinstance(obj, dict):
        return obj.items()
    if isinstance(obj, list | tuple):
        return enumerate(obj)
    return None


def _encodes(obj: Any, option: int) -> bool:
    try:
        orjson.dumps(obj, default=_default, option=option)
    except orjson.JSONEncodeError:
        return bool(_native(obj) is not obj and _encodes(_native(obj), option))
    return True


def _failure(obj: Any, path: KeyPath, option: int, exc: orjson.JSONEncodeError) -> str:
    """``"<path>: <reason>"`` for the value inside ``obj`` that orjson refused."""
    if "Recursion limit" in str(exc):
        return (
            f"{render_path(path)}: nests more than {_ORJSON_DEPTH} levels deep "
            "(orjson's limit), or contains itself"
        )
    depth = 0
    while depth <= _ORJSON_DEPTH:
        children = child_items(obj)
        if children is None:
            break
        for key, child in children:
            if not _encodes(child, option):
                obj, path = child, (path, key)
                break
        else:
            if isinstance(obj, dict):
                for key in obj:
                    if bad_key(key):
                        return key_error(path, key)
            break
        depth += 1
    try:
        orjson.dumps(obj, default=_default, option=option)
    except orjson.JSONEncodeError as leaf:
        cause = leaf.__cause__
        reason = str(cause) if cause is not None else str(leaf)
    else:  # pragma: no cover - the walk always ends at a value that fails
        reason = str(exc)
    if not reason.startswith(("cannot encode", "numpy")):
        reason = f"cannot encode {qualname(obj)}: {reason}"
    return f"{render_path(path)}: {reason}"


def dumps(obj: Any, option: int, path: KeyPath, prefix: str = "") -> bytes:
    """orjson-encode ``obj`` (found at ``path``) with ``option``.

    Raises:
        EncodeError: a value inside ``obj`` cannot be written; the message is ``prefix``
            followed by that value's path and the reason.
    """
    try:
        return orjson.dumps(obj, default=_default, option=option)
    except orjson.JSONEncodeError as exc:
        error = exc
    fixed = _native(obj)  # arrays of non-native byte order: orjson refuses them outright
    if fixed is not obj:
        try:
            return orjson.dumps(fixed, default=_default, option=option)
        except orjson.JSONEncodeError as exc:
            error = exc
    raise EncodeError(prefix + _failure(obj, path, option, error)) from None


# -- decoding -------------------------------------------------------------------------


def _to_array(obj: Any, tp: Any) -> np.ndarray:
    """A fresh array from decoded JSON for a field typed ``tp`` (``np.ndarray`` or
    ``NDArray[dtype]``)."""
    arr = _number_array(obj)
    target = _annotated_dtype(tp)
    if target is None or target == arr.dtype:
        return arr
    return _cast(arr, target)


def _number_array(obj: Any) -> np.ndarray:
    """An array of the numbers in ``obj`` (decoded JSON), of the dtype numpy infers."""
    if obj is None:
        raise ValueError(
            "null where an array was expected: JSON has no NaN or Inf (rlwire writes them "
            "as null), so the value cannot be rebuilt"
        )
    if not isinstance(obj, list | int | float | bool):
        raise TypeError(f"Expected `array`, got `{type(obj).__name__}`")
    arr = np.array(obj)
    if arr.dtype.kind not in "biuf":
        if arr.dtype.kind == "O" and any(x is None for x in arr.ravel()):
            raise ValueError(
                "null inside an array: JSON has no NaN or Inf (rlwire writes them as "
                "null), so the array cannot be rebuilt; decode without a type to see the "
                "raw values"
            )
        if arr.dtype.kind == "O" and any(type(x) is int for x in arr.ravel()):
            raise ValueError(
                "integer beyond 64 bits inside an array: no numpy dtype holds it exactly; "
                "read it into list[int] (or without a type) to get it exactly"
            )
        raise ValueError(
            f"expected an array of numbers, got array-like values of dtype {arr.dtype}"
        )
    if arr.dtype.kind == "f" and arr.size and arr.max() >= 2.0**63:
        # numpy makes [0, 2**63] float64; keep uint64 when that loses nothing.
        with contextlib.suppress(OverflowError, ValueError, TypeError):
            exact = np.array(obj, dtype=np.uint64)
            if np.array_equal(exact.astype(np.float64), arr):
                arr = exact
        if arr.dtype.kind == "f" and all(type(x) is int for x in np.array(obj, object).flat):
            raise ValueError(  # negative ones beside ones above int64: float64 rounds them
                "integers of int64 and uint64 range together inside an array: no numpy "
                "dtype holds them exactly; read it into list[int] (or without a type)"
            )
    return arr


def _cast(arr: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    """``arr`` as ``target``, refused if a value would change or the kinds do not fit."""
    if target.kind == "b" or target.kind in "iu":
        if arr.dtype.kind not in ("b" if target.kind == "b" else "biu"):
            raise ValueError(f"expected {target} values, got {arr.dtype} ones")
        out = arr.astype(target)
        if not np.array_equal(out, arr):
            raise ValueError(f"values out of range for {target}")
        return out
    if target.kind == "f":
        with np.errstate(over="ignore"):
            out = arr.astype(target)
        if not np.isfinite(out).all():
            raise ValueError(f"values out of range for {target}")
        return out
    raise ValueError(f"arrays of dtype {target} cannot be read from JSON")


_ANNOTATED: dict[Any, np.dtype[Any] | None] = {}


def _annotated_dtype(tp: Any) -> np.dtype[Any] | None:
    """The dtype of an ``NDArray[...]`` annotation, or None for plain ``np.ndarray``."""
    if tp is np.ndarray:
        return None
    try:
        return _ANNOTATED[tp]
    except KeyError:
        pass
    dtype = None
    args = typing.get_args(tp)
    if len(args) == 2:
        inner = typing.get_args(args[1])
        if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], np.generic):
            dtype = np.dtype(inner[0])
    _ANNOTATED[tp] = dtype
    return dtype


def _dec_hook(tp: Any, obj: Any) -> Any:
    if tp is np.ndarray or typing.get_origin(tp) is np.ndarray:
        return _to_array(obj, tp)
    if isinstance(tp, type) and isinstance(obj, tp):
        return obj
    raise TypeError(f"Expected `{type_name(tp)}`, got `{type(obj).__name__}`")


def convert(raw: Any, tp: Any) -> Any:
    """``raw`` (as orjson parsed it) as an instance of ``tp``; fields typed ``np.ndarray``
    or ``NDArray[dtype]`` get fresh arrays.

    Raises:
        msgspec.ValidationError: ``raw`` does not match ``tp`` (callers say where).
        ConfigError: msgspec cannot decode into ``tp`` at all.
    """
    if tp is Any or tp is object:
        return raw
    try:
        return msgspec.convert(raw, tp, dec_hook=_dec_hook)
    except TypeError as exc:  # msgspec refuses the type itself
        raise ConfigError(f"cannot decode into {type_name(tp)}: {exc}") from None
