"""Segment checksums: the xxh3-64 of a frame's header and of each buffer.

Every sink records them and every source verifies them (docs/format.md): the stored
layout in its envelope, ZeroMQ in each message's seal. Hashing runs beside the thread that
reads or writes (xxhash releases the GIL), in slices; a large message by as many threads
as :func:`rlwire._core.pools.worker_count` allows, in rlwire's shared executor.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import xxhash

from rlwire._core.errors import CorruptFrameError, UnsupportedVersionError
from rlwire._core.pools import shared_executor, worker_count
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._frame.frame import Frame
from rlwire._frame.pieces import Pieces

__all__ = [
    "CHECKSUM",
    "PARALLEL_HASH_BYTES",
    "Sidecar",
    "check_algorithm",
    "checksum_segments",
    "compare_digests",
    "placeholder_checksums",
    "segment_digests",
    "verify_segments",
    "verify_some",
]

#: The algorithm of every checksum rlwire writes.
CHECKSUM = "xxh3-64"
_CHECKSUM_CHUNK = 64 << 20  # bytes hashed per slice (xxhash releases the GIL meanwhile)
_U64 = np.dtype("<u8")

#: Below this many bytes a message's segments are hashed in the calling thread.
PARALLEL_HASH_BYTES = 32 << 20
# Nor are segments this small on average hashed by the pool: each hash call takes the GIL,
# and passing it among the pool's threads costs more than the hashing (and it kept the
# event loop waiting for it several switch intervals in a row).
_POOLED_SEGMENT_BYTES = 256 << 10

#: The segments of a message stored in its sidecar (``i + 1`` for buffer ``i``), and where
#: that sidecar is (a path or URL): a mismatch of one of them names the sidecar, not the
#: main file.
Sidecar = tuple[Collection[int], str]


def placeholder_checksums(frame: Frame) -> bytes:
    """Zero checksums for every segment of ``frame``: plan with these, hash while
    writing, then write the stored layout's head over the first chunk."""
    return bytes(8 * (len(frame.buffers) + 1))


def checksum_segments(frame: Frame) -> Sliced[bytes]:
    """The xxh3-64 checksum of each segment (header, then buffers) as packed little-endian
    u64, computed in slices of at most 64 MiB per thread or 0.3 ms of Python. Segments up
    to 64 MiB are hashed in groups, by up to :func:`~rlwire._core.pools.worker_count`
    threads; a :class:`~rlwire._frame.pieces.Pieces` run by run into one hash, which is
    the hash of the joined bytes."""
    sums: list[int] = []
    group: list[memoryview] = []
    group_bytes = 0
    slicer = SliceTimer()
    for seg in [frame.header, *frame.buffers]:
        if isinstance(seg, Pieces) or memoryview(seg).nbytes > _CHECKSUM_CHUNK:  # in chunks
            sums += segment_digests(group)
            group, group_bytes = [], 0
            sums.append((yield from _chunked_digest(seg, slicer)))
            continue
        view = memoryview(seg)
        group.append(view)
        group_bytes += view.nbytes
        if group_bytes >= _CHECKSUM_CHUNK * worker_count() or slicer.due():
            sums += segment_digests(group)
            group, group_bytes = [], 0
            yield
            slicer.restart()
    sums += segment_digests(group)
    return np.array(sums, _U64).tobytes()


def _chunked_digest(seg: bytes | memoryview | Pieces, slicer: SliceTimer) -> Sliced[int]:
    """The xxh3-64 of one segment, hashed a chunk of at most 64 MiB at a time (xxhash
    releases the GIL meanwhile), yielding after each 64 MiB, at the end, and whenever the
    Python between the chunks of many small runs has taken a slice."""
    hasher = xxhash.xxh3_64()
    runs = seg.runs if isinstance(seg, Pieces) else (memoryview(seg).cast("B"),)
    hashed = 0
    for run in runs:
        for start in range(0, run.nbytes, _CHECKSUM_CHUNK):
            chunk = run[start : start + _CHECKSUM_CHUNK]
            hasher.update(chunk)
            hashed += chunk.nbytes
            if hashed >= _CHECKSUM_CHUNK or slicer.due():
                hashed = 0
                yield
                slicer.restart()
    if hashed:  # the segment's tail, as every chunk, ends a slice
        yield
        slicer.restart()
    return hasher.intdigest()


