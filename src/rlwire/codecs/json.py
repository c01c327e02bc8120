"""JSON codec and JSON lines on orjson, for rollouts, logs and anything a person reads.

:class:`JsonCodec` turns objects into a :class:`~rlwire.Frame` whose header is one JSON
document (no out-of-band buffers). :func:`dump_jsonl` / :func:`load_jsonl` (and the async
:func:`adump_jsonl` / :func:`aload_jsonl`) stream JSON lines: one document per line,
written and read in batches, never the whole file at once.

Value rules (the same for the codec and JSON lines):

* numpy arrays of bool, integer and float dtypes become (nested) JSON arrays; numpy
  scalars become numbers. JSON keeps no dtype: decoded into a field typed ``np.ndarray``
  an array's dtype is inferred by numpy (bool, int64 or float64), unless the field is
  annotated with a dtype, e.g. ``numpy.typing.NDArray[np.float32]``.
* msgspec Structs become objects (arrays for ``array_like`` Structs), honouring field
  renames and tags; dataclasses become objects; tuples (and sets) become arrays; bytes
  become base64 strings (msgspec's rule, so a field typed ``bytes`` decodes them).
* NaN, +Inf and -Inf, in Python floats, numpy scalars and array elements alike, are
  written as ``null`` (orjson's and JavaScript's rule), so the output is valid JSON that
  any reader parses. They read back as ``None``; a ``null`` inside an array decoded into
  an ``np.ndarray`` field is a :class:`~rlwire.errors.DecodeError`.
* Dict keys must be strings; integers must fit in 64 bits. Types orjson writes natively
  (``datetime``, ``UUID``, enums, datetime64 arrays, ...) are written as orjson writes them.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import os
import time
import typing
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import anyio
import msgspec
import numpy as np
import orjson
from anyio import CapacityLimiter, to_thread

from .._aio import make_limiter, offload_sliced
from .._args import check_int
from .._slicing import Sliced, SliceTimer, run_sliced
from ..errors import (
    ConfigError,
    CorruptFrameError,
    DecodeError,
    EncodeError,
    FrameTooLargeError,
    RlwireError,
    transport_error,
)
from ..frame import Frame

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "JsonCodec",
    "adump_jsonl",
    "aload_jsonl",
    "dump_jsonl",
    "load_jsonl",
]

#: Longest line :func:`load_jsonl` accepts by default (bytes, newline excluded).
DEFAULT_MAX_LINE_BYTES = 256 << 20

_OPTION = orjson.OPT_SERIALIZE_NUMPY
_LINE_OPTION = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
_SCALARS = (str, int, float, bool, type(None))
_ORJSON_DEPTH = 254  # orjson's nesting limit when encoding

# Encoding in slices: containers are encoded in groups of entries sized (from the cost of
# the previous group) to take about _GROUP_SECONDS; arrays with more than _ARRAY_SLICE
# elements are encoded a block of rows at a time. Containers deeper than _SPLIT_DEPTH are
# encoded in one call.
_GROUP_SECONDS = 0.00015
_ARRAY_SLICE = 16384
_SPLIT_DEPTH = 6

# JSON lines: bytes read per chunk, bytes encoded before a write, records per batch taken
# from an async iterable.
_READ_CHUNK = 1 << 20
_WRITE_BYTES = 1 << 20
_ASYNC_BATCH = 256

#: The ``check`` hook: called as ``check(struct, path)`` for every Struct encoded.
Check: TypeAlias = Callable[[Any, str], None]

# A path is a linked list (parent, key) rendered only when an error needs it.
_Path: TypeAlias = "tuple[_Path, str | int] | None"


def _render(path: _Path) -> str:
    keys: list[str | int] = []
    while path is not None:
        path, key = path
        keys.append(key)
    out = ["$"]
    for key in reversed(keys):
        out.append(f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]")
    return "".join(out)


def _type_name(tp: Any) -> str:
    name = getattr(tp, "__qualname__", None)
    if name is None or typing.get_args(tp):
        return repr(tp)
    return str(name)


def _qualname(obj: Any) -> str:
    kind = type(obj)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


# -- Structs --------------------------------------------------------------------------


class _StructPlan:
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


_PLANS: dict[type, _StructPlan] = {}


def _plan(cls: type[msgspec.Struct]) -> _StructPlan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _StructPlan(cls)
    return plan


# -- values orjson does not write natively --------------------------------------------


def _array_problem(arr: np.ndarray) -> str | None:
    dtype = arr.dtype
    if dtype.fields is None and dtype.subdtype is None:
        if dtype.kind in "biuM" or (dtype.kind == "f" and dtype.itemsize <= 8):
            return None
        if dtype.kind == "f" or dtype.kind == "c":
            return (
                f"numpy arrays of dtype {dtype} are not supported (JSON numbers are "
                "float64 at most and not complex); convert the array first, e.g. "
                ".astype(np.float64)"
            )
    hint = (
        " (object arrays would need pickle, which rlwire never uses)" if dtype.kind == "O" else ""
    )
    return (
        f"numpy arrays of dtype {dtype} are not supported; only bool and numeric dtypes are{hint}"
    )


def _default(obj: Any) -> Any:
    """orjson's ``default=`` hook: called for values orjson does not write itself."""
    if isinstance(obj, msgspec.Struct):
        return _plan(type(obj)).builtin(obj)
    if isinstance(obj, np.ndarray):
        problem = _array_problem(obj)
        if problem is not None:
            raise TypeError(problem)
        if obj.ndim == 0:
            return obj[()]
        if not obj.dtype.isnative:
            obj = obj.astype(obj.dtype.newbyteorder("="))
        return np.ascontiguousarray(obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, set | frozenset | tuple):  # tuple: subclasses such as NamedTuple
        return list(obj)
    if isinstance(obj, np.generic):
        raise TypeError(
            f"numpy scalar of dtype {obj.dtype} has no JSON equivalent"
            + ("; convert it with float() first" if obj.dtype.kind == "f" else "")
        )
    raise TypeError(f"cannot encode value of type {_qualname(obj)}")


