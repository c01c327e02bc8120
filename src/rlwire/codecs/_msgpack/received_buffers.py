"""The out-of-band buffers of a received frame: what each extension value in its header
becomes, with each buffer taken by one value at most.

An array becomes a view over its buffer, out-of-band bytes a memoryview of theirs, a
ragged array a :class:`~rlwire.Ragged` of two such arrays, a chunked container a
:class:`Chunked` placeholder and a columns value a
:class:`~rlwire.codecs._msgpack.received_columns.ColumnsFound`, both filled later; every
reference and chunk table is checked against the buffers first.

Example:
    >>> import msgspec
    >>> from rlwire.codecs._msgpack.extensions import EXT_BYTES, BytesRef
    >>> received = ReceivedBuffers((memoryview(b"abc"),), writable=False)
    >>> ref = memoryview(msgspec.msgpack.encode(BytesRef(0)))
    >>> bytes(received.ext_hook(EXT_BYTES, ref))
    b'abc'
    >>> received.ext_hook(EXT_BYTES, ref)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    rlwire.errors.CorruptFrameError: header refers to buffer 0 twice ...
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rlwire._core.errors import CorruptFrameError, RlwireError
from rlwire.codecs._msgpack.arrays import make_array
from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_BYTES,
    EXT_CHUNKED_ARRAY,
    EXT_CHUNKED_MAP,
    EXT_COLUMNS,
    EXT_INLINE_ARRAY,
    EXT_RAGGED,
    ArrayRef,
    BytesRef,
    ChunksRef,
    InlineArray,
)
from rlwire.codecs._msgpack.fields import NOT_READ
from rlwire.codecs._msgpack.received_columns import in_column, parse_columns, ragged

__all__ = ["Chunked", "ReceivedBuffers", "unbounded"]

_array_ref = msgspec.msgpack.Decoder(ArrayRef)
_inline = msgspec.msgpack.Decoder(InlineArray)
_bytes_ref = msgspec.msgpack.Decoder(BytesRef)
_chunks_ref = msgspec.msgpack.Decoder(ChunksRef)
# A columns value's names and its columns undecoded: each is decoded again on its own
# to tell which one an error is in.
_columns_parts = msgspec.msgpack.Decoder(tuple[Any, Any, list[str], list[msgspec.Raw]])


def unbounded(data: memoryview) -> Any:
    """The payload decoder outside a decode: refuses."""
    raise CorruptFrameError("header: a nested extension value outside a decode")


class Chunked:
    """A chunked container met in the header or in a chunk, before it is filled."""

    __slots__ = ("is_map", "ref")

    def __init__(self, is_map: bool, ref: ChunksRef) -> None:
        self.is_map = is_map
        self.ref = ref


class ReceivedBuffers:
    """The buffers of one frame, and the extension hook that hands them out."""

    def __init__(
        self,
        buffers: Sequence[memoryview],
        writable: bool,
        missing: frozenset[int] = frozenset(),
        fields: frozenset[str] | None = None,
    ) -> None:
        self.buffers = buffers
        self.writable = writable
        # A partial read (``fields=``): the buffers not read, and the columns kept.
        self.missing = missing
        self.fields = fields
        # The names of the columns values a partial read met (None: it met none): each
        # keeps the fields it holds; one of them is missing only if none holds it.
        self.held: dict[str, None] | None = None
        self.in_columns = 0  # columns values being decoded, one inside another
        # Buffers referred to by arrays and bytes values: each may be referred to once,
        # or a small header could have one large buffer copied many times. (A typed
        # decode that fails and is tried again into builtins never took any: the types
        # tried first hold no arrays or bytes, so msgspec never calls the hook.)
        self.claimed: set[int] = set()
        # Byte ranges of buffers referred to by chunk tables, each (start, end) sorted:
        # each byte may be in one chunk only, or a small chunk table could list one
        # chunk thousands of times.
        self.chunk_starts: dict[int, list[int]] = {}
        self.chunk_ends: dict[int, list[int]] = {}
        # The claims, in order, a buffer's index or a chunk's (index, start): a failed
        # try is undone.
        self.claim_log: list[int | tuple[int, int]] = []
        # What the hook made since :meth:`count_from_zero`: the walk that looks for them
        # stops once it has found them all, and is skipped if none.
        self.chunked_made = 0
        self.bytes_made = 0
        self.columns_made = 0
        # Decodes the payload of a ragged array or columns value, whose items are
        # extension values too, within the frame's heap allowance (set by the decoder).
        self.decode_payload: Callable[[memoryview], Any] = unbounded

    def count_from_zero(self) -> None:
        """Start counting the chunked containers, columns and bytes values made anew."""
        self.chunked_made = self.bytes_made = self.columns_made = 0

    def claims_mark(self) -> int:
        """A mark to undo the claims made after it (:meth:`unclaim_since`)."""
        return len(self.claim_log)

    def unclaim_since(self, mark: int) -> None:
        """Undo the claims made since ``mark``: a dropped decode may take them again."""
        for claim in self.claim_log[mark:]:
            if isinstance(claim, int):
                self.claimed.discard(claim)
            else:
                index, start = claim
                starts = self.chunk_starts[index]
                at = bisect.bisect_left(starts, start)
                del starts[at], self.chunk_ends[index][at]
        del self.claim_log[mark:]

    def ext_hook(self, code: int, data: memoryview) -> Any:
        """msgspec's ``ext_hook``: the value an extension value stands for."""
        try:
            if code == EXT_ARRAY:
                ref = _array_ref.decode(data)
                if ref.index in self.missing:
                    return self._not_read(ref.index)
                buf = self._claim(ref.index)
                return make_array(buf, ref.dtype, ref.shape, ref.order, self.writable)
            if code == EXT_INLINE_ARRAY:
                return self._inline(data)
            if code == EXT_BYTES:
                index = _bytes_ref.decode(data).index
                if index in self.missing:
                    return self._not_read(index)
                buf = self._claim(index)
                self.bytes_made += 1
                return bytearray(buf) if self.writable and buf.readonly else buf
            if code in (EXT_CHUNKED_ARRAY, EXT_CHUNKED_MAP):
                chunks = _chunks_ref.decode(data)
                if chunks.index in self.missing:
                    return self._not_read(chunks.index)
                self.chunked_made += 1
                return self._chunked(code == EXT_CHUNKED_MAP, chunks)
            if code == EXT_RAGGED:
                payload = self.decode_payload(data)
                if type(payload) is list and any(p is NOT_READ for p in payload):
                    return NOT_READ
                return ragged(payload)
            if code == EXT_COLUMNS:
                return self._columns(data)
        except msgspec.DecodeError as exc:
            raise CorruptFrameError(f"header: malformed extension {code}: {exc}") from exc
        raise CorruptFrameError(
            f"header: unknown msgpack extension type {code} (written by a newer rlwire?)"
        )

    def _columns(self, data: memoryview) -> Any:
        """A columns value; what its columns hold to be filled later (chunked lists,
        out-of-band bytes) counts as part of it, not on its own."""
        chunked, made, columns = self.chunked_made, self.bytes_made, self.columns_made
        # A partial read keeps its fields of the outermost columns value (the samples);
        # a columns value in a kept column is kept whole.
        fields = self.fields if not self.in_columns else None
        mark = self.claims_mark()
        self.in_columns += 1
        try:
            payload = self.decode_payload(data)
        except CorruptFrameError as exc:
            self.unclaim_since(mark)
            raise self._named(data, exc) from exc
        finally:
            self.in_columns -= 1
        inner = self.chunked_made - chunked + self.bytes_made - made + self.columns_made - columns
        self.chunked_made, self.bytes_made, self.columns_made = chunked, made, columns + 1
        found = parse_columns(payload, inner, fields)
        if fields is not None:  # its names checked by parse_columns: distinct strings
            self.held = {} if self.held is None else self.held
            self.held.update(dict.fromkeys(payload[2]))
        return found

    def _named(self, data: memoryview, exc: CorruptFrameError) -> CorruptFrameError:
        """``exc``, raised decoding columns value ``data``, said of the column it is in:
        the columns decoded again one by one (as they were, in order) until one fails.
        The decode in one call is kept for messages that are sound."""
        try:
            _, _, names, columns = _columns_parts.decode(data)
            for name, column in zip(names, columns, strict=True):
                try:
                    self.decode_payload(memoryview(column))
                except CorruptFrameError as found:
                    return in_column(name, found)
        except (msgspec.DecodeError, ValueError, RlwireError):  # not columns to tell apart
            pass
        return exc

    def _not_read(self, index: int) -> Any:
        """What a reference to ``index``, a buffer a partial read skipped, becomes:
        :data:`NOT_READ` in a column (dropped unless asked for, then refused by
        :func:`~rlwire.codecs._msgpack.received_columns.parse_columns`)."""
        if not self.in_columns:
            raise CorruptFrameError(
                f"header refers to buffer {index}, which this partial read skipped"
            )
        return NOT_READ

    def _inline(self, data: memoryview) -> Any:
        """An inline array, in memory of its own: the bytes msgspec decoded may be an
        object CPython shares (every one-byte ``bytes`` is one cached object), and a
        library that ignores the read-only flag must not write through to them."""
        inl = _inline.decode(data)
        arr = make_array(memoryview(inl.data), inl.dtype, inl.shape, inl.order, writable=False)
        arr = arr.copy(order="K")
        arr.flags.writeable = self.writable
        return arr

    def buffer(self, index: int) -> memoryview:
        """Buffer ``index``, which the header refers to."""
        if not 0 <= index < len(self.buffers):
            raise CorruptFrameError(
                f"header refers to buffer {index} but the frame has {len(self.buffers)} buffers"
            )
        return self.buffers[index]

    def _claim(self, index: int) -> memoryview:
        buf = self.buffer(index)
        if index in self.claimed:
            raise CorruptFrameError(
                f"header refers to buffer {index} twice (an array or bytes value may "
                "have a buffer of its own only)"
            )
        self.claimed.add(index)
        self.claim_log.append(index)
        return buf

    def _chunked(self, is_map: bool, ref: ChunksRef) -> Chunked:
        buf = self.buffer(ref.index)
        bounds = ref.ranges
        if ref.count < 0 or len(bounds) % 2 or (ref.count and not bounds):
            raise CorruptFrameError(f"chunked container: malformed chunk table {ref}")
        for start, end in zip(bounds[::2], bounds[1::2], strict=True):
            if not 0 <= start <= end <= buf.nbytes:
                raise CorruptFrameError(
                    f"chunked container: chunk {start}..{end} lies outside its "
                    f"{buf.nbytes}-byte buffer"
                )
        for start, end in zip(bounds[::2], bounds[1::2], strict=True):
            if end > start:
                self._claim_chunk(ref.index, start, end)
        return Chunked(is_map, ref)

    def _claim_chunk(self, index: int, start: int, end: int) -> None:
        """Claim bytes ``start:end`` of buffer ``index`` for one chunk."""
        starts = self.chunk_starts.setdefault(index, [])
        ends = self.chunk_ends.setdefault(index, [])
        at = bisect.bisect_right(starts, start)
        if (at and ends[at - 1] > start) or (at < len(starts) and starts[at] < end):
            raise CorruptFrameError(
                f"chunked container: chunk {start}..{end} of buffer {index} overlaps "
                "another chunk (each chunk's bytes may be listed once)"
            )
        starts.insert(at, start)
        ends.insert(at, end)
        self.claim_log.append((index, start))
