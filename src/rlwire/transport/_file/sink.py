"""Local or shared filesystem sink and source.

Each step and rank is one main file, ``step-00000042.rank-0000.rlw``, plus, when a
sidecar is asked for, ``step-00000042.rank-0000.sidecar.rlw``. Files are written under
hidden temporary names beside their final names and renamed into place, sidecars first
and main files last, so a main file's appearance means the whole message is there. Readers
poll with ``stat``-free ``open`` calls (works on NFS, where inotify does not) and map files
with mmap, so arrays are views over the page cache.
"""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import xxhash

from rlwire._core.atomic import AtomicFile, fsync_dir, write_atomic
from rlwire._core.errors import (
    ConfigError,
    CorruptFrameError,
    StepExistsError,
    transport_error,
)
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._frame.checksums import hash_pool, placeholder_checksums
from rlwire.transport._base import (
    OnExisting,
    PendingFrame,
    Sink,
    SinkOptions,
    SourceOptions,
    Staged,
    reject_unknown,
    take_frame,
)
from rlwire.transport._stored.layout import Layout, end_mark, plan
from rlwire.transport._stored.names import (
    END_NAME,
    TEMP_RE,
    main_name,
    names_to_delete,
    sidecar_name,
)
from rlwire.transport._stored.names import start_step as first_step
from rlwire.transport._stored.retention import read_consumed, steps_to_prune
from rlwire.transport._stored.source import StoredSource
from rlwire.transport._url import URL

__all__ = ["FileSink", "FileSource", "local_path"]


#: Bytes written per slice. os.write releases the GIL, so large slices cost the event
#: loop nothing; they only bound how long a cancelled send takes to stop (tens of ms).
SLICE_BYTES = 64 << 20
#: Bytes per writev call. Each is hashed while it is written, in chunks this small, so
#: the hash and the write read it from cache: checksums then cost almost nothing.
_CHUNK_BYTES = 2 << 20
#: A writev batch of at most this many buffers holds large ones: hashed in another thread.
_FEW_VIEWS = 4
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16)


def local_path(url: URL) -> str:
    """The path a plain path or ``file://`` URL names.

    Raises:
        ConfigError: a ``file://`` URL that names another host.
    """
    if url.rest == url.text:  # a plain path
        return url.text
    if url.parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"{url.text!r}: file URLs must name a local path (file:///dir), "
            f"not host {url.parts.netloc!r}"
        )
    return unquote(url.parts.path)


class _FileStaged(Staged):
    def __init__(self, root: Path, fsync: bool) -> None:
        self.root = root
        self.fsync = fsync
        self.sidecars: list[AtomicFile] = []
        self.mains: list[AtomicFile] = []

    def commit(self) -> None:
        # Everything that can fail routinely happens before the first main file appears:
        # a failure there leaves nothing visible. After that only renames of main files in
        # one directory remain; if one of those fails, what is visible stays visible.
        ranks: list[int] = []
        try:
            for out in self.sidecars:
                out.rename()
            if self.fsync and self.sidecars:
                fsync_dir(self.root)
            for rank, out in enumerate(self.mains):
                out.rename()
                ranks.append(rank)
                self.visible = True
            if self.fsync:
                fsync_dir(self.root)
        except OSError as exc:
            self.discard()
            if ranks:
                raise transport_error(
                    exc,
                    f"commit the step in full (visible for ranks {ranks} only)",
                    where=self.root,
                ) from exc
            for out in self.sidecars:
                out.final.unlink(missing_ok=True)
            raise transport_error(
                exc, "commit the step (nothing was made visible)", where=self.root
            ) from exc

    def discard(self) -> None:
        for out in (*self.mains, *self.sidecars):
            out.discard()


