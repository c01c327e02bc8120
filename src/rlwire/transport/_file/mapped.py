"""Mappings of a recycling directory's files kept from one use of a file to its next.

On tmpfs a file's pages are memory. Writing a file the sink wrote before with ``write``
costs the kernel's copy, about 5 GB/s on a 2-CPU VM; copying into a mapping of it whose
pages are already mapped is a plain memcpy, about twice as fast. A new mapping would give
that back: its first write to each page is a page fault (about 0.8 µs a 4 KiB page),
which costs as much as the write. So a recycling sink keeps the mapping of each of its
files while the file is stored or pooled (:class:`WarmMaps`), and a file written again
reuses it. A receiver likewise keeps its mapping of each step file it read
(:class:`WarmReads`): when the file comes back, recycled for a later step, reading it
through the same mapping costs no page faults, and no unmapping (10 ms for 200 MB).
Only on tmpfs (:func:`on_tmpfs`): on a disk's filesystem a write through a mapping to a
page no longer cached reads the page in first, and a kept mapping keeps pages cached.

A file never grows through its mapping (a page past the end of a file raises SIGBUS when
touched): :func:`map_for_writing` gives the file its new size first, allocating what it
adds with ``posix_fallocate``, so a full tmpfs is an ``OSError`` (``ENOSPC``), not a
signal.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "WarmMaps",
    "WarmReads",
    "close_quietly",
    "inode_of",
    "map_for_writing",
    "mount_type",
    "on_tmpfs",
]


#: The escapes of a mountinfo path field: a space, tab, newline or backslash as ``\ooo``.
_OCTAL = re.compile(r"\\([0-7]{3})")


def on_tmpfs(path: Path) -> bool:
    """Whether ``path`` (an existing directory) lies on a tmpfs mount, such as
    ``/dev/shm``, by ``/proc/self/mountinfo``; False where that cannot be read (not
    Linux)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as file:
            table = file.read()
    except OSError:
        return False
    return mount_type(os.path.realpath(path), table) == "tmpfs"