def _native(obj: Any, depth: int = 0) -> Any:
    """``obj`` with arrays orjson refuses outright (non-native byte order) replaced by
    native ones; ``obj`` itself when there are none. The slow path, taken only after
    orjson failed."""
    if depth > _ORJSON_DEPTH:
        return obj
    if isinstance(obj, np.ndarray):
        return obj if obj.dtype.isnative or _array_problem(obj) else _default(obj)
    if isinstance(obj, msgspec.Struct):
        built = _plan(type(obj)).builtin(obj)
        new = _native(built, depth + 1)
        return obj if new is built else new
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        new = _native(fields, depth + 1)
        return obj if new is fields else new
    if isinstance(obj, dict):
        out = {k: _native(v, depth + 1) for k, v in obj.items()}
        changed = any(out[k] is not v for k, v in obj.items())
        return out if changed else obj
    if isinstance(obj, list | tuple):
        items = [_native(v, depth + 1) for v in obj]
        return items if any(a is not b for a, b in zip(items, obj, strict=True)) else obj
    return obj


def _children(obj: Any) -> Iterable[tuple[str | int, Any]] | None:
    """The ``(key, value)`` pairs of a container, named as error paths name them."""
    if isinstance(obj, msgspec.Struct):
        return ((name, getattr(obj, name)) for name in obj.__struct_fields__)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
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


