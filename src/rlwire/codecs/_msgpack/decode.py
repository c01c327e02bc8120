"""Decoding for the msgpack codec: arrays as views, chunked containers a slice at a time.

The header decodes first, in one msgspec call: it is light, because the encoder moved
every heavy container into chunks in an out-of-band buffer (see :mod:`._msgpack_encode`).
Each chunked container comes out of the header as an empty list or dict; its chunks then
decode one msgspec call each, straight into the annotation found at its path where the
receiver asked for a type, and fill it in place. A shape this cannot follow (a chunked
tuple, a tagged union of containers) falls back to filling plain builtins and converting
them whole: the same result, in one longer call.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import typing
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from rlwire._core.copying import copied
from rlwire._core.errors import CorruptFrameError, DecodeError, FrameTooLargeError, RlwireError
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._core.types import child_annotation, field_at, may_hold_buffer
from rlwire._frame.frame import Frame
from rlwire.codecs._msgpack.cost import WORST_RATIO, plain_cost
from rlwire.codecs._msgpack.encode import (
    EXT_ARRAY,
    EXT_BYTES,
    EXT_CHUNKED_ARRAY,
    EXT_CHUNKED_MAP,
    EXT_INLINE_ARRAY,
    _ArrayRef,
    _BytesRef,
    _ChunksRef,
    _InlineArray,
)

__all__ = ["Decoding"]

_MAX_NDIM = 64
_DTYPE_RE = re.compile(r"[<>|=][biufc][0-9]{1,2}")
_array_ref = msgspec.msgpack.Decoder(_ArrayRef)
_inline = msgspec.msgpack.Decoder(_InlineArray)
_bytes_ref = msgspec.msgpack.Decoder(_BytesRef)
_chunks_ref = msgspec.msgpack.Decoder(_ChunksRef)


class _Chunked:
    """A chunked container met in the header or in a chunk, before it is filled."""

    __slots__ = ("is_map", "ref")

    def __init__(self, is_map: bool, ref: _ChunksRef) -> None:
        self.is_map = is_map
        self.ref = ref


class _CannotFollow(Exception):
    """The typed result has no container to fill where the raw one had a chunked one."""


# A step of a path through raw data: (key, the kind of container it indexes).
_Step = tuple[Any, type]
# What assemble finds to fill in: (path, a chunked container or out-of-band bytes, the
# placeholder left in the raw data).
_Found = tuple[list[_Step], Any, Any]
_LOOK_INSIDE = (dict, list, _Chunked, memoryview)
_LOOK_INSIDE_SET = frozenset(_LOOK_INSIDE)
# Plain builtins decoded from one message may take this much heap, plus HEAP_RATIO
# times the message's size: far more than any header the encoder writes needs (it moves
# heavy containers into chunks), far less than a hostile one could make msgspec build.
HEAP_FLOOR = 256 << 20
HEAP_RATIO = 16
#: A msgpack array or map this long or longer is not decoded in one msgspec call: each
#: array or bytes value in it costs a Python callback, and thousands of them in one call
#: would hold the GIL for tens of ms. An array's items are decoded in runs of about this
#: many bytes, a map's values one by one, several calls to a time slice.
ITEMWISE_BYTES = 8 << 10
#: A list this long or longer is converted to ``list[T]`` in groups of
#: :data:`_CONVERT_GROUP` items, several groups to a time slice.
ITEMWISE_ITEMS = 64
_CONVERT_GROUP = 16
# An item of a long array this large is taken apart itself; smaller ones are decoded
# in runs of ITEMWISE_BYTES or so.
_ITEMWISE_BIG = 1 << 20
# How deep inside a message containers are taken apart item by item.
_ITEMWISE_DEPTH = 4
# Items smaller than this on average are decoded in one call.
_ITEMWISE_MIN_ITEM = 64
_raw_items = msgspec.msgpack.Decoder(list[msgspec.Raw])
_raw_values = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])


def _container(view: memoryview) -> type | None:
    """``list`` or ``dict`` if ``view`` is a msgpack array or map worth decoding item by
    item (see :data:`ITEMWISE_BYTES`), else None. Tiny items (numbers, empty lists)
    call no hook, and a view of each would cost more than the item: those go whole."""
    if view.nbytes < ITEMWISE_BYTES:
        return None
    first = view[0]
    if 0x80 <= first <= 0x8F:  # fixmap: a Struct's fields, say
        return dict
    widths = {0xDC: (list, 2), 0xDD: (list, 4), 0xDE: (dict, 2), 0xDF: (dict, 4)}
    if first not in widths:
        return None
    kind, width = widths[first]
    count = int.from_bytes(view[1 : 1 + width], "big")
    return kind if count * _ITEMWISE_MIN_ITEM <= view.nbytes else None


class Decoding:
    """Decodes one frame; :meth:`run` is the sliced generator."""

    def __init__(self, frame: Frame, writable: bool) -> None:
        self.buffers = frame.buffers
        self.header = frame.header
        self.writable = writable
        # Chunks are decoded at most twice (a typed try, then plain builtins): a chunk
        # table that makes the reader decode more than this is hostile.
        self.budget = 4 * frame.nbytes
        self.heap_left = self.heap_limit = HEAP_FLOOR + HEAP_RATIO * frame.nbytes
        self.nbytes = frame.nbytes
        self.timer = SliceTimer()
        # Data decoded so far charged its worst case, with that charge.
        self.unsettled: list[tuple[bytes | memoryview, int]] = []
        # Buffers referred to by arrays and bytes values: each may be referred to once,
        # or a small header could have one large buffer copied many times. (A typed
        # decode that fails and is tried again into builtins never took any: the types
        # tried first hold no arrays or bytes, so msgspec never calls the hook.)
        self.claimed: set[int] = set()
        self.claim_log: list[int] = []  # the same, in order: a failed try is undone
        self.typed: dict[Any, msgspec.msgpack.Decoder[Any]] = {}
        # What the extension hook made during the latest decode call: the walk that
        # looks for them stops once it has found them all, and is skipped if none.
        self.chunked_made = 0
        self.bytes_made = 0
        self.to_find = 0

    def ext_hook(self, code: int, data: memoryview) -> Any:
        try:
            if code == EXT_ARRAY:
                ref = _array_ref.decode(data)
                buf = self._claim(ref.index)
                return _make_array(buf, ref.dtype, ref.shape, ref.order, self.writable)
            if code == EXT_INLINE_ARRAY:
                inl = _inline.decode(data)
                return _make_array(
                    memoryview(inl.data), inl.dtype, inl.shape, inl.order, self.writable
                )
            if code == EXT_BYTES:
                buf = self._claim(_bytes_ref.decode(data).index)
                self.bytes_made += 1
                return bytearray(buf) if self.writable and buf.readonly else buf
            if code in (EXT_CHUNKED_ARRAY, EXT_CHUNKED_MAP):
                self.chunked_made += 1
                return self._chunked(code == EXT_CHUNKED_MAP, _chunks_ref.decode(data))
        except msgspec.DecodeError as exc:
            raise CorruptFrameError(f"header: malformed extension {code}: {exc}") from exc
        raise CorruptFrameError(
            f"header: unknown msgpack extension type {code} (written by a newer rlwire?)"
        )

    def _claim(self, index: int) -> memoryview:
        buf = _buffer(self.buffers, index)
        if index in self.claimed:
            raise CorruptFrameError(
                f"header refers to buffer {index} twice (an array or bytes value may "
                "have a buffer of its own only)"
            )
        self.claimed.add(index)
        self.claim_log.append(index)
        return buf

    def _chunked(self, is_map: bool, ref: _ChunksRef) -> _Chunked:
        buf = _buffer(self.buffers, ref.index)
        bounds = ref.ranges
        if ref.count < 0 or len(bounds) % 2 or (ref.count and not bounds):
            raise CorruptFrameError(f"chunked container: malformed chunk table {ref}")
        for start, end in zip(bounds[::2], bounds[1::2], strict=True):
            if not 0 <= start <= end <= buf.nbytes:
                raise CorruptFrameError(
                    f"chunked container: chunk {start}..{end} lies outside its "
                    f"{buf.nbytes}-byte buffer"
                )
        return _Chunked(is_map, ref)

    def decode(self, data: bytes | memoryview | msgspec.Raw, annotation: Any = None) -> Any:
        """One msgspec call: ``data`` as ``annotation`` (None: plain builtins)."""
        try:
            if annotation is None:
                self._charge(data)
                return msgspec.msgpack.decode(data, ext_hook=self.ext_hook)
            decoder = self.typed.get(annotation)
            if decoder is None:
                decoder = self.typed[annotation] = msgspec.msgpack.Decoder(
                    annotation, ext_hook=self.ext_hook, dec_hook=_dec_hook
                )
            return decoder.decode(data)
        except RlwireError:
            raise
        except msgspec.ValidationError as exc:
            if annotation is not None:
                raise  # the caller tries again into plain builtins
            raise CorruptFrameError(f"header: {exc}") from exc  # e.g. a bad timestamp
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise CorruptFrameError(f"header: {exc}") from exc
        except (TypeError, ValueError) as exc:  # e.g. a bytes extension used as a map key
            raise CorruptFrameError(f"header: malformed: {exc}") from exc

    def _charge(self, data: bytes | memoryview) -> None:
        """Take what decoding ``data`` into plain builtins costs from the message's
        heap allowance, or refuse it (before decoding) if that is more than what is
        left. Data is charged its worst case unless that does not fit: then what was
        charged so far is walked to tell its real cost, and so is ``data``."""
        worst = WORST_RATIO * memoryview(data).nbytes  # data: bytes, a view or a Raw
        if worst > self.heap_left and self.unsettled:
            for earlier, charged in self.unsettled:
                self.heap_left += charged - plain_cost(earlier, self.heap_limit)
            self.unsettled.clear()
        if worst <= self.heap_left:
            self.unsettled.append((data, worst))
            self.heap_left -= worst
            return
        cost = plain_cost(data, self.heap_left)
        if cost > self.heap_left:
            raise FrameTooLargeError(
                f"header: decoding it would build over {self.heap_limit >> 20} MiB "
                f"of Python objects from a {self.nbytes}-byte message (the limit is "
                f"{HEAP_RATIO} times the message's size + {HEAP_FLOOR >> 20} MiB): "
                "it is made of tiny values, such as empty lists or maps. Received "
                "into a Struct type, fields the type does not declare are skipped "
                "without being built"
            )
        self.heap_left -= cost

    def run(self, annotation: Any) -> Sliced[Any]:
        """The header decoded into ``annotation`` (``Any``: plain builtins)."""
        self.chunked_made = self.bytes_made = 0
        skeleton = _skeleton(annotation) if isinstance(annotation, type) else None
        raw = (yield from self._known_fields(skeleton)) if skeleton is not None else _NONE
        if raw is _NONE:
            raw = yield from self.plain(self.header)
        yield
        return (yield from self.assemble(raw, annotation))

    def plain(self, data: bytes | memoryview | msgspec.Raw, depth: int = 0) -> Sliced[Any]:
        """``data`` decoded into plain builtins; a long msgpack array in runs of items,
        and a map with string keys value by value, down to :data:`_ITEMWISE_DEPTH`
        levels (see :data:`ITEMWISE_BYTES`)."""
        kind = _container(memoryview(data).cast("B")) if depth < _ITEMWISE_DEPTH else None
        try:
            if kind is dict:
                fields = _raw_values.decode(data)
            elif kind is list:
                items = _raw_items.decode(data)
            else:
                return self.decode(data)
        except (msgspec.DecodeError, RecursionError):  # keys other than strings, malformed
            return self.decode(data)  # the whole decode says what is wrong, if anything
        if kind is dict:
            out: dict[str, Any] = {}
            for key, value in fields.items():
                out[key] = yield from self.plain(value, depth + 1)
            return out
        values: list[Any] = []
        run: list[msgspec.Raw] = []  # small items, decoded together as one array
        run_bytes = 0
        for item in items:
            size = len(memoryview(item))
            if size >= _ITEMWISE_BIG:  # e.g. a list of lists of samples
                values += self._run(run)
                run, run_bytes = [], 0
                values.append((yield from self.plain(item, depth + 1)))
            else:
                run.append(item)
                run_bytes += size
                if run_bytes < ITEMWISE_BYTES:
                    continue
                values += self._run(run)
                run, run_bytes = [], 0
            if self.timer.due():
                yield
                self.timer.restart()
        values += self._run(run)
        return values

    def _run(self, items: list[msgspec.Raw]) -> list[Any]:
        """Consecutive small items of an array, decoded in one call (as an array of
        them: one call per item would cost more than the item)."""
        if len(items) < 2:
            return [self.decode(item) for item in items]
        joined = b"\xdd" + len(items).to_bytes(4, "big") + b"".join(items)
        decoded: list[Any] = self.decode(joined)
        return decoded

    def converted(self, raw: Any, annotation: Any) -> Sliced[Any]:
        """``raw`` (plain builtins) converted to ``annotation``; a long list into
        ``list[T]`` in groups (see :data:`ITEMWISE_ITEMS`)."""
        item = _list_item(annotation)
        if item is None or type(raw) is not list or len(raw) < ITEMWISE_ITEMS:
            return _convert(raw, annotation)
        out: list[Any] = []
        for start in range(0, len(raw), _CONVERT_GROUP):
            group = raw[start : start + _CONVERT_GROUP]
            try:
                out += msgspec.convert(group, annotation, dec_hook=_dec_hook)
            except msgspec.ValidationError as exc:
                where = _shift_index(str(exc), start)
                raise DecodeError(
                    f"received data does not match {_type_name(annotation)}: {where}"
                ) from exc
            if self.timer.due():
                yield
                self.timer.restart()
        return out

    def _known_fields(self, skeleton: _Skeleton) -> Sliced[Any]:
        """The header of a Struct, with only the fields the receiving type knows
        decoded: the others are skipped in C, so that a header cannot make the reader
        build objects the type would drop anyway. ``_NONE`` if it is not such a Struct's
        header (the plain decode then says what is wrong)."""
        try:
            parts = skeleton.decoder.decode(self.header)
        except msgspec.ValidationError as exc:
            if bytes(self.header[:1]) in _EXT_MARKERS:  # e.g. a heavy dict sent whole, chunked
                return _NONE
            # Not the type's shape: say so now, without building what the header holds.
            raise DecodeError(
                f"received data does not match {_type_name(skeleton.cls)}: {exc}"
            ) from exc
        except msgspec.DecodeError:
            return _NONE  # malformed: the plain decode says where
        values = [getattr(parts, f"f{i}") for i in range(len(skeleton.names))]
        if skeleton.array_like:
            while values and values[-1] is msgspec.UNSET:
                values.pop()
            if msgspec.UNSET in values:
                return _NONE
            out = [] if skeleton.tag is None else [skeleton.tag]
            for value in values:
                out.append((yield from self.plain(value)))
            return out
        raw = {} if skeleton.tag is None else {skeleton.tag_field: skeleton.tag}
        for name, value in zip(skeleton.names, values, strict=True):
            if value is not msgspec.UNSET:
                raw[name] = yield from self.plain(value)
        return raw

    def assemble(self, raw: Any, annotation: Any) -> Sliced[Any]:
        """``raw`` (plain builtins, with chunked containers unfilled, just decoded) as
        ``annotation``.

        Out-of-band bytes come out of the header as memoryviews: into a field annotated
        ``bytes`` they are copied, each in a slice of its own, not all in one call.
        """
        if annotation is Any or annotation is object:
            annotation = None
        found: list[_Found] = []
        into_type = annotation is not None
        self.to_find = self.chunked_made + (self.bytes_made if into_type else 0)
        if self.to_find:
            raw = yield from self._unfilled(raw, (), found, typed=into_type)
        if annotation is None:
            typed = raw
        else:
            try:
                typed = yield from self.converted(raw, annotation)
            except DecodeError:
                if not found:
                    raise
                typed = None  # e.g. a dict received into a Struct: fill, then convert
        if typed is not None:
            claims = len(self.claim_log)
            try:
                for path, payload, _ in found:
                    inner = _annotation_at(annotation, path)
                    if inner is None:  # e.g. inside a tagged union: no type to aim at
                        raise _CannotFollow
                    if isinstance(payload, _Chunked):
                        yield from self._fill(_follow(typed, path), payload, inner)
                    elif path:
                        _put(typed, path, (yield from _as_annotated(payload, inner)))
                        yield
                    else:  # the whole message is one out-of-band bytes value
                        typed = yield from _as_annotated(payload, inner)
                return typed
            except _CannotFollow:
                # The typed try is dropped, with what it decoded: its buffers may be
                # claimed again, and its chunks decoded again from the start.
                self.claimed.difference_update(self.claim_log[claims:])
                del self.claim_log[claims:]
        for path, payload, placeholder in found:
            if isinstance(payload, _Chunked):
                placeholder.clear()  # the typed try may have filled it part way
                yield from self._fill(placeholder, payload, None)
            elif path:
                _put(raw, path, payload)
            else:
                raw = payload
        yield
        return (yield from self.converted(raw, annotation))

    def _unfilled(
        self, raw: Any, path: tuple[Any, ...], found: list[_Found], *, typed: bool
    ) -> Sliced[Any]:
        """``raw`` with each chunked container replaced by an empty one and, when it is
        to be converted to a type, each out-of-band bytes value by ``b""``; each
        recorded in ``found`` with its path and placeholder. Stops once it has found
        all :attr:`to_find`: a header full of other containers costs no walk past them.
        ``path`` is a chain ``(parent chain, step)``, made into a list only when found."""
        if isinstance(raw, _Chunked):
            empty: Any = {} if raw.is_map else []
            found.append((_steps(path), raw, empty))
            self.to_find -= 1
            return empty
        if typed and type(raw) is memoryview:
            found.append((_steps(path), raw, b""))
            self.to_find -= 1
            return b""
        if type(raw) is dict:
            for key, value in raw.items():
                if type(value) in _LOOK_INSIDE and value:
                    step: _Step = (key, dict)
                    raw[key] = yield from self._unfilled(value, (path, step), found, typed=typed)
                    if not self.to_find:
                        break
        elif type(raw) is list:
            if _LOOK_INSIDE_SET.isdisjoint(set(map(type, raw))):  # in C: lists of numbers
                return raw
            for i, value in enumerate(raw):
                if type(value) in _LOOK_INSIDE and value:
                    step = (i, list)
                    raw[i] = yield from self._unfilled(value, (path, step), found, typed=typed)
                    if not self.to_find:
                        break
                if i & 4095 == 4095:
                    yield
        return raw

    def _fill(self, target: Any, chunked: _Chunked, annotation: Any) -> Sliced[None]:
        """Decode ``chunked``'s chunks one call each and add them to ``target``."""
        ref, view = chunked.ref, _buffer(self.buffers, chunked.ref.index)
        kind = dict if chunked.is_map else list
        if type(target) is not kind:
            raise _CannotFollow
        before = len(target)
        for start, end in zip(ref.ranges[::2], ref.ranges[1::2], strict=True):
            self.budget -= end - start
            if self.budget < 0:
                raise CorruptFrameError(
                    "chunked containers: the chunk tables refer to far more data than "
                    "the message holds"
                )
            part = yield from self._chunk(view[start:end], annotation, kind)
            if isinstance(target, dict):
                target.update(part)
            else:
                target.extend(part)
            if self.timer.due():  # chunks are short: several to a slice
                yield
                self.timer.restart()
        if len(target) - before != ref.count:
            raise CorruptFrameError(
                f"chunked container: its chunks hold {len(target) - before} items, "
                f"its table says {ref.count}"
            )

    def _chunk(self, data: memoryview, annotation: Any, kind: type) -> Sliced[Any]:
        if annotation is not None and not may_hold_buffer(annotation):
            try:  # straight into the type: one pass, the common case
                part = self.decode(data, annotation)
            except msgspec.ValidationError:
                part = None  # a nested chunked container, or bytes where out of band
            if part is not None:
                if not isinstance(part, kind):
                    raise _CannotFollow
                return part
        self.chunked_made = self.bytes_made = 0
        raw = yield from self.plain(data)
        if type(raw) is not kind:
            raise CorruptFrameError(f"chunked container: a chunk is a {type(raw).__name__}")
        return (yield from self.assemble(raw, annotation))


