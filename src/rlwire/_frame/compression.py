"""Per-segment compression of a :class:`~rlwire.Frame` with lz4 or zstd.

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

Compression ids, as recorded in the wire format (docs/format.md): ``0`` stored as is,
``1`` lz4 block (no size prefix), ``2`` zstd frame (content size in its header).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from rlwire._core.args import check_int
from rlwire._core.errors import ConfigError, CorruptFrameError, FrameTooLargeError
from rlwire._core.pools import shared_executor
from rlwire._core.slicing import Sliced, run_sliced
from rlwire._frame.frame import Frame, as_byte_view

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

NONE, LZ4, ZSTD = 0, 1, 2
#: Compression ids of the wire format, by name.
COMPRESSION_IDS = {"none": NONE, "lz4": LZ4, "zstd": ZSTD}
_NAMES = {v: k for k, v in COMPRESSION_IDS.items()}
_EXTRAS = {LZ4: ("lz4", "lz4"), ZSTD: ("zstandard", "zstd")}

#: Default bound on the bytes one frame may decompress to (16 GiB).
DEFAULT_MAX_DECOMPRESSED = 16 << 30
#: Default bound on how many times its stored size a frame may decompress to: a stored
#: message under 1 MB can then never make a receiver allocate more than 1 GiB.
DEFAULT_MAX_RATIO = 1024.0
#: Any frame may decompress to this much, whatever its ratio.
RATIO_FLOOR = 64 << 20
DEFAULT_MIN_SIZE = 64 << 10
_SAMPLE = 64 << 10
_KEEP_RATIO = 0.9  # keep a compressed segment only when it is at most 90 % of the original
_LZ4_MAX_INPUT = 0x7E000000  # LZ4_MAX_INPUT_SIZE: larger segments are stored as they are
_LEVELS = {LZ4: (0, 12, 0), ZSTD: (1, 22, 3)}  # (min, max, default)
_GROUP_BYTES = 4 << 20  # uncompressed bytes per parallel task, at least

Segment: TypeAlias = "bytes | memoryview"
J = TypeVar("J")
R = TypeVar("R")


def _import(cid: int) -> Any:
    module, extra = _EXTRAS[cid]
    try:
        if cid == LZ4:
            import lz4.block

            return lz4.block
        import zstandard

        return zstandard
    except ImportError:
        raise ConfigError(
            f"{_NAMES[cid]} compression needs the {module} package: pip install 'rlwire[{extra}]'"
        ) from None


# zstandard's (de)compressor objects are not thread-safe: one per thread.
_local = threading.local()


def _zstd_compressor(level: int) -> Any:
    cache: dict[int, Any] = _local.__dict__.setdefault("zc", {})
    if level not in cache:
        cache[level] = _import(ZSTD).ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _zstd_decompressor() -> Any:
    if not hasattr(_local, "zd"):
        _local.zd = _import(ZSTD).ZstdDecompressor()
    return _local.zd


@dataclass(frozen=True)
class Compressor:
    """What to compress and how: parsed from ``open_sender(..., compression=...)``.

    Args:
        algorithm: ``"lz4"`` or ``"zstd"``.
        level: zstd level 1-22 (default 3); for lz4, 0 is the fast mode and 1-12 the
            high-compression levels (default 0).
        min_size: segments smaller than this many bytes are stored as they are.

    Raises:
        ConfigError: an unknown algorithm, a level out of range, or the library for the
            algorithm is not installed (the message says which extra to install).

    Example:
        >>> Compressor.parse("zstd:1")
        Compressor(algorithm='zstd', level=1, min_size=65536)
    """

    algorithm: str
    level: int | None = None
    min_size: int = DEFAULT_MIN_SIZE

    def __post_init__(self) -> None:
        cid = COMPRESSION_IDS.get(self.algorithm, NONE)
        if cid == NONE:
            raise ConfigError(f"unknown compression {self.algorithm!r}; known: lz4, zstd (or None)")
        low, high, default = _LEVELS[cid]
        level = default if self.level is None else self.level
        check_int(level, f"{self.algorithm} level", low=low, high=high)
        check_int(self.min_size, "min_size")
        object.__setattr__(self, "level", level)
        _import(cid)

    @classmethod
    def parse(cls, spec: str | Compressor | None) -> Compressor | None:
        """``None``, a Compressor, or a string ``"lz4"``, ``"zstd"``, ``"zstd:LEVEL"``."""
        if spec is None or isinstance(spec, Compressor):
            return spec
        if not isinstance(spec, str):
            raise ConfigError(f"compression must be a string like 'zstd:3', got {spec!r}")
        name, _, level = spec.partition(":")
        try:
            number = int(level) if level else None
        except ValueError:
            raise ConfigError(f"compression {spec!r}: level {level!r} is not an integer") from None
        return cls(name, number)

    @property
    def id(self) -> int:
        """The wire-format id of the algorithm."""
        return COMPRESSION_IDS[self.algorithm]

    def segment(self, data: Segment) -> tuple[int, Segment]:
        """Compress one segment: ``(id, stored bytes)``, or ``(0, data)`` when it is too
        small, too large for lz4, or does not shrink by 10 %."""
        view = as_byte_view(data)
        n = view.nbytes
        if n < self.min_size or (self.id == LZ4 and n > _LZ4_MAX_INPUT):
            return NONE, data
        if n >= 4 * _SAMPLE:
            middle = n // 2
            if len(self._run(view[middle : middle + _SAMPLE])) > _KEEP_RATIO * _SAMPLE:
                return NONE, data
        out = self._run(view)
        return (self.id, out) if len(out) <= _KEEP_RATIO * n else (NONE, data)

    def _run(self, view: memoryview) -> bytes:
        if self.id == LZ4:
            mode = "high_compression" if self.level else "default"
            out: bytes = _import(LZ4).compress(
                view, mode=mode, compression=self.level or 0, store_size=False
            )
            return out
        out = _zstd_compressor(self.level or 0).compress(view)
        return out


def _segments(frame: Frame) -> list[Segment]:
    """The frame's header and buffers, in segment order."""
    return [frame.header, *frame.buffers]


