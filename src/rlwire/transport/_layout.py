"""The byte layout of a stored message: main part and sidecar part (docs/format.md).

Shared by every sink that stores messages as files or objects. The main part is::

    magic (8) | major u16 | minor u16 | envelope length u32 | envelope (msgpack)
    | zero padding to 64 | header | padding to 64 | buffer | padding to 64 | ...

The sidecar part is::

    sidecar magic (8) | major u16 | minor u16 | reserved u32 | message id (16)
    | zero padding to 64 | buffer | padding to 64 | buffer | padding to 64 | ...

Every buffer starts at a multiple of 64 bytes from the start of its part, so views
over a page-aligned mmap are aligned for every dtype.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec
import numpy as np

from ..errors import CorruptFrameError, UnsupportedVersionError
from ..frame import Frame

__all__ = [
    "ALIGN",
    "FORMAT_VERSION",
    "Layout",
    "parse_main",
    "plan",
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


class _Envelope(msgspec.Struct):
    id: bytes
    step: int
    rank: int
    size: int
    header: tuple[int, int]
    parts: bytes  # one byte per buffer: MAIN or SIDECAR
    offsets: bytes  # little-endian u64 per buffer, from the start of its part
    lengths: bytes  # little-endian u64 per buffer
    sidecar_size: int | None = None


_envelope_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)
_U64 = np.dtype("<u8")


class Layout(NamedTuple):
    """A message laid out for storage: the byte pieces of each part, in order, padding
    included, so a sink can write or stream them one after the other."""

    main: list[bytes | memoryview]
    sidecar: list[bytes | memoryview]


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


def _pieces(bufs: Sequence[memoryview], out: list[bytes | memoryview]) -> None:
    for buf in bufs:
        out.append(buf)
        pad = _pad(buf.nbytes)
        if pad:
            out.append(_ZEROS[:pad])


def plan(frame: Frame, step: int, rank: int) -> Layout:
    """Lay ``frame`` out as a main part and a sidecar part (empty without sidecar).

    Offsets come from numpy arithmetic and the buffer table is three packed arrays, so
    this costs microseconds per thousand buffers.
    """
    msg_id = os.urandom(16)
    n = len(frame.buffers)
    lengths = np.fromiter((b.nbytes for b in frame.buffers), _U64, n)
    parts = np.zeros(n, np.uint8)
    if frame.sidecar:
        parts[sorted(frame.sidecar)] = SIDECAR
    in_side = parts == SIDECAR
    padded = (lengths + np.uint64(ALIGN - 1)) // np.uint64(ALIGN) * np.uint64(ALIGN)
    offsets = np.empty(n, _U64)
    offsets[in_side] = _starts(padded[in_side], ALIGN)
    sidecar_size = ALIGN + int(padded[in_side].sum()) if frame.sidecar else None
    header_len = len(frame.header)
    # The envelope holds offsets that depend on its own length: lay out with a guess,
    # then again with the real length until it stops growing (a pass or two).
    env_len = 0
    while True:
        header_offset = _PRELUDE.size + env_len + _pad(_PRELUDE.size + env_len)
        body = header_offset + header_len + _pad(header_len)
        offsets[~in_side] = _starts(padded[~in_side], body)
        size = body + int(padded[~in_side].sum())
        env = _envelope_encoder.encode(
            _Envelope(
                id=msg_id,
                step=step,
                rank=rank,
                size=size,
                header=(header_offset, header_len),
                parts=parts.tobytes(),
                offsets=offsets.tobytes(),
                lengths=lengths.tobytes(),
                sidecar_size=sidecar_size,
            )
        )
        if len(env) == env_len:
            break
        env_len = len(env)
    main: list[bytes | memoryview] = [
        _PRELUDE.pack(MAIN_MAGIC, *FORMAT_VERSION, env_len),
        env,
        _ZEROS[: header_offset - _PRELUDE.size - env_len],
    ]
    _pieces([memoryview(frame.header)], main)
    _pieces([b for b, side in zip(frame.buffers, in_side.tolist(), strict=True) if not side], main)
    sidecar: list[bytes | memoryview] = []
    if frame.sidecar:
        sidecar = [
            _SIDECAR_PRELUDE.pack(SIDECAR_MAGIC, *FORMAT_VERSION, 0, msg_id),
            _ZEROS[: ALIGN - _SIDECAR_PRELUDE.size],
        ]
        _pieces([frame.buffers[i] for i in sorted(frame.sidecar)], sidecar)
    return Layout(main=[p for p in main if len(p)], sidecar=sidecar)


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
    _check_magic(magic, major, MAIN_MAGIC, f"{where}: not an rlwire message", where)
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
    n = len(env.parts)
    if len(env.offsets) != 8 * n or len(env.lengths) != 8 * n:
        raise CorruptFrameError(
            f"{where}: buffer table sizes disagree ({n} parts, "
            f"{len(env.offsets)} offset bytes, {len(env.lengths)} "
            "length bytes)"
        )
    parts = np.frombuffer(env.parts, np.uint8)
    offsets = np.frombuffer(env.offsets, _U64)
    lengths = np.frombuffer(env.lengths, _U64)
    if (parts > SIDECAR).any():
        i = int(np.argmax(parts > SIDECAR))
        raise CorruptFrameError(f"{where}: buffer {i} is in unknown part {parts[i]}")
    sidecar = data[:0]
    if (parts == SIDECAR).any():
        if env.sidecar_size is None:
            raise CorruptFrameError(
                f"{where}: buffers refer to a sidecar the message does not declare"
            )
        sidecar = load_sidecar()
        _check_sidecar(sidecar, env.id, env.sidecar_size, where)
    limit = np.where(parts == MAIN, np.uint64(data.nbytes), np.uint64(sidecar.nbytes))
    outside = (offsets > limit) | (lengths > limit - np.minimum(offsets, limit))
    if outside.any():
        i = int(np.argmax(outside))
        part = "sidecar" if parts[i] == SIDECAR else "main part"
        raise CorruptFrameError(
            f"{where}: buffer {i} at offset {offsets[i]} length "
            f"{lengths[i]} lies outside the {int(limit[i])}-byte {part}"
        )
    views = (data, sidecar)
    buffers = [
        views[part][off : off + length]
        for part, off, length in zip(
            parts.tolist(), offsets.tolist(), lengths.tolist(), strict=True
        )
    ]
    return Frame(header, tuple(buffers), frozenset(np.flatnonzero(parts == SIDECAR).tolist()))


def _check_magic(magic: bytes, major: int, expected: bytes, bad: str, where: str) -> None:
    if magic != expected:
        raise CorruptFrameError(f"{bad} (bad magic bytes {magic!r})")
    if major != FORMAT_VERSION[0]:
        raise UnsupportedVersionError(
            f"{where}: wire format major version {major} is not supported; this reader "
            f"knows version {FORMAT_VERSION[0]} (upgrade rlwire to read it)"
        )


def _check_sidecar(side: memoryview, msg_id: bytes, size: int, where: str) -> None:
    if side.nbytes < _SIDECAR_PRELUDE.size:
        raise CorruptFrameError(f"{where}: sidecar truncated to {side.nbytes} bytes")
    magic, major, _minor, _reserved, side_id = _SIDECAR_PRELUDE.unpack_from(side)
    _check_magic(magic, major, SIDECAR_MAGIC, f"{where}: not an rlwire sidecar", f"{where} sidecar")
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
