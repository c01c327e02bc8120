"""The byte layout of a stored message: main file and sidecar file (docs/format.md).

Shared by every sink that stores messages as files or objects. The main file is::

    magic (8) | major u16 | minor u16 | envelope length u32 | envelope xxh3-64 u64
    | envelope (msgpack) | zero padding to 64 | header | padding to 64 | buffer | ...

The sidecar file is::

    sidecar magic (8) | major u16 | minor u16 | reserved u32 | message id (16)
    | zero padding to 64 | buffer | padding to 64 | buffer | padding to 64 | ...

Every buffer starts at a multiple of 64 bytes from the start of its file, so views over a
page-aligned mmap are aligned for every dtype. The envelope carries an xxh3-64 checksum of
each segment (the header, then each buffer), the prelude one of the envelope: every byte
but the zero padding is covered.

A :class:`~rlwire._frame.pieces.Pieces` buffer is laid out as its joined bytes would be
(one table entry, aligned at its start): its runs are consecutive chunks, unpadded.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np
import xxhash

from rlwire._core.errors import CorruptFrameError
from rlwire._frame.checksums import CHECKSUM, verify_segments
from rlwire._frame.frame import Frame
from rlwire._frame.pieces import Pieces
from rlwire.transport._parts import PartInfo
from rlwire.transport._stored.table import ALIGN, SIDECAR, check_magic, checked_table, side_of, span

__all__ = [
    "ALIGN",
    "FIELDS_VERSION",
    "FORMAT_VERSION",
    "PARTS_VERSION",
    "Layout",
    "check_magic",
    "parse_main",
    "plan",
]

MAIN_MAGIC = b"\x89RLW\r\n\x1a\n"
SIDECAR_MAGIC = b"\x89RLS\r\n\x1a\n"
FORMAT_VERSION = (1, 1)  # 1.1: the msgpack header may hold extension types 6 and 7
RANKS_VERSION = (1, 8)  # a whole step's files: 1.8 added the envelope's `ranks`
PARTS_VERSION = (1, 2)  # a part's files and a seal: 1.2 added the envelope's part, key, cost
TIED_PARTS_VERSION = (1, 6)  # a part after part 0: 1.6 added the envelope's `of`
FIELDS_VERSION = (1, 5)  # fields appended to a step (add_fields); 1.5 added the envelope's `of`
MAX_ENVELOPE = 64 << 20
_PRELUDE = struct.Struct("<8sHHIQ")
_SIDECAR_PRELUDE = struct.Struct("<8sHHI16s")
_ZEROS = bytes(ALIGN)


class _Envelope(msgspec.Struct, omit_defaults=True):
    id: bytes
    step: int
    rank: int
    size: int
    header: tuple[int, int]
    parts: bytes  # one byte per buffer, the file it is in: MAIN or SIDECAR (on-disk key)
    offsets: bytes  # little-endian u64 per buffer, from the start of its file
    lengths: bytes  # little-endian u64 per buffer
    codec: str  # the name of the codec that made the header
    sidecar_size: int | None = None
    checksum: str | None = None  # the algorithm of `checksums`, None when there are none
    checksums: bytes = b""  # little-endian u64 per segment: the header, then each buffer
    compression: bytes = b""  # one byte per segment, empty when nothing is compressed
    raw_sizes: bytes = b""  # little-endian u64 per segment, empty likewise
    ranks: int | None = None  # 1.8, a whole step's: the ranks it was sent to (_stored/resumed.py)

    def __post_init__(self) -> None:  # on decode too: msgspec makes this a ValidationError
        if self.ranks is not None and self.ranks <= self.rank:  # no rank of such a step
            raise ValueError(f"its key 'ranks' is {self.ranks}, not more than its rank {self.rank}")


class _PartEnvelope(_Envelope, omit_defaults=True):
    # Since 1.2; a whole step's keeps 15 fields at most, one msgpack fixmap as 1.1's
    part: int | None = None  # its index among its rank's parts
    key: str | int | None = None  # the producer's key
    cost: float | None = None  # its cost when it was assigned
    of: bytes | None = None  # 1.5, fields: their step message's id; 1.6, parts: part 0's


class _FieldsEnvelope(_Envelope, omit_defaults=True, kw_only=True):
    of: bytes  # as _PartEnvelope's; empty: the rank had no message (no parts), always written


_envelope_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(_PartEnvelope)
_U64 = np.dtype("<u8")


class Layout(NamedTuple):
    """A message laid out for storage: the byte chunks of each file, in order, padding
    included, so a sink can write or stream them one after the other.

    ``main_segments[j]`` (``sidecar_segments[j]``) is the segment that chunk ``j`` of the
    file holds, or -1 for the prelude, envelope and padding: a sink can hash each segment
    while it writes it, then :meth:`head` renders the prelude and envelope with those
    checksums, to write over ``main[0]`` (the same length, the layout planned with
    :func:`~rlwire._frame.checksums.placeholder_checksums`)."""

    main: list[bytes | memoryview]
    sidecar: list[bytes | memoryview]
    main_segments: list[int]
    sidecar_segments: list[int]
    envelope: _Envelope

    def head(self, checksums: bytes) -> bytes:
        """The prelude and envelope of the main file, with ``checksums`` recorded."""
        env = _envelope_encoder.encode(
            msgspec.structs.replace(self.envelope, checksum=CHECKSUM, checksums=checksums)
        )
        version = _version(self.envelope)
        return _PRELUDE.pack(MAIN_MAGIC, *version, len(env), xxhash.xxh3_64_intdigest(env)) + env


def _version(envelope: _Envelope) -> tuple[int, int]:
    if isinstance(envelope, _PartEnvelope):
        return PARTS_VERSION if envelope.of is None else TIED_PARTS_VERSION
    if isinstance(envelope, _FieldsEnvelope):
        return FIELDS_VERSION
    return FORMAT_VERSION if envelope.ranks is None else RANKS_VERSION


def _pad(offset: int) -> int:
    return -offset % ALIGN


def _starts(padded: np.ndarray, base: int) -> np.ndarray:
    """Offsets of consecutive padded buffers placed from ``base``."""
    out = np.empty(len(padded), _U64)
    if len(padded):
        out[0] = 0
        np.cumsum(padded[:-1], out=out[1:])
    out += np.uint64(base)
    return out


def _chunks(
    bufs: Sequence[tuple[int, bytes | memoryview | Pieces]],
    out: list[bytes | memoryview],
    segs: list[int],
) -> None:
    for seg, buf in bufs:
        if isinstance(buf, Pieces):  # its runs back to back: the joined bytes, uncopied
            size = buf.nbytes
            out += buf.runs
            segs += [seg] * len(buf.runs)
        else:
            size = memoryview(buf).nbytes
            if size:
                out.append(buf)
                segs.append(seg)
        pad = _pad(size)
        if pad:
            out.append(_ZEROS[:pad])
            segs.append(-1)


def plan(
    frame: Frame,
    step: int,
    rank: int,
    checksums: bytes | None = None,
    *,
    part: PartInfo | None = None,
    of: bytes | None = None,
    ranks: int | None = None,
) -> Layout:
    """Lay ``frame`` out as a main file and a sidecar file (empty without sidecar).

    ``checksums`` comes from :func:`~rlwire._frame.checksums.checksum_segments` (None:
    no segment checksums). Microseconds per thousand buffers (numpy, packed tables).
    ``part`` makes it a part of a step (index, key, cost in the envelope; version 1.2;
    1.6 with the id of its rank's part 0 it follows, ``part.of``); ``of`` a message of
    fields appended to a step, checked against the step's message of that id (``b""``:
    the rank had none; version 1.5); ``ranks`` a whole step's message, the step sent
    to that many ranks (version 1.8).
    """
    msg_id = os.urandom(16)
    n = len(frame.buffers)
    lengths = np.fromiter((b.nbytes for b in frame.buffers), _U64, n)
    files = np.zeros(n, np.uint8)
    if frame.sidecar:
        files[sorted(frame.sidecar)] = SIDECAR
    in_side = files == SIDECAR
    padded = (lengths + np.uint64(ALIGN - 1)) // np.uint64(ALIGN) * np.uint64(ALIGN)
    offsets = np.empty(n, _U64)
    offsets[in_side] = _starts(padded[in_side], ALIGN)
    sidecar_size = ALIGN + int(padded[in_side].sum()) if frame.sidecar else None
    header_len = len(frame.header)
    kind: type[_Envelope] = _Envelope
    kind_keys: dict[str, Any] = {}
    if part is not None:
        kind, kind_keys = _PartEnvelope, {"part": part.index, "key": part.key, "cost": part.cost}
        kind_keys |= {"of": part.of} if part.of is not None else {}
    elif of is not None:
        kind, kind_keys = _FieldsEnvelope, {"of": of}
    elif ranks is not None:
        kind_keys = {"ranks": ranks}
    # The envelope holds offsets that depend on its own length: lay out with a guess,
    # then again with the real length until it stops growing (a pass or two).
    env_len = 0
    while True:
        header_offset = _PRELUDE.size + env_len + _pad(_PRELUDE.size + env_len)
        body = header_offset + header_len + _pad(header_len)
        offsets[~in_side] = _starts(padded[~in_side], body)
        size = body + int(padded[~in_side].sum())
        envelope = kind(
            id=msg_id,
            step=step,
            rank=rank,
            size=size,
            header=(header_offset, header_len),
            parts=files.tobytes(),
            offsets=offsets.tobytes(),
            lengths=lengths.tobytes(),
            sidecar_size=sidecar_size,
            codec=frame.codec,
            checksum=None if checksums is None else CHECKSUM,
            checksums=checksums or b"",
            compression=bytes(frame.compression),
            raw_sizes=np.array(frame.raw_sizes, _U64).tobytes(),
            **kind_keys,
        )
        env = _envelope_encoder.encode(envelope)
        if len(env) == env_len:
            break
        env_len = len(env)
    version = _version(envelope)
    head = _PRELUDE.pack(MAIN_MAGIC, *version, env_len, xxhash.xxh3_64_intdigest(env))
    main: list[bytes | memoryview] = [head + env]
    main_segs = [-1]
    gap = header_offset - _PRELUDE.size - env_len
    if gap:
        main.append(_ZEROS[:gap])
        main_segs.append(-1)
    _chunks([(0, frame.header)], main, main_segs)
    side_flags = in_side.tolist()
    _chunks([(i + 1, b) for i, b in enumerate(frame.buffers) if not side_flags[i]], main, main_segs)
    sidecar: list[bytes | memoryview] = []
    side_segs: list[int] = []
    if frame.sidecar:
        sidecar = [
            _SIDECAR_PRELUDE.pack(SIDECAR_MAGIC, *version, 0, msg_id)
            + _ZEROS[: ALIGN - _SIDECAR_PRELUDE.size]
        ]
        side_segs = [-1]
        _chunks([(i + 1, frame.buffers[i]) for i in sorted(frame.sidecar)], sidecar, side_segs)
    return Layout(main, sidecar, main_segs, side_segs, envelope)


def parse_main(
    data: memoryview,
    *,
    step: int,
    rank: int,
    load_sidecar: Callable[[int], memoryview],
    where: str,
    verify: bool = True,
) -> Frame:
    """Rebuild a Frame from a main file, as views over ``data`` and the sidecar.

    Args:
        data: the whole main file.
        step: the step the caller expects the message to hold.
        rank: the rank the caller expects it to be for.
        load_sidecar: the whole sidecar file, given its size; called only if it has one.
        where: names the message in error messages (a path or URL).
        verify: check the checksum of every segment (the envelope's is always checked).

    Raises:
        UnsupportedVersionError: the major format version is not one this reader knows,
            or the message uses a checksum algorithm it does not know.
        CorruptFrameError: anything truncated, garbled or inconsistent, or a segment
            whose checksum does not match (the message names step, rank and buffer).
    """
    env = _whole_envelope(data, where)
    return _parse(env, data, step, rank, load_sidecar, where, verify)


def _whole_envelope(data: memoryview, where: str) -> _PartEnvelope:
    env = _envelope(data, where)
    if env.part is not None:
        raise CorruptFrameError(f"holds part {env.part}, not a whole step", where=where)
    return env


def _parse(
    env: _PartEnvelope,
    data: memoryview,
    step: int,
    rank: int,
    load_sidecar: Callable[[int], memoryview],
    where: str,
    verify: bool,
) -> Frame:
    if (env.step, env.rank) != (step, rank):
        raise CorruptFrameError(
            f"holds step {env.step} rank {env.rank}, expected step {step} rank {rank}",
            where=where,
        )
    header = span(data, env.header[0], env.header[1], where, "header")
    head_end = _PRELUDE.size + _PRELUDE.unpack_from(data)[3]
    files, offsets, lengths = checked_table(env, data.nbytes, head_end, where)
    sidecar, side = data[:0], side_of(files, where)  # side: the segments there, and where
    if side is not None:
        sidecar = load_sidecar(env.sidecar_size or 0)
        _check_sidecar(sidecar, env.id, env.sidecar_size or 0, side[1])
    stored = data.nbytes + sidecar.nbytes
    views = (data, sidecar)
    table = zip(files.tolist(), offsets.tolist(), lengths.tolist(), strict=True)
    buffers = [views[file][off : off + length] for file, off, length in table]
    verified = False
    if verify and env.checksum is not None:
        try:
            verify_segments(env.checksum, env.checksums, [header, *buffers], where, sidecar=side)
        except CorruptFrameError as exc:
            exc.add_context(step=step, rank=rank)
            raise
        verified = True
    return Frame(
        header,
        tuple(buffers),
        frozenset(np.flatnonzero(files == SIDECAR).tolist()),
        env.codec,
        tuple(env.compression),
        tuple(np.frombuffer(env.raw_sizes, _U64).tolist()),
        stored_size=stored,
        verified=verified,
        message_id=env.id,
    )


def _envelope(data: memoryview, where: str, *, whole: bool = True) -> _PartEnvelope:
    """The envelope of a main file, its prelude, length, checksum and (``whole``) size checked."""
    if data.nbytes < _PRELUDE.size:
        raise CorruptFrameError(
            f"truncated: {data.nbytes} bytes is shorter than the {_PRELUDE.size}-byte prelude",
            where=where,
        )
    magic, major, _minor, env_len, env_sum = _PRELUDE.unpack_from(data)
    check_magic(
        magic, major, expected=MAIN_MAGIC, known=FORMAT_VERSION[0], what="message", where=where
    )
    if env_len > min(MAX_ENVELOPE, data.nbytes - _PRELUDE.size):
        raise CorruptFrameError(
            f"envelope length {env_len} exceeds the message ({data.nbytes} bytes)",
            where=where,
        )
    raw_env = data[_PRELUDE.size : _PRELUDE.size + env_len]
    if xxhash.xxh3_64_intdigest(raw_env) != env_sum:
        raise CorruptFrameError("the envelope does not match its checksum", where=where)
    try:
        env = _envelope_decoder.decode(raw_env)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a str field that is not UTF-8
        raise CorruptFrameError(f"malformed envelope: {exc}", where=where) from exc
    if whole and env.size != data.nbytes:
        raise CorruptFrameError(
            f"truncated or extended: the envelope says {env.size} bytes, found {data.nbytes}",
            where=where,
        )
    return env


def _check_sidecar(side: memoryview, msg_id: bytes, size: int, where: str) -> None:
    """Check the sidecar at ``where`` (its own place, which its errors name)."""
    if side.nbytes < _SIDECAR_PRELUDE.size:
        raise CorruptFrameError(f"sidecar truncated to {side.nbytes} bytes", where=where)
    magic, major, _minor, _reserved, side_id = _SIDECAR_PRELUDE.unpack_from(side)
    check_magic(
        magic,
        major,
        expected=SIDECAR_MAGIC,
        known=FORMAT_VERSION[0],
        what="sidecar",
        where=where,
    )
    if side_id != msg_id:
        raise CorruptFrameError(
            "sidecar belongs to another message (id mismatch; "
            "a stale sidecar from an earlier run?)",
            where=where,
        )
    if side.nbytes != size:
        raise CorruptFrameError(
            f"sidecar truncated or extended: expected {size} bytes, found {side.nbytes}",
            where=where,
        )
