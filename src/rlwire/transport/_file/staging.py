"""A step of the file sink being written: each rank's files under temporary names
(:class:`~rlwire._core.atomic.AtomicFile`), hashed while written, renamed into place at
commit, sidecar files first and main files last. A sink that recycles hands it pooled
files of pruned steps to write over instead of new files, on tmpfs through the mappings
it kept of them (:mod:`~rlwire.transport._file.mapped`). On a machine with cores to
spare, a large rank's files are written in a thread of their own while the next rank's
are (:meth:`FileStaging.write_rank`)."""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlwire._core.atomic import AtomicFile, fsync_dir
from rlwire._core.errors import StepExistsError, transport_error
from rlwire._core.pools import shared_executor
from rlwire._core.slicing import Sliced, SliceTimer, run_sliced_beside
from rlwire.transport._file.mapped import WarmMaps, close_quietly, inode_of, map_for_writing
from rlwire.transport._file.writev import batches, hash_batch, writev_all
from rlwire.transport._stored.layout import Layout
from rlwire.transport._stored.names import FIELDS_RE
from rlwire.transport._stored.sink import StoredStaging

__all__ = ["BESIDE_BYTES", "SLICE_BYTES", "FileStaging", "RankFile", "envelope"]

#: Bytes written per slice. os.write releases the GIL, so large slices cost the event
#: loop nothing; they only bound how long a cancelled send takes to stop (tens of ms).
SLICE_BYTES = 64 << 20
#: A rank's files of at least this many bytes may be written in a thread of their own.
#: Below it the hand-off costs more than the overlap saves.
BESIDE_BYTES = 8 << 20
#: A batch of views of at least this many bytes on average is copied into a file's
#: mapping; below it numpy's call per view costs more than the kernel's copy saves.
MAPPED_VIEW_BYTES = 64 << 10
#: One file of a rank: its name, chunks, the segment of each chunk, what writes its
#: envelope at offset 0 once it is hashed (main files), whether it is the main file, and
#: its size in bytes.
RankFile = tuple[
    str, Sequence[bytes | memoryview], Sequence[int], Callable[[], bytes] | None, bool, int
]


def _taken(exc: FileExistsError, ranks: list[int], root: Path) -> StepExistsError:
    """The error of a commit whose move found its name taken: names the file in the way
    (``filename2``, the move's target, not the temporary file); ``ranks`` are those of
    the step the commit made visible before."""
    where = exc.filename2 or exc.filename or root
    what = "another sender committed this step first (two senders on one destination)"
    if FIELDS_RE.fullmatch(Path(where).name):
        what = "another stage appended to this step and rank first, under this number"
    return StepExistsError(
        what + (f"; ranks {ranks} are this sender's" if ranks else ""), where=where
    )


