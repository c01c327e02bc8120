"""Sinks with one planted defect each: the file sink served under a scheme of its own
(``broken-<name>://``, as a plugin registers one) with one method gone wrong, writing
and reading real files. ``tests/transport/test_contract_catches.py`` runs the contract
(:class:`rlwire.testing.SinkContract`) against each and asserts that it fails: the
guard itself is guarded.

Each class's docstring says which promise it breaks. :data:`BROKEN` lists them by
name; :func:`register` registers each under ``broken-<name>`` in this process.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from rlwire._frame.checksums import checksum_segments
from rlwire._frame.frame import Frame
from rlwire.abc import URL, PartInfo, Pieces, Seal, SourceOptions, Staged
from rlwire.aio import Sliced
from rlwire.transport import FileSink, FileSource, register_sink, reject_unknown
from rlwire.transport._stored.layout import plan
from rlwire.transport._stored.names import main_name, seal_name, sidecar_name
from rlwire.transport._stored.parts import seal_bytes
from rlwire.transport._stored.sink import StoredSink, StoredStaging
from rlwire.transport._url import local_path

__all__ = ["BROKEN", "register"]


class BrokenSink(FileSink):
    """The file sink under another scheme, read by :attr:`source_class`; sound as it
    is. A subclass plants one defect."""

    source_class: ClassVar[type[FileSource]] = FileSource

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> FileSource:
        reject_unknown(url, options.storage_options, ())
        return cls.source_class(
            local_path(url),
            rank=options.rank,
            writable=options.writable,
            verify=options.verify,
            poll_interval=options.poll_interval,
        )


# -- delivery -----------------------------------------------------------------------------


class DeliversAStepTwice(BrokenSink):
    """Step 1 is read as step 0 again: step 0 delivered twice (and step 1 never)."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def read(self, step: int) -> Frame | None:
            return super().read(0 if step == 1 else step)


class DeliversOutOfOrder(BrokenSink):
    """Steps 1 and 2 are read in each other's place: delivered out of order."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def read(self, step: int) -> Frame | None:
            return super().read({1: 2, 2: 1}.get(step, step))


class _ChangesMessages(BrokenSink):
    """Writes (and hashes) each rank's message as :meth:`change` turns it."""

    gathers = True

    def change(self, frame: Frame, rank: int) -> Frame:
        return frame

    def write_message(
        self, staging: StoredStaging, step: int, rank: int, frame: Frame
    ) -> Sliced[None]:
        yield from super().write_message(staging, step, rank, self.change(frame, rank))


class GivesRankOneRankZeros(_ChangesMessages):
    """Every rank after 0 is written rank 0's message (in its own files)."""

    def change(self, frame: Frame, rank: int) -> Frame:
        self._first: Frame = frame if rank == 0 else self._first
        return self._first


class _InPlace(StoredStaging):
    """Writes each file under its final name, a chunk per slice: readers see it while
    it is written. ``keep``: a discarded step's files stay."""

    def __init__(self, root: Path, *, keep: bool) -> None:
        self.root = root
        self.keep = keep
        self.paths: list[Path] = []

    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        path = self.root / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.paths.append(path)
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                for start in range(0, view.nbytes, 1 << 20):
                    os.write(fd, view[start : start + (1 << 20)])
                    yield
        finally:
            os.close(fd)

    def commit(self) -> None:
        self.visible = True

    def discard(self) -> None:
        if not self.keep:
            for path in self.paths:
                path.unlink(missing_ok=True)


class WritesInPlace(BrokenSink):
    """Writes a step's files under their final names, 1 MiB a slice: a step is visible
    before all its buffers are written (commit does nothing)."""

    gathers = True
    keep_discarded: ClassVar[bool] = False

    def staging(self, step: int) -> Any:
        return _InPlace(self.root, keep=self.keep_discarded)

    def write_message(
        self, staging: StoredStaging, step: int, rank: int, frame: Frame
    ) -> Sliced[None]:
        yield from StoredSink.write_message(self, staging, step, rank, frame)

    def write_part(
        self, staging: StoredStaging, step: int, part: PartInfo, frame: Frame
    ) -> Sliced[None]:
        yield from StoredSink.write_part(self, staging, step, part, frame)


class LeavesCancelledWrites(WritesInPlace):
    """As :class:`WritesInPlace`, and a cancelled send's half-written files stay."""

    keep_discarded = True


class PublishesRanksEarly(BrokenSink):
    """Moves each rank's files into place once the next rank's write begins, before the
    step's checks pass, and leaves them if it fails: half a step failed for rank 1."""

    def write_message(self, staging: Any, step: int, rank: int, frame: Frame) -> Sliced[None]:
        yield from staging.drain()  # the ranks before are written in full
        for out in (*staging.sidecars, *staging.mains):
            out.rename(replace=False)
        staging.sidecars.clear(), staging.mains.clear()
        yield from super().write_message(staging, step, rank, frame)


