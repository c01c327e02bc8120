"""Writing many buffers to a file descriptor in few system calls, hashing them as they go:
the file sink's inner loop."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["CHUNK_BYTES", "batches", "hash_batch", "writev_all"]

#: Bytes per writev call. Each is hashed while it is written, in chunks this small, so
#: the hash and the write read it from cache: checksums then cost almost nothing.
CHUNK_BYTES = 2 << 20
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16)


def hash_batch(hashers: Sequence[Any], batch: list[tuple[memoryview, int]]) -> None:
    """Hash each view of ``batch`` into ``hashers[segment]`` (segments below 0: none)."""
    for view, seg in batch:
        if seg >= 0:
            hashers[seg].update(view)


def batches(
    chunks: Sequence[bytes | memoryview], segments: Sequence[int]
) -> Iterator[list[tuple[memoryview, int]]]:
    """Group chunks into writev batches of at most CHUNK_BYTES and _IOV_MAX entries, so
    thousands of small buffers cost a few system calls; each item is (view, segment).

    Example:
        >>> [len(b) for b in batches([b"ab", b"cd"], [0, 1])]
        [2]
    """
    batch: list[tuple[memoryview, int]] = []
    size = 0
    for chunk, seg in zip(chunks, segments, strict=True):
        if (
            type(chunk) is memoryview
            and chunk.nbytes <= CHUNK_BYTES
            and chunk.format == "B"
            and chunk.ndim == 1
            and chunk.c_contiguous
        ):
            # The common case, thousands of times for the runs of Pieces: a flat byte
            # view, taken as it is.
            batch.append((chunk, seg))
            size += chunk.nbytes
            if size >= CHUNK_BYTES or len(batch) >= _IOV_MAX:
                yield batch
                batch, size = [], 0
            continue
        view = memoryview(chunk).cast("B") if not isinstance(chunk, bytes) else memoryview(chunk)
        for start in range(0, view.nbytes, CHUNK_BYTES):
            piece = view[start : start + CHUNK_BYTES]
            batch.append((piece, seg))
            size += piece.nbytes
            if size >= CHUNK_BYTES or len(batch) >= _IOV_MAX:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def writev_all(fd: int, views: list[memoryview]) -> int:
    """Write every byte of ``views`` to ``fd`` in order; the number of bytes written."""
    total = left = sum(v.nbytes for v in views)
    first = 0  # views before this one are written; a count, not list slices (O(n) not n²)
    while first < len(views):
        n = os.writev(fd, views[first:] if first else views)
        left -= n
        if not left:  # all written: the common case, with no walk over the views
            break
        while first < len(views) and n >= views[first].nbytes:
            n -= views[first].nbytes
            first += 1
        if n:  # a short write ended inside this view
            views[first] = views[first][n:]
    return total
