"""A rank's message as the objects it is stored as in Ray's object store, and back.

A message is one *main* object, and a *sidecar* object when some of its buffers go in
the sidecar. Each object is a list of :class:`pickle.PickleBuffer`, which Ray stores out
of band (a pickle of a few bytes, no globals) and hands back as read-only views of its
shared memory: no user data is ever pickled. The main object holds the envelope (a small
msgspec message rlwire writes: codec, segment sizes, compression, checksums, which
buffers are in the sidecar), the codec's header, then the buffers that are not in the
sidecar; the sidecar object holds the others, in buffer order.

A buffer the codec hands over as :class:`~rlwire._frame.pieces.Pieces` (a column of
per-sample arrays) is stored as its runs, one value each, when every run but the last
is a multiple of 64 bytes long (:func:`runs_fit`): Ray lays an object's out-of-band
buffers out back to back, each at the next multiple of 64 (of 8 below 2 KiB), so such
runs land one right after the other, and the receiver maps them as one view. That
spares the sender a join of the column (a copy of the step) before Ray's own copy. A
receiver that finds the runs apart (another Ray's layout) joins them: a copy, never a
wrong byte.
"""

from __future__ import annotations

from pickle import PickleBuffer
from typing import Any

import msgspec
import numpy as np
from numpy.lib.stride_tricks import as_strided

from rlwire._core.errors import CorruptFrameError, UnsupportedVersionError
from rlwire._frame.checksums import CHECKSUM, verify_segments
from rlwire._frame.frame import Frame
from rlwire._frame.pieces import Pieces

__all__ = [
    "ENVELOPE_VERSION",
    "Envelope",
    "Payload",
    "make_payload",
    "out_of_band",
    "parse_payload",
    "runs_fit",
]

#: The version of the envelope this module writes and reads.
ENVELOPE_VERSION = 1
#: More than any envelope takes: one larger is refused unread.
_MAX_ENVELOPE_BYTES = 1 << 20
#: The alignment Ray gives an out-of-band buffer of 2 KiB or more (8 below).
_RAY_ALIGN = 64
#: Ray copies a value larger than this with threads it starts for that value alone (six,
#: in Ray 2.x): on 2 shared cores they starve the sender's event loop (a 200 MB block
#: stalled it 6 ms, against 2 ms as 1 MiB values, for the same time end to end), and for
#: many runs of a few MiB they are slower than a plain copy (7x). Every buffer and run is
#: stored as values of at most this size (a multiple of 64: they still lie back to back).
_RAY_THREADED_COPY = 1 << 20
#: Runs stored one value each must average this many bytes: each value costs Ray (and
#: the hashing and the receiver) some microseconds, more than a copy of a smaller run
#: (on a dense step, rows of 2-16 KiB, the join into warm memory was 3x faster).
_MIN_RUN_BYTES = 256 << 10


class Envelope(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """What a main object says about its message, before the header.

    Attributes:
        version: :data:`ENVELOPE_VERSION`.
        codec: the name of the codec that made the header.
        sizes: each segment's size in bytes (0 is the header, ``i + 1`` buffer ``i``).
        sidecar: the indices of the buffers stored in the sidecar object, ascending.
        compression: each segment's compression id, or empty when none is compressed.
        raw_sizes: each segment's size after decompression, or empty.
        checksum: the checksum algorithm, or ``""`` when none was recorded.
        checksums: each segment's checksum, packed little-endian u64.
        runs: how many values each buffer is stored as (its runs, one after another),
            or empty when every buffer is one value.
        board_checksums: the checksums are not here (``checksums`` is empty) but on
            the board, which gives them with the objects' references: the sender hashed
            the message while Ray copied it into the object store, and handed them over
            with the commit.
    """

    version: int
    codec: str
    sizes: tuple[int, ...]
    sidecar: tuple[int, ...]
    compression: tuple[int, ...]
    raw_sizes: tuple[int, ...]
    checksum: str
    checksums: bytes
    runs: tuple[int, ...] = ()
    board_checksums: bool = False


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Envelope)

#: What goes into the object store for one rank: the main object's buffers, and the
#: sidecar object's (``None`` when the message has no sidecar).
Payload = tuple[list[memoryview], list[memoryview] | None]


def out_of_band(views: list[memoryview]) -> list[PickleBuffer]:
    """The values of one object, as Ray stores them: each buffer out of band.

    Make them just before Ray takes them, and drop them right after (clear the list
    in a ``finally``): a PickleBuffer over a memoryview must never be left to the cyclic
    garbage collector (a traceback kept in a cycle): clearing a memoryview that still
    exports a buffer fails there, and CPython 3.11 was seen to crash in that collection.
    """
    return [PickleBuffer(view) for view in views]


