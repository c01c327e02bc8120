"""Which buffers of a message hold the fields a receiver asked for (``fields=``), told
from the header alone, before those buffers are read.

A list of samples is stored as a columns value (extension 7): one column per field, each
column's bytes in buffers of its own. The header is scanned with an extension hook that
reads no buffer and records, for each extension value, the buffers it refers to. The
buffers needed are those of the named columns of every columns value, and every buffer
referred to outside columns values (small fields of the step beside its samples). A
step may hold several lists stored as columns (``{"samples": [...], "eval": [...]}``):
each keeps the named columns it holds, and a name is missing only if none holds it. A
container chunked into a buffer (extension 4 or 5) may refer to more buffers from inside
its chunks: its buffer is needed first, then scanned in turn
(:attr:`~rlwire._frame.selection.Selection.complete` is False until it has been read).

Example:
    >>> import numpy as np, rlwire
    >>> from rlwire.codecs._msgpack.codec import MsgpackCodec
    >>> cols = rlwire.Columns({
    ...     "a": rlwire.Ragged.from_arrays([np.arange(5000)]),
    ...     "b": rlwire.Ragged.from_arrays([np.arange(5000.0)]),
    ... })
    >>> frame = MsgpackCodec().encode({"samples": cols})
    >>> len(frame.buffers), sorted(select_fields(frame, frozenset({"b"})).buffers)
    (2, [1])
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from rlwire._core.errors import FieldNotFoundError, FrameTooLargeError
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selection
from rlwire.codecs._msgpack.allowance import HeapAllowance
from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_BYTES,
    EXT_CHUNKED_ARRAY,
    EXT_CHUNKED_MAP,
    EXT_COLUMNS,
    EXT_RAGGED,
    ArrayRef,
    BytesRef,
    ChunksRef,
    weak_hook_decoder,
)

__all__ = ["NOT_READ", "check_fields_present", "select_fields"]

#: What an extension value referring to a buffer a partial read skipped becomes in the
#: decode, inside a columns value (the column is then dropped: it was not asked for).
NOT_READ: Any = type("NotRead", (), {"__repr__": lambda self: "NOT_READ"})()

_array_ref = msgspec.msgpack.Decoder(ArrayRef)
_bytes_ref = msgspec.msgpack.Decoder(BytesRef)
_chunks_ref = msgspec.msgpack.Decoder(ChunksRef)


class _Refs:
    """The buffers one extension value refers to, and its chunk tables (to scan)."""

    __slots__ = ("buffers", "chunks")

    def __init__(self, buffers: tuple[int, ...] = (), chunks: tuple[ChunksRef, ...] = ()):
        self.buffers = buffers
        self.chunks = chunks


class _ColumnsRefs:
    """A columns value: its names, and what each column refers to."""

    __slots__ = ("columns", "names")

    def __init__(self, names: list[str], columns: list[Any]) -> None:
        self.names = names
        self.columns = columns


class _Scan:
    """One scan of a frame's header (and of the chunks of the buffers read so far)."""

    def __init__(self, frame: Frame, fields: frozenset[str]) -> None:
        self.frame = frame
        self.allowance = HeapAllowance.of(frame)
        self.fields = fields
        self.needed: set[int] = set()
        self.complete = True
        self.found_columns = False
        self.held: dict[str, None] = {}  # the names of every columns value, in order
        self.decoder = weak_hook_decoder(self.hook)  # no cycle: see there
        self.chunks_seen: set[tuple[int, int]] = set()

    def hook(self, code: int, data: memoryview) -> Any:
        if code == EXT_ARRAY:
            return _Refs((_array_ref.decode(data).index,))
        if code == EXT_BYTES:
            return _Refs((_bytes_ref.decode(data).index,))
        if code in (EXT_CHUNKED_ARRAY, EXT_CHUNKED_MAP):
            ref = _chunks_ref.decode(data)
            return _Refs((ref.index,), (ref,))
        if code in (EXT_RAGGED, EXT_COLUMNS):
            self.allowance.charge_decode(data, kept=False)
        if code == EXT_RAGGED:
            refs = list(_refs_in(self.decoder.decode(data)))
            return _Refs(
                tuple(i for r in refs for i in r.buffers), tuple(c for r in refs for c in r.chunks)
            )
        if code == EXT_COLUMNS:
            payload = self.decoder.decode(data)
            if type(payload) is list and len(payload) == 4:
                names, columns = payload[2], payload[3]
                if type(names) is list and type(columns) is list and len(names) == len(columns):
                    return _ColumnsRefs(names, columns)
            raise ValueError("a malformed columns value")  # left to the decode to word
        return _Refs()  # an inline array, or an extension the decode will refuse

    def take(self, value: Any, *, whole: bool = False) -> None:
        """Record what ``value`` (decoded with :meth:`hook`) needs: of a columns value,
        the columns of ``self.fields``, and all of every value those hold (a columns
        value nested in a kept column included), or all of it with ``whole``."""
        for refs in _refs_in(value, into_columns=whole):
            if isinstance(refs, _ColumnsRefs):
                self.found_columns = True
                self.held.update(dict.fromkeys(refs.names))
                for name, column in zip(refs.names, refs.columns, strict=True):
                    if name in self.fields:
                        self.take(column, whole=True)
                continue
            self.needed.update(refs.buffers)
            for chunks in refs.chunks:
                self.take_chunks(chunks, whole=whole)

    def take_chunks(self, ref: ChunksRef, *, whole: bool = False) -> None:
        """Scan the chunks of ``ref`` if its buffer was read; else ask for it first."""
        if ref.index in self.frame.missing or not 0 <= ref.index < len(self.frame.buffers):
            self.complete = False
            return
        view = memoryview(self.frame.buffers[ref.index])  # type: ignore[arg-type]
        for start, end in zip(ref.ranges[::2], ref.ranges[1::2], strict=False):
            if (ref.index, start) in self.chunks_seen or not 0 <= start <= end <= view.nbytes:
                continue
            self.chunks_seen.add((ref.index, start))
            self.allowance.charge_decode(view[start:end])
            self.take(self.decoder.decode(view[start:end]), whole=whole)


