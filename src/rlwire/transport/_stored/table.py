"""Checks of a stored message's buffer table: its arrays agree, and every buffer lies
inside its file, once (see :mod:`rlwire.transport._stored.layout`); and of the magic
bytes and version that open every stored file.

A writer lays each segment out once, on its own bytes. A table that lists the same
bytes twice (sixteen buffers over one lz4 block, 131,072 over one range) is forged, to
make a reader hash, decompress and decode them many times over: it is refused here,
where the table is parsed, before a single segment is read.

Example:
    >>> import numpy as np
    >>> files = np.zeros(2, np.uint8)
    >>> offsets, lengths = np.array([64, 96], "<u8"), np.array([64, 8], "<u8")
    >>> try:  # doctest: +NORMALIZE_WHITESPACE
    ...     check_disjoint(files, offsets, lengths, main=[(0, 64)], sidecar=[], where="m")
    ... except Exception as exc:
    ...     print(exc)
    m: the buffer table lays buffer 0 and buffer 1 over the same bytes of the main file
    (at offset 96): segments may not overlap
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlwire._core.errors import CorruptFrameError, UnsupportedVersionError

__all__ = [
    "ALIGN",
    "MAIN",
    "MAX_EMPTY_BUFFERS",
    "SIDECAR",
    "check_count",
    "check_disjoint",
    "check_magic",
    "check_table_sizes",
    "check_within",
    "checked_table",
    "side_of",
    "sidecar_place",
    "span",
]

ALIGN = 64
#: How many empty buffers a message may hold beyond one per ALIGN bytes of it.
MAX_EMPTY_BUFFERS = 4096
MAIN, SIDECAR = 0, 1
_U64 = np.dtype("<u8")
_SIDECAR_PRELUDE_SIZE = 32  # magic, version, reserved, message id


def checked_table(
    env: Any, main_size: int, head_end: int, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The buffer table of envelope ``env`` (of a main file of ``main_size`` bytes whose
    prelude and envelope end at ``head_end``) as arrays ``(files, offsets, lengths)``,
    once every check of docs/format.md passes: the arrays agree, every buffer is in a
    file the message has and lies inside it (the sidecar's size as declared), and no two
    overlap. Reads nothing but the envelope.

    Raises:
        CorruptFrameError: any of these fails.
    """
    n = len(env.parts)
    check_table_sizes(env, n, where)
    files = np.frombuffer(env.parts, np.uint8)
    offsets = np.frombuffer(env.offsets, _U64)
    lengths = np.frombuffer(env.lengths, _U64)
    if (files > SIDECAR).any():
        i = int(np.argmax(files > SIDECAR))
        raise CorruptFrameError(f"buffer {i} is in unknown file {files[i]}", where=where)
    sidecar_size = 0
    if (files == SIDECAR).any():
        if env.sidecar_size is None:
            raise CorruptFrameError(
                "buffers refer to a sidecar the message does not declare", where=where
            )
        sidecar_size = max(0, int(env.sidecar_size))
    check_count(n, main_size + sidecar_size, where)
    check_within(files, offsets, lengths, (main_size, sidecar_size), where)
    check_disjoint(
        files,
        offsets,
        lengths,
        main=[(0, head_end), (env.header[0], env.header[0] + env.header[1])],
        sidecar=[(0, _SIDECAR_PRELUDE_SIZE)],
        where=where,
    )
    return files, offsets, lengths


def check_magic(
    magic: bytes, major: int, *, expected: bytes, known: int, what: str, where: str
) -> None:
    """Check the magic bytes and major version that open every file rlwire writes.

    Raises:
        CorruptFrameError: ``magic`` is not ``expected``: not an rlwire ``what``.
        UnsupportedVersionError: ``major`` is not ``known``.
    """
    if magic != expected:
        raise CorruptFrameError(f"not an rlwire {what} (bad magic bytes {magic!r})", where=where)
    if major != known:
        raise UnsupportedVersionError(
            f"{what} format major version {major} is not supported; this reader "
            f"knows version {known} (upgrade rlwire to read it)",
            where=where,
        )


def check_table_sizes(env: Any, n: int, where: str) -> None:
    """Check that every array of the buffer table of envelope ``env`` holds one entry
    per buffer."""
    sizes = {
        "offsets": (len(env.offsets), 8 * n),
        "lengths": (len(env.lengths), 8 * n),
        "checksums": (len(env.checksums), 8 * (n + 1) if env.checksum else 0),
        "compression": (len(env.compression), n + 1 if env.compression else 0),
        "raw_sizes": (len(env.raw_sizes), 8 * (n + 1) if env.compression else 0),
    }
    for name, (found, expected) in sizes.items():
        if found != expected:
            raise CorruptFrameError(
                f"the buffer table disagrees with itself: {n} buffers, "
                f"{found} bytes of {name} (expected {expected})",
                where=where,
            )


