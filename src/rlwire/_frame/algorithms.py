"""The compression algorithms of the wire format, lz4 and zstd, one segment at a time.

Their ids (docs/format.md): ``0`` stored as is, ``1`` lz4 block (no size prefix), ``2``
zstd frame (content size in its header). Both libraries are optional extras, imported
when first used. :class:`Compressor` compresses one segment and keeps the result only
when it pays; :func:`expand` decompresses one segment to exactly its declared size.
Whole frames, in parallel and bounded, are :mod:`rlwire._frame.compression`'s work.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from rlwire._core.args import check_int
from rlwire._core.errors import ConfigError, CorruptFrameError
from rlwire._frame.frame import as_byte_view

__all__ = [
    "COMPRESSION_IDS",
    "DEFAULT_MIN_SIZE",
    "NONE",
    "Compressed",
    "Compressor",
    "Segment",
    "check_known",
    "expand",
]

NONE, LZ4, ZSTD = 0, 1, 2
#: Compression ids of the wire format, by name.
COMPRESSION_IDS = {"none": NONE, "lz4": LZ4, "zstd": ZSTD}
_NAMES = {v: k for k, v in COMPRESSION_IDS.items()}
_EXTRAS = {LZ4: ("lz4", "lz4"), ZSTD: ("zstandard", "zstd")}

DEFAULT_MIN_SIZE = 64 << 10
_SAMPLE = 64 << 10
_KEEP_RATIO = 0.9  # keep a compressed segment only when it is at most 90 % of the original
_LZ4_MAX_INPUT = 0x7E000000  # LZ4_MAX_INPUT_SIZE: larger segments are stored as they are
_LEVELS = {LZ4: (0, 12, 0), ZSTD: (1, 22, 3)}  # (min, max, default)

Segment: TypeAlias = "bytes | memoryview"


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


def check_known(cid: int, segment: int) -> None:
    """Check that ``cid`` is a compression id this reader knows.

    Raises:
        CorruptFrameError: it is not, naming the segment.
    """
    if cid not in _NAMES:
        raise CorruptFrameError(
            f"unknown compression id {cid}; this reader knows "
            + ", ".join(f"{v} {k}" for k, v in COMPRESSION_IDS.items()),
            segment=segment,
        )


class Compressed(NamedTuple):
    """One compressed segment of a frame, as its frame declares it."""

    segment: int
    """Its index: 0 the header, ``i + 1`` buffer ``i``."""
    cid: int
    """Its compression id."""
    data: Segment
    """Its stored bytes."""
    raw: int
    """Its declared size once decompressed."""


def expand(job: Compressed) -> bytes:
    """Decompress one segment to exactly its declared size.

    Raises:
        CorruptFrameError: data that does not decompress to exactly its declared size.
        ConfigError: the algorithm's library is not installed.
    """
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