def verify_segments(
    algorithm: str,
    checksums: bytes,
    segments: Sequence[memoryview],
    where: str,
    *,
    sidecar: Sidecar | None = None,
) -> None:
    """Check each segment (the header, then the buffers) against ``checksums``, packed
    little-endian u64 of ``algorithm``, which the caller has checked holds one per segment.

    Raises:
        UnsupportedVersionError: an algorithm this reader does not know.
        CorruptFrameError: a mismatch, naming the segment (and ``sidecar``'s place
            rather than ``where`` for a segment stored there).
    """
    check_algorithm(algorithm, where)
    compare_digests(checksums, segment_digests(segments), segments, where, sidecar=sidecar)


def check_algorithm(algorithm: str, where: str) -> None:
    """Check that ``algorithm`` is the checksum algorithm this reader computes.

    Raises:
        UnsupportedVersionError: it is another.
    """
    if algorithm != CHECKSUM:
        raise UnsupportedVersionError(
            f"checksum algorithm {algorithm!r} is not one this reader knows "
            f"({CHECKSUM}); receive with verify=False to skip checking",
            where=where,
        )


def compare_digests(
    checksums: bytes,
    digests: Sequence[int],
    segments: Sequence[memoryview],
    where: str,
    *,
    names: Sequence[int] | None = None,
    sidecar: Sidecar | None = None,
) -> None:
    """Check ``digests`` (from :func:`segment_digests`) of ``segments`` against the
    packed little-endian u64 ``checksums`` recorded for them, one per segment;
    ``names``: each one's segment index, when they are not all the segments in order.

    Raises:
        CorruptFrameError: a mismatch, naming the segment, and where it is stored:
            ``where``, or the place ``sidecar`` gives for a segment it lists.
    """
    stored = np.frombuffer(checksums, _U64).tolist()
    for i, (seg, computed) in enumerate(zip(segments, digests, strict=True)):
        if computed != stored[i]:
            k = i if names is None else names[i]
            side = sidecar is not None and k in sidecar[0]
            what = (
                "the header"
                if k == 0
                else f"buffer {k - 1} ({seg.nbytes} bytes{', in the sidecar' if side else ''})"
            )
            raise CorruptFrameError(
                f"{what} does not match its checksum (stored "
                f"{stored[i]:#018x}, computed {computed:#018x})",
                where=sidecar[1] if sidecar is not None and side else where,
                segment=k,
            )


def segment_digests(segments: Sequence[memoryview]) -> list[int]:
    """The xxh3-64 of each segment. A large message's segments are hashed by a thread
    per core but one, in groups of about equal bytes: xxhash releases the GIL, and so
    does the page fault that first touches each page of a fresh mapping. The core left
    is the event loop's: with every core hashing, the kernel let a receiver's loop wait
    for one (on 2 cores, a dense step's verify held it 1.8-3.1 ms above its idle gap,
    against 0.8-1.2 ms with one thread, for 1-2 ms more of receive)."""
    total = sum(seg.nbytes for seg in segments)
    workers = worker_count(spare=1)
    if (
        total < PARALLEL_HASH_BYTES
        or total < len(segments) * _POOLED_SEGMENT_BYTES
        or workers < 2
        or len(segments) < 2
    ):
        return _hashed(segments)
    bounds = np.searchsorted(
        np.cumsum([seg.nbytes for seg in segments]), np.arange(1, workers) * (total / workers)
    ).tolist()
    groups = [segments[a:b] for a, b in zip([0, *bounds], [*bounds, len(segments)], strict=True)]
    return [digest for group in shared_executor().map(_hashed, groups) for digest in group]


def _hashed(segments: Sequence[memoryview]) -> list[int]:
    return [xxhash.xxh3_64_intdigest(segment) for segment in segments]


def verify_some(
    algorithm: str,
    checksums: bytes,
    segments: dict[int, memoryview],
    where: str,
    *,
    sidecar: Sidecar | None = None,
) -> None:
    """:func:`verify_segments` for some segments of a message only (a partial read):
    ``segments`` maps a segment's index (0 the header, ``i + 1`` buffer ``i``) to its
    bytes; ``checksums`` holds one per segment of the whole message.

    Raises:
        UnsupportedVersionError: an algorithm this reader does not know.
        CorruptFrameError: a mismatch, naming the segment.
    """
    check_algorithm(algorithm, where)
    order = sorted(segments)
    stored = np.frombuffer(checksums, _U64)
    compare_digests(
        stored[order].tobytes(),
        segment_digests([segments[k] for k in order]),
        [segments[k] for k in order],
        where,
        names=order,
        sidecar=sidecar,
    )