_NONE: Any = object()
#: First bytes of a msgpack extension value (fixext 1-16, ext 8/16/32).
_EXT_MARKERS = {bytes([b]) for b in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9)}


class _Skeleton:
    """A Struct type's fields as :class:`msgspec.Raw` values, to decode its known
    fields only."""

    __slots__ = ("array_like", "cls", "decoder", "names", "tag", "tag_field")

    def __init__(self, cls: type[msgspec.Struct]) -> None:
        self.cls = cls
        config = cls.__struct_config__
        self.names = tuple(f.encode_name for f in msgspec.structs.fields(cls))
        self.array_like = config.array_like
        self.tag, self.tag_field = config.tag, config.tag_field
        fields = [
            (f"f{i}", msgspec.Raw | msgspec.UnsetType, msgspec.UNSET)
            for i in range(len(self.names))
        ]
        shape = msgspec.defstruct(
            f"{cls.__name__}Fields",
            fields,
            array_like=config.array_like,
            tag=config.tag,
            tag_field=config.tag_field,
            rename={f"f{i}": name for i, name in enumerate(self.names)},
        )
        self.decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(shape)


@functools.cache
def _skeleton(annotation: type) -> _Skeleton | None:
    """The skeleton of a Struct type that ignores unknown fields, else ``None``."""
    if not issubclass(annotation, msgspec.Struct):
        return None
    if annotation.__struct_config__.forbid_unknown_fields:
        return None
    return _Skeleton(annotation)