def _in_groups(
    func: Callable[[J], R], jobs: Sequence[J], sizes: Sequence[int], threads: int
) -> Sliced[list[R]]:
    """``[func(job) for job in jobs]``, jobs taken in groups of at least _GROUP_BYTES,
    up to ``threads`` groups at once in the shared executor; yields as each group finishes.

    One task per group rather than per job: thousands of small segments would otherwise
    cost thousands of futures, each a few microseconds of GIL-holding Python. Closing
    the generator cancels the groups not started yet.
    """
    groups: list[list[int]] = [[]]
    size = 0
    for i, n in enumerate(sizes):
        if size >= _GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n

    def run(group: list[int]) -> list[R]:
        return [func(jobs[i]) for i in group]

    results: list[R] = [None] * len(jobs)  # type: ignore[list-item]
    if threads <= 1 or len(groups) == 1:
        for group in groups:
            for i, out in zip(group, run(group), strict=True):
                results[i] = out
            yield
        return results
    pool = shared_executor()
    waiting = iter(groups)
    running: dict[concurrent.futures.Future[list[R]], list[int]] = {}
    try:
        while True:
            for group in itertools.islice(waiting, threads - len(running)):
                running[pool.submit(run, group)] = group
            if not running:
                return results
            done, _ = concurrent.futures.wait(running, return_when="FIRST_COMPLETED")
            for future in done:
                for i, out in zip(running.pop(future), future.result(), strict=True):
                    results[i] = out
            yield
    finally:
        for future in running:
            future.cancel()


def _with_segments(frame: Frame, results: Sequence[tuple[int, Segment]]) -> Frame:
    ids = tuple(cid for cid, _ in results)
    if not any(ids):
        return frame
    raw = tuple(
        len(frame.header) if i == 0 else frame.buffers[i - 1].nbytes for i in range(len(ids))
    )
    return Frame(
        results[0][1],
        tuple(as_byte_view(seg) for _, seg in results[1:]),
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
    results: list[tuple[int, Segment]] = [(NONE, s) for s in segs]
    outs = yield from _in_groups(
        compressor.segment, [segs[i] for i in big], [len(segs[i]) for i in big], threads
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


def _check_sizes(
    frame: Frame, max_bytes: int, max_ratio: float
) -> list[tuple[int, int, Segment, int]]:
    """The compressed segments as ``(segment, id, data, raw size)``, after checking that
    their declared sizes fit under ``max_bytes`` and under ``max_ratio`` times the
    frame's stored size (at least :data:`RATIO_FLOOR`)."""
    by_ratio = max(RATIO_FLOOR, int(max_ratio * frame.nbytes))
    limit, option = (
        (max_bytes, "max_decompressed_bytes")
        if max_bytes <= by_ratio
        else (
            by_ratio,
            f"max_compression_ratio (now {max_ratio:g}x the {frame.nbytes} bytes stored)",
        )
    )
    jobs = []
    total = 0
    for i, (cid, raw) in enumerate(zip(frame.compression, frame.raw_sizes, strict=True)):
        if cid == NONE:
            continue
        if cid not in _EXTRAS:
            raise CorruptFrameError(
                f"unknown compression id {cid}; this reader knows "
                + ", ".join(f"{v} {k}" for k, v in COMPRESSION_IDS.items()),
                segment=i,
            )
        total += raw
        if total > limit:
            raise FrameTooLargeError(
                f"the frame declares more than {limit} bytes once decompressed "
                f"(segment {i} alone declares {raw}); raise {option} to accept it"
            )
        jobs.append((i, cid, frame.header if i == 0 else frame.buffers[i - 1], raw))
    return jobs


def _expand(job: tuple[int, int, Segment, int]) -> bytes:
    i, cid, data, raw = job
    lib = _import(cid)
    try:
        if cid == LZ4:
            out: bytes = lib.decompress(data, uncompressed_size=raw)
        else:
            declared = lib.frame_content_size(data)
            if declared != raw:
                raise CorruptFrameError(
                    f"zstd frame declares {declared} bytes, the frame {raw}", segment=i
                )
            out = _zstd_decompressor().decompress(data, max_output_size=raw)
    except (CorruptFrameError, MemoryError):
        raise
    except Exception as exc:  # the libraries raise their own error types for bad input
        raise CorruptFrameError(f"{_NAMES[cid]} data is corrupt: {exc}", segment=i) from None
    if len(out) != raw:
        raise CorruptFrameError(
            f"{_NAMES[cid]} data expands to {len(out)} bytes, its declared size is {raw}",
            segment=i,
        )
    return out


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
    outs = yield from _in_groups(_expand, jobs, [job[3] for job in jobs], threads)
    segs = _segments(frame)
    for (i, *_), out in zip(jobs, outs, strict=True):
        segs[i] = memoryview(out)
    return Frame(segs[0], tuple(as_byte_view(s) for s in segs[1:]), frame.sidecar, frame.codec)


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
            decompressed, or more than ``max_ratio`` times its stored size (and more
            than :data:`RATIO_FLOOR`); the message names the option that raises it.
        CorruptFrameError: an unknown compression id, or data that does not decompress
            to exactly its declared size; :attr:`~rlwire.RlwireError.segment` says which.
        ConfigError: the frame uses an algorithm whose library is not installed.
    """
    return run_sliced(
        decompress_sliced(frame, max_bytes=max_bytes, max_ratio=max_ratio, threads=threads)
    )