# -- checksums ----------------------------------------------------------------------------


def _flipped(frame: Frame) -> Frame:
    """``frame`` with the last byte of its largest segment (header or buffer) flipped."""
    sizes = [len(frame.header), *(b.nbytes for b in frame.buffers)]
    big = sizes.index(max(sizes))
    data = bytearray(frame.header if big == 0 else frame.views()[big - 1])
    if data:
        data[-1] ^= 0xFF
    if big == 0:
        return replace(frame, header=bytes(data))
    buffers = list(frame.buffers)
    buffers[big - 1] = memoryview(data)
    return replace(frame, buffers=tuple(buffers))


class CorruptsAfterChecksum(BrokenSink):
    """Hashes each message, then writes it with one byte flipped: the receiver must
    raise CorruptFrameError."""

    def write_message(
        self, staging: StoredStaging, step: int, rank: int, frame: Frame
    ) -> Sliced[None]:
        sums = (yield from checksum_segments(frame)) if self.checksum else None
        layout = plan(_flipped(frame), step, rank, sums)
        if layout.sidecar:
            yield from staging.add(sidecar_name(step, rank), layout.sidecar, main=False)
        yield from staging.add(main_name(step, rank), layout.main, main=True)


class DropsChecksums(BrokenSink):
    """Records no checksums, whatever the sender asks: receivers verify nothing."""

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **{**options, "checksum": False})


# -- retention ----------------------------------------------------------------------------


class KeepsEverything(BrokenSink):
    """keep_last ignored: prune deletes nothing."""

    def prune(self, below: int) -> int:
        return below


class ReadsRankZerosMark(BrokenSink):
    """Reads rank 0's consumption mark for every rank: deletes steps a rank has not
    moved past (and lets max_ahead run ahead of it)."""

    def read_consumption(self, ranks: int, sent: int) -> list[int | None]:
        return super().read_consumption(1, sent) * ranks


class PrunesHeldSteps(BrokenSink):
    """Deletes every step before ``below``, also one a rank holding files of it has not
    moved past (the send went to fewer ranks)."""

    def prune(self, below: int) -> int:
        from rlwire.transport._stored.retention import steps_to_prune

        for step in steps_to_prune(self.names(), below):
            for batch in step:
                self.remove(batch)
        return below


class RecordsNoMarks(BrokenSink):
    """Receivers record no consumption marks: keep_last and max_ahead never see a
    rank move on."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def mark_consumed(self, next_step: int) -> None:
            self.mark_skipped = False


class WaitsForDeletedSteps(BrokenSink):
    """A receiver at a step keep_last deleted waits for it for ever, never told (the
    source lists no stored steps, as StoredSource by default)."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def listed(self) -> list[str] | None:
            return None  # cannot tell: a step keep_last deleted is waited for


class NeverEnds(BrokenSink):
    """finish() writes no end mark: receivers wait for ever for the next step."""

    def finish(self, end: int) -> None:
        pass


class MapsFilesWritable(BrokenSink):
    """Hands out views of a shared, writable mapping of each file: arrays writable to
    numpy, and a trainer's write changes the stored step for every reader."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def load(self, name: str, advice: int | None = None) -> memoryview | None:
            try:
                fd = os.open(self.root / name, os.O_RDWR)
            except FileNotFoundError:
                return None
            try:
                if os.fstat(fd).st_size == 0:
                    return None
                return memoryview(mmap.mmap(fd, 0))  # shared and writable: the file itself
            finally:
                os.close(fd)


# -- parts --------------------------------------------------------------------------------


class PartsOutOfOrder(BrokenSink):
    """A rank's parts 0 and 1 are read in each other's place."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
            got = super().read_part(step, {0: 1, 1: 0}.get(index, index))
            return None if got is None else (replace(got[0], index=index), got[1])


class _Deferred(Staged):
    """A part's staging whose commit is put off until the sink closes."""

    def __init__(self, inner: Staged, pending: list[Staged]) -> None:
        self.inner = inner
        self.pending = pending

    def commit(self) -> None:
        self.pending.append(self.inner)
        self.visible = True  # as far as the sender can tell

    def discard(self) -> None:
        self.inner.discard()


