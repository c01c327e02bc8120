"""The JSON codec on orjson, for messages that something other than rlwire reads.

:class:`JsonCodec` turns objects into a :class:`~rlwire.Frame` whose header is one JSON
document (no out-of-band buffers), and back. JSON-lines files, which follow the same value
rules, are :mod:`rlwire.codecs.jsonl`.

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
* An array holding no values whose JSON (a list per row) would take over 1 MiB, such
  as one of shape ``(10**6, 0)``, is refused (:mod:`rlwire.codecs._json.numpy_text`).
* Dict keys must be strings; integers must fit in 64 bits (read, integers of any size are
  exact: :mod:`rlwire.codecs._json.parse`). Types orjson writes natively
  (``datetime``, ``UUID``, enums, datetime64 arrays, ...) are written as orjson writes them;
  datetime64 values of units finer than microseconds (``ns``) are refused: orjson would
  cut them to microseconds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import orjson

from rlwire._core.errors import CorruptFrameError, DecodeError, EncodeError
from rlwire._core.paths import KeyPath, render_path
from rlwire._core.slicing import Sliced, SliceTimer, run_sliced
from rlwire._frame.frame import Frame
from rlwire.codecs._json.cost import refuse_costly
from rlwire.codecs._json.parse import parse
from rlwire.codecs._json.values import (
    OPTION,
    bad_key,
    child_items,
    convert,
    dumps,
    key_error,
    struct_plan,
    type_name,
)
from rlwire.codecs._registry import Check

__all__ = ["JsonCodec"]

_SCALARS = (str, int, float, bool, type(None))

# Encoding in slices: containers are encoded in groups of entries sized (from the cost of
# the previous group) to take about _GROUP_SECONDS; arrays with more than _ARRAY_BLOCK
# elements are encoded a block of rows at a time. Containers deeper than _SPLIT_DEPTH are
# encoded in one call.
_GROUP_SECONDS = 0.00015
_ARRAY_BLOCK = 16384
_SPLIT_DEPTH = 6


def _check_walk(obj: Any, path: KeyPath, check: Check, slicer: SliceTimer) -> Sliced[None]:
    """Call ``check(struct, path)`` for every Struct in ``obj``."""
    if type(obj) in _SCALARS or isinstance(obj, np.ndarray):
        return
    if isinstance(obj, msgspec.Struct):
        check(obj, render_path(path))
    children = child_items(obj)
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
        return obj.ndim >= 1 and obj.size > _ARRAY_BLOCK and len(obj) > 1
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

    def _dump(self, obj: Any, path: KeyPath) -> bytes:
        start = time.perf_counter()
        try:
            return dumps(obj, OPTION, path)
        finally:
            self.work += time.perf_counter() - start

    def value(self, obj: Any, path: KeyPath, depth: int) -> Sliced[None]:
        if depth < _SPLIT_DEPTH and _splittable(obj):
            if isinstance(obj, np.ndarray):
                yield from self._array(obj, path)
                return
            if isinstance(obj, msgspec.Struct):
                plan = struct_plan(type(obj))
                yield from self._entries(plan.entries(obj), not plan.array_like, path, depth)
                return
            if isinstance(obj, list | tuple):
                entries = [(None, i, v) for i, v in enumerate(obj)]
                yield from self._entries(entries, False, path, depth)
                return
            if isinstance(obj, dict):
                yield from self._entries([(k, k, v) for k, v in obj.items()], True, path, depth)
                return
            fields = child_items(obj) or ()  # a dataclass instance's
            yield from self._entries([(k, k, v) for k, v in fields], True, path, depth)
            return
        self.out += self._dump(obj, path)

    def _entries(
        self,
        entries: Sequence[tuple[Any, str | int, Any]],
        mapping: bool,
        path: KeyPath,
        depth: int,
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
                    if bad_key(key):
                        raise EncodeError(key_error(path, key))
                    out += orjson.dumps(key) + b":"
                yield from self.value(value, (path, name), depth + 1)
                j = i + 1
            else:
                j = min(n, i + k)
                group: Any
                if mapping:
                    group = {key: value for key, _, value in entries[i:j]}
                    if len(group) < j - i:  # cannot happen for dicts and Structs
                        raise EncodeError(f"{render_path(path)}: duplicate key")
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
        self, entries: Sequence[tuple[Any, str | int, Any]], mapping: bool, path: KeyPath
    ) -> None:
        """Raise the EncodeError of the first entry of a failed group, at its own path."""
        for key, name, value in entries:
            if mapping and bad_key(key):
                raise EncodeError(key_error(path, key))
            self._dump(value, (path, name))

    def _array(self, arr: np.ndarray, path: KeyPath) -> Sliced[None]:
        """Write a large array a block of rows at a time."""
        rows = max(1, _ARRAY_BLOCK // max(1, arr[0].size))
        out = self.out
        out += b"["
        for start in range(0, len(arr), rows):
            if start:
                out += b","
            out += memoryview(self._dump(arr[start : start + rows], path))[1:-1]
            yield from self._tick()
        out += b"]"


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
        """Encode ``obj`` as a sliced generator (see :mod:`rlwire._core.slicing`).

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

    def decode(
        self, frame: Frame, type: Any = Any, *, writable: bool = False, as_columns: bool = False
    ) -> Any:
        """Decode ``frame`` into ``type`` (default: plain dicts, lists and numbers).

        Fields typed ``np.ndarray`` get fresh (so always writable) arrays whose dtype
        numpy infers: bool, int64 or float64. ``writable`` is accepted for compatibility
        with other codecs, and so is ``as_columns``: JSON stores no columns.

        Raises:
            CorruptFrameError: the header is not valid JSON, or the frame has buffers.
            FrameTooLargeError: parsing the header could build more Python objects than
                the message's stored size allows (see :mod:`rlwire.codecs._json.cost`).
            DecodeError: the data does not match ``type``; the message names the path.
        """
        if frame.buffers:
            raise CorruptFrameError(
                f"json frame has {len(frame.buffers)} out-of-band buffers; json frames have none"
            )
        refuse_costly(frame.header, frame.stored_nbytes, "header")
        try:
            raw = parse(frame.header)
        except orjson.JSONDecodeError as exc:
            raise CorruptFrameError(f"header: malformed JSON: {exc}") from None
        try:
            return convert(raw, type)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"received data does not match {type_name(type)}: {exc}") from None
