"""Msgpack codec on msgspec, with numpy arrays and large bytes carried out-of-band.

msgspec copies every byte it encodes. This codec walks the object first and swaps each
numpy array (and each large bytes value) for a small msgpack extension that refers to
an out-of-band buffer; only that small tree goes through msgspec. Decoding rebuilds
arrays as views over the received buffers.

Extension types in the header (see docs/format.md):

* ``1`` out-of-band array: ``[buffer index, dtype, shape, order]``
* ``2`` inline array: ``[dtype, shape, order, raw bytes]`` (arrays below the threshold)
* ``3`` out-of-band bytes: ``[buffer index]``
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

import msgspec
import numpy as np

from .._args import check_int
from .._slicing import Sliced, SliceTimer, run_sliced
from ..errors import ConfigError, CorruptFrameError, DecodeError, EncodeError, RlwireError
from ..frame import Frame, as_byte_view

__all__ = ["DEFAULT_INLINE_THRESHOLD", "MsgpackCodec"]

EXT_ARRAY = 1
EXT_INLINE_ARRAY = 2
EXT_BYTES = 3

#: Arrays and bytes values at least this large (in bytes) go out-of-band.
DEFAULT_INLINE_THRESHOLD = 4096

_MAX_NDIM = 64
_DTYPE_RE = re.compile(r"[<>|=][biufc][0-9]{1,2}")
_SCALARS = (str, int, float, bool, type(None))
# Sequences longer than this are encoded in groups of this many items, a slice each.
_CHUNK = 64

Check: TypeAlias = Callable[[Any, str], None]


class _ArrayRef(msgspec.Struct, array_like=True):
    index: int
    dtype: str
    shape: list[int]
    order: str


class _InlineArray(msgspec.Struct, array_like=True):
    dtype: str
    shape: list[int]
    order: str
    data: bytes


class _BytesRef(msgspec.Struct, array_like=True):
    index: int


# A path is a linked list (parent, key) rendered only when an error needs it.
_Path: TypeAlias = "tuple[_Path, str | int] | None"


def _render(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]")
    return "$" + "".join(reversed(parts))


class MsgpackCodec:
    """Encode msgspec Structs, dicts and lists holding numpy arrays to :class:`Frame`.

    Args:
        sidecar: field (or dict key) names whose bytes-like and array values, at any
            depth inside the named field, go to the sidecar.
        inline_threshold: arrays and bytes of at least this many bytes go out-of-band.
        check: called as ``check(struct, path)`` for every Struct the encoder walks;
            rlwire uses it to validate :class:`~rlwire.TrainingSample` in the same pass.

    Raises:
        EncodeError: from :meth:`encode`, naming the path of a value it cannot carry.

    Example:
        >>> import numpy as np
        >>> codec = MsgpackCodec()
        >>> frame = codec.encode({"x": np.arange(10_000)})
        >>> len(frame.buffers)
        1
        >>> codec.decode(frame)["x"][-1]
        np.int64(9999)
    """

    name = "msgpack"

    def __init__(
        self,
        *,
        sidecar: Iterable[str] = (),
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        check: Check | None = None,
    ) -> None:
        names = (sidecar,) if isinstance(sidecar, str) else sidecar
        try:
            self.sidecar = frozenset(names)
        except TypeError:
            raise ConfigError(f"sidecar must be field names, got {sidecar!r}") from None
        if not all(isinstance(name, str) for name in self.sidecar):
            raise ConfigError(f"sidecar names must be strings, got {sidecar!r}")
        self.inline_threshold = check_int(inline_threshold, "inline_threshold")
        self.check = check
        self._encoder = msgspec.msgpack.Encoder()
        self._array_ref = msgspec.msgpack.Decoder(_ArrayRef)
        self._inline = msgspec.msgpack.Decoder(_InlineArray)
        self._bytes_ref = msgspec.msgpack.Decoder(_BytesRef)

    # -- encoding ---------------------------------------------------------------------

    def encode(self, obj: Any) -> Frame:
        """Encode ``obj`` in the calling thread; see :meth:`encode_sliced`."""
        return run_sliced(self.encode_sliced(obj))

    def encode_sliced(self, obj: Any) -> Sliced[Frame]:
        """Encode ``obj`` as a sliced generator (see :mod:`rlwire._slicing`).

        Array bytes are never copied, except for arrays that are neither C- nor
        F-contiguous, which are made C-contiguous first.
        """
        walk = _Walk(self)
        try:
            tree = yield from walk.value(obj, None, False)
        except RecursionError:
            raise EncodeError(
                "$: nests too deeply for Python's recursion limit (or contains itself)"
            ) from None
        yield  # msgspec encodes the rest of the header in one call: a slice of its own
        header = walk.encode(tree, None)
        return Frame(header, tuple(walk.buffers), frozenset(walk.sidecar))

    # -- decoding ---------------------------------------------------------------------

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> Any:
        """Decode ``frame`` into ``type`` (default: plain dicts and lists).

        Arrays are views over ``frame.buffers`` (no copy). They are read-only when the
        buffers are, unless ``writable=True``, which copies only read-only ones.

        Raises:
            CorruptFrameError: the header or an array descriptor is malformed or does
                not match its buffer.
            DecodeError: the data does not match ``type``; the message names the path.
        """
        buffers = frame.buffers

        def ext_hook(code: int, data: memoryview) -> Any:
            try:
                if code == EXT_ARRAY:
                    ref = self._array_ref.decode(data)
                    buf = _buffer(buffers, ref.index)
                    return _make_array(buf, ref.dtype, ref.shape, ref.order, writable)
                if code == EXT_INLINE_ARRAY:
                    inl = self._inline.decode(data)
                    return _make_array(
                        memoryview(inl.data), inl.dtype, inl.shape, inl.order, writable
                    )
                if code == EXT_BYTES:
                    buf = _buffer(buffers, self._bytes_ref.decode(data).index)
                    return bytearray(buf) if writable and buf.readonly else buf
            except msgspec.DecodeError as exc:
                raise CorruptFrameError(f"header: malformed extension {code}: {exc}") from exc
            raise CorruptFrameError(f"header: unknown msgpack extension type {code}")

        try:
            raw = msgspec.msgpack.decode(frame.header, ext_hook=ext_hook)
        except RlwireError:
            raise
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise CorruptFrameError(f"header: {exc}") from exc
        except (TypeError, ValueError) as exc:  # e.g. a bytes extension used as a map key
            raise CorruptFrameError(f"header: malformed: {exc}") from exc
        if type is Any or type is object:
            return raw
        try:
            return msgspec.convert(raw, type, dec_hook=_dec_hook)
        except msgspec.ValidationError as exc:
            raise DecodeError(f"received data does not match {_type_name(type)}: {exc}") from exc


class _Walk:
    """One encoding pass: swaps arrays for extension refs and collects their buffers."""

    def __init__(self, codec: MsgpackCodec) -> None:
        self.codec = codec
        self.buffers: list[memoryview] = []
        self.sidecar: list[int] = []
        self.slicer = SliceTimer()

    def value(self, obj: Any, path: _Path, side: bool) -> Sliced[Any]:
        kind = type(obj)
        if kind in _SCALARS:
            return obj
        if isinstance(obj, np.ndarray):
            return self._array(obj, path, side)
        if isinstance(obj, msgspec.Struct):
            return (yield from self._struct(obj, path, side))
        if kind is dict:
            return (yield from self._dict(obj, path, side))
        if kind is list or kind is tuple:
            return (yield from self._sequence(obj, path, side))
        if isinstance(obj, bytes | bytearray | memoryview):
            return self._bytes(obj, path, side)
        if isinstance(obj, np.generic):
            value = obj.item()
            if type(value) not in (bool, int, float):
                raise EncodeError(
                    f"{_render(path)}: numpy scalar of dtype {obj.dtype} has no plain "
                    "number equivalent"
                    + (
                        "; send it as a 0-d array (np.asarray(value))"
                        if obj.dtype.kind in "biufc"
                        else ""
                    )
                )
            return value
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return (yield from self._dict(fields, path, side))
        if isinstance(obj, dict | list | tuple):
            raise EncodeError(
                f"{_render(path)}: subclasses of dict, list and tuple "
                f"({kind.__name__}) are not supported; convert to the base type"
            )
        try:
            self.codec._encoder.encode(obj)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(
                f"{_render(path)}: cannot encode value of type "
                f"{kind.__module__}.{kind.__qualname__}: {exc}"
            ) from None
        return obj

    def _tick(self) -> Sliced[None]:
        if self.slicer.due():
            yield
            self.slicer.restart()

    def _struct(self, obj: msgspec.Struct, path: _Path, side: bool) -> Sliced[Any]:
        if self.codec.check is not None:
            self.codec.check(obj, _render(path))
        out = None
        for name in obj.__struct_fields__:
            old = getattr(obj, name)
            new = yield from self.value(old, (path, name), side or name in self.codec.sidecar)
            if new is not old:
                if out is None:
                    out = copy.copy(obj)  # shallow; unlike replace() it skips __post_init__
                msgspec.structs.force_setattr(out, name, new)
        yield from self._tick()
        return obj if out is None else out

    def _dict(self, obj: dict[Any, Any], path: _Path, side: bool) -> Sliced[dict[Any, Any]]:
        out = {}
        names = self.codec.sidecar
        for key, item in obj.items():
            out[key] = yield from self.value(item, (path, key), side or key in names)
            yield from self._tick()
        return out

    def _sequence(self, obj: list[Any] | tuple[Any, ...], path: _Path, side: bool) -> Sliced[Any]:
        out = []
        for i, item in enumerate(obj):
            if type(item) in _SCALARS:
                out.append(item)
                if i & 1023 == 1023:
                    yield from self._tick()
                continue
            out.append((yield from self.value(item, (path, i), side)))
            yield from self._tick()
        if len(out) > _CHUNK:
            return (yield from self._encode_long(out, path))
        return out if type(obj) is list else tuple(out)

    def _encode_long(self, items: list[Any], path: _Path) -> Sliced[msgspec.Raw]:
        """Encode a long sequence in groups of items, one slice each, so that a header with many
        samples never makes msgspec hold the GIL for long in one call."""
        body = []
        for start in range(0, len(items), _CHUNK):
            chunk = self.encode(items[start : start + _CHUNK], path, start)
            body.append(memoryview(chunk)[_array_header_size(chunk[0]) :])
            yield from self._tick()
        return msgspec.Raw(_array_header(len(items)) + b"".join(body))

    def encode(self, tree: Any, path: _Path, offset: int = 0) -> bytes:
        """msgspec-encode ``tree``, naming the path of a value msgspec refuses."""
        try:
            return self.codec._encoder.encode(tree)
        except (TypeError, ValueError, OverflowError) as exc:
            # Rare (e.g. an int beyond 64 bits): find the culprit's path the slow way.
            if isinstance(tree, list) and offset:
                tree = dict(enumerate(tree, offset))
            culprit = _find_unencodable(self.codec._encoder, tree, path)
            raise EncodeError(f"{_render(culprit)}: cannot encode: {exc}") from None

    def _add_buffer(self, view: memoryview, side: bool) -> int:
        index = len(self.buffers)
        self.buffers.append(view)
        if side:
            self.sidecar.append(index)
        return index

    def _array(self, arr: np.ndarray, path: _Path, side: bool) -> msgspec.msgpack.Ext:
        dtype = arr.dtype
        if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
            hint = (
                " (object arrays would need pickle, which rlwire never uses)"
                if dtype.kind == "O"
                else ""
            )
            raise EncodeError(
                f"{_render(path)}: numpy arrays of dtype {dtype} are not "
                f"supported; only bool and numeric dtypes are{hint}"
            )
        if arr.flags.c_contiguous:
            order, flat = "C", arr
        elif arr.flags.f_contiguous:
            order, flat = "F", arr.T
        else:
            order, flat = "C", np.ascontiguousarray(arr)
        shape = list(arr.shape)
        raw = flat.reshape(-1).view(np.uint8)
        if side or arr.nbytes >= self.codec.inline_threshold:
            index = self._add_buffer(raw.data, side)
            ref = _ArrayRef(index, dtype.str, shape, order)
            return msgspec.msgpack.Ext(EXT_ARRAY, self.codec._encoder.encode(ref))
        inline = _InlineArray(dtype.str, shape, order, raw.tobytes())
        return msgspec.msgpack.Ext(EXT_INLINE_ARRAY, self.codec._encoder.encode(inline))

    def _bytes(self, obj: bytes | bytearray | memoryview, path: _Path, side: bool) -> Any:
        view = memoryview(obj)
        if not view.contiguous:
            raise EncodeError(
                f"{_render(path)}: non-contiguous memoryview cannot be sent; "
                "copy it with bytes() first"
            )
        if side or view.nbytes >= self.codec.inline_threshold:
            index = self._add_buffer(as_byte_view(view), side)
            return msgspec.msgpack.Ext(EXT_BYTES, self.codec._encoder.encode(_BytesRef(index)))
        return obj if isinstance(obj, bytes | bytearray) else view.tobytes()


def _array_header_size(first: int) -> int:
    """Length of the msgpack array header that starts with byte ``first``."""
    return 1 if first & 0xF0 == 0x90 else 3 if first == 0xDC else 5


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _find_unencodable(encoder: msgspec.msgpack.Encoder, tree: Any, path: _Path) -> _Path:
    """The path of the first leaf of ``tree`` that ``encoder`` refuses (``path`` if none)."""
    if isinstance(tree, msgspec.Struct):
        items: Iterable[tuple[Any, Any]] = ((f, getattr(tree, f)) for f in tree.__struct_fields__)
    elif isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list | tuple):
        items = enumerate(tree)
    else:
        return path
    for key, item in items:
        try:
            encoder.encode(item)
        except (TypeError, ValueError, OverflowError):
            return _find_unencodable(encoder, item, (path, key))
    return path


def _buffer(buffers: Sequence[memoryview], index: int) -> memoryview:
    if not 0 <= index < len(buffers):
        raise CorruptFrameError(
            f"header refers to buffer {index} but the frame has {len(buffers)} buffers"
        )
    return buffers[index]


# Parsed dtypes by string. Bounded: _DTYPE_RE admits at most a few thousand strings.
_DTYPES: dict[str, np.dtype[Any]] = {}


def _dtype(dtype_str: str) -> np.dtype[Any]:
    dtype = _DTYPES.get(dtype_str)
    if dtype is None:
        if not _DTYPE_RE.fullmatch(dtype_str):
            raise CorruptFrameError(
                f"array descriptor: dtype {dtype_str!r} is not a plain bool or numeric dtype"
            )
        try:
            dtype = np.dtype(dtype_str)
        except TypeError as exc:
            raise CorruptFrameError(f"array descriptor: invalid dtype {dtype_str!r}") from exc
        _DTYPES[dtype_str] = dtype
    return dtype


def _make_array(
    buf: memoryview, dtype_str: str, shape: list[int], order: str, writable: bool
) -> np.ndarray:
    dtype = _dtype(dtype_str)
    if len(shape) > _MAX_NDIM or (shape and (min(shape) < 0 or max(shape) > sys.maxsize)):
        raise CorruptFrameError(f"array descriptor: invalid shape {shape}")
    count = math.prod(shape)
    if count * dtype.itemsize != buf.nbytes:
        raise CorruptFrameError(
            f"array descriptor: shape {shape} of {dtype_str} needs "
            f"{count * dtype.itemsize} bytes but its buffer has {buf.nbytes}"
        )
    if order not in ("C", "F"):
        raise CorruptFrameError(f"array descriptor: invalid order {order!r}")
    arr = np.frombuffer(buf, dtype=dtype, count=count)
    try:
        arr = arr.reshape(shape) if order == "C" else arr.reshape(shape[::-1]).T
    except ValueError as exc:  # e.g. a zero-size shape with a dimension numpy refuses
        raise CorruptFrameError(f"array descriptor: invalid shape {shape}: {exc}") from None
    if writable and not arr.flags.writeable:
        arr = arr.copy(order="K")
    return arr


def _dec_hook(tp: Any, obj: Any) -> Any:
    # Arrays and memoryviews come out of ext_hook already built; accept them as they are.
    if isinstance(tp, type) and isinstance(obj, tp):
        return obj
    raise TypeError(f"Expected `{_type_name(tp)}`, got `{type(obj).__name__}`")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)