def _steps(chain: tuple[Any, ...]) -> list[_Step]:
    """The steps of a path chain ``(parent chain, step)``, root first."""
    steps: list[_Step] = []
    while chain:
        chain, step = chain
        steps.append(step)
    steps.reverse()
    return steps


def _follow(typed: Any, path: list[_Step]) -> Any:
    """The value at ``path`` (raw keys) inside the typed object."""
    for key, _ in path:
        if isinstance(typed, msgspec.Struct):
            field = field_at(type(typed), key)
            if field is None:
                raise _CannotFollow
            typed = getattr(typed, field.name)
        elif isinstance(typed, dict | list):
            try:
                typed = typed[key]
            except (KeyError, IndexError, TypeError):
                raise _CannotFollow from None
        else:
            raise _CannotFollow
    return typed


def _put(container: Any, path: list[_Step], value: Any) -> None:
    """Set the value at ``path`` (raw keys) inside ``container`` to ``value``."""
    parent, (key, _) = _follow(container, path[:-1]), path[-1]
    if isinstance(parent, msgspec.Struct):
        field = field_at(type(parent), key)
        if field is None:
            raise _CannotFollow
        msgspec.structs.force_setattr(parent, field.name, value)
    elif isinstance(parent, dict | list):
        parent[key] = value
    else:
        raise _CannotFollow