def _refs_in(value: Any, *, into_columns: bool = True) -> Iterator[Any]:
    """Every :class:`_Refs` (and, unless ``into_columns``, :class:`_ColumnsRefs`, not
    looked into) inside ``value``."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is _Refs:
            yield item
        elif kind is _ColumnsRefs:
            if into_columns:
                stack += item.columns
            else:
                yield item
        elif kind is list or kind is tuple:  # a tuple: a map's key that was an array
            stack += item
        elif kind is dict:  # keys too: a hostile header may put a reference in one
            stack += item.keys()
            stack += item.values()


def check_fields_present(fields: frozenset[str], names: list[str]) -> None:
    """Check that every one of ``fields`` is among ``names``: those of the columns
    values of a message, all of them (a selection keeps what each holds).

    Raises:
        FieldNotFoundError: one is not, naming it and the names there are.
    """
    absent = sorted(fields.difference(names))
    if absent:
        which = ", ".join(map(repr, absent))
        raise FieldNotFoundError(
            f"field{'s' if len(absent) > 1 else ''} {which} not in the step (its samples "
            f"hold: {', '.join(map(str, names)) or 'no field'})"
        )


def select_fields(frame: Frame, fields: frozenset[str]) -> Selection | None:
    """The buffers of ``frame`` that decoding only the columns ``fields`` of its lists of
    samples needs, from its (decompressed) header and the buffers read so far; ``None``
    when that cannot be told (no list stored as columns, a header this scan cannot read):
    then every buffer is read, and the decode says what is wrong.

    Raises:
        FieldNotFoundError: no columns value of the message has a column of one of
            ``fields`` (told once the scan is complete).
        FrameTooLargeError: the scan could build more Python objects than a plain
            decode of the message may (its :class:`HeapAllowance`): refused before
            anything is built, as that decode would.
    """
    scan = _Scan(frame, fields)
    try:
        scan.allowance.charge_decode(frame.header)
        scan.take(scan.decoder.decode(frame.header))
    except (FieldNotFoundError, FrameTooLargeError):
        raise
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
        return None
    if not scan.found_columns:
        return None
    if scan.complete:  # else a chunk still to read may hold a columns value of them
        check_fields_present(fields, list(scan.held))
    n = len(frame.buffers)
    return Selection(frozenset(i for i in scan.needed if 0 <= i < n), scan.complete)
