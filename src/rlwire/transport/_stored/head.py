"""The head of a stored message, read alone: its envelope, its buffer table and its codec
header (what a manifest is made from), and then byte ranges of single buffers (what a
read of some rows of a column fetches).

On a file this touches the envelope's and header's pages; on S3 it is the first ranged
GET (64 KiB), and more only when the header lies beyond it. Every check a whole read
makes of the envelope and the table is made here too; the header is checked against its
checksum, and a buffer read whole against its own. A range inside a buffer cannot be
checked against the buffer's checksum (it covers the whole buffer): :meth:`Head.read`
checks only that the range lies inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlwire._core.errors import CorruptFrameError
from rlwire._frame.checksums import verify_some
from rlwire._frame.frame import Frame
from rlwire.transport._parts import PartInfo
from rlwire.transport._stored.layout import _PRELUDE, _PartEnvelope
from rlwire.transport._stored.names import (
    main_name,
    part_name,
    part_sidecar_name,
    sidecar_name,
)
from rlwire.transport._stored.selected import Ranged, open_checked_sidecar, read_envelope
from rlwire.transport._stored.table import MAIN, SIDECAR, checked_table, side_of

if TYPE_CHECKING:
    from rlwire.transport._stored.source import StoredSource

__all__ = ["Head", "open_head", "read_head"]

_U64 = np.dtype("<u8")


@dataclass
class Head:
    """A stored message's envelope, buffer table and codec header (as stored).

    Attributes:
        id: the message's random id (the envelope's), which tells it from any other.
        info: its part's record, or ``None`` for a whole step's message.
        size: the bytes of its main file and sidecar together.
        checksums: each segment's XXH3-64 (0 the header, ``i + 1`` buffer ``i``), or
            ``None`` when the writer recorded none.
        frame: its codec header and no buffer (every one :attr:`~rlwire.Frame.missing`).
    """

    env: _PartEnvelope
    info: PartInfo | None
    main: Ranged
    open_sidecar: Callable[[int], Ranged]
    files: list[int]
    offsets: list[int]
    lengths: list[int]
    frame: Frame
    where: str
    verify: bool
    _sidecar: Ranged | None = None

    @property
    def id(self) -> bytes:
        return self.env.id

    @property
    def size(self) -> int:
        return self.main.size + (self.env.sidecar_size or 0)

    @property
    def checksums(self) -> list[int] | None:
        if self.env.checksum is None:
            return None
        return np.frombuffer(self.env.checksums, _U64).tolist()  # type: ignore[no-any-return]

    def compressed(self, index: int) -> bool:
        """Whether buffer ``index`` is stored compressed."""
        return bool(self.frame.compression) and self.frame.compression[index + 1] != 0

    def read(self, spans: Sequence[tuple[int, int, int]]) -> list[memoryview]:
        """For each ``(buffer, start, end)``: bytes ``start:end`` of that buffer (as
        stored), read by ranges; a span covering the whole buffer is checked against its
        checksum (when the receiver verifies).

        Raises:
            CorruptFrameError: a span outside its buffer, a buffer index outside the
                table, a sidecar that is not this message's, a checksum mismatch.
        """
        n = len(self.files)
        ranges: dict[int, list[tuple[int, int]]] = {MAIN: [], SIDECAR: []}
        where: list[tuple[int, int]] = []
        for index, start, end in spans:
            if not 0 <= index < n:
                raise CorruptFrameError(
                    f"buffer {index} is not in the message ({n} buffers)", where=self.where
                )
            if not 0 <= start <= end <= self.lengths[index]:
                raise CorruptFrameError(
                    f"bytes {start}:{end} lie outside buffer {index} ({self.lengths[index]} bytes)",
                    where=self.where,
                )
            file = self.files[index]
            where.append((file, len(ranges[file])))
            base = self.offsets[index]
            ranges[file].append((base + start, base + end))
        got = {
            file: (self.main if file == MAIN else self._side()).read(rs) if rs else []
            for file, rs in ranges.items()
        }
        out = [got[file][i] for file, i in where]
        whole = {
            index + 1: view
            for (index, start, end), view in zip(spans, out, strict=True)
            if start == 0 and end == self.lengths[index]
        }
        if self.verify and whole and self.env.checksum is not None:
            side = side_of(self.files, self.where)
            verify_some(self.env.checksum, self.env.checksums, whole, self.where, sidecar=side)
        return out

    def _side(self) -> Ranged:
        if self._sidecar is None:
            self._sidecar = open_checked_sidecar(self.open_sidecar, self.env, self.where)
        return self._sidecar


def read_head(
    main: Ranged,
    open_sidecar: Callable[[int], Ranged],
    *,
    step: int,
    rank: int,
    part: int | None,
    where: str,
    verify: bool = True,
) -> Head:
    """The :class:`Head` of the stored message ``main``, which must be step ``step`` of
    ``rank`` (with ``part``, that part of it; else a whole step's message).

    Raises:
        CorruptFrameError: as :func:`~rlwire.transport._stored.layout.parse_main`, for
            the envelope, the table and the header.
        UnsupportedVersionError: likewise.
    """
    head, env, info = read_envelope(main, where, step=step, rank=rank, part=part)
    head_end = _PRELUDE.size + int(_PRELUDE.unpack_from(head)[3])
    files, offsets, lengths = checked_table(env, main.size, head_end, where)
    offset, length = env.header
    if offset < 0 or length < 0 or offset + length > main.size:
        raise CorruptFrameError(
            f"header at offset {offset} length {length} lies outside the {main.size}-byte data",
            where=where,
        )
    if offset + length <= head.nbytes:
        header = head[offset : offset + length]
    else:
        header = main.read([(offset, offset + length)])[0]
    if verify and env.checksum is not None:
        verify_some(env.checksum, env.checksums, {0: header}, where)
    n = len(files)
    empty = memoryview(b"")
    frame = Frame(
        header,
        (empty,) * n,
        frozenset(i for i in range(n) if files[i] == SIDECAR),
        env.codec,
        tuple(env.compression),
        tuple(np.frombuffer(env.raw_sizes, _U64).tolist()),
        stored_size=main.size + (env.sidecar_size or 0),
        missing=frozenset(range(n)),
        message_id=env.id,
    )
    return Head(
        env,
        info,
        main,
        open_sidecar,
        files.tolist(),
        offsets.tolist(),
        lengths.tolist(),
        frame,
        where,
        verify,
    )


def open_head(source: StoredSource, step: int, rank: int, part: int | None) -> Head | None:
    """The :class:`Head` of step ``step`` of ``rank`` (with ``part``, of that part) in
    ``source``'s store, or ``None`` when it is not stored.

    Raises:
        What :func:`read_head` and the store's reads raise.
    """
    if part is None:
        name, side = main_name(step, rank), sidecar_name(step, rank)
    else:
        name, side = part_name(step, rank, part), part_sidecar_name(step, rank, part)
    main = source.open_ranged(name)
    if main is None:
        return None
    return read_head(
        main,
        source._sidecar_opener(side),
        step=step,
        rank=rank,
        part=part,
        where=str(source.locate(name)),
        verify=source.verify,
    )