def runs_fit(pieces: Pieces) -> bool:
    """True when ``pieces`` can be stored as its runs (one value each) and still reach a
    receiver as one block: every run but the last a multiple of 64 bytes long (see the
    module's docstring), and the runs not too many for their bytes."""
    runs = pieces.runs
    return len(runs) * _MIN_RUN_BYTES <= pieces.nbytes and all(
        run.nbytes % _RAY_ALIGN == 0 for run in runs[:-1]
    )


def make_payload(frame: Frame, checksums: bytes | None, *, on_board: bool = False) -> Payload:
    """The objects of ``frame``, whose buffers are memoryviews, or
    :class:`~rlwire._frame.pieces.Pieces` that :func:`runs_fit` (the sender joined any
    other), with ``checksums`` of its segments (packed u64, from
    :func:`~rlwire._frame.checksums.checksum_segments`) or ``None``; with ``on_board``
    (and ``checksums`` ``None``), the envelope says the board holds them
    (:attr:`Envelope.board_checksums`). Nothing is copied: the values are the frame's
    own memory (wrap them with :func:`out_of_band`)."""
    stored = [_values(b) for b in frame.buffers]
    sidecar = tuple(sorted(frame.sidecar))
    counts = tuple(len(values) for values in stored)
    envelope = Envelope(
        version=ENVELOPE_VERSION,
        codec=frame.codec,
        sizes=(len(frame.header), *(b.nbytes for b in frame.buffers)),
        sidecar=sidecar,
        compression=tuple(frame.compression),
        raw_sizes=tuple(frame.raw_sizes),
        checksum="" if checksums is None and not on_board else CHECKSUM,
        checksums=checksums or b"",
        runs=counts if any(c != 1 for c in counts) else (),
        board_checksums=on_board,
    )
    main = [memoryview(_ENCODER.encode(envelope)), memoryview(frame.header)]
    for i, values in enumerate(stored):
        if i not in frame.sidecar:
            main += values
    side = [v for i in sidecar for v in stored[i]] if sidecar else None
    return main, side


def _values(buffer: memoryview | Pieces) -> list[memoryview]:
    """The values one buffer is stored as: itself, or the runs of a Pieces, each cut in
    values of at most :data:`_RAY_THREADED_COPY` bytes."""
    if isinstance(buffer, Pieces):
        if not runs_fit(buffer):  # the sender joins them
            raise TypeError("a ray:// frame buffer must be a memoryview or Pieces that fit")
        runs = buffer.runs
    else:
        runs = (buffer,)
    values = []
    step = _RAY_THREADED_COPY
    for run in runs:
        if run.nbytes > step:
            run = run.cast("B")
            values += [run[at : at + step] for at in range(0, run.nbytes, step)]
        else:
            values.append(run)
    return values or [memoryview(b"")]


def parse_payload(
    main: object,
    side: object,
    *,
    verify: bool,
    writable: bool,
    where: str,
    checksums: bytes | None = None,
    message_id: bytes = b"",
) -> Frame:
    """The frame stored as ``main`` (and ``side``, ``None`` without a sidecar), the
    values ``ray.get`` returned for the objects :func:`make_payload` made, as views of
    them (copies, with ``writable``). ``checksums`` are those the board gave with the
    references, for an envelope that says they are there (``board_checksums``);
    ``message_id`` the frame's (its step's commit,
    :func:`~rlwire.transport.ray._answers.commit_id`).

    Raises:
        CorruptFrameError: the objects are not such a message, or (with ``verify``) a
            segment does not match its checksum, or the envelope's checksums are on the
            board and it gave none.
        UnsupportedVersionError: an envelope or checksum algorithm this reader does not
            know.
    """
    values = _views(main, "main object", where)
    if len(values) < 2:
        raise CorruptFrameError(
            f"the main object holds {len(values)} values, at least 2 expected", where=where
        )
    envelope = _envelope(values[0], where)
    segments = len(envelope.sizes)
    buffers = segments - 1
    sidecar = envelope.sidecar
    if (
        buffers < 0
        or list(sidecar) != sorted(set(sidecar))
        or any(not 0 <= i < buffers for i in sidecar)
    ):
        raise CorruptFrameError(
            f"the envelope's sidecar indices {list(sidecar)} do not fit {buffers} buffers",
            where=where,
        )
    side_values = [] if side is None else _views(side, "sidecar object", where)
    if (side is None) != (not sidecar):
        what = "has no sidecar object" if side is None else "has a sidecar object it lists none for"
        raise CorruptFrameError(f"the message {what}", where=where)
    ordered = [values[1], *_buffers(envelope, values[2:], side_values, where)]
    # A segment stored in the sidecar object is named there, as the files and S3 name
    # their sidecar file (``_stored.table.side_of``); the board holds no other name.
    side_at = f"{where} sidecar object"
    in_side = frozenset(i + 1 for i in sidecar)
    for i, (view, size) in enumerate(zip(ordered, envelope.sizes, strict=True)):
        if view.nbytes != size:
            what = "the header" if i == 0 else f"buffer {i - 1}"
            raise CorruptFrameError(
                f"{what} is {view.nbytes} bytes, the envelope says {size}",
                where=side_at if i in in_side else where,
                segment=i,
            )
    if verify and envelope.checksum:
        sums = envelope.checksums
        if envelope.board_checksums:
            if checksums is None:
                raise CorruptFrameError(
                    "the envelope says the board holds the checksums, and it gave none",
                    where=where,
                )
            sums = checksums
        if len(sums) != 8 * segments:
            raise CorruptFrameError(
                f"the message has {len(sums) // 8} checksums for {segments} segments",
                where=where,
            )
        verify_segments(envelope.checksum, sums, ordered, where, sidecar=(in_side, side_at))
    verified = verify and bool(envelope.checksum)
    if writable:
        ordered = [memoryview(bytearray(view)) for view in ordered]
    try:
        return Frame(
            ordered[0],
            tuple(ordered[1:]),
            sidecar=frozenset(sidecar),
            codec=envelope.codec,
            compression=envelope.compression,
            raw_sizes=envelope.raw_sizes,
            stored_size=values[0].nbytes + sum(envelope.sizes),
            message_id=message_id,
            verified=verified,
        )
    except ValueError as exc:  # compression and raw_sizes that do not fit the segments
        raise CorruptFrameError(f"the envelope is inconsistent: {exc}", where=where) from exc


