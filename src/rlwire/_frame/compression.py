"""Compression of a whole :class:`~rlwire.Frame`, segment by segment, in parallel and bounded.

A frame's *segments* are its header (segment 0) and its buffers (segment ``i + 1`` is
buffer ``i``). Each segment of at least ``min_size`` bytes is compressed on its own and
kept compressed only when that saves at least 10 %; large segments are first tried on a
64 KiB sample, so float arrays that barely compress cost almost nothing. Both libraries
release the GIL, so segments compress and decompress in parallel threads of rlwire's
shared executor (:mod:`rlwire._core.pools`), in groups of a few MiB. Both directions take
the same path: a sliced generator (:func:`compress_sliced`, :func:`decompress_sliced`)
that hands the groups to the executor and yields as each one finishes, so the sender
drives it from worker threads under its limiter and stays cancellable, and the receiver
drives it in its own thread.

Decompression is bounded: the declared sizes are checked against a limit before any
memory is allocated, and every segment must expand to exactly its declared size.

The algorithms themselves, their wire ids and their libraries are in
:mod:`rlwire._frame.algorithms`.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar

from rlwire._core.errors import FrameTooLargeError
from rlwire._core.pools import shared_executor
from rlwire._core.slicing import Sliced, run_sliced
from rlwire._frame.algorithms import (
    _LZ4_MAX_INPUT,
    _SAMPLE,
    COMPRESSION_IDS,
    LZ4,
    NONE,
    Compressed,
    Compressor,
    Segment,
    check_known,
    expand,
)
from rlwire._frame.bounds import HEAP_FLOOR
from rlwire._frame.frame import Frame, as_byte_view
from rlwire._frame.pieces import Pieces

__all__ = [
    "COMPRESSION_IDS",
    "DEFAULT_MAX_DECOMPRESSED",
    "DEFAULT_MAX_RATIO",
    "RATIO_FLOOR",
    "Compressor",
    "compress",
    "compress_sliced",
    "decompress",
    "decompress_sliced",
]

#: Default bound on the bytes one frame may decompress to (16 GiB).
DEFAULT_MAX_DECOMPRESSED = 16 << 30
#: Default bound on how many times its stored size a frame may cost a receiver once
#: decompressed and decoded: a stored message under 1 MB can then never make a receiver
#: allocate more than 1 GiB.
DEFAULT_MAX_RATIO = 1024.0
#: Any frame may decompress to this much, whatever its ratio.
RATIO_FLOOR = 64 << 20
_GROUP_BYTES = 4 << 20  # uncompressed bytes per parallel task, at least

J = TypeVar("J")
R = TypeVar("R")


#: A segment of a frame to send: a received frame's segments are never Pieces.
Sent: TypeAlias = "bytes | memoryview | Pieces"


def _segments(frame: Frame) -> list[Sent]:
    """The frame's header and buffers, in segment order."""
    return [frame.header, *frame.buffers]


def _received(frame: Frame) -> list[Segment]:
    """The segments of a received frame, which holds memoryviews only."""
    return [frame.header, *frame.views()]


