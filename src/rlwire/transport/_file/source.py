"""FileSource: reads, for one rank, the files a FileSink wrote, as mmap views."""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from rlwire._core.atomic import write_atomic
from rlwire._core.errors import CorruptFrameError, transport_error
from rlwire._frame.frame import Frame
from rlwire.transport._file.handed import HandedMappings
from rlwire.transport._file.mapped import WarmReads, on_tmpfs
from rlwire.transport._file.watch import DirectoryWatch
from rlwire.transport._stored.marks import too_long
from rlwire.transport._stored.names import LEFTOVER_RE, STORED_RE, consumed_name
from rlwire.transport._stored.selected import Ranged, WholeFile
from rlwire.transport._stored.source import StoredSource

__all__ = ["FileSource", "open_regular", "read_bounded"]


class FileSource(StoredSource):
    """Reads the files a :class:`~rlwire.transport.FileSink` wrote, for one rank, as mmap views.

    Every file is mapped private and copy-on-write (``mmap.ACCESS_COPY``, i.e.
    ``MAP_PRIVATE``). Reading such a mapping shares the page cache's pages, so opening a
    step costs what a read-only mapping costs; a write copies only the page it touches
    into memory private to this process, and never reaches the file. By default the
    buffers handed out are read-only memoryviews, so numpy arrays over them are
    read-only (``flags.writeable`` is False); a library that ignores numpy's flag and
    writes anyway (``torch.from_numpy`` then an in-place op, ``ctypes``) writes into
    private pages instead of crashing the process with SIGSEGV.

    On tmpfs, a source that verifies checksums and hands out read-only buffers keeps
    its mapping of each step file it read, once it has seen a file come back recycled
    (:class:`~rlwire.transport._file.mapped.WarmReads`): a file a recycling sink writes
    a later step into is read again through it, without page faults or unmapping. A
    page this process wrote into (as above) is no longer the file's; a step whose
    checksums then fail is read again through a new mapping before anything is
    reported. A step without checksums turns the kept mappings off for good (nothing
    would tell such a page), and that step is read again through new mappings.

    Args:
        path: the directory the sink writes to.
        rank: the data-parallel rank to read.
        writable: hand out writable buffers, so arrays are writable numpy arrays without
            a copy. The first write to each page pays a copy-on-write page fault (about
            1.7 ms per MiB written, on a 2-CPU VM); writes never reach the file.
        verify: check every segment against its recorded checksum.
        poll_interval: seconds between checks while waiting for a step or a part. On
            Linux a waiting source is also woken as soon as a file appears in the
            directory (inotify); it still checks every ``poll_interval``, for files
            written on another machine of a network filesystem, which raise no event.
        watch: False: never use inotify, only poll. It is not used either where the
            platform lacks it, or the per-user limit of inotify instances or watches
            is reached (then it is tried again, at most once a second).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        writable: bool = False,
        verify: bool = True,
        poll_interval: float = 0.01,
        watch: bool = True,
    ) -> None:
        self.root = Path(path)
        # Consumption marks move as other ranks read: no reason to wake this one.
        self.watch = DirectoryWatch(self.root, enabled=watch, ignore=("consumed.",))
        self.poll_interval = poll_interval
        self.rank = rank
        self.writable = writable
        self.verify = verify
        # Every mapping handed out, unmapped once no view of it is left, in the thread
        # that reads the next file.
        self._mapped = HandedMappings()
        # Mappings of step files kept for when the file comes back recycled, and the
        # keys of those this read is served from (forgotten if its checksums fail).
        # (They hold the list, not the source: a source dropped unclosed must go at once,
        # its descriptors with it, not when the cyclic collector runs.)
        warm = verify and not writable and on_tmpfs(self.root)
        self._warm = WarmReads(self._mapped.append) if warm else None
        self._served: dict[str, tuple[int, int]] = {}
        self._fresh = False  # reading again: every file through a new mapping
        self._swept = False  # the temporary files of this rank's killed marks removed

    def __repr__(self) -> str:
        return f"FileSource({str(self.root)!r}, rank={self.rank})"

    def wait(self, timeout: float | None) -> None:
        self.watch.wait(self._bounded(timeout))

    async def await_message(self, timeout: float | None) -> None:
        await self.watch.await_change(self._bounded(timeout))

    def _bounded(self, timeout: float | None) -> float:
        return self.interval if timeout is None else max(0.0, min(timeout, self.interval))

    def close(self) -> None:
        """Release the directory's watch; unmap the mappings nothing uses (the others
        go when their last view does)."""
        self.watch.close()
        if self._warm is not None:
            self._warm.close()
        self._mapped.unmap_unused()
        self._mapped.clear()

    def locate(self, name: str) -> str:
        return str(self.root / name)

    def listed(self) -> list[str] | None:
        try:
            with os.scandir(self.root) as entries:
                return [e.name for e in entries]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise transport_error(exc, "list", where=self.root) from exc

    def save(self, name: str, data: bytes) -> None:
        if not self._swept:
            self._swept = True
            self._sweep()
        try:
            for _ in range(3):
                try:
                    write_atomic(self.root / name, data)
                    return
                except FileNotFoundError:
                    # A sender opening (resume, overwrite, truncate) removes temporary
                    # files killed writers left, and may take this one: write it again.
                    if not self.root.is_dir():
                        raise
            write_atomic(self.root / name, data)
        except OSError as exc:
            raise transport_error(
                exc, "record what this rank consumed", where=self.root / name
            ) from exc

    def _sweep(self) -> None:
        """Remove the temporary files of this rank's marks (consumption and part) that
        its receivers, killed while writing one, left. A sender removes them too, but
        only when one opens: without this, those of a trainer killed while its producer
        ran on (or had ended) stayed for good. A live receiver of the rank writing a mark
        now writes it again (:meth:`save`)."""
        prefix = "." + consumed_name(self.rank).removesuffix("rlw")
        try:
            with os.scandir(self.root) as entries:
                doomed = [e.name for e in entries if e.name.startswith(prefix)]
            for leftover in doomed:
                if LEFTOVER_RE.fullmatch(leftover):
                    os.unlink(self.root / leftover)
        except OSError:
            pass  # a clean-up only: the write says what is wrong with the directory

    def open_ranged(self, name: str) -> Ranged | None:
        """The file mapped as :meth:`load` maps it, for a partial read: with readahead
        off (``MADV_RANDOM``), so that what is not read stays on disk, and each range
        read asked for ahead (``MADV_WILLNEED``), so that it still streams in."""
        view = self.load(name, advice=getattr(mmap, "MADV_RANDOM", None))
        return None if view is None else _MappedFile(view)

    def read(self, step: int) -> Frame | None:
        self._served.clear()
        try:
            frame = super().read(step)
        except CorruptFrameError:
            if self._warm is None or not self._served:
                raise
            # Kept mappings served it: a page of them this process wrote into fails the
            # checksums though the file is whole. Read through new mappings to tell:
            # every kept mapping of the step forgotten as it is loaded, also those the
            # failed read had not reached yet (a sidecar after a main file that failed).
            self._fresh = True
            try:
                return super().read(step)
            finally:
                self._fresh = False
        if self._warm is not None and frame is not None and not frame.verified:
            # No checksums: a page this process wrote into would pass for the file's.
            warm, self._warm = self._warm, None
            warm.close()
            if self._served:
                return super().read(step)
        return frame

    def load(self, name: str, advice: int | None = None) -> memoryview | None:
        self._mapped.unmap_due()
        warm = self._warm
        if warm is not None:  # here, as a waiting receiver polls too
            warm.evict_deleted()
        path = self.root / name
        fd = open_regular(path)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise CorruptFrameError("empty file", where=path)
            got = None
            if warm is not None and advice is None and STORED_RE.fullmatch(name):
                got = warm.map(fd, size, name, fresh=self._fresh)
            if got is not None:  # fd is the kept mappings' now
                fd = -1
                mapping, key, kept = got
                if kept:
                    self._served[name] = key
                return memoryview(mapping)[:size].toreadonly()
            # The mapping outlives fd; arrays keep it alive through their memoryviews.
            # Always copy-on-write, even when read-only to Python: see the class docstring.
            mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
            if advice is not None:
                mapping.madvise(advice)
            self._mapped.append(mapping)
            view = memoryview(mapping)
            return view if self.writable else view.toreadonly()
        except OSError as exc:
            action = "map" + self._mapped.crowding(exc)
            raise transport_error(exc, action, where=path) from exc
        finally:
            if fd >= 0:
                os.close(fd)

    def load_mark(self, name: str, limit: int, what: str) -> bytes | None:
        return read_bounded(self.root / name, limit, what)

    def load_sidecar(self, name: str, size: int) -> memoryview | None:
        """The sidecar ``name``, its size looked at before it is mapped: one longer than
        its envelope says is refused unmapped (a sparse 4 GiB one was mapped whole:
        under a limit on address space a TransportError, 'cannot map'); a shorter one
        is mapped and checked as ever (its prelude says if it is another message's)."""
        try:
            info = os.stat(self.root / name)
        except OSError:
            info = None  # gone, or not to be looked at: load says which
        found = info.st_size if info is not None and stat.S_ISREG(info.st_mode) else size
        if found > size:  # (not a regular file: load says what it is)
            raise CorruptFrameError(
                f"sidecar extended: expected {size} bytes, found {found}; not read",
                where=self.root / name,
            )
        return self.load(name)


class _MappedFile(WholeFile):
    """A mapped file read by ranges: each range's pages are asked for ahead."""

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        mapping = self.data.obj
        willneed = getattr(mmap, "MADV_WILLNEED", None)
        if isinstance(mapping, mmap.mmap) and willneed is not None:
            for start, end in ranges:
                first = start - start % mmap.PAGESIZE
                if end > first:
                    mapping.madvise(willneed, first, end - first)
        return super().read(ranges)


def open_regular(path: Path) -> int | None:
    """A descriptor of the regular file at ``path``, or ``None`` if nothing is there.

    Opened without blocking, so that a FIFO (which would wait for a writer) or a device
    at a step's path cannot hang a reader.

    Raises:
        CorruptFrameError: something other than a regular file is there.
        TransportError: it cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise transport_error(exc, "open", where=path) from exc
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise transport_error(exc, "open", where=path) from exc
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(mode), "special file")
        raise CorruptFrameError(f"not a regular file but a {kind}", where=path)
    return fd


def read_bounded(path: Path, limit: int, what: str) -> bytes | None:
    """The file at ``path``, a ``what`` (a mark, a seal) of at most ``limit`` bytes,
    read (not mapped), or ``None`` if nothing is there; one longer is refused by its
    size, unread.

    Raises:
        CorruptFrameError: it is longer than ``limit``, or not a regular file.
        TransportError: it cannot be read.
    """
    fd = open_regular(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as file:
        try:
            size = os.fstat(fd).st_size
            data = file.read(size + 1) if size <= limit else b""  # all there is
        except OSError as exc:
            raise transport_error(exc, "read", where=path) from exc
    if size > limit or len(data) > limit:
        raise too_long(what, max(size, len(data)), limit, str(path))
    return data


_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}