def _as_annotated(view: memoryview, annotation: Any) -> Sliced[Any]:
    """Out-of-band bytes as a field annotated ``annotation`` wants them: the view itself
    (no copy) for ``memoryview`` or ``Any``, a copy for ``bytes`` or ``bytearray`` (made
    with the GIL released, a slice at a time)."""
    members = {annotation, *typing.get_args(annotation)}
    if memoryview in members or Any in members or object in members:
        return view
    if bytes in members:
        return (yield from copied(view, bytes))
    if bytearray in members:
        return (yield from copied(view, bytearray))
    return _convert(view, annotation)  # raises DecodeError naming the mismatch


def _annotation_at(annotation: Any, path: list[_Step]) -> Any:
    """The annotation at ``path`` inside ``annotation``; None when it cannot be told."""
    for key, container in path:
        if annotation is None:
            return None
        annotation = child_annotation(annotation, key, container)
    return annotation


def _shift_index(message: str, by: int) -> str:
    """A msgspec error message about part of a list, with its path made the whole
    list's: ``$[i]`` becomes ``$[by + i]``."""
    return re.sub(r" - at `\$\[(\d+)\]", lambda m: f" - at `$[{by + int(m[1])}]", message, count=1)


def _list_item(annotation: Any) -> Any:
    """``T`` of an annotation ``list[T]``, else None."""
    if typing.get_origin(annotation) is list:
        args = typing.get_args(annotation)
        return args[0] if args else None
    return None