def _buffers(
    envelope: Envelope, main: list[memoryview], side: list[memoryview], where: str
) -> list[memoryview]:
    """The buffers stored as the values ``main`` (after the envelope and the header) and
    ``side``, in buffer order, each as one view (:func:`_one_block`)."""
    buffers = len(envelope.sizes) - 1
    sidecar = envelope.sidecar
    counts = envelope.runs or (1,) * buffers
    if len(counts) != buffers or any(c < 1 for c in counts):
        raise CorruptFrameError(
            f"the envelope's run counts {list(counts)} do not fit {buffers} buffers", where=where
        )
    in_side = sum(counts[i] for i in sidecar)
    if len(main) != sum(counts) - in_side or len(side) != in_side:
        raise CorruptFrameError(
            f"the envelope lists {buffers} buffers ({len(sidecar)} in the sidecar) stored as "
            f"{sum(counts) - in_side} and {in_side} values; the objects hold "
            f"{len(main)} and {len(side)}",
            where=where,
        )
    main_values, side_values = iter(main), iter(side)
    ordered = []
    for i, count in enumerate(counts):
        source = side_values if i in sidecar else main_values
        ordered.append(_one_block([next(source) for _ in range(count)]))
    return ordered


def _one_block(views: list[memoryview]) -> memoryview:
    """One view of a buffer stored as the runs ``views``: a view spanning them where
    they lie back to back in one object (they do in Ray's layout: see the module's
    docstring), else a copy of them joined."""
    if len(views) == 1:
        return views[0]
    arrays = [np.frombuffer(view, np.uint8) for view in views]
    at = start = _address(arrays[0])
    for array in arrays:
        if array.nbytes == 0 or _address(array) != at:
            return np.concatenate(arrays).data.toreadonly()
        at += array.nbytes
    # Every byte of the span is in one of the runs, all in one object of the store: the
    # view keeps the first run alive, and with it the whole object's memory.
    span = as_strided(arrays[0], shape=(at - start,), strides=(1,), writeable=False)
    return span.data


def _address(array: np.ndarray[Any, Any]) -> int:
    return int(array.__array_interface__["data"][0])


def _views(values: object, what: str, where: str) -> list[memoryview]:
    if not isinstance(values, list):
        raise CorruptFrameError(
            f"the {what} is a {type(values).__name__}, not a list of buffers", where=where
        )
    try:
        return [_flat(value) for value in values]
    except TypeError as exc:
        raise CorruptFrameError(
            f"the {what} holds a value that is not a buffer", where=where
        ) from exc


def _flat(value: Any) -> memoryview:
    view = memoryview(value)
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


def _envelope(view: memoryview, where: str) -> Envelope:
    if view.nbytes > _MAX_ENVELOPE_BYTES:
        raise CorruptFrameError(
            f"the envelope is {view.nbytes} bytes, more than {_MAX_ENVELOPE_BYTES}", where=where
        )
    try:
        envelope = _DECODER.decode(view)
    except msgspec.DecodeError as exc:
        raise CorruptFrameError(f"the envelope cannot be read: {exc}", where=where) from exc
    if envelope.version != ENVELOPE_VERSION:
        raise UnsupportedVersionError(
            f"envelope version {envelope.version} is not one this reader knows "
            f"({ENVELOPE_VERSION}); upgrade rlwire",
            where=where,
        )
    return envelope