def check_count(n: int, stored: int, where: str) -> None:
    """Check that a message of ``stored`` bytes has room for ``n`` buffers."""
    if n > stored // ALIGN + MAX_EMPTY_BUFFERS:
        # Every non-empty buffer starts on its own ALIGN-byte boundary, so a message
        # has room for at most this many; more are empty buffers that would only cost
        # the reader a view and a checksum each.
        raise CorruptFrameError(
            f"{n} buffers in a message of {stored} bytes: at most one per {ALIGN} bytes "
            f"plus {MAX_EMPTY_BUFFERS} empty ones can be real",
            where=where,
        )


def check_within(
    files: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, sizes: tuple[int, int], where: str
) -> None:
    """Check that every buffer lies inside its file (``sizes``: main file, sidecar)."""
    limit = np.where(files == MAIN, np.uint64(sizes[MAIN]), np.uint64(sizes[SIDECAR]))
    outside = (offsets > limit) | (lengths > limit - np.minimum(offsets, limit))
    if outside.any():
        i = int(np.argmax(outside))
        file = "sidecar" if files[i] == SIDECAR else "main file"
        raise CorruptFrameError(
            f"buffer {i} at offset {offsets[i]} length "
            f"{lengths[i]} lies outside the {int(limit[i])}-byte {file}",
            where=where,
        )


def check_disjoint(
    files: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    *,
    main: list[tuple[int, int]],
    sidecar: list[tuple[int, int]],
    where: str,
) -> None:
    """Check that no two non-empty buffers share a byte, nor a buffer any of the fixed
    ranges ``(start, end)`` of each file (``main``: the prelude and envelope, then the
    header; ``sidecar``: its prelude). Every buffer must lie inside its file already
    (:func:`check_within`). Sorted by offset, each range must end before the next one
    starts: in numpy, a table of 100,000 buffers takes milliseconds."""
    for file, fixed in ((MAIN, main), (SIDECAR, sidecar)):
        mine = np.flatnonzero((files == file) & (lengths > 0))
        if not mine.size and file == SIDECAR:
            continue
        fixed = [(start, end) for start, end in fixed if end > start]
        names = np.concatenate((-1 - np.arange(len(fixed)), mine))
        starts = np.concatenate((np.array([f[0] for f in fixed], _U64), offsets[mine]))
        ends = np.concatenate(
            (np.array([f[1] for f in fixed], _U64), offsets[mine] + lengths[mine])
        )
        order = np.argsort(starts, kind="stable")
        clash = ends[order[:-1]] > starts[order[1:]]
        if clash.any():
            k = int(np.argmax(clash))
            first, second = (_name(int(names[order[j]]), file) for j in (k, k + 1))
            raise CorruptFrameError(
                f"the buffer table lays {first} and {second} over the same bytes of the "
                f"{'main file' if file == MAIN else 'sidecar'} (at offset "
                f"{int(starts[order[k + 1]])}): segments may not overlap",
                where=where,
            )


def _name(segment: int, file: int) -> str:
    if segment >= 0:
        return f"buffer {segment}"
    if segment == -1:
        return "the prelude and envelope" if file == MAIN else "the sidecar's prelude"
    return "the header"


def side_of(files: np.ndarray | Sequence[int], where: str) -> tuple[frozenset[int], str] | None:
    """The segments of a message stored in its sidecar (``i + 1`` for each buffer ``i``
    that ``files``, its table's, puts there) and where that sidecar is, given ``where``,
    the main file's place, a path or URL ending in its name (``….rlw``: the sidecar's
    ends in ``….sidecar.rlw``; another ``where`` gains `` sidecar``); ``None`` if it has
    none. What names a damaged sidecar (:func:`rlwire._frame.checksums.compare_digests`).

    Example:
        >>> side_of(np.array([0, 1, 1], np.uint8), "/run/step-00000003.rank-0000.rlw")
        (frozenset({2, 3}), '/run/step-00000003.rank-0000.sidecar.rlw')
    """
    segments = frozenset((np.flatnonzero(np.asarray(files) == SIDECAR) + 1).tolist())
    return (segments, sidecar_place(where)) if segments else None


def sidecar_place(where: str) -> str:
    """Where the sidecar of the message at ``where`` is (see :func:`side_of`): what
    every error about the sidecar itself names.

    Example:
        >>> sidecar_place("s3://b/run/step-00000003.rank-0000.part-000001.rlw")
        's3://b/run/step-00000003.rank-0000.part-000001.sidecar.rlw'
        >>> sidecar_place("msg")
        'msg sidecar'
    """
    return f"{where[:-4]}.sidecar.rlw" if where.endswith(".rlw") else f"{where} sidecar"


def span(data: memoryview, offset: int, length: int, where: str, what: str) -> memoryview:
    """Bytes ``offset:offset + length`` of ``data``, which must lie inside it (``what``
    names them in the error).

    Raises:
        CorruptFrameError: they do not.
    """
    if offset < 0 or length < 0 or offset + length > data.nbytes:
        raise CorruptFrameError(
            f"{what} at offset {offset} length {length} lies outside the {data.nbytes}-byte data",
            where=where,
        )
    return data[offset : offset + length]