def _convert(raw: Any, annotation: Any) -> Any:
    if annotation is None:
        return raw
    try:
        return msgspec.convert(raw, annotation, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"received data does not match {_type_name(annotation)}: {exc}") from exc


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
    dtype = _DTYPES.get(dtype_str) or _dtype(dtype_str)
    if len(shape) == 1 and order == "C" and 0 <= shape[0] * dtype.itemsize == buf.nbytes:
        arr = np.frombuffer(buf, dtype=dtype, count=shape[0])  # the common case, quickly
    else:  # the general case, which also says what is wrong
        arr = _shaped_array(buf, dtype, dtype_str, shape, order)
    if writable and not arr.flags.writeable:
        arr = arr.copy(order="K")
    return arr


def _shaped_array(
    buf: memoryview, dtype: np.dtype[Any], dtype_str: str, shape: list[int], order: str
) -> np.ndarray:
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
        return arr.reshape(shape) if order == "C" else arr.reshape(shape[::-1]).T
    except ValueError as exc:  # e.g. a zero-size shape with a dimension numpy refuses
        raise CorruptFrameError(f"array descriptor: invalid shape {shape}: {exc}") from None


def _dec_hook(tp: Any, obj: Any) -> Any:
    # Arrays and memoryviews come out of ext_hook already built; accept them as they are.
    if isinstance(tp, type) and isinstance(obj, tp):
        return obj
    raise TypeError(f"Expected `{_type_name(tp)}`, got `{type(obj).__name__}`")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)