class _SegmentCompressor:
    """Compresses one segment as :meth:`Compressor.segment` does, a
    :class:`~rlwire._frame.pieces.Pieces` included: its runs are joined (a copy, with the
    GIL released) only once the segment is to be compressed, after the same 64 KiB
    sample from its middle that a joined buffer would be tried on has shrunk. The
    decision is the one for the joined bytes, so the stored message is the same."""

    def __init__(self, compressor: Compressor) -> None:
        self.compressor = compressor
        self.sampler = dataclasses.replace(compressor, min_size=0)

    def __call__(self, seg: Sent) -> tuple[int, Sent]:
        if not isinstance(seg, Pieces):
            return self.compressor.segment(seg)
        n = seg.nbytes
        cid = self.compressor.id
        if n < self.compressor.min_size or (cid == LZ4 and n > _LZ4_MAX_INPUT):
            return NONE, seg
        if n >= 4 * _SAMPLE and self.sampler.segment(_sample(seg, n // 2))[0] == NONE:
            return NONE, seg
        result = self.compressor.segment(run_sliced(seg.joined_sliced()))
        return result if result[0] != NONE else (NONE, seg)  # not the copy: let it go


def _sample(pieces: Pieces, start: int) -> bytes:
    """The bytes ``start:start + 64 KiB`` of ``pieces`` (a small copy across runs)."""
    ends = list(itertools.accumulate(run.nbytes for run in pieces.runs))
    i = bisect.bisect_right(ends, start)
    offset = start - (ends[i - 1] if i else 0)
    out = bytearray()
    while len(out) < _SAMPLE and i < len(pieces.runs):
        out += pieces.runs[i][offset : offset + _SAMPLE - len(out)]
        i, offset = i + 1, 0
    return bytes(out)


def _in_groups(
    func: Callable[[J], R], jobs: Sequence[J], sizes: Sequence[int], threads: int
) -> Sliced[list[R]]:
    """``[func(job) for job in jobs]``, jobs taken in groups of at least _GROUP_BYTES,
    up to ``threads`` groups at once in the shared executor; yields as each group finishes.

    One task per group rather than per job: thousands of small segments would otherwise
    cost thousands of futures, each a few microseconds of GIL-holding Python. Closing
    the generator cancels the groups not started yet.
    """
    groups = _grouped(sizes)

    def run(group: list[int]) -> list[R]:
        return [func(jobs[i]) for i in group]

    results: list[R] = [None] * len(jobs)  # type: ignore[list-item]
    if threads <= 1 or len(groups) == 1:
        for group in groups:
            for i, out in zip(group, run(group), strict=True):
                results[i] = out
            yield
        return results
    yield from _pooled(run, groups, threads, results)
    return results


def _grouped(sizes: Sequence[int]) -> list[list[int]]:
    """Indices of consecutive jobs, cut into groups of at least _GROUP_BYTES."""
    groups: list[list[int]] = [[]]
    size = 0
    for i, n in enumerate(sizes):
        if size >= _GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return groups


def _pooled(
    run: Callable[[list[int]], list[R]], groups: list[list[int]], threads: int, results: list[R]
) -> Sliced[None]:
    """Run ``groups`` in the shared executor, ``threads`` at once, into ``results``."""
    pool = shared_executor()
    waiting = iter(groups)
    running: dict[concurrent.futures.Future[list[R]], list[int]] = {}
    try:
        while True:
            for group in itertools.islice(waiting, threads - len(running)):
                running[pool.submit(run, group)] = group
            if not running:
                return
            done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
            for future in done:
                for i, out in zip(running.pop(future), future.result(), strict=True):
                    results[i] = out
            yield
    finally:
        for future in running:
            future.cancel()


def _with_segments(frame: Frame, results: Sequence[tuple[int, Sent]]) -> Frame:
    ids = tuple(cid for cid, _ in results)
    if not any(ids):
        return frame
    raw = tuple(
        len(frame.header) if i == 0 else frame.buffers[i - 1].nbytes for i in range(len(ids))
    )
    header = results[0][1]
    assert not isinstance(header, Pieces)  # a header is bytes
    return Frame(
        header,
        tuple(seg if isinstance(seg, Pieces) else as_byte_view(seg) for _, seg in results[1:]),
        frame.sidecar,
        frame.codec,
        ids,
        raw,
    )


def compress_sliced(frame: Frame, compressor: Compressor, *, threads: int = 1) -> Sliced[Frame]:
    """:func:`compress` as a sliced generator: the segments large enough to try are
    compressed in up to ``threads`` threads of the shared executor, and the generator yields
    as each group of them finishes."""
    segs = _segments(frame)
    big = [i for i, s in enumerate(segs) if len(s) >= compressor.min_size]
    results: list[tuple[int, Sent]] = [(NONE, s) for s in segs]
    outs = yield from _in_groups(
        _SegmentCompressor(compressor),
        [segs[i] for i in big],
        [len(segs[i]) for i in big],
        threads,
    )
    for i, result in zip(big, outs, strict=True):
        results[i] = result
    return _with_segments(frame, results)


def compress(frame: Frame, compressor: Compressor, *, threads: int = 1) -> Frame:
    """Compress the segments of ``frame`` that pay off, in up to ``threads`` threads.

    Example:
        >>> frame = Frame(b"h", (memoryview(bytes(1 << 20)),))
        >>> small = compress(frame, Compressor("zstd"))
        >>> small.compression, small.buffers[0].nbytes < 1000
        ((0, 2), True)
        >>> decompress(small).buffers[0] == frame.buffers[0]
        True
    """
    return run_sliced(compress_sliced(frame, compressor, threads=threads))


def _check_sizes(frame: Frame, max_bytes: int, max_ratio: float) -> list[Compressed]:
    """The compressed segments of ``frame``, after checking that their declared sizes
    fit under ``max_bytes`` and under ``max_ratio`` times the frame's stored size, less
    the :data:`~rlwire._frame.bounds.HEAP_FLOOR` that decoding may then take (at least
    :data:`RATIO_FLOOR`): decompressing and decoding share one budget."""
    stored = frame.stored_nbytes  # each stored byte once, whatever the table lists
    by_ratio = max(RATIO_FLOOR, int(max_ratio * stored) - HEAP_FLOOR)
    limit, option = (
        (max_bytes, "max_decompressed_bytes")
        if max_bytes <= by_ratio
        else (
            by_ratio,
            f"max_compression_ratio (now {max_ratio:g}x the {stored} bytes stored, "
            f"less {HEAP_FLOOR >> 20} MiB kept for decoding)",
        )
    )
    jobs = []
    total = 0
    segments = _received(frame)
    for i, (cid, raw) in enumerate(zip(frame.compression, frame.raw_sizes, strict=True)):
        if cid == NONE or i - 1 in frame.missing:  # a buffer not read stays empty
            continue
        check_known(cid, i)
        total += raw
        if total > limit:
            raise FrameTooLargeError(
                f"the frame declares more than {limit} bytes once decompressed "
                f"(segment {i} alone declares {raw}); raise {option} to accept it"
            )
        jobs.append(Compressed(i, cid, segments[i], raw))
    return jobs


def decompress_sliced(
    frame: Frame,
    *,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED,
    max_ratio: float = DEFAULT_MAX_RATIO,
    threads: int = 1,
) -> Sliced[Frame]:
    """:func:`decompress` as a sliced generator, in up to ``threads`` threads of the
    shared executor; its errors are those of :func:`decompress`, raised before anything
    is allocated when the declared sizes are too large."""
    if not frame.compression:
        return frame
    jobs = _check_sizes(frame, max_bytes, max_ratio)
    outs = yield from _in_groups(expand, jobs, [job.raw for job in jobs], threads)
    segs = _received(frame)
    for job, out in zip(jobs, outs, strict=True):
        segs[job.segment] = memoryview(out)
    return Frame(
        segs[0],
        tuple(as_byte_view(s) for s in segs[1:]),
        frame.sidecar,
        frame.codec,
        stored_size=frame.stored_nbytes,  # the decode bound stays on what was stored
        missing=frame.missing,
        verified=frame.verified,
        message_id=frame.message_id,
    )


def decompress(
    frame: Frame,
    *,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED,
    max_ratio: float = DEFAULT_MAX_RATIO,
    threads: int = 1,
) -> Frame:
    """Undo :func:`compress`, in up to ``threads`` threads.

    Raises:
        FrameTooLargeError: the frame declares more than ``max_bytes`` once
            decompressed, or more than ``max_ratio`` times its stored size less the
            256 MiB decoding may take (and more than :data:`RATIO_FLOOR`); the message
            names the option that raises it.
        CorruptFrameError: an unknown compression id, or data that does not decompress
            to exactly its declared size; :attr:`~rlwire.RlwireError.segment` says which.
        ConfigError: the frame uses an algorithm whose library is not installed.
    """
    return run_sliced(
        decompress_sliced(frame, max_bytes=max_bytes, max_ratio=max_ratio, threads=threads)
    )