def _failure(obj: Any, path: _Path, option: int, exc: orjson.JSONEncodeError) -> str:
    """``"<path>: <reason>"`` for the value inside ``obj`` that orjson refused."""
    if "Recursion limit" in str(exc):
        return (
            f"{_render(path)}: nests more than {_ORJSON_DEPTH} levels deep "
            "(orjson's limit), or contains itself"
        )
    depth = 0
    while depth <= _ORJSON_DEPTH:
        children = _children(obj)
        if children is None:
            break
        for key, child in children:
            if not _encodes(child, option):
                obj, path = child, (path, key)
                break
        else:
            if isinstance(obj, dict):
                for key in obj:
                    if not isinstance(key, str):
                        return (
                            f"{_render(path)}: dict keys must be str, got "
                            f"{_qualname(key)} key {key!r}"
                        )
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
        reason = f"cannot encode {_qualname(obj)}: {reason}"
    return f"{_render(path)}: {reason}"


def _dumps(obj: Any, option: int, path: _Path, where: str = "") -> bytes:
    """orjson-encode ``obj``; an :class:`EncodeError` names the path of a refused value."""
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
    raise EncodeError(where + _failure(obj, path, option, error)) from None


# -- encoding a Frame in slices -------------------------------------------------------


def _check_walk(obj: Any, path: _Path, check: Check, slicer: SliceTimer) -> Sliced[None]:
    """Call ``check(struct, path)`` for every Struct in ``obj``."""
    if type(obj) in _SCALARS or isinstance(obj, np.ndarray):
        return
    if isinstance(obj, msgspec.Struct):
        check(obj, _render(path))
    children = _children(obj)
    if children is None:
        return
    for key, item in children:
        if type(item) in _SCALARS:
            continue
        yield from _check_walk(item, (path, key), check, slicer)
        if slicer.due():
            yield
            slicer.restart()


def _splittable(obj: Any) -> bool:
    if isinstance(obj, np.ndarray):
        return obj.ndim >= 1 and obj.size > _ARRAY_SLICE and len(obj) > 1
    return isinstance(obj, msgspec.Struct | dict | list | tuple) or (
        dataclasses.is_dataclass(obj) and not isinstance(obj, type)
    )


