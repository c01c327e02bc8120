"""Partial reads of a stored message (a receiver opened with ``fields=``): its prelude and
envelope first, then its codec header, then only the buffers the receiver's selector
(:mod:`rlwire._frame.selection`) asks for, each checked against its checksum.

Every check a whole read makes of the envelope and the buffer table is made here too,
before any buffer is read; what is not read is neither hashed nor touched. A store
provides :class:`Ranged` views of its files: a mapped file (its pages faulted in only
where read), an object fetched by ranged GETs, or, by default, the whole file loaded.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence

import numpy as np

from rlwire._core.errors import CorruptFrameError
from rlwire._frame.checksums import verify_some
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport._parts import PartInfo
from rlwire.transport._stored.layout import (
    _PRELUDE,
    _SIDECAR_PRELUDE,
    MAX_ENVELOPE,
    _check_sidecar,
    _envelope,
    _PartEnvelope,
)
from rlwire.transport._stored.parts import _part_info
from rlwire.transport._stored.table import MAIN, SIDECAR, checked_table, side_of, sidecar_place

__all__ = [
    "HEAD_BYTES",
    "Ranged",
    "WholeFile",
    "open_checked_sidecar",
    "parse_selected",
    "read_envelope",
]

#: Bytes read first: the prelude and envelope, and the codec header of most messages.
HEAD_BYTES = 64 << 10
_U64 = np.dtype("<u8")


class Ranged(abc.ABC):
    """A stored file, read by byte ranges.

    Attributes:
        size: its length in bytes.
    """

    size: int

    @abc.abstractmethod
    def read(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """The bytes ``start:end`` of each range, inside the file, in order.

        Raises:
            CorruptFrameError: the file changed or is shorter than said.
            TransportError: it cannot be read.
        """

    def head(self) -> memoryview:
        """Its first :data:`HEAD_BYTES` bytes (all of a smaller file)."""
        return self.read([(0, min(self.size, HEAD_BYTES))])[0]


class WholeFile(Ranged):
    """A file loaded whole: ranges are views of it.

    Example:
        >>> [bytes(v) for v in WholeFile(memoryview(b"abcdef")).read([(1, 3), (4, 6)])]
        [b'bc', b'ef']
    """

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.size = data.nbytes

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        return [self.data[start:end] for start, end in ranges]


def open_checked_sidecar(
    open_sidecar: Callable[[int], Ranged], env: _PartEnvelope, where: str
) -> Ranged:
    """The sidecar of the message whose envelope is ``env``, opened by ``open_sidecar``
    (given the size the envelope says, which a store that learns an object's size before
    it reads it refuses another of unread) and checked: its prelude names the message's
    id, and it is as long as the envelope says.

    Raises:
        CorruptFrameError: a sidecar of another message, or truncated or extended.
    """
    size, at = env.sidecar_size or 0, sidecar_place(where)
    side = open_sidecar(size)
    prelude = side.read([(0, min(side.size, _SIDECAR_PRELUDE.size))])[0]
    _check_sidecar(prelude, env.id, prelude.nbytes, at)
    if side.size != size:
        raise CorruptFrameError(
            f"sidecar truncated or extended: expected {size} bytes, found {side.size}",
            where=at,
        )
    return side


def read_envelope(
    main: Ranged, where: str, *, step: int, rank: int, part: int | None
) -> tuple[memoryview, _PartEnvelope, PartInfo | None]:
    """The head of a stored main file (as far as its envelope), its envelope and (with
    ``part``) its :class:`PartInfo`, read by ranges and checked: the envelope's
    checksum, the file's size, and that it is step ``step`` of ``rank`` (with ``part``,
    that part of it; else a whole step's message).

    Raises:
        CorruptFrameError, UnsupportedVersionError: as
            :func:`~rlwire.transport._stored.layout.parse_main`, for the envelope.
    """
    head = main.head()
    if head.nbytes >= _PRELUDE.size:
        end = _PRELUDE.size + int(_PRELUDE.unpack_from(head)[3])
        if head.nbytes < end <= min(main.size, _PRELUDE.size + MAX_ENVELOPE):
            head = main.read([(0, end)])[0]
    env = _envelope(head, where, whole=False)
    if env.size != main.size:
        raise CorruptFrameError(
            f"truncated or extended: the envelope says {env.size} bytes, found {main.size}",
            where=where,
        )
    info = None
    if part is None:
        if env.part is not None:
            raise CorruptFrameError(f"holds part {env.part}, not a whole step", where=where)
    else:
        info = _part_info(env, rank, part, where)
    if (env.step, env.rank) != (step, rank):
        raise CorruptFrameError(
            f"holds step {env.step} rank {env.rank}, expected step {step} rank {rank}",
            where=where,
        )
    return head, env, info


def parse_selected(
    main: Ranged,
    open_sidecar: Callable[[int], Ranged],
    *,
    step: int,
    rank: int,
    part: int | None,
    select: Selector,
    where: str,
    verify: bool = True,
) -> tuple[_PartEnvelope, PartInfo | None, Frame]:
    """The frame of a stored message with only the buffers ``select`` asks for read
    (the others empty, listed in :attr:`~rlwire.Frame.missing`), after its envelope
    (what an appended message is tied to: its ``of``); with ``part``, the message must
    be that part of ``rank`` (and its :class:`PartInfo` is returned), else a whole
    step's message.

    Raises:
        CorruptFrameError: as :func:`~rlwire.transport._stored.layout.parse_main`, for
            the envelope, the table, the header and the buffers read.
        UnsupportedVersionError: likewise.
        RlwireError: what ``select`` raises (a field the step does not hold).
    """
    head, env, info = read_envelope(main, where, step=step, rank=rank, part=part)
    head_end = _PRELUDE.size + int(_PRELUDE.unpack_from(head)[3])
    files, offsets, lengths = checked_table(env, main.size, head_end, where)
    header = _header(env, head, main, where)
    reading = _Reading(env, files, offsets, lengths, main, open_sidecar, where)
    frame = reading.run(header, select)
    if verify and env.checksum is not None:
        segments = {0: header} | {i + 1: reading.loaded[i] for i in reading.loaded}
        try:
            side = side_of(files, where)
            verify_some(env.checksum, env.checksums, segments, where, sidecar=side)
        except CorruptFrameError as exc:
            exc.add_context(step=step, rank=rank)
            raise
    return env, info, frame


def _header(env: _PartEnvelope, head: memoryview, main: Ranged, where: str) -> memoryview:
    offset, length = env.header
    if offset < 0 or length < 0 or offset + length > main.size:
        raise CorruptFrameError(
            f"header at offset {offset} length {length} lies outside the {main.size}-byte data",
            where=where,
        )
    if offset + length <= head.nbytes:
        return head[offset : offset + length]
    return main.read([(offset, offset + length)])[0]


class _Reading:
    """The buffers of one message read so far, and the asking and reading of more."""

    def __init__(
        self,
        env: _PartEnvelope,
        files: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        main: Ranged,
        open_sidecar: Callable[[int], Ranged],
        where: str,
    ) -> None:
        self.env = env
        self.files, self.offsets, self.lengths = files.tolist(), offsets.tolist(), lengths.tolist()
        self.main = main
        self.open_sidecar = open_sidecar
        self.sidecar: Ranged | None = None
        self.where = where
        self.loaded: dict[int, memoryview] = {}

    def frame(self, header: memoryview) -> Frame:
        n = len(self.files)
        empty = memoryview(b"")
        return Frame(
            header,
            tuple(self.loaded.get(i, empty) for i in range(n)),
            frozenset(i for i in range(n) if self.files[i] == SIDECAR),
            self.env.codec,
            tuple(self.env.compression),
            tuple(np.frombuffer(self.env.raw_sizes, _U64).tolist()),
            stored_size=self.main.size + (self.env.sidecar_size or 0),
            missing=frozenset(i for i in range(n) if i not in self.loaded),
            message_id=self.env.id,
        )

    def run(self, header: memoryview, select: Selector) -> Frame:
        """Ask ``select`` and read what it names until it names nothing new (each
        round reads at least one buffer more, so at most one round per buffer)."""
        n = len(self.files)
        while True:
            frame = self.frame(header)
            chosen = select(frame)
            wanted = range(n) if chosen is None else chosen.buffers
            new = sorted(i for i in wanted if 0 <= i < n and i not in self.loaded)
            if not new:
                return frame
            self._read(new)
            if chosen is None:
                return self.frame(header)

    def _read(self, indices: list[int]) -> None:
        for file in (MAIN, SIDECAR):
            mine = [i for i in indices if self.files[i] == file]
            empty = [i for i in mine if not self.lengths[i]]
            self.loaded.update((i, memoryview(b"")) for i in empty)
            mine = [i for i in mine if self.lengths[i]]
            if not mine:
                continue
            ranged = self.main if file == MAIN else self._sidecar()
            ranges = [(self.offsets[i], self.offsets[i] + self.lengths[i]) for i in mine]
            self.loaded.update(zip(mine, ranged.read(ranges), strict=True))

    def _sidecar(self) -> Ranged:
        if self.sidecar is None:
            self.sidecar = open_checked_sidecar(self.open_sidecar, self.env, self.where)
        return self.sidecar