class FileSink(Sink):
    """Writes each step's frames as files in a directory.

    Args:
        path: the directory; created if missing.
        fsync: fsync every file before it is renamed, and the directory after, so a
            committed step survives a power loss (slower).
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = False, checksum: bool = True
    ) -> None:
        self.root = Path(path)
        self.fsync = fsync
        self.checksum = checksum

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> FileSink:
        reject_unknown(url, options.storage_options, ())
        return cls(local_path(url), fsync=options.fsync, checksum=options.checksum)

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> FileSource:
        reject_unknown(url, options.storage_options, ())
        return FileSource(
            local_path(url),
            rank=options.rank,
            writable=options.writable,
            verify=options.verify,
            poll_interval=options.poll_interval,
        )

    def __repr__(self) -> str:
        return f"FileSink({str(self.root)!r})"

    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".rlwire-probe.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as exc:
            raise transport_error(
                exc, "write to the destination directory", where=self.root
            ) from exc
        with os.scandir(self.root) as entries:
            names = [e.name for e in entries]
        step = first_step(str(self.root), names, on_existing, start_step)
        if on_existing != "error":
            self._remove([n for n in names if TEMP_RE.fullmatch(n)])
        for doomed in names_to_delete(names, on_existing, start_step):
            self._remove(doomed)  # in the order names_to_delete gives: see why there
        return step

    def finish(self, end: int) -> None:
        _save(self.root / END_NAME, end_mark(end), "mark the end of the stream", self.fsync)

    def consumed(self, ranks: int, sent: int) -> list[int | None]:
        return read_consumed(_load_small(self.root), lambda n: str(self.root / n), ranks, sent)

    def prune(self, below: int) -> None:
        with os.scandir(self.root) as entries:
            names = [e.name for e in entries]
        for step in steps_to_prune(names, below):
            for batch in step:
                self._remove(batch)

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        staged = _FileStaged(self.root, self.fsync)
        try:
            for rank in range(len(frames)):
                final = self.root / main_name(step, rank)
                if final.exists():
                    raise StepExistsError(
                        f"{final}: step {step} rank {rank} already exists at the destination",
                    )
            for rank, pending in enumerate(frames):
                frame = yield from take_frame(pending)
                sums = placeholder_checksums(frame) if self.checksum else None
                layout = plan(frame, step, rank, sums)
                hashers = (
                    [xxhash.xxh3_64() for _ in range(len(frame.buffers) + 1)]
                    if self.checksum
                    else []
                )
                if layout.sidecar:
                    final = self.root / sidecar_name(step, rank)
                    out = yield from self._write(
                        final, layout.sidecar, layout.sidecar_segments, hashers
                    )
                    staged.sidecars.append(out)
                final = self.root / main_name(step, rank)
                head = _head(layout, hashers) if self.checksum else None
                out = yield from self._write(
                    final, layout.main, layout.main_segments, hashers, head
                )
                staged.mains.append(out)
        except BaseException:
            staged.discard()
            raise
        return staged

    def _write(
        self,
        final: Path,
        chunks: Sequence[bytes | memoryview],
        segments: Sequence[int],
        hashers: Sequence[Any],
        head: Callable[[], bytes] | None = None,
    ) -> Sliced[AtomicFile]:
        """Write ``chunks`` to a temporary file beside ``final``, hashing each chunk of a
        segment into ``hashers[segment]`` as it goes; then write ``head()`` at offset 0."""
        out = AtomicFile(final, fsync=self.fsync)
        try:
            out.create()
        except OSError as exc:
            raise transport_error(exc, "create a file", where=out.tmp) from exc
        hashing: concurrent.futures.Future[None] | None = None
        try:
            written = 0
            slicer = SliceTimer()
            for batch in _batches(chunks, segments):
                if hashing is not None:  # segments are hashed in order, a batch at a time
                    hashing.result()
                    hashing = None
                if hashers and len(batch) <= _FEW_VIEWS:
                    # Large buffers: another core hashes the batch while this one writes
                    # it (xxhash and the write both release the GIL).
                    hashing = hash_pool().submit(_hash_batch, hashers, batch)
                elif hashers:
                    _hash_batch(hashers, batch)
                # Only the work between writes holds the GIL (many small buffers to
                # hash make it long); the writes themselves leave the event loop free.
                busy = slicer.due()
                written += _writev_all(out.fd, [view for view, _ in batch])
                if written >= SLICE_BYTES or busy:
                    written = 0
                    yield
                slicer.restart()
            if hashing is not None:
                hashing.result()
                hashing = None
            if head is not None:
                data = head()
                if os.pwrite(out.fd, data, 0) != len(data):
                    raise OSError(errno.EIO, "short write of the envelope")
            out.close()
        except OSError as exc:
            out.discard()
            raise transport_error(exc, "write", where=out.tmp) from exc
        except BaseException:
            out.discard()
            raise
        finally:
            if hashing is not None:  # stopped midway: let the hashing thread finish first
                concurrent.futures.wait([hashing])
        return out

    def _remove(self, names: Sequence[str]) -> None:
        try:
            for name in names:
                (self.root / name).unlink(missing_ok=True)
        except OSError as exc:
            raise transport_error(exc, "delete an earlier step", where=self.root) from exc


class FileSource(StoredSource):
    """Reads the files a :class:`FileSink` wrote, for one rank, as mmap views.

    Every file is mapped private and copy-on-write (``mmap.ACCESS_COPY``, i.e.
    ``MAP_PRIVATE``). Reading such a mapping shares the page cache's pages, so opening a
    step costs what a read-only mapping costs; a write copies only the page it touches
    into memory private to this process, and never reaches the file. By default the
    buffers handed out are read-only memoryviews, so numpy arrays over them are
    read-only (``flags.writeable`` is False); a library that ignores numpy's flag and
    writes anyway (``torch.from_numpy`` then an in-place op, ``ctypes``) writes into
    private pages instead of crashing the process with SIGSEGV.

    Args:
        path: the directory the sink writes to.
        rank: the data-parallel rank to read.
        writable: hand out writable buffers, so arrays are writable numpy arrays without
            a copy. The first write to each page pays a copy-on-write page fault (about
            1.7 ms per MiB written, on a 2-CPU VM); writes never reach the file.
        verify: check every segment against its recorded checksum.
        poll_interval: seconds between checks while waiting for a step.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rank: int = 0,
        writable: bool = False,
        verify: bool = True,
        poll_interval: float = 0.01,
    ) -> None:
        self.root = Path(path)
        self.poll_interval = poll_interval
        self.rank = rank
        self.writable = writable
        self.verify = verify
        # Every mapping handed out, unmapped here once no view of it is left: in the
        # thread that reads the next step, not wherever the last array of a step is
        # dropped. Unmapping a step of 1.6 GB takes ~0.15 s; in a trainer's event-loop
        # thread (``batch = await receiver.areceive()`` drops the previous batch) that
        # is a 0.15 s stall.
        self._mapped: list[mmap.mmap] = []
        self._mapped_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileSource({str(self.root)!r}, rank={self.rank})"

    def close(self) -> None:
        """Unmap the mappings nothing uses; the others go when their last view does."""
        self._unmap_unused()
        with self._mapped_lock:
            self._mapped.clear()

    def _unmap_unused(self) -> None:
        with self._mapped_lock:
            in_use = []
            for mapping in self._mapped:
                try:
                    mapping.close()  # munmap, with the GIL released
                except BufferError:  # arrays or views over it are still alive
                    in_use.append(mapping)
            self._mapped = in_use

    def locate(self, name: str) -> str:
        return str(self.root / name)

    def save(self, name: str, data: bytes) -> None:
        _save(self.root / name, data, "record what this rank consumed")

    def load(self, name: str) -> memoryview | None:
        self._unmap_unused()
        path = self.root / name
        fd = _open_regular(path)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise CorruptFrameError("empty file", where=path)
            # The mapping outlives fd; arrays keep it alive through their memoryviews.
            # Always copy-on-write, even when read-only to Python: see the class docstring.
            mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
            with self._mapped_lock:
                self._mapped.append(mapping)
            view = memoryview(mapping)
            return view if self.writable else view.toreadonly()
        except OSError as exc:
            raise transport_error(exc, "map", where=path) from exc
        finally:
            os.close(fd)