class _Writer:
    """One encoding pass: writes the JSON of an object into ``out`` in slices."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.slicer = SliceTimer()
        self.work = 0.0  # seconds spent in orjson so far

    def _tick(self) -> Sliced[None]:
        if self.slicer.due():
            yield
            self.slicer.restart()

    def _dump(self, obj: Any, path: _Path) -> bytes:
        start = time.perf_counter()
        try:
            return _dumps(obj, _OPTION, path)
        finally:
            self.work += time.perf_counter() - start

    def value(self, obj: Any, path: _Path, depth: int) -> Sliced[None]:
        if depth < _SPLIT_DEPTH and _splittable(obj):
            if isinstance(obj, np.ndarray):
                yield from self._array(obj, path)
                return
            if isinstance(obj, msgspec.Struct):
                plan = _plan(type(obj))
                yield from self._entries(plan.entries(obj), not plan.array_like, path, depth)
                return
            if isinstance(obj, list | tuple):
                entries = [(None, i, v) for i, v in enumerate(obj)]
                yield from self._entries(entries, False, path, depth)
                return
            if isinstance(obj, dict):
                yield from self._entries([(k, k, v) for k, v in obj.items()], True, path, depth)
                return
            fields = dataclasses.fields(obj)
            yield from self._entries(
                [(f.name, f.name, getattr(obj, f.name)) for f in fields], True, path, depth
            )
            return
        self.out += self._dump(obj, path)

    def _entries(
        self, entries: Sequence[tuple[Any, str | int, Any]], mapping: bool, path: _Path, depth: int
    ) -> Sliced[None]:
        """Write a container's entries in groups whose size adapts to their cost; an
        entry that alone is expensive is written by recursing into it."""
        out = self.out
        out += b"{" if mapping else b"["
        n, i, k = len(entries), 0, 1
        while i < n:
            if i:
                out += b","
            key, name, value = entries[i]
            before = self.work
            if k == 1 and _splittable(value):
                if mapping:
                    if not isinstance(key, str):
                        raise EncodeError(
                            f"{_render(path)}: dict keys must be str, got "
                            f"{_qualname(key)} key {key!r}"
                        )
                    out += orjson.dumps(key) + b":"
                yield from self.value(value, (path, name), depth + 1)
                j = i + 1
            else:
                j = min(n, i + k)
                group: Any
                if mapping:
                    group = {key: value for key, _, value in entries[i:j]}
                    if len(group) < j - i:  # cannot happen for dicts and Structs
                        raise EncodeError(f"{_render(path)}: duplicate key")
                else:
                    group = [value for _, _, value in entries[i:j]]
                try:
                    chunk = self._dump(group, None)
                except EncodeError:
                    self._group_error(entries[i:j], mapping, path)
                    raise
                out += memoryview(chunk)[1:-1]
            cost = (self.work - before) / (j - i)
            k = max(1, min(2 * (j - i), int(_GROUP_SECONDS / cost) if cost > 0 else n))
            i = j
            yield from self._tick()
        out += b"}" if mapping else b"]"

    def _group_error(
        self, entries: Sequence[tuple[Any, str | int, Any]], mapping: bool, path: _Path
    ) -> None:
        """Raise the EncodeError of the first entry of a failed group, at its own path."""
        for key, name, value in entries:
            if mapping and not isinstance(key, str):
                raise EncodeError(
                    f"{_render(path)}: dict keys must be str, got {_qualname(key)} key {key!r}"
                )
            self._dump(value, (path, name))

    def _array(self, arr: np.ndarray, path: _Path) -> Sliced[None]:
        """Write a large array a block of rows at a time."""
        rows = max(1, _ARRAY_SLICE // max(1, arr[0].size))
        out = self.out
        out += b"["
        for start in range(0, len(arr), rows):
            if start:
                out += b","
            out += memoryview(self._dump(arr[start : start + rows], path))[1:-1]
            yield from self._tick()
        out += b"]"


# -- decoding -------------------------------------------------------------------------


def _to_array(obj: Any, tp: Any) -> np.ndarray:
    """A fresh array from decoded JSON for a field typed ``tp`` (``np.ndarray`` or
    ``NDArray[dtype]``)."""
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
        raise ValueError(
            f"expected an array of numbers, got array-like values of dtype {arr.dtype}"
        )
    if arr.dtype.kind == "f" and arr.size and arr.max() >= 2.0**63:
        # numpy makes [0, 2**63] float64; keep uint64 when that loses nothing.
        with contextlib.suppress(OverflowError, ValueError, TypeError):
            exact = np.array(obj, dtype=np.uint64)
            if np.array_equal(exact.astype(np.float64), arr):
                arr = exact
    target = _annotated_dtype(tp)
    if target is None or target == arr.dtype:
        return arr
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
    raise TypeError(f"Expected `{_type_name(tp)}`, got `{type(obj).__name__}`")


def _convert(raw: Any, tp: Any) -> Any:
    """``raw`` (from orjson) as ``tp``; raises msgspec.ValidationError."""
    if tp is Any or tp is object:
        return raw
    try:
        return msgspec.convert(raw, tp, dec_hook=_dec_hook)
    except TypeError as exc:  # msgspec refuses the type itself
        raise ConfigError(f"cannot decode into {_type_name(tp)}: {exc}") from None


# -- the codec ------------------------------------------------------------------------


class JsonCodec:
    """Encode msgspec Structs, dataclasses, dicts and lists (numpy arrays included) to a
    :class:`~rlwire.Frame` holding one JSON document, and back.

    The frame's header is the JSON text; it has no out-of-band buffers. See the module
    docstring for the value rules: arrays become lists and lose their dtype, NaN and
    Inf become ``null``.

    Args:
        check: called as ``check(struct, path)`` for every Struct in the object before
            it is encoded; rlwire uses it to validate :class:`~rlwire.TrainingSample`.

    Raises:
        EncodeError: from :meth:`encode`, naming the path and type of a value JSON
            cannot carry (e.g. ``$.samples[1].extras.x: numpy arrays of dtype <U1 ...``).

    Example:
        >>> import numpy as np
        >>> codec = JsonCodec()
        >>> frame = codec.encode({"x": np.arange(3), "loss": float("nan")})
        >>> bytes(frame.header)
        b'{"x":[0,1,2],"loss":null}'
        >>> codec.decode(frame, type=dict[str, np.ndarray | None])["x"]
        array([0, 1, 2])
    """

    name = "json"

    def __init__(self, *, check: Check | None = None) -> None:
        self.check = check

    def encode(self, obj: Any) -> Frame:
        """Encode ``obj`` in the calling thread; see :meth:`encode_sliced`."""
        return run_sliced(self.encode_sliced(obj))

    def encode_sliced(self, obj: Any) -> Sliced[Frame]:
        """Encode ``obj`` as a sliced generator (see :mod:`rlwire._slicing`).

        Runs ``check`` over every Struct first, then encodes long containers a group of
        entries at a time and large arrays a block of rows at a time, so that each slice
        holds the GIL for a fraction of a millisecond. The header is a read-only
        memoryview of the JSON text.

        Raises:
            EncodeError: naming the path of the first value JSON cannot carry.
        """
        if self.check is not None:
            try:
                yield from _check_walk(obj, None, self.check, SliceTimer())
            except RecursionError:
                raise EncodeError(
                    "$: nests too deeply for Python's recursion limit (or contains itself)"
                ) from None
        yield
        writer = _Writer()
        yield from writer.value(obj, None, 0)
        return Frame(memoryview(writer.out).toreadonly(), (), codec=self.name)

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> Any:
        """Decode ``frame`` into ``type`` (default: plain dicts, lists and numbers).

        Fields typed ``np.ndarray`` get fresh (so always writable) arrays whose dtype
        numpy infers: bool, int64 or float64. ``writable`` is accepted for compatibility
        with other codecs.

        Raises:
            CorruptFrameError: the header is not valid JSON, or the frame has buffers.
            DecodeError: the data does not match ``type``; the message names the path.
        """
        if frame.buffers:
            raise CorruptFrameError(
                f"json frame has {len(frame.buffers)} out-of-band buffers; json frames have none"
            )
        try:
            raw = orjson.loads(frame.header)
        except orjson.JSONDecodeError as exc:
            raise CorruptFrameError(f"header: malformed JSON: {exc}") from None
        try:
            return _convert(raw, type)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"received data does not match {_type_name(type)}: {exc}") from None


# -- JSON lines: files ----------------------------------------------------------------


class _BinaryWriter(Protocol):
    def write(self, data: bytes, /) -> int | None: ...


class _BinaryReader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


#: What :func:`dump_jsonl` writes to: a path or a binary file object.
JsonlDestination: TypeAlias = "str | os.PathLike[str] | _BinaryWriter"
#: What :func:`load_jsonl` reads from: a path or a binary file object.
JsonlSource: TypeAlias = "str | os.PathLike[str] | _BinaryReader"


class _Sink:
    """Where JSON lines go: a temporary file renamed into place at the end, a file
    opened for appending, or the caller's file object."""

    def __init__(self, file: JsonlDestination, append: bool) -> None:
        self.fd = -1
        self.tmp: Path | None = None
        self.path: Path | None = None
        self.fileobj: _BinaryWriter | None = None
        if isinstance(file, str | os.PathLike):
            self.path = Path(os.fspath(file))
            if append:
                target, flags = self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
            else:
                self.tmp = target = self.path.with_name(
                    f".{self.path.name}.{os.urandom(6).hex()}.tmp"
                )
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            try:
                self.fd = os.open(target, flags, 0o644)
            except OSError as exc:
                raise transport_error(exc, "create a file", where=target) from exc
            return
        if append:
            raise ConfigError(
                "append=True applies to paths; a file object is written at its position"
            )
        if isinstance(file, io.TextIOBase) or not callable(getattr(file, "write", None)):
            raise ConfigError(f"dump_jsonl needs a path or a binary file object, got {file!r}")
        self.fileobj = file

    @property
    def name(self) -> object:
        if self.path is not None:
            return self.path
        return getattr(self.fileobj, "name", None) or f"<{type(self.fileobj).__name__}>"

    def write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        try:
            while view:
                if self.fileobj is not None:
                    n = self.fileobj.write(view)  # type: ignore[arg-type]
                    if n is None:  # buffered streams write everything or raise
                        break
                    if n <= 0:
                        raise OSError(f"write() wrote {n} bytes")
                else:
                    n = os.write(self.fd, view)
                view = view[n:]
        except OSError as exc:
            raise transport_error(exc, "write", where=self.tmp or self.name) from exc
        finally:
            view.release()

    def commit(self) -> None:
        try:
            if self.fileobj is not None:
                flush = getattr(self.fileobj, "flush", None)
                if flush is not None:
                    flush()
                return
            os.close(self.fd)
            self.fd = -1
            if self.tmp is not None:
                os.replace(self.tmp, self.path)  # type: ignore[arg-type]
                self.tmp = None
        except OSError as exc:
            self.abort()
            raise transport_error(exc, "write", where=self.name) from exc

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
            self.tmp = None