def mount_type(real: str, mountinfo: str) -> str:
    """The filesystem type of the mount holding the real path ``real``: of the mounts
    in ``mountinfo`` (the text of ``/proc/self/mountinfo``), the one whose mount point
    is the longest prefix of it, the last such when mounted over; "" if none is.

    Example:
        >>> mount_type("/dev/shm/run", "22 1 0:5 / /dev/shm rw - tmpfs tmpfs rw")
        'tmpfs'
    """
    best, kind = "", ""
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)
        if len(fields) != 2 or len(fields[0].split(" ")) < 5:
            continue
        point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[0].split(" ")[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[1].split(" ", 1)[0]
    return kind


def map_for_writing(fd: int, size: int, mapping: mmap.mmap | None) -> mmap.mmap:
    """A writable mapping of at least ``size`` bytes of the file open as ``fd`` (for
    reading and writing), now cut or grown to ``size``: ``mapping`` itself when it is
    long enough (its pages stay mapped), else a new one (``mapping`` is closed).

    Raises:
        OSError: the file cannot be sized, allocated (``ENOSPC`` on a full tmpfs) or
            mapped; ``mapping`` is then closed.
    """
    try:
        old = os.fstat(fd).st_size
        if size < old:
            os.ftruncate(fd, size)
        elif size > old:
            os.posix_fallocate(fd, old, size - old)
        if mapping is not None and len(mapping) >= size:
            return mapping
        close_quietly(mapping)
        mapping = None
        return mmap.mmap(fd, size)
    except BaseException:
        close_quietly(mapping)
        raise


def close_quietly(mapping: mmap.mmap | None) -> None:
    """Unmap ``mapping`` unless it is ``None`` or a view of it is still alive (it is
    then unmapped when the last view goes)."""
    if mapping is None:
        return
    with contextlib.suppress(BufferError):
        mapping.close()


_Key = tuple[int, int]


def inode_of(fd: int) -> _Key:
    """The device and inode number of the file open as ``fd``: which file it is."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class WarmMaps:
    """The writable mappings of a recycling file sink's files, by file name, each with
    the inode it maps, kept while the file is stored or pooled so that writing it again
    reuses mapped pages.

    Every name the sink deletes, moves or pools goes through :meth:`drop` or
    :meth:`move`: a mapping of a deleted file would keep its tmpfs memory. A name may
    come to name another file all the same (another sender on the destination deleted
    the file and wrote a new one under its name): :meth:`take` then hands out nothing,
    as a write through the mapping would go to the deleted file, not the new one.
    Thread-safe: ranks are written, and their files committed, from several threads.

    Example:
        >>> maps = WarmMaps()
        >>> maps.take("a") is None
        True
    """

    def __init__(self) -> None:
        # Each one's mapping and the (st_dev, st_ino) of the file it maps.
        self._maps: dict[str, tuple[mmap.mmap, _Key | None]] = {}
        self._lock = threading.Lock()

    def take(self, name: str, fd: int | None = None) -> mmap.mmap | None:
        """The mapping kept for the file ``name``, now the caller's, or ``None``. Given
        ``fd``, the file about to be written: ``None`` too (the mapping closed) unless
        the mapping was kept with that file's inode.

        Raises:
            OSError: ``fd`` cannot be asked its inode (the mapping is closed).
        """
        with self._lock:
            mapping, inode = self._maps.pop(name, (None, None))
        if mapping is None or fd is None:
            return mapping
        try:
            if inode is not None and inode == inode_of(fd):
                return mapping
        except BaseException:
            close_quietly(mapping)
            raise
        close_quietly(mapping)  # a mapping of a file no longer under this name
        return None

    def keep(self, name: str, mapping: mmap.mmap, inode: _Key | None = None) -> None:
        """Keep ``mapping``, of the file whose :func:`inode_of` is ``inode``, as the file
        ``name``'s (one it replaces is closed); without ``inode``, :meth:`take` given a
        descriptor never hands it out."""
        with self._lock:
            old, _ = self._maps.pop(name, (None, None))
            self._maps[name] = (mapping, inode)
        if old is not mapping:
            close_quietly(old)

    def move(self, old: str, new: str) -> None:
        """The file ``old`` was renamed ``new``: its mapping follows it."""
        with self._lock:
            mapping, inode = self._maps.pop(old, (None, None))
        if mapping is not None:
            self.keep(new, mapping, inode)

    def drop(self, names: Iterable[str]) -> None:
        """The files ``names`` are gone: close their mappings."""
        for name in names:
            close_quietly(self.take(name))

    def clear(self) -> None:
        """Close every mapping."""
        with self._lock:
            maps, self._maps = self._maps, {}
        for mapping, _ in maps.values():
            close_quietly(mapping)

    def __len__(self) -> int:
        return len(self._maps)


#: The most step files a receiver keeps mapped: two a step (main and sidecar), enough for
#: a ring of eight recycled steps. Each mapped page costs 8 bytes of page table.
MAX_WARM_READS = 16
#: How many step files' inodes a receiver remembers to tell that a file came back.
_SEEN = 64


class WarmReads:
    """A receiver's private (copy-on-write) mappings of the step files it read, by
    inode, each with a descriptor of its file, until the file is deleted.

    Mappings are kept only once the receiver has seen a file come back: an inode it
    read under one step's name, again under another's (a recycling sink). Until then
    :meth:`map` keeps nothing, so a directory that does not recycle costs nothing more.
    Pages this process wrote to (a copy-on-write page) are its own and no longer the
    file's: the caller verifies what a kept mapping gives against the file's checksums
    and, on a mismatch, :meth:`forget` s it and maps afresh. Mappings that cannot be
    closed yet (views of them alive) go to ``unmap_later``.

    Example:
        >>> reads = WarmReads(unmap_later=[].append)
        >>> len(reads), reads.recycling
        (0, False)
    """

    def __init__(self, unmap_later: Callable[[mmap.mmap], None]) -> None:
        self._kept: dict[_Key, tuple[int, mmap.mmap]] = {}  # a descriptor and a mapping
        self._names: dict[_Key, str] = {}  # the last _SEEN step files read, by inode
        self._unmap_later = unmap_later
        self._lock = threading.Lock()  # a receiver's reads and its close
        #: Whether a file has come back under another step's name.
        self.recycling = False

    def map(
        self, fd: int, size: int, name: str, *, fresh: bool = False
    ) -> tuple[mmap.mmap, _Key, bool] | None:
        """A copy-on-write mapping of at least ``size`` bytes of the step file ``name``
        open as ``fd``, its key, and whether it was kept from an earlier read; or
        ``None`` before any file came back. ``fresh``: a new mapping, the kept one
        dropped (a read again after a kept one failed the checks). A mapping returned
        takes ``fd`` (closed here or kept); with ``None`` or an error, ``fd`` stays the
        caller's.

        Raises:
            OSError: the file cannot be mapped.
        """
        with self._lock:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            before = self._names.pop(key, None)
            self._names[key] = name
            if len(self._names) > _SEEN:
                del self._names[next(iter(self._names))]
            self.recycling = self.recycling or (before is not None and before != name)
            if not self.recycling:
                return None
            kept = self._kept.get(key)
            if kept is not None and len(kept[1]) >= size and not fresh:
                os.close(fd)
                self._kept[key] = self._kept.pop(key)  # the most recent: evicted last
                return kept[1], key, True
            mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
            self._evict(key)
            self._kept[key] = (fd, mapping)
            while len(self._kept) > MAX_WARM_READS:
                self._evict(next(iter(self._kept)))
            return mapping, key, False

    def forget(self, key: _Key) -> None:
        """Drop the mapping kept under ``key`` (read afresh next time)."""
        with self._lock:
            self._evict(key)

    def evict_deleted(self) -> None:
        """Drop the mappings of files that were deleted: one would keep their memory."""
        with self._lock:
            for key, (fd, _) in list(self._kept.items()):
                if os.fstat(fd).st_nlink == 0:
                    self._evict(key)

    def close(self) -> None:
        """Drop every kept mapping."""
        with self._lock:
            for key in list(self._kept):
                self._evict(key)

    def _evict(self, key: _Key) -> None:
        kept = self._kept.pop(key, None)
        if kept is None:
            return
        fd, mapping = kept
        os.close(fd)
        try:
            mapping.close()
        except BufferError:  # arrays over it are alive: unmapped once they are gone
            self._unmap_later(mapping)

    def __len__(self) -> int:
        return len(self._kept)

    def __del__(self) -> None:
        # A receiver dropped without close(): its descriptors go with it, as its
        # mappings do (an mmap object unmaps itself when collected).
        for fd, _ in self._kept.values():
            with contextlib.suppress(OSError):
                os.close(fd)