class CommitsPartsAtClose(BrokenSink):
    """A part's commit is put off until the sender closes: no part is visible while the
    step fills, and the seal goes before its parts."""

    def stage_part(self, step: int, part: PartInfo, frame: Any) -> Sliced[Staged]:
        staged = yield from super().stage_part(step, part, frame)
        return _Deferred(staged, self.__dict__.setdefault("_pending", []))

    def close(self) -> None:
        for staged in self.__dict__.pop("_pending", []):
            staged.commit()
        super().close()


class SealsTooFew(BrokenSink):
    """The seal lists every rank's parts but the last: receivers of the whole step
    miss a part."""

    def seal(self, seal: Seal) -> None:
        keys = tuple(k[:-1] for k in seal.keys)
        short = replace(seal, keys=keys, costs=tuple(c[:-1] for c in seal.costs))
        self.save(seal_name(seal.step), seal_bytes(short))


# -- Pieces and columns -------------------------------------------------------------------


def _pieces_changed(frame: Frame, change: Any) -> Frame:
    buffers = [change(b) if isinstance(b, Pieces) else b for b in frame.buffers]
    return replace(frame, buffers=tuple(buffers))


class ReversesRuns(_ChangesMessages):
    """Gathers, writing the runs of each Pieces last to first."""

    def change(self, frame: Frame, rank: int) -> Frame:
        return _pieces_changed(frame, lambda p: Pieces(p.runs[::-1]))


def _first_run(pieces: Pieces) -> Pieces:
    if not pieces.runs:
        return pieces
    first = pieces.runs[0]
    return Pieces([first, memoryview(bytes(pieces.nbytes - first.nbytes))])


class WritesFirstRunOnly(_ChangesMessages):
    """Says it gathers, and writes only the first run of each Pieces (zeros after it)."""

    def change(self, frame: Frame, rank: int) -> Frame:
        return _pieces_changed(frame, _first_run)


def _rotated(frame: Frame) -> Frame:
    """``frame`` with each buffer read in the place of the one before it (among those
    read): a partial read that hands out the wrong columns."""
    kept = [i for i in range(len(frame.buffers)) if i not in frame.missing]
    buffers = list(frame.buffers)
    for place, source in zip(kept, kept[1:] + kept[:1], strict=True):
        buffers[place] = frame.buffers[source]
    return replace(frame, buffers=tuple(buffers))


class ReadsWrongColumns(BrokenSink):
    """A read with ``fields=`` hands each column the bytes of another."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def read(self, step: int) -> Frame | None:
            frame = super().read(step)
            return frame if frame is None or self.select is None else _rotated(frame)

        def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
            got = super().read_part(step, index)
            if got is None or self.select is None:
                return got
            return got[0], _rotated(got[1])


# -- plugin errors -------------------------------------------------------------------------


class RaisesBareErrors(BrokenSink):
    """stage() raises a bare ValueError (what it staged discarded first): a plugin's bug,
    which users must get typed (PluginError naming the sink and the call), not bare."""

    def stage(self, step: int, frames: Any) -> Sliced[Staged]:
        staged = yield from super().stage(step, frames)
        staged.discard()
        raise ValueError("planted: a bare error from the plugin's stage")


class ReadsBytes(BrokenSink):
    """Its source's read() returns the message's bytes, not a Frame: refused by name
    (PluginError), not an AttributeError deep in the receiver."""

    class source_class(FileSource):  # what BrokenSink.open_source reads with
        def read(self, step: int) -> Frame | None:
            frame = super().read(step)
            return frame if frame is None else bytes(frame.header)  # type: ignore[return-value]


BROKEN: dict[str, type[BrokenSink]] = {
    "dup": DeliversAStepTwice,
    "order": DeliversOutOfOrder,
    "ranks": GivesRankOneRankZeros,
    "inplace": WritesInPlace,
    "halfleft": LeavesCancelledWrites,
    "early": PublishesRanksEarly,
    "corrupt": CorruptsAfterChecksum,
    "nosums": DropsChecksums,
    "keepall": KeepsEverything,
    "rank0mark": ReadsRankZerosMark,
    "pruneheld": PrunesHeldSteps,
    "nomarks": RecordsNoMarks,
    "noend": NeverEnds,
    "gapless": WaitsForDeletedSteps,
    "sharedmap": MapsFilesWritable,
    "partorder": PartsOutOfOrder,
    "lateparts": CommitsPartsAtClose,
    "shortseal": SealsTooFew,
    "reversed": ReversesRuns,
    "firstrun": WritesFirstRunOnly,
    "columns": ReadsWrongColumns,
    "bareerror": RaisesBareErrors,
    "readbytes": ReadsBytes,
}


def register() -> None:
    """Register each broken sink under ``broken-<name>`` (again: no conflict)."""
    register_sink("broken-sound", BrokenSink)
    for name, cls in BROKEN.items():
        register_sink(f"broken-{name}", cls)