class FileStaging(StoredStaging):
    """The files of one step, written under temporary names in ``root``.

    ``take(name)``, when given, returns a pooled file to write the file ``name`` into (or
    ``None``): it is moved to the temporary name, written over and cut to size.
    ``writers``: how many threads may write its ranks at once, the staging thread
    included (:meth:`write_rank`). ``warm``: the mappings kept of pooled files; a pooled
    file that has one (or gets one: its second use on) is written through it, and its
    mapping is kept under its new name once committed.
    """

    def __init__(
        self,
        root: Path,
        fsync: bool,
        take: Callable[[str], Path | None] | None = None,
        writers: int = 1,
        warm: WarmMaps | None = None,
    ) -> None:
        self.root = root
        self.fsync = fsync
        self.take = take
        self.writers = writers
        self.warm = warm
        # The mappings files of this step were written through, by final name: kept at
        # commit, closed at discard.
        # Each with the (st_dev, st_ino) of the file it maps.
        self._mapped: dict[str, tuple[mmap.mmap, tuple[int, int]]] = {}
        # In the order the files were opened (a rank's sidecar before its main file, rank
        # by rank), whichever thread writes them: commit moves them in this order.
        self.sidecars: list[AtomicFile] = []
        self.mains: list[AtomicFile] = []
        self._beside: list[concurrent.futures.Future[None]] = []
        self._stop = threading.Event()  # set when the step is discarded: writers stop

    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        yield from self.write_rank([(name, chunks, [-1] * len(chunks), None, main, -1)], [], 0)

    def write_rank(
        self,
        files: Sequence[RankFile],
        hashers: Sequence[Any],
        size: int,
        *,
        beside: bool = False,
    ) -> Sliced[None]:
        """Write one rank's ``files`` in order, each to a temporary file beside its name,
        hashing each chunk of a segment into ``hashers[segment]`` (shared by them) as it
        goes, then its envelope (``head()``, if any) at offset 0. ``size``: about how
        many bytes they hold. If ``beside``, they
        hold :data:`BESIDE_BYTES` or more and fewer than ``writers - 1`` ranks are being
        written beside, a thread of the shared executor writes them, hashing each batch
        itself, and this returns at once; :meth:`drain` waits for it.

        Raises:
            TransportError: a file cannot be created or written (here, or at
                :meth:`drain` for one written beside); the step is then discarded
                whole.
        """
        outs = [self._open(name, main) for name, _, _, _, main, _ in files]
        work = zip(outs, files, strict=True)
        if beside and size >= BESIDE_BYTES and self._free_writer():
            fills = [
                self._fill(out, reused, chunks, segs, hashers, head, nbytes, hash_beside=False)
                for (out, reused), (_, chunks, segs, head, _, nbytes) in work
            ]
            self._beside.append(
                shared_executor().submit(run_sliced_beside, _one_after_another(fills), self._stop)
            )
            return
        for (out, reused), (_, chunks, segs, head, _, nbytes) in work:
            fill = self._fill(out, reused, chunks, segs, hashers, head, nbytes, hash_beside=True)
            yield from fill

    def _free_writer(self) -> bool:
        return sum(not f.done() for f in self._beside) < self.writers - 1

    def drain(self) -> Sliced[None]:
        """Wait for the ranks written beside; raises the first one's error (the step is
        then discarded whole)."""
        while self._beside:
            # A short timeout bounds how long a cancelled send takes to notice.
            done, _ = concurrent.futures.wait(
                self._beside, timeout=0.05, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                self._beside.remove(future)
                future.result()
            if self._beside:
                yield

    def _open(self, name: str, main: bool) -> tuple[AtomicFile, bool]:
        """A new temporary file for ``name``, or a pooled one (then True, and its kept
        mapping, if any, is this step's), listed for commit.

        Raises:
            TransportError: it cannot be created.
        """
        out = AtomicFile(self.root / name, fsync=self.fsync)
        pooled = self.take(name) if self.take is not None else None
        try:
            try:
                if pooled is None:
                    out.create()
                else:
                    out.reuse(pooled)
            except FileNotFoundError:  # the pooled file is gone (another sender opened)
                if pooled is None:
                    raise
                if self.warm is not None:  # its mapping would keep its memory
                    self.warm.drop([pooled.name])
                pooled = None
                out.create()
        except OSError as exc:
            raise transport_error(exc, "create a file", where=out.tmp) from exc
        (self.mains if main else self.sidecars).append(out)
        if pooled is None:
            return out, False
        try:  # not a mapping of another file that had the pooled file's name
            mapping = None if self.warm is None else self.warm.take(pooled.name, out.fd)
            if mapping is not None:  # this step's now: kept at commit, closed at discard
                self._mapped[out.final.name] = (mapping, inode_of(out.fd))
        except OSError as exc:
            raise transport_error(exc, "write", where=out.tmp) from exc
        return out, True

    def _fill(
        self,
        out: AtomicFile,
        reused: bool,
        chunks: Sequence[bytes | memoryview],
        segments: Sequence[int],
        hashers: Sequence[Any],
        head: Callable[[], bytes] | None,
        size: int,
        *,
        hash_beside: bool,
    ) -> Sliced[None]:
        """Write ``chunks`` (``size`` bytes, or -1: not known ahead) into ``out``, hashed
        (by another thread if ``hash_beside``), then ``head()`` at offset 0; cut it to
        size if it is a ``reused`` (pooled) file; close it. A reused file of known size
        is written through a mapping when the sink keeps them (``warm``): the one it
        kept, or a new one, kept at commit. On an error it is discarded.

        Raises:
            TransportError: it cannot be written.
        """
        mapping = None
        try:
            if reused and self.warm is not None and size >= 0:
                name = out.final.name
                kept, _ = self._mapped.pop(name, (None, None))
                mapping = map_for_writing(out.fd, size, kept)
                self._mapped[name] = (mapping, inode_of(out.fd))
            written = yield from _write_hashed(
                out.fd, chunks, segments, hashers, hash_beside, mapping
            )
            if head is not None:
                data = head()
                if os.pwrite(out.fd, data, 0) != len(data):
                    raise OSError(errno.EIO, "short write of the envelope")
            if reused:  # every byte up to written is new: drop the rest
                os.ftruncate(out.fd, written)
            out.close()
        except OSError as exc:
            out.discard()
            raise transport_error(exc, "write", where=out.tmp) from exc
        except BaseException:
            out.discard()
            raise

    def commit(self) -> None:
        # Everything that can fail routinely happens before the first main file appears:
        # a failure there leaves nothing visible. After that only moves of main files in
        # one directory remain; if one of those fails, what is visible stays visible.
        # No move replaces a file (AtomicFile.rename(replace=False)): of two senders
        # committing the same step, in the same order, the first to move its first file
        # wins and the other gets StepExistsError having made nothing visible.
        ranks: list[int] = []
        moved: list[AtomicFile] = []
        try:
            for out in self.sidecars:
                out.rename(replace=False)
                moved.append(out)
            if self.fsync and self.sidecars:
                fsync_dir(self.root)
            for rank, out in enumerate(self.mains):
                out.rename(replace=False)
                ranks.append(rank)
                self.visible = True
            if self.fsync:
                fsync_dir(self.root)
            if self.warm is not None:
                for name, (mapping, inode) in self._mapped.items():
                    self.warm.keep(name, mapping, inode)
                self._mapped.clear()
        except OSError as exc:
            self.discard()
            if not ranks:
                for out in moved:  # only this sender's: nothing replaced them
                    out.final.unlink(missing_ok=True)
            if isinstance(exc, FileExistsError):
                raise _taken(exc, ranks, self.root) from exc
            if ranks:
                raise transport_error(
                    exc,
                    f"commit the step in full (visible for ranks {ranks} only)",
                    where=self.root,
                ) from exc
            raise transport_error(
                exc, "commit the step (nothing was made visible)", where=self.root
            ) from exc

    def discard(self) -> None:
        # The writers beside stop after their current slice; no file is closed under them.
        self._stop.set()
        concurrent.futures.wait(self._beside)
        self._beside.clear()
        for out in (*self.mains, *self.sidecars):
            out.discard()
        for mapping, _ in self._mapped.values():
            close_quietly(mapping)
        self._mapped.clear()


def envelope(layout: Layout, hashers: Sequence[Any]) -> Callable[[], bytes]:
    """What writes a main file's envelope once its segments are hashed: the envelope
    planned with placeholder checksums, now with the real ones (the same length)."""

    def head() -> bytes:
        sums = np.array([h.intdigest() for h in hashers], np.dtype("<u8"))
        data = layout.head(sums.tobytes())
        if len(data) != memoryview(layout.main[0]).nbytes:  # planned with placeholders
            raise AssertionError("the envelope changed length when checksums were added")
        return data

    return head


def _one_after_another(fills: list[Sliced[None]]) -> Sliced[None]:
    """The slices of ``fills``, one generator after the other; those not started are
    closed if this one is (their files are discarded with the step)."""
    try:
        for fill in fills:
            yield from fill
    finally:
        for fill in fills:
            fill.close()


def _write_hashed(
    fd: int,
    chunks: Sequence[bytes | memoryview],
    segments: Sequence[int],
    hashers: Sequence[Any],
    hash_beside: bool,
    mapping: mmap.mmap | None = None,
) -> Sliced[int]:
    """Write ``chunks`` to ``fd`` with ``writev``, hashing each chunk of a segment into
    ``hashers[segment]``; the number of bytes written. With ``hash_beside`` another
    thread hashes each batch while this one writes it, and has finished whenever this
    returns or raises; else this thread hashes each batch after writing it (a writer
    beside others, which must not wait for the shared executor it runs in). With a
    ``mapping`` of the file, sized for all of them, a batch of large views is copied
    into it instead (numpy lets go of the GIL for each), the file's offset moved past."""
    hashing: concurrent.futures.Future[None] | None = None
    total = 0
    # The mapping as bytes numpy copies into; no view of it outlives the write.
    target = None if mapping is None else np.frombuffer(mapping, np.uint8)
    try:
        written = 0
        slicer = SliceTimer()
        for batch in batches(chunks, segments):
            if hashing is not None:  # segments are hashed in order, a batch at a time
                hashing.result()  # a wait with the GIL let go: not part of the slice
                hashing = None
                slicer.restart()
            if hashers and hash_beside:
                # Another core hashes the batch while this one writes it (xxhash and the
                # write both release the GIL), the hash reading it from cache.
                hashing = shared_executor().submit(hash_batch, hashers, batch)
            # Only the work between writes holds the GIL (many small buffers to hash make
            # it long); the writes themselves leave the event loop free.
            busy = slicer.due()
            views = [view for view, _ in batch]
            if target is not None and _batch_bytes(views) >= MAPPED_VIEW_BYTES * len(views):
                n = _copy_into(target, total, views)
                os.lseek(fd, n, os.SEEK_CUR)
            else:
                n = writev_all(fd, views)
            if hashers and not hash_beside:
                hash_batch(hashers, batch)  # just written: read from cache
            written += n
            total += n
            if written >= SLICE_BYTES or busy:
                written = 0
                yield
            slicer.restart()
        if hashing is not None:
            hashing.result()
            hashing = None
        return total
    finally:
        del target
        if hashing is not None:  # stopped midway: let the hashing thread finish first
            concurrent.futures.wait([hashing])


def _batch_bytes(views: list[memoryview]) -> int:
    return sum(view.nbytes for view in views)


def _copy_into(target: np.ndarray, offset: int, views: list[memoryview]) -> int:
    """Copy ``views`` back to back into ``target`` from ``offset``; the bytes copied."""
    start = offset
    for view in views:
        end = offset + view.nbytes
        target[offset:end] = view
        offset = end
    return offset - start
