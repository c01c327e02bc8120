"""One encoding pass of the msgpack codec: buffers out of band, heavy containers chunked.

The pass walks the object in Python only where an out-of-band buffer can be (numpy
arrays, bytes-like values; Struct fields whose annotation allows them, see
:mod:`rlwire._core.types`) and swaps each buffer for a small extension value
(:mod:`rlwire.codecs._msgpack.sent_buffers`). Everything else is left to msgspec, which
encodes it in C; plain builtins are weighed without the walk, and left as they are
(:mod:`rlwire.codecs._msgpack.plain_values`).

msgspec holds the GIL for the whole of one call, so no call may get much work: each
value carries a *weight*, an estimate of the items msgspec must write for it. A container
heavier than :data:`CHUNK_WEIGHT` is cut into chunks of at most that weight, each encoded
by its own call, in its own time slice; the chunks are then copied, with the GIL
released, into one buffer (the *bulk* buffer, an out-of-band buffer like any other); the
header holds a small extension value that lists where the chunks are. What is left for
the header is light, and a receiver can decode the chunks one slice at a time too.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from itertools import islice, repeat
from operator import add
from typing import Any

import msgspec
import numpy as np

from rlwire._core.chunked import Chunked
from rlwire._core.columns import Columns
from rlwire._core.errors import EncodeError
from rlwire._core.paths import KeyPath, render_path
from rlwire._core.ragged import Ragged
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._frame.frame import Frame
from rlwire.codecs._msgpack.entries import Entries, mapping_entries
from rlwire.codecs._msgpack.extensions import EXT_CHUNKED_ARRAY, EXT_CHUNKED_MAP, ChunksRef
from rlwire.codecs._msgpack.plain_values import CHUNK_WEIGHT, PlainWeights
from rlwire.codecs._msgpack.refused_values import (
    REFUSED,
    refuse,
    scalar,
    unencodable_path,
    walked_fields,
)
from rlwire.codecs._msgpack.sent_buffers import SentBuffers
from rlwire.codecs._msgpack.sent_columns import list_as_columns, packed_value
from rlwire.codecs._msgpack.weights import SCALARS, SCAN, run_weights, weight
from rlwire.codecs._registry import Check

__all__ = ["CHUNK_WEIGHT", "Encoding", "weight"]

# A container lighter than this is never worth chunking on its own.
_MIN_CHUNKED = 1024
# Entries looked at a time when adding up their weights.
_LOOK = 8192
# Items of a chunked container weighed at a time.
_RUN = 512

_BUFFER_LIKE = (np.ndarray, bytes, bytearray, memoryview)
_WALKED = (*_BUFFER_LIKE, *REFUSED)  # looked at in any Struct field, whatever its annotation
_PACKED = frozenset((Ragged, Columns, Chunked))  # packed by the user: one buffer a field


class Encoding:
    """One pass over one object; :meth:`run` returns its :class:`~rlwire.Frame`."""

    def __init__(
        self,
        encoder: msgspec.msgpack.Encoder,
        *,
        sidecar: frozenset[str],
        inline_threshold: int,
        check: Check | None,
    ) -> None:
        self.encoder = encoder
        self.sidecar_names = sidecar
        self.matched: set[str] = set()  # the sidecar names met as a field or key
        self.check = check
        self.sent = SentBuffers(encoder, inline_threshold)
        self.plain = PlainWeights(sidecar, inline_threshold)
        self.timer = SliceTimer()
        # Above 0 while a Struct already walked is walked again (to chunk its heavy
        # fields): the extension values in it are the codec's own, not the user's.
        self.again = 0

    def run(self, obj: Any) -> Sliced[Frame]:
        try:
            tree, heft = yield from self.value(obj, None, False)
            if heft > CHUNK_WEIGHT and type(tree) in (list, tuple, dict):
                tree = yield from self.chunked(tree, None)
        except RecursionError:
            raise EncodeError(
                "$: nests too deeply for Python's recursion limit (or contains itself)"
            ) from None
        yield
        header = self.encode(tree, None)
        yield from self.sent.join_bulk()
        return Frame(header, tuple(self.sent.buffers), frozenset(self.sent.sidecar))

    # -- the walk -----------------------------------------------------------------------

    def tick(self) -> Sliced[None]:
        if self.timer.due():
            yield
            self.timer.restart()

    def value(self, obj: Any, path: KeyPath, side: bool) -> Sliced[tuple[Any, int]]:
        """``(what to encode in obj's place, its weight)``."""
        kind = type(obj)
        if kind in SCALARS:
            return obj, (1 + len(obj) // 64 if kind is str else 1)
        if isinstance(obj, np.ndarray):
            return self.sent.array(obj, path, side), 1
        if kind in _PACKED:
            return (yield from packed_value(self, obj, path, side)), 1
        if isinstance(obj, msgspec.Struct):
            return (yield from self.struct(obj, path, side))
        if kind is dict:
            return (yield from self.mapping(obj, path, side))
        if kind is list or kind is tuple:
            return (yield from self.sequence(obj, path, side))
        if isinstance(obj, bytes | bytearray | memoryview) and not isinstance(obj, np.generic):
            # (a np.bytes_ is bytes too: a numpy scalar, refused by leaf() at any size)
            return self.sent.bytes_value(obj, path, side)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return (yield from self.mapping(_dataclass_fields(obj), path, side))
        if isinstance(obj, dict | list | tuple):
            raise EncodeError(
                f"{render_path(path)}: subclasses of dict, list and tuple "
                f"({kind.__name__}) are not supported; convert to the base type"
            )
        return self.leaf(obj, path), 1

    def leaf(self, obj: Any, path: KeyPath) -> Any:
        """What to encode in place of ``obj``, a value the walk does not look into."""
        if isinstance(obj, np.generic):
            return scalar(obj, path)
        if isinstance(obj, REFUSED):
            if self.again:
                return obj
            raise refuse(obj, path)
        try:
            self.encoder.encode(obj)
        except (TypeError, ValueError, OverflowError) as exc:
            kind = type(obj)
            raise EncodeError(
                f"{render_path(path)}: cannot encode value of type "
                f"{kind.__module__}.{kind.__qualname__}: {exc}"
            ) from None
        return obj

    def struct(self, obj: msgspec.Struct, path: KeyPath, side: bool) -> Sliced[tuple[Any, int]]:
        if self.check is not None:
            self.check(obj, render_path(path))
            yield from self.tick()
        fields = walked_fields(type(obj))
        names = [name for name, _, _ in fields]
        entries = Entries([getattr(obj, name) for name in names], names)
        for i, (name, encoded, walked) in enumerate(fields):
            old = entries.items[i]
            # The annotation is a promise Python does not keep: look at what is there.
            if walked or isinstance(old, _WALKED):
                named = self.named(name, encoded)
                new, heft = yield from self.value(old, (path, name), side or named)
                entries.put(i, new)
            else:
                heft = weight(old)
            entries.weights.append(heft)
        total = yield from self.lighten(entries, path)
        out = obj
        for name, new in zip(names, entries.values(), strict=True):
            if new is not getattr(obj, name):
                if out is obj:
                    out = copy.copy(obj)  # shallow; unlike replace() it skips __post_init__
                msgspec.structs.force_setattr(out, name, new)
        yield from self.tick()
        return out, total

    def named(self, name: Any, encoded: Any) -> bool:
        """Whether a field or key is one of the sidecar names, by its attribute name or
        its encoded name (a Struct's renamed field answers to both, alone or stored as a
        column of a list); the names met are noted."""
        named = False
        for met in (name, encoded):
            if met in self.sidecar_names:
                self.matched.add(met)
                named = True
        return named

    def mapping(self, obj: dict[Any, Any], path: KeyPath, side: bool) -> Sliced[tuple[Any, int]]:
        entries = yield from mapping_entries(obj)
        if self.sidecar_names and not self.sidecar_names.isdisjoint(obj):
            for i, (key, item) in enumerate(obj.items()):
                named = self.named(key, key)
                new, heft = yield from self.value(item, (path, key), side or named)
                entries.put(i, new)
                entries.weights.append(heft + 1)
                yield from self.tick()
        else:  # no key is a sidecar name
            yield from self.weigh(entries, path, side, 1)
        total = yield from self.lighten(entries, path)
        if entries.changed:
            obj = dict(zip(obj, entries.values(), strict=True))
        yield from entries.release()
        return obj, total + 1

    def sequence(
        self, obj: list[Any] | tuple[Any, ...], path: KeyPath, side: bool
    ) -> Sliced[tuple[Any, int]]:
        if not obj:
            return obj, 1
        if type(obj[0]) in SCALARS and (yield from self.only_scalars(obj)):
            return obj, weight(obj)
        if type(obj) is list:
            columns = yield from list_as_columns(self, obj, path, side)
            if columns is not None:
                return columns, 1
        entries = Entries(obj)
        yield from self.weigh(entries, path, side, 0)
        total = yield from self.lighten(entries, path)
        if not entries.changed:
            return obj, total + 1
        out = entries.values()
        return (out if type(obj) is list else tuple(out)), total + 1

    def weigh(self, entries: Entries, path: KeyPath, side: bool, extra: int) -> Sliced[None]:
        """The weight (+ ``extra``) of each item of ``entries``, and what to encode in
        its place: runs of plain ones weighed a run per slice, without the walk and left
        as they are (:mod:`rlwire.codecs._msgpack.plain_values`), the others walked."""
        items = entries.items
        i, n = 0, len(items)
        while i < n:
            if not side:
                weights, stopped = self.plain.weights(items, i)
                entries.weights += map(add, weights, repeat(extra))
                i += len(weights)
                yield from self.tick()
                if not stopped:
                    continue
            new, heft = yield from self.value(items[i], (path, entries.key(i)), side)
            entries.put(i, new)
            entries.weights.append(heft + extra)
            i += 1
            yield from self.tick()

    def only_scalars(self, items: list[Any] | tuple[Any, ...]) -> Sliced[bool]:
        """True if every item is a plain scalar, checked in C a group of items at a time."""
        for start in range(0, len(items), SCAN):
            if not set(map(type, items[start : start + SCAN])) <= SCALARS:
                return False
            yield from self.tick()
        return True

    def lighten(self, entries: Entries, path: KeyPath) -> Sliced[int]:
        """If ``entries`` (updated in place) weigh more than
        CHUNK_WEIGHT together, chunk every container among them that is not light;
        returns their weight then.

        Every one, not just enough to get under the limit: a chunk that holds a list
        inline beside a chunked one decodes in two passes, a list on its own in one.
        """
        weights = entries.weights
        total = 0
        for start in range(0, len(weights), _LOOK):
            total += sum(weights[start : start + _LOOK])
            yield from self.tick()
        if total <= CHUNK_WEIGHT:
            return total
        for start in range(0, len(weights), _LOOK):
            run = weights[start : start + _LOOK]
            for i in [i for i, heft in enumerate(run, start) if heft >= _MIN_CHUNKED]:
                value = entries.value(i)
                if type(value) in (list, tuple, dict):
                    entries.put(i, (yield from self.chunked(value, (path, entries.key(i)))))
                    total -= weights[i] - 1
                    weights[i] = 1
            yield from self.tick()
        return total

    # -- chunked containers -----------------------------------------------------------

    def heavy(self, column: list[Any], heft: int, path: KeyPath) -> Sliced[tuple[Any, int]]:
        """``column`` (a list of encoded values weighing ``heft``), chunked if heavy."""
        if heft > CHUNK_WEIGHT and len(column) >= 2:
            return (yield from self.chunked(column, path)), 1
        return column, heft

    def chunked(self, obj: Any, path: KeyPath) -> Sliced[msgspec.msgpack.Ext]:
        """Encode the list, tuple or dict ``obj`` as chunks in the bulk buffer; return the
        extension value that stands for it."""
        is_map = type(obj) is dict
        n = len(obj)
        first = next(iter(obj.values())) if is_map else obj[0]
        ranges: list[int] = []
        if type(first) in SCALARS:
            # A run of scalars: cut by count, straight from obj, with no copy of it all
            # (copying a list of millions holds the GIL for milliseconds).
            per = max(1, CHUNK_WEIGHT // max(weight(first), 1))
            entries = iter(obj.items()) if is_map else None
            for a in range(0, n, per):
                group = obj[a : a + per] if entries is None else dict(islice(entries, per))
                ranges += self.encode_chunk(group, path, a)
                yield from self.tick()
        else:  # a sequence is copied only if an item is chunked on its own
            entries = (yield from mapping_entries(obj)) if is_map else Entries(obj)
            keys = entries.keys
            bounds = yield from self.bounds(entries, path)
            for a, b in itertools.pairwise(bounds):
                values = entries.items[a:b]
                if entries.changed:
                    values = [entries.value(i) for i in range(a, b)]
                group = values if keys is None else dict(zip(keys[a:b], values, strict=True))
                ranges += self.encode_chunk(group, path, a)
                yield from self.tick()
        ref = ChunksRef(self.sent.bulk_index, n, ranges)
        code = EXT_CHUNKED_MAP if is_map else EXT_CHUNKED_ARRAY
        return msgspec.msgpack.Ext(code, self.encoder.encode(ref))

    def bounds(self, entries: Entries, path: KeyPath) -> Sliced[list[int]]:
        """Where to cut ``entries``' items (a container among them chunked on its own
        where heavier than a chunk) so that no chunk weighs more than CHUNK_WEIGHT;
        weighed a run at a time."""
        bounds, load, items = [0], 0, entries.items
        for start in range(0, len(items), _RUN):
            for i, heft in enumerate(run_weights(items[start : start + _RUN]), start):
                if heft > CHUNK_WEIGHT:
                    heft = yield from self.alone(entries, i, path, heft)
                if load and load + heft > CHUNK_WEIGHT:
                    bounds.append(i)
                    load = 0
                load += heft
            yield from self.tick()
        bounds.append(len(items))
        return bounds

    def alone(self, entries: Entries, i: int, path: KeyPath, heft: int) -> Sliced[int]:
        """Item ``i`` of ``entries``, heavier than a chunk (``heft``): a container becomes
        chunks of its own, a Struct's heavy fields do; its weight then."""
        key, value = entries.key(i), entries.items[i]
        if type(value) in (list, tuple, dict):
            value, heft = (yield from self.chunked(value, (path, key))), 1
        elif isinstance(value, msgspec.Struct):  # its heavy fields become chunks
            self.again += 1  # walked already: its extension values are the codec's
            try:
                value, heft = yield from self.struct(value, (path, key), False)
            finally:
                self.again -= 1
        entries.put(i, value)
        return heft

    def encode_chunk(self, group: Any, path: KeyPath, offset: int) -> list[int]:
        """Encode ``group`` (a chunk's items) into the bulk buffer; its ``[start, end]``."""
        try:
            chunk = self.encoder.encode(group)
        except (TypeError, ValueError, OverflowError) as exc:
            tree = dict(enumerate(group, offset)) if isinstance(group, list | tuple) else group
            culprit = unencodable_path(self.encoder, tree, path)
            raise EncodeError(f"{render_path(culprit)}: cannot encode: {exc}") from None
        return self.sent.add_chunk(chunk)

    def encode(self, tree: Any, path: KeyPath) -> bytes:
        """msgspec-encode ``tree``, naming the path of a value msgspec refuses."""
        try:
            return self.encoder.encode(tree)
        except (TypeError, ValueError, OverflowError) as exc:
            culprit = unencodable_path(self.encoder, tree, path)
            raise EncodeError(f"{render_path(culprit)}: cannot encode: {exc}") from None


def _dataclass_fields(obj: Any) -> dict[str, Any]:
    """A dataclass instance's fields by name, as msgspec encodes it: a field never set
    (``field(init=False)`` left unassigned) is left out."""
    fields = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name, _UNSET)
        if value is not _UNSET:
            fields[field.name] = value
    return fields


_UNSET: Any = object()