class _LineWriter:
    """Encodes records as lines and writes them a batch (~1 MiB) at a time."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.buf = bytearray()
        self.count = 0
        self.slicer = SliceTimer()

    def feed(self, records: Iterable[Any]) -> Sliced[None]:
        """Encode and write ``records``; on an error, the lines of the records before
        the failing one are written (whole), then the EncodeError is raised."""
        for record in records:
            try:
                self.buf += _dumps(record, _LINE_OPTION, None, f"record {self.count}: ")
            except EncodeError:
                self._write()
                raise
            self.count += 1
            if len(self.buf) >= _WRITE_BYTES:
                yield
                self._write()  # a slice of its own: os.write releases the GIL
                yield
                self.slicer.restart()
            elif self.slicer.due():
                yield
                self.slicer.restart()

    def finish(self) -> Sliced[None]:
        """Write what is left and commit (rename the temporary file into place)."""
        yield
        self._write()
        self.sink.commit()

    def _write(self) -> None:
        if self.buf:
            buf, self.buf = self.buf, bytearray()
            self.sink.write(buf)


def _dump_sliced(records: Iterable[Any], file: JsonlDestination, append: bool) -> Sliced[int]:
    sink = _Sink(file, append)
    try:
        writer = _LineWriter(sink)
        yield from writer.feed(records)
        yield from writer.finish()
    except BaseException:
        sink.abort()
        raise
    return writer.count


def dump_jsonl(records: Iterable[Any], file: JsonlDestination, *, append: bool = False) -> int:
    """Write ``records`` as JSON lines (one JSON document per line) and return how many.

    Records follow the value rules of this module (arrays become lists, NaN/Inf become
    ``null``). They are encoded one by one and written about a megabyte at a time, so
    the file is never held in memory whole.

    Given a path, the lines go to a temporary file beside it that is renamed into place
    at the end: a reader sees the old file or the whole new one, never a part. With
    ``append=True`` the lines are appended to the file (created if missing) directly, in
    whole lines. A binary file object is written at its position and not closed.

    Raises:
        EncodeError: a record holds a value JSON cannot carry; the message names the
            record and the path inside it (``record 17: $.extras.x: ...``). A path given
            without ``append`` is then left untouched; with ``append=True`` or a file
            object, exactly the records before the failing one have been written.
        TransportError: the file cannot be created or written.
        ConfigError: ``file`` is a text file object, or ``append=True`` with a file object.

    Example:
        >>> import numpy as np, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "rollouts.jsonl"
        >>> dump_jsonl([{"ids": np.arange(3)}, {"ids": np.arange(2), "r": 0.5}], path)
        2
        >>> path.read_bytes()
        b'{"ids":[0,1,2]}\\n{"ids":[0,1],"r":0.5}\\n'
    """
    return run_sliced(_dump_sliced(records, file, append))


async def adump_jsonl(
    records: Iterable[Any] | AsyncIterable[Any],
    file: JsonlDestination,
    *,
    append: bool = False,
    limiter: CapacityLimiter | int | None = None,
) -> int:
    """:func:`dump_jsonl` for async code: encoding and writing run in worker threads
    under ``limiter``, in slices short enough that the event loop stays responsive.

    ``records`` may be an async iterable; its records are taken on the event loop and
    encoded a batch (up to 256 records) at a time. Cancelling leaves nothing at a path
    written without ``append``. Raises what :func:`dump_jsonl` raises.

    Example:
        >>> import anyio, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> anyio.run(adump_jsonl, [{"step": 1}, {"step": 2}], path)
        2
    """
    lim = make_limiter(limiter)
    if not isinstance(records, AsyncIterable):
        return await offload_sliced(_dump_sliced(records, file, append), lim)
    sink = await to_thread.run_sync(_Sink, file, append, limiter=lim)
    try:
        writer = _LineWriter(sink)
        batch: list[Any] = []
        async for record in records:
            batch.append(record)
            if len(batch) >= _ASYNC_BATCH:
                await offload_sliced(writer.feed(batch), lim)
                batch = []
        if batch:
            await offload_sliced(writer.feed(batch), lim)
        await offload_sliced(writer.finish(), lim)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await to_thread.run_sync(sink.abort, limiter=lim)
        raise
    return writer.count


class _LineReader:
    """Reads a file a chunk at a time, splits lines, and parses them."""

    def __init__(self, file: JsonlSource, tp: Any, max_line_bytes: int) -> None:
        self.type = tp
        self.max_line_bytes = check_int(max_line_bytes, "max_line_bytes", low=1)
        self.owned = isinstance(file, str | os.PathLike)
        self.name: object
        if isinstance(file, str | os.PathLike):
            self.name = os.fspath(file)
            try:
                self.file: _BinaryReader = open(file, "rb", buffering=0)  # noqa: SIM115
            except OSError as exc:
                raise transport_error(exc, "open the file", where=self.name) from exc
        else:
            if isinstance(file, io.TextIOBase) or not callable(getattr(file, "read", None)):
                raise ConfigError(f"load_jsonl needs a path or a binary file object, got {file!r}")
            self.file = file
            self.name = getattr(file, "name", None) or f"<{type(file).__name__}>"
        self.pending: list[bytes] = []  # the start of a line that continues in later chunks
        self.pending_len = 0
        self.lineno = 0
        self.done = False
        self.error: RlwireError | None = None
        self.slicer = SliceTimer()

    def close(self) -> None:
        if self.owned:
            self.file.close()  # type: ignore[attr-defined]

    def _read(self) -> bytes:
        try:
            chunk = self.file.read(_READ_CHUNK)
        except OSError as exc:
            raise transport_error(exc, "read", where=self.name) from exc
        if not isinstance(chunk, bytes | bytearray):
            raise ConfigError(f"{self.name}: load_jsonl needs a binary file, read gave {chunk!r}")
        return bytes(chunk)

    def _too_long(self) -> FrameTooLargeError:
        return FrameTooLargeError(
            f"{self.name}: line {self.lineno + 1}: longer than max_line_bytes="
            f"{self.max_line_bytes}; pass a larger max_line_bytes if this is expected"
        )

    def batch(self) -> Sliced[list[Any] | None]:
        """The records of the lines completed by the next chunk(s), or None at the end.

        A bad line ends the batch: the records before it are returned, and the error is
        raised by the next call."""
        if self.error is not None:
            error, self.error, self.done = self.error, None, True
            raise error
        while not self.done:
            chunk = self._read()
            yield  # the read released the GIL; parsing is the next slice
            if not chunk:
                self.done = True
                tail = b"".join(self.pending)
                self.pending = []
                if not tail or tail.isspace():
                    return None
                if len(tail) > self.max_line_bytes:
                    raise self._too_long()
                self.lineno += 1
                return [self._parse(tail, last=True)]
            lines = chunk.split(b"\n")
            if len(lines) == 1:
                self.pending.append(chunk)
                self.pending_len += len(chunk)
                if self.pending_len > self.max_line_bytes:
                    raise self._too_long()
                continue
            if self.pending:
                self.pending.append(lines[0])
                lines[0] = b"".join(self.pending)
            tail = lines.pop()
            self.pending = [tail] if tail else []
            self.pending_len = len(tail)
            records: list[Any] = []
            try:
                for line in lines:
                    if len(line) > self.max_line_bytes:
                        raise self._too_long()
                    self.lineno += 1
                    if line and not line.isspace():
                        records.append(self._parse(line, last=False))
                    if self.slicer.due():
                        yield
                        self.slicer.restart()
            except RlwireError as exc:
                if not records:
                    raise
                self.error = exc
            return records
        return None

    def _parse(self, line: bytes, *, last: bool) -> Any:
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if last:
                raise CorruptFrameError(
                    f"{self.name}: line {self.lineno}: truncated: the file ends without a "
                    f"newline in the middle of a JSON document ({exc})"
                ) from None
            raise CorruptFrameError(
                f"{self.name}: line {self.lineno}: malformed JSON: {exc}"
            ) from None
        try:
            return _convert(raw, self.type)
        except msgspec.ValidationError as exc:
            raise DecodeError(
                f"{self.name}: line {self.lineno}: does not match {_type_name(self.type)}: {exc}"
            ) from None


def load_jsonl(
    file: JsonlSource, *, type: Any = Any, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[Any]:
    """Yield the records of a JSON-lines file, decoded into ``type`` (default: plain
    dicts, lists and numbers; see :meth:`JsonCodec.decode` for arrays).

    The file is read a megabyte at a time and never whole; blank lines are skipped. A
    last line without a newline is read if it is complete JSON. A path is opened (and
    closed when the iterator ends or is closed); a binary file object is read from its
    position and not closed.

    Raises:
        CorruptFrameError: a line is not valid JSON, or the last line is cut short; the
            message names the file and the line number.
        DecodeError: a record does not match ``type``; names the line and the path.
        FrameTooLargeError: a line is longer than ``max_line_bytes`` (bytes, newline
            excluded), so a file without newlines cannot exhaust memory.
        TransportError: the file cannot be opened or read.

    Example:
        >>> import io
        >>> list(load_jsonl(io.BytesIO(b'{"a": 1}\\n\\n[1, 2]\\n')))
        [{'a': 1}, [1, 2]]
    """
    reader = _LineReader(file, type, max_line_bytes)
    try:
        while (records := run_sliced(reader.batch())) is not None:
            yield from records
    finally:
        reader.close()


async def aload_jsonl(
    file: JsonlSource,
    *,
    type: Any = Any,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    limiter: CapacityLimiter | int | None = None,
) -> AsyncIterator[Any]:
    """:func:`load_jsonl` for async code: an async generator that reads and parses each
    chunk of lines in worker threads under ``limiter``, in slices short enough that the
    event loop stays responsive. Raises what :func:`load_jsonl` raises.

    Close it (``contextlib.aclosing``) if you stop iterating early.

    Example:
        >>> import anyio, io
        >>> async def main() -> list[int]:
        ...     return [r["step"] async for r in aload_jsonl(io.BytesIO(b'{"step": 7}\\n'))]
        >>> anyio.run(main)
        [7]
    """
    lim = make_limiter(limiter)
    reader = await to_thread.run_sync(_LineReader, file, type, max_line_bytes, limiter=lim)
    try:
        while (records := await offload_sliced(reader.batch(), lim)) is not None:
            for record in records:
                yield record
    finally:
        reader.close()