def _head(layout: Layout, hashers: Sequence[Any]) -> Callable[[], bytes]:
    def head() -> bytes:
        sums = np.array([h.intdigest() for h in hashers], np.dtype("<u8"))
        data = layout.head(sums.tobytes())
        if len(data) != memoryview(layout.main[0]).nbytes:  # planned with placeholders
            raise AssertionError("the envelope changed length when checksums were added")
        return data

    return head


def _hash_batch(hashers: Sequence[Any], batch: list[tuple[memoryview, int]]) -> None:
    for view, seg in batch:
        if seg >= 0:
            hashers[seg].update(view)


def _batches(
    chunks: Sequence[bytes | memoryview], segments: Sequence[int]
) -> Iterator[list[tuple[memoryview, int]]]:
    """Group chunks into writev batches of at most _CHUNK_BYTES and _IOV_MAX entries, so
    thousands of small buffers cost a few system calls; each item is (view, segment)."""
    batch: list[tuple[memoryview, int]] = []
    size = 0
    for chunk, seg in zip(chunks, segments, strict=True):
        view = memoryview(chunk).cast("B") if not isinstance(chunk, bytes) else memoryview(chunk)
        for start in range(0, view.nbytes, _CHUNK_BYTES):
            chunk = view[start : start + _CHUNK_BYTES]
            batch.append((chunk, seg))
            size += chunk.nbytes
            if size >= _CHUNK_BYTES or len(batch) >= _IOV_MAX:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _writev_all(fd: int, views: list[memoryview]) -> int:
    total = sum(v.nbytes for v in views)
    while views:
        n = os.writev(fd, views)
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views = views[1:]
        if views and n:
            views = [views[0][n:], *views[1:]]
    return total


def _save(final: Path, data: bytes, action: str, fsync: bool = False) -> None:
    """Write ``data`` to ``final`` so that it appears whole."""
    try:
        write_atomic(final, data, fsync=fsync)
    except OSError as exc:
        raise transport_error(exc, f"{action}", where=final) from exc


def _load_small(root: Path) -> Callable[[str], bytes | None]:
    """Reads a small part of ``root`` whole (``None`` if missing)."""

    def load(name: str) -> bytes | None:
        fd = _open_regular(root / name)
        if fd is None:
            return None
        try:
            with os.fdopen(fd, "rb") as file:
                return file.read(_MAX_MARK_BYTES)
        except OSError as exc:
            raise transport_error(exc, "read", where=root / name) from exc

    return load


#: More than any mark holds: a larger file at a mark's name is refused by its length.
_MAX_MARK_BYTES = 4096


def _open_regular(path: Path) -> int | None:
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


_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}
