"""Decoding for the msgpack codec: arrays as views, chunked containers a slice at a time.

The header decodes first, in one msgspec call: it is light, because the encoder moved
every heavy container into chunks in an out-of-band buffer (see
:mod:`rlwire.codecs._msgpack.encode`). Each chunked container comes out of the header as
an empty list or dict; its chunks then decode one msgspec call each, straight into the
annotation found at its path where the receiver asked for a type, and fill it in place.
A shape this cannot follow (a chunked tuple, a tagged union of containers) falls back to
filling plain builtins and converting them whole: the same result, in one longer call.

Around this skeleton: :mod:`~rlwire.codecs._msgpack.received_buffers` (what extension
values become), :mod:`~rlwire.codecs._msgpack.decode_calls` (each msgspec call, short and
within the heap allowance), :mod:`~rlwire.codecs._msgpack.known_fields` (a Struct's
header without the fields its type drops), :mod:`~rlwire.codecs._msgpack.conversion`
(into the receiver's type) and :mod:`~rlwire.codecs._msgpack.typed_paths`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rlwire._core.column_types import check_column_types
from rlwire._core.errors import CorruptFrameError, DecodeError
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._core.types import may_hold_buffer
from rlwire._frame.frame import Frame
from rlwire.codecs._msgpack.allowance import HeapAllowance
from rlwire.codecs._msgpack.conversion import as_annotated, converted
from rlwire.codecs._msgpack.cost import DICT_ITEM, LIST_ITEM
from rlwire.codecs._msgpack.decode_calls import DecodeCalls
from rlwire.codecs._msgpack.extensions import ROWS_AS_ARRAYS
from rlwire.codecs._msgpack.fields import check_fields_present
from rlwire.codecs._msgpack.known_fields import known_fields, skeleton
from rlwire.codecs._msgpack.received_buffers import Chunked, ReceivedBuffers, unbounded
from rlwire.codecs._msgpack.received_columns import (
    ROW_COST,
    ColumnsFound,
    columns_of,
    in_column,
    rows_of,
    structs_of,
)
from rlwire.codecs._msgpack.typed_paths import (
    CannotFollow,
    RawStep,
    annotation_at,
    follow,
    put,
    render_raw,
    steps,
)

__all__ = ["Decoding"]

# What assemble finds to fill in: (path, a chunked container or out-of-band bytes, the
# placeholder left in the raw data).
_Found = tuple[list[RawStep], Any, Any]
_LOOK_INSIDE = (dict, list, Chunked, memoryview, ColumnsFound)
_LOOK_INSIDE_SET = frozenset(_LOOK_INSIDE)
#: Map keys that may hide a placeholder: one itself, or a tuple (msgpack array) holding one.
_KEYS_TO_LOOK_INTO = frozenset((*_LOOK_INSIDE, tuple))


def _holds_placeholder(key: Any) -> bool:
    """True if ``key`` is, or a tuple holds at any depth, what stands for an out-of-band
    or chunked value."""
    stack = [key]
    while stack:
        item = stack.pop()
        if type(item) is tuple:
            stack += item
        elif type(item) in _LOOK_INSIDE_SET:
            return True
    return False


class Decoding:
    """Decodes one frame; :meth:`run` is the sliced generator."""

    def __init__(
        self,
        frame: Frame,
        writable: bool,
        as_columns: bool = False,
        fields: frozenset[str] | None = None,
    ) -> None:
        self.header = frame.header
        # Chunks are decoded at most twice (a typed try, then plain builtins): a chunk
        # table that makes the reader decode more than this is hostile.
        self.budget = 4 * frame.nbytes
        self.timer = SliceTimer()
        # A frame straight from an encoder may hold Pieces, which a source never does.
        self.received = ReceivedBuffers(frame.views(), writable, frame.missing, fields)
        self.calls = DecodeCalls(HeapAllowance.of(frame), self.received.ext_hook, self.timer)
        self.received.decode_payload = self.calls.decode
        self.as_columns = as_columns or fields is not None
        # Chunked containers and bytes values still to find in the raw data (the walk
        # stops once it has found them all).
        self.to_find = 0

    def run(self, annotation: Any) -> Sliced[Any]:
        """The header decoded into ``annotation`` (``Any``: plain builtins)."""
        try:
            self.received.count_from_zero()
            fields = skeleton(annotation) if isinstance(annotation, type) else None
            raw = None
            if fields is not None:
                raw = yield from known_fields(self.header, fields, self.calls)
            if raw is None:
                raw = yield from self.calls.plain(self.header)
            yield
            value = yield from self.assemble(raw, annotation)
            held, wanted = self.received.held, self.received.fields
            if held is not None and wanted is not None:  # a partial read met columns
                check_fields_present(wanted, list(held))
            return value
        finally:
            # The buffers and their hook refer to each other through decode_payload:
            # left as a cycle, the received memory (a mapped file) would wait for the
            # garbage collector to be let go.
            self.received.decode_payload = unbounded

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
        made = self.received
        self.to_find = made.chunked_made + made.columns_made + (made.bytes_made if into_type else 0)
        if self.to_find:
            raw = yield from self._unfilled(raw, (), found, typed=into_type)
        if annotation is None:
            typed = raw
        else:
            try:
                typed = yield from converted(raw, annotation, self.timer)
            except DecodeError:
                if not found:
                    raise
                typed = None  # e.g. a dict received into a Struct: fill, then convert
        if typed is not None:
            mark = self.received.claims_mark()
            try:
                return (yield from self._fill_typed(typed, annotation, found))
            except CannotFollow:
                # The typed try is dropped, with what it decoded: its buffers may be
                # claimed again, and its chunks decoded again from the start.
                self.received.unclaim_since(mark)
        raw = yield from self._fill_plain(raw, found)
        yield
        return (yield from converted(raw, annotation, self.timer))

    def _fill_typed(self, typed: Any, annotation: Any, found: list[_Found]) -> Sliced[Any]:
        """``typed`` (converted to ``annotation``) with what ``found`` holds put in, each
        as the annotation at its path.

        Raises:
            CannotFollow: the typed value does not follow a path, or has no type at it.
        """
        for path, payload, _ in found:
            inner = annotation_at(annotation, path)
            if inner is None:  # e.g. inside a tagged union: no type to aim at
                raise CannotFollow
            if isinstance(payload, Chunked):
                yield from self._fill(follow(typed, path), payload, inner)
            elif isinstance(payload, ColumnsFound):
                typed = yield from self._fill_columns(typed, path, payload, inner)
            elif path:
                put(typed, path, (yield from as_annotated(payload, inner)))
                yield
            else:  # the whole message is one out-of-band bytes value
                typed = yield from as_annotated(payload, inner)
        return typed

    def _fill_plain(self, raw: Any, found: list[_Found]) -> Sliced[Any]:
        """``raw`` with what ``found`` holds put in, as plain builtins."""
        for path, payload, placeholder in found:
            if isinstance(payload, Chunked):
                placeholder.clear()  # the typed try may have begun to fill it
                yield from self._fill(placeholder, payload, None)
            elif isinstance(payload, ColumnsFound):
                placeholder.clear()
                raw = yield from self._fill_columns(raw, path, payload, None)
            elif path:
                put(raw, path, payload)
            else:
                raw = payload
        return raw

    def _unfilled(
        self, raw: Any, path: tuple[Any, ...], found: list[_Found], *, typed: bool
    ) -> Sliced[Any]:
        """``raw`` with each chunked container replaced by an empty one and, when it is
        to be converted to a type, each out-of-band bytes value by ``b""``; each
        recorded in ``found`` with its path and placeholder. Stops once it has found
        all ``to_find``: a header full of other containers costs no walk past them.
        ``path`` is a chain ``(parent chain, step)``, made into a list only when found."""
        if isinstance(raw, Chunked | ColumnsFound):
            empty: Any = {} if isinstance(raw, Chunked) and raw.is_map else []
            found.append((steps(path), raw, empty))
            self.to_find -= 1
            return empty
        if typed and type(raw) is memoryview:
            found.append((steps(path), raw, b""))
            self.to_find -= 1
            return b""
        if type(raw) is dict:
            yield from self._unfilled_values(raw, path, found, typed=typed)
        elif type(raw) is list:
            yield from self._unfilled_items(raw, path, found, typed=typed)
        return raw

    def _unfilled_values(
        self, raw: dict[Any, Any], path: tuple[Any, ...], found: list[_Found], *, typed: bool
    ) -> Sliced[None]:
        """:meth:`_unfilled` on the values of ``raw``, in place.

        Raises:
            CorruptFrameError: a key is an out-of-band or chunked value: rlwire never
                writes one there, and left there it would hand the caller a placeholder
                of this decoder.
        """
        for key, value in raw.items():
            if type(key) in _KEYS_TO_LOOK_INTO and _holds_placeholder(key):
                raise CorruptFrameError(
                    "the header holds an out-of-band or chunked value as a map's key"
                )
            if type(value) in _LOOK_INSIDE and value:
                step: RawStep = (key, dict)
                raw[key] = yield from self._unfilled(value, (path, step), found, typed=typed)
                if not self.to_find:
                    break

    def _unfilled_items(
        self, raw: list[Any], path: tuple[Any, ...], found: list[_Found], *, typed: bool
    ) -> Sliced[None]:
        """:meth:`_unfilled` on the items of ``raw``, in place."""
        if _LOOK_INSIDE_SET.isdisjoint(set(map(type, raw))):  # in C: lists of numbers
            return
        for i, value in enumerate(raw):
            if type(value) in _LOOK_INSIDE and value:
                step: RawStep = (i, list)
                raw[i] = yield from self._unfilled(value, (path, step), found, typed=typed)
                if not self.to_find:
                    break
            if i & 4095 == 4095:
                yield

    def _fill_columns(
        self, root: Any, path: list[RawStep], found: ColumnsFound, annotation: Any
    ) -> Sliced[Any]:
        """``root`` with the list at ``path`` (left empty) made of ``found``'s rows, as
        ``annotation`` (a ``list[T]``; None: plain builtins), or replaced by a
        :class:`~rlwire.Columns` when the receiver asked for columns. Returns the root
        (``found`` itself may be the whole message)."""
        if found.inner:  # columns that hold chunked lists or bytes: plain values first
            to_find, self.to_find = self.to_find, found.inner
            inner: list[_Found] = []
            found.columns = yield from self._unfilled(found.columns, (), inner, typed=False)
            # Their chunks are decoded now, and a columns value they hold is inside this
            # one, as one decoded with it is (a partial read keeps it whole).
            self.received.in_columns += 1
            try:
                for entry in inner:  # one by one, to say which column an error is in
                    try:
                        found.columns = yield from self._fill_plain(found.columns, [entry])
                    except CorruptFrameError as exc:
                        raise in_column(found.names[entry[0][0][0]], exc) from exc
            finally:
                self.received.in_columns -= 1
            self.to_find, found.inner = to_find, 0
        if self.as_columns:
            value: Any = columns_of(found)
            if annotation is not None:  # refused as its rows would be, a look a column
                positional = found.layout == ROWS_AS_ARRAYS
                check_column_types(value, annotation, render_raw(path), positional=positional)
        else:
            cells = found.count * max(1, len(found.names))  # a row of no field is an object
            self.calls.charge(cells * ROW_COST, "rows from columns")
            value = None
            if annotation is not None:
                value = yield from structs_of(found, annotation, self.timer)
            if value is None:
                value = yield from self._rows(found, path, annotation)
        if not path:
            return value
        put(root, path, value)
        return root

    def _rows(self, found: ColumnsFound, path: list[RawStep], annotation: Any) -> Sliced[Any]:
        """``found``'s rows as plain builtins, converted to ``annotation`` if not None."""
        value = yield from rows_of(found, self.timer)
        if annotation is not None:
            try:
                value = yield from converted(value, annotation, self.timer)
            except DecodeError as exc:  # its path starts at the list: say where that is
                where = render_raw(path)
                raise DecodeError(str(exc).replace(" - at `$", f" - at `{where}", 1)) from None
        return value

    def _fill(self, target: Any, chunked: Chunked, annotation: Any) -> Sliced[None]:
        """Decode ``chunked``'s chunks one call each and add them to ``target``."""
        ref, view = chunked.ref, self.received.buffer(chunked.ref.index)
        kind = dict if chunked.is_map else list
        if type(target) is not kind:
            raise CannotFollow
        # The container gets every item its table declares (checked below): a slot each,
        # taken before a chunk is built, so a table declaring millions is refused at once.
        slot = DICT_ITEM if chunked.is_map else LIST_ITEM
        self.calls.charge(slot * ref.count, f"a chunked container of {ref.count} items")
        before = len(target)
        for start, end in zip(ref.ranges[::2], ref.ranges[1::2], strict=True):
            self.budget -= end - start
            if self.budget < 0:
                raise CorruptFrameError(
                    "chunked containers: the chunk tables refer to far more data than "
                    "the message holds"
                )
            items = yield from self._chunk(view[start:end], annotation, kind)
            if isinstance(target, dict):
                target.update(items)
            else:
                target.extend(items)
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
                items = self.calls.decode(data, annotation)
            except msgspec.ValidationError:
                items = None  # a nested chunked container, or bytes where out of band
            if items is not None:
                if not isinstance(items, kind):
                    raise CannotFollow
                return items
        self.received.count_from_zero()
        raw = yield from self.calls.plain(data)
        if type(raw) is not kind:
            raise CorruptFrameError(f"chunked container: a chunk is a {type(raw).__name__}")
        return (yield from self.assemble(raw, annotation))
