"""The byte layout of a stored message: main part and sidecar part (docs/format.md).

Shared by every sink that stores messages as files or objects. The main part is::

    magic (8) | major u16 | minor u16 | envelope length u32 | envelope (msgpack)
    | zero padding to 64 | header | padding | buffer | padding | buffer ...

The sidecar part is::

    sidecar magic (8) | major u16 | minor u16 | reserved u32 | message id (16)
    | zero padding to 64 | buffer | padding | buffer ...

Every buffer starts at a multiple of 64 bytes from the start of its part, so views
over a page-aligned mmap are aligned for every dtype.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence

import msgspec

from ..errors import CorruptFrameError, UnsupportedVersionError
from ..frame import Frame

__all__ = [
    "ALIGN",
    "FORMAT_VERSION",
    "Layout",
    "parse_main",
    "plan",
    "sizes",
]

MAIN_MAGIC = b"\x89RLW\r\n\x1a\n"
SIDECAR_MAGIC = b"\x89RLS\r\n\x1a\n"
FORMAT_VERSION = (1, 0)
ALIGN = 64
MAX_ENVELOPE = 64 << 20

_PRELUDE = struct.Struct("<8sHHI")
_SIDECAR_PRELUDE = struct.Struct("<8sHHI16s")
_ZEROS = bytes(ALIGN)

MAIN, SIDECAR = 0, 1


class _BufferEntry(msgspec.Struct, array_like=True):
    part: int
    offset: int
    length: int


class _Envelope(msgspec.Struct):
    id: bytes
    step: int
    rank: int
    size: int
    header: tuple[int, int]
    buffers: list[_BufferEntry]
    sidecar_size: int | None = None


_envelope_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)


class Layout(msgspec.Struct):
    """A message laid out for storage: the pieces of each part, in order."""

    main: list[bytes | memoryview]
    sidecar: list[bytes | memoryview]


def _pad(offset: int) -> int:
    return -offset % ALIGN


def plan(frame: Frame, step: int, rank: int) -> Layout:
    """Lay ``frame`` out as a main part and a sidecar part (empty without sidecar)."""
    msg_id = os.urandom(16)
    side_pieces: list[bytes | memoryview] = []
    entries: list[_BufferEntry] = []
    side_offset = ALIGN if frame.sidecar else 0
    main_bufs: list[tuple[int, memoryview]] = []
    for i, buf in enumerate(frame.buffers):
        if i in frame.sidecar:
            entries.append(_BufferEntry(SIDECAR, side_offset, buf.nbytes))
            side_pieces.append(buf)
            side_pieces.append(_ZEROS[: _pad(buf.nbytes)])
            side_offset += buf.nbytes + _pad(buf.nbytes)
        else:
            entries.append(_BufferEntry(MAIN, 0, buf.nbytes))  # offset fixed below
            main_bufs.append((i, buf))
    sidecar: list[bytes | memoryview] = []
    if frame.sidecar:
        prelude = _SIDECAR_PRELUDE.pack(SIDECAR_MAGIC, *FORMAT_VERSION, 0, msg_id)
        sidecar = [prelude, _ZEROS[: _pad(len(prelude))], *side_pieces]

    header_len = len(frame.header)

    def envelope(header_offset: int, size: int) -> bytes:
        return _envelope_encoder.encode(
            _Envelope(
                id=msg_id,
                step=step,
                rank=rank,
                size=size,
                header=(header_offset, header_len),
                buffers=entries,
                sidecar_size=side_offset if frame.sidecar else None,
            )
        )

    # The envelope holds offsets that depend on its own length: lay out once with a
    # guess, then again with the real length (integers only grow msgpack by a few bytes).
    env_len = 0
    for _ in range(4):
        header_offset = _PRELUDE.size + env_len
        header_offset += _pad(header_offset)
        offset = header_offset + header_len
        for i, buf in main_bufs:
            offset += _pad(offset)
            entries[i].offset = offset
            offset += buf.nbytes
        env = envelope(header_offset, offset)
        if len(env) == env_len:
            break
        env_len = len(env)
    main: list[bytes | memoryview] = [
        _PRELUDE.pack(MAIN_MAGIC, *FORMAT_VERSION, len(env)),
        env,
        _ZEROS[: header_offset - _PRELUDE.size - len(env)],
        frame.header,
    ]
    pos = header_offset + header_len
    for i, buf in main_bufs:
        main.append(_ZEROS[: entries[i].offset - pos])
        main.append(buf)
        pos = entries[i].offset + buf.nbytes
    return Layout(main=[p for p in main if len(p)], sidecar=[p for p in sidecar if len(p)])


def parse_main(
    data: memoryview,
    *,
    step: int,
    rank: int,
    load_sidecar: Callable[[], memoryview],
    where: str,
) -> Frame:
    """Rebuild a Frame from a main part, as views over ``data`` and the sidecar.

    Args:
        data: the whole main part.
        step, rank: what the caller expects the message to be.
        load_sidecar: returns the whole sidecar part; called only if the message has one.
        where: names the message in error messages (a path or URL).

    Raises:
        UnsupportedVersionError: the major format version is not one this reader knows.
        CorruptFrameError: anything truncated, garbled or inconsistent.
    """
    if data.nbytes < _PRELUDE.size:
        raise CorruptFrameError(
            f"{where}: truncated: {data.nbytes} bytes is shorter than "
            f"the {_PRELUDE.size}-byte prelude"
        )
    magic, major, _minor, env_len = _PRELUDE.unpack_from(data)
    if magic != MAIN_MAGIC:
        raise CorruptFrameError(f"{where}: not an rlwire message (bad magic bytes {magic!r})")
    if major != FORMAT_VERSION[0]:
        raise UnsupportedVersionError(
            f"{where}: wire format major version {major} is not supported; this reader "
            f"knows version {FORMAT_VERSION[0]} (upgrade rlwire to read it)"
        )
    if env_len > min(MAX_ENVELOPE, data.nbytes - _PRELUDE.size):
        raise CorruptFrameError(
            f"{where}: envelope length {env_len} exceeds the message ({data.nbytes} bytes)"
        )
    try:
        env = _envelope_decoder.decode(data[_PRELUDE.size : _PRELUDE.size + env_len])
    except msgspec.DecodeError as exc:
        raise CorruptFrameError(f"{where}: malformed envelope: {exc}") from exc
    if env.size != data.nbytes:
        raise CorruptFrameError(
            f"{where}: truncated or extended: the envelope says "
            f"{env.size} bytes, found {data.nbytes}"
        )
    if (env.step, env.rank) != (step, rank):
        raise CorruptFrameError(
            f"{where}: holds step {env.step} rank {env.rank}, expected step {step} rank {rank}"
        )
    header = _slice(data, env.header[0], env.header[1], where, "header")
    sidecar: memoryview | None = None
    if any(e.part == SIDECAR for e in env.buffers):
        if env.sidecar_size is None:
            raise CorruptFrameError(
                f"{where}: buffers refer to a sidecar the message does not declare"
            )
        sidecar = load_sidecar()
        _check_sidecar(sidecar, env.id, env.sidecar_size, where)
    buffers: list[memoryview] = []
    side_indices: list[int] = []
    for i, e in enumerate(env.buffers):
        if e.part == MAIN:
            buffers.append(_slice(data, e.offset, e.length, where, f"buffer {i}"))
        elif e.part == SIDECAR and sidecar is not None:
            buffers.append(_slice(sidecar, e.offset, e.length, where + " sidecar", f"buffer {i}"))
            side_indices.append(i)
        else:
            raise CorruptFrameError(f"{where}: buffer {i} is in unknown part {e.part}")
    return Frame(header, tuple(buffers), frozenset(side_indices))


def _check_sidecar(side: memoryview, msg_id: bytes, size: int, where: str) -> None:
    if side.nbytes < _SIDECAR_PRELUDE.size:
        raise CorruptFrameError(f"{where}: sidecar truncated to {side.nbytes} bytes")
    magic, major, _minor, _reserved, side_id = _SIDECAR_PRELUDE.unpack_from(side)
    if magic != SIDECAR_MAGIC:
        raise CorruptFrameError(f"{where}: sidecar has bad magic bytes {magic!r}")
    if major != FORMAT_VERSION[0]:
        raise UnsupportedVersionError(
            f"{where}: sidecar format major version {major} is not "
            f"supported; this reader knows {FORMAT_VERSION[0]}"
        )
    if side_id != msg_id:
        raise CorruptFrameError(
            f"{where}: sidecar belongs to another message (id mismatch; "
            "a stale sidecar from an earlier run?)"
        )
    if side.nbytes != size:
        raise CorruptFrameError(
            f"{where}: sidecar truncated or extended: expected {size} bytes, found {side.nbytes}"
        )


def _slice(data: memoryview, offset: int, length: int, where: str, what: str) -> memoryview:
    if offset < 0 or length < 0 or offset + length > data.nbytes:
        raise CorruptFrameError(
            f"{where}: {what} at offset {offset} length {length} lies "
            f"outside the {data.nbytes}-byte data"
        )
    return data[offset : offset + length]


def sizes(pieces: Sequence[bytes | memoryview]) -> int:
    """Total length of ``pieces`` in bytes."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)
