"""Local or shared filesystem sink.

Each step and rank is one main file, ``step-00000042.rank-0000.rlw``, plus, when a
sidecar is asked for, the sidecar file ``step-00000042.rank-0000.sidecar.rlw``. Files are
written under hidden temporary names beside their final names and renamed into place,
sidecar files first and main files last, so a main file's appearance means the whole
message is there. Readers (:class:`~rlwire.transport._file.source.FileSource`) poll with
``open`` calls (on NFS too) and map files with mmap: arrays view the page cache.

With ``recycle``, pruning moves the files of the newest step it retires into a pool
(:data:`~rlwire.transport._stored.names.POOL_RE`, hidden names that readers skip and
that ``open`` removes as leftovers) instead of deleting them, and the next step's files
are written over them: on tmpfs their pages are already allocated, and allocating and
zeroing fresh pages is most of what writing a large step there costs. On tmpfs the sink
also keeps a writable mapping of each file it writes over
(:mod:`~rlwire.transport._file.mapped`), and copies the next step into the pages that
stay mapped.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import xxhash

from rlwire._core.atomic import write_atomic
from rlwire._core.errors import ConfigError, transport_error
from rlwire._core.pools import worker_count
from rlwire._core.slicing import Sliced
from rlwire._frame.checksums import placeholder_checksums
from rlwire._frame.frame import Frame
from rlwire.transport._base import OnExisting, PendingFrame, Staged
from rlwire.transport._file.mapped import WarmMaps, on_tmpfs
from rlwire.transport._file.source import FileSource, open_regular
from rlwire.transport._file.staging import FileStaging, RankFile, envelope
from rlwire.transport._options import SinkOptions, SourceOptions, reject_unknown
from rlwire.transport._parts import PartInfo
from rlwire.transport._stored.layout import Layout, plan
from rlwire.transport._stored.marks import MAX_MARK_BYTES
from rlwire.transport._stored.names import (
    POOL_RE,
    STORED_RE,
    main_name,
    never_replaced,
    part_name,
    part_sidecar_name,
    pool_name,
    sidecar_name,
)
from rlwire.transport._stored.retention import prune_steps
from rlwire.transport._stored.sink import StoredSink, StoredStaging
from rlwire.transport._url import URL, local_directory

__all__ = ["FileSink", "FileSource"]


class FileSink(StoredSink):
    """Writes each step's frames as files in a directory.

    Args:
        path: the directory; created if missing.
        fsync: fsync every file before it is renamed, and the directory after, so a
            committed step survives a power loss (slower).
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
        recycle: write each new step into the files of a step ``keep_last`` pruned
            instead of into new files (the storage option ``"recycle"``). On tmpfs
            (``/dev/shm``) their memory is then already allocated, which makes sending
            and receiving a large step about twice as fast; elsewhere it saves little.
            On tmpfs the sink also keeps a writable mapping of each file it wrote over,
            from one use to the next, and copies large buffers into it: a memcpy into
            pages already mapped, about twice as fast again as ``write`` (the mappings
            hold no memory beyond the files themselves; each goes when its file is
            deleted). Receivers there keep theirs too (:class:`FileSource`).
            Needs ``keep_last``. The pool holds the files of one pruned step at most,
            and only until the next step is written, so a run holds no more than
            without it.

            What a receiver may keep: the arrays of a step stay unchanged while its
            receiver has not moved past the step (asked for a later one: ``receive``,
            ``poll``, ``wait_next``, the next turn of a ``for`` loop). Once every rank
            has moved past it and ``keep_last`` newer steps are stored, the sender
            may write a new step into its files, and arrays still held over them
            change (or, where the new file is shorter, reading them kills the process
            with SIGBUS). Copy what must outlive the next ``receive``
            (``np.array(sample.token_ids)``). A receiver opened with
            ``record_consumed=False`` holds nothing back: it must copy what it keeps
            as soon as it receives it, and a step it reads just as the step is
            recycled fails its checksums or raises SIGBUS; point it at a destination
            that does not recycle. Without ``recycle`` (the default) pruned files are
            deleted and arrays over them stay valid for as long as they are held.
        writers: how many threads may write a step's ranks at once (the storage option
            ``"writers"``), the thread that stages the step included: with more than
            one, each rank of 8 MiB or more is written in a thread of its own while the
            next is written. On tmpfs the kernel's copy into the files is the cost, and
            it runs on every core given it. ``None`` (default): the cores less one,
            left to the event loop (1 on 2 cores, where a second writer held the loop
            2-4 ms longer). 1: one rank after another.

    Raises:
        ConfigError: ``recycle`` without ``keep_last`` (when the sender is opened);
            ``writers`` not a whole number of at least 1.

    Example:
        >>> import rlwire, tempfile
        >>> run = tempfile.mkdtemp()  # on tmpfs, e.g. under /dev/shm, for the speed
        >>> sender = rlwire.open_sender(run, storage_options={"recycle": True}, keep_last=2)
        >>> rlwire.open_sender(run, storage_options={"recycle": True})
        Traceback (most recent call last):
        ...
        rlwire.errors.ConfigError: ...: the storage option 'recycle' reuses the files of ...
    """

    gathers = True  # write_message writes the layout's chunks, runs of Pieces included
    heads_cheap = True  # resume reads each step's ranks: a file's first bytes

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        checksum: bool = True,
        recycle: bool = False,
        writers: int | None = None,
    ) -> None:
        self.root = Path(path)
        self.fsync = fsync
        self.checksum = checksum
        self.recycle = recycle
        self.writers = worker_count(spare=1) if writers is None else writers
        if type(self.writers) is not int or self.writers < 1:
            raise ConfigError(
                f"the storage option 'writers' must be a whole number of at least 1, "
                f"got {writers!r}",
                where=self.root,
            )
        # The pooled files by what they held ("rank-0000.rlw", "rank-0000.sidecar.rlw").
        self._pool: dict[str, list[Path]] = {}
        self._pool_lock = threading.Lock()
        # The mappings of the files written over, on tmpfs (set when the sink opens).
        self._warm: WarmMaps | None = None

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> FileSink:
        reject_unknown(url, options.storage_options, ("recycle", "writers"))
        recycle = options.storage_options.get("recycle", False)
        if not isinstance(recycle, bool):
            raise ConfigError(
                f"the storage option 'recycle' must be True or False, got {recycle!r}",
                where=url.text,
            )
        return cls(
            local_directory(url),
            fsync=options.fsync,
            checksum=options.checksum,
            recycle=recycle,
            writers=options.storage_options.get("writers"),
        )

    def check_retention(self, keep_last: int | None, max_ahead: int | None) -> None:
        if self.recycle and keep_last is None:
            raise ConfigError(
                "the storage option 'recycle' reuses the files of steps keep_last deletes, "
                "and without keep_last none are: open the sender with keep_last=N too",
                where=self.root,
            )

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> FileSource:
        reject_unknown(url, options.storage_options, ("watch",))
        watch = options.storage_options.get("watch", True)
        if not isinstance(watch, bool):
            raise ConfigError(
                f"the storage option 'watch' must be True or False, got {watch!r}",
                where=url.text,
            )
        return FileSource(
            local_directory(url),
            rank=options.rank,
            writable=options.writable,
            verify=options.verify,
            poll_interval=options.poll_interval,
            watch=watch,
        )

    def __repr__(self) -> str:
        return f"FileSink({str(self.root)!r})"

    def locate(self, name: str | None = None) -> str:
        return str(self.root if name is None else self.root / name)

    def prepare(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".rlwire-probe.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink(missing_ok=True)  # a producer opening meanwhile cleans it up
        except OSError as exc:
            raise transport_error(
                exc, "write to the destination directory", where=self.root
            ) from exc
        if self.recycle and self._warm is None and on_tmpfs(self.root):
            self._warm = WarmMaps()

    def names(self) -> list[str]:
        try:
            with os.scandir(self.root) as entries:
                return [e.name for e in entries]
        except FileNotFoundError:
            return []

    def load(self, name: str) -> bytes | None:
        return self.load_head(name, MAX_MARK_BYTES)

    def load_head(self, name: str, size: int) -> bytes | None:
        fd = open_regular(self.root / name)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as file:
            return file.read(size)

    def size_of(self, name: str) -> int | None:
        try:
            return os.stat(self.root / name).st_size
        except OSError:
            return None

    def save(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data, fsync=self.fsync, replace=not never_replaced(name))

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)
        if self._warm is not None:
            self._warm.drop(names)

    def close(self) -> None:
        self._empty_pool()
        if self._warm is not None:
            self._warm.clear()

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        """Stage ``step`` as :class:`StoredSink` does, then delete what the pool still
        holds (the files of ranks this step has not: it went to fewer ranks)."""
        staged = yield from super().stage(step, frames)
        self._empty_pool()
        return staged

    def _empty_pool(self) -> None:
        """Delete the pooled files no write took (quietly: they are leftovers, which
        the next ``open`` removes anyway)."""
        with self._pool_lock:
            files = [path for paths in self._pool.values() for path in paths]
            self._pool.clear()
        with contextlib.suppress(OSError):
            self.remove([path.name for path in files])

    def existing(self, names: Sequence[str]) -> list[int]:
        return [i for i, name in enumerate(names) if (self.root / name).exists()]

    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        with self._pool_lock:  # files pooled before are leftovers now, removed or not
            self._pool.clear()
        if self._warm is not None:
            self._warm.clear()
        return super().open(on_existing, start_step)

    def prune(self, below: int) -> int:
        """Delete the stored steps before ``below`` as :class:`StoredSink` does
        (:func:`~rlwire.transport._stored.retention.prune_steps`: every step's main
        files, then the marks read again, then the sidecars they still let go), except,
        with ``recycle``, the newest of them: its files are moved into the pool instead,
        replacing what the pool held. A trainer restarted at a pruned step lowers its
        mark before it opens the step's files: if the marks read again hold one, the
        pooled main files are deleted, never written into, and the sidecars stay."""
        if not self.recycle:
            return super().prune(below)

        def check(below: int) -> None:
            self.fence.check(f"delete the steps before step {below}")
            with self._pool_lock:  # the pool never holds more than one step's files
                self._pool.clear()
            self.remove([n for n in names if POOL_RE.fullmatch(n)])

        with self.errors("delete steps every rank consumed"):
            names = self.names()  # no step some rank holding files of it may still read
            read, sealed = self.read_consumption, self.sealed_for
            kept = prune_steps(names, below, read, sealed, self.remove, check, self._pool_files)
            if kept < below:
                self._empty_pool()
        return kept

    def _pool_files(self, names: list[str]) -> None:
        """Move the step files ``names`` into the pool (a part's files are never written
        into again, nor a seal or appended fields: deleted)."""
        self.remove([n for n in names if not STORED_RE.fullmatch(n)])
        for name in filter(STORED_RE.fullmatch, names):
            pooled = self.root / pool_name(name)
            try:
                os.rename(self.root / name, pooled)
            except FileNotFoundError:
                continue
            if self._warm is not None:
                self._warm.move(name, pooled.name)
            with self._pool_lock:
                self._pool.setdefault(_kind(name), []).append(pooled)

    def _take(self, name: str) -> Path | None:
        """A pooled file to write the file ``name`` into: one that held the same rank's
        file of its kind if there is one, else any."""
        with self._pool_lock:
            same = self._pool.get(_kind(name))
            if same:
                return same.pop()
            for files in self._pool.values():
                if files:
                    return files.pop()
        return None

    def staging(self, step: int) -> FileStaging:
        return FileStaging(
            self.root, self.fsync, self._take if self.recycle else None, self.writers, self._warm
        )

    def write_message(
        self, staging: StoredStaging, step: int, rank: int, frame: Frame
    ) -> Sliced[None]:
        """Write the files while hashing them: the envelope is planned with placeholder
        checksums and written last, at offset 0, with the real ones."""
        names = (main_name(step, rank), sidecar_name(step, rank))
        planner = _plan_with(step, rank, None, staging.ranks)
        yield from self._write_hashed(staging, frame, planner, names, beside=True)

    def write_part(
        self, staging: StoredStaging, step: int, part: PartInfo, frame: Frame
    ) -> Sliced[None]:
        """Write a part's files as :meth:`write_message` writes a message's."""
        names = (
            part_name(step, part.rank, part.index),
            part_sidecar_name(step, part.rank, part.index),
        )
        yield from self._write_hashed(
            staging, frame, _plan_with(step, part.rank, part), names, beside=False
        )

    def _write_hashed(
        self,
        staging: StoredStaging,
        frame: Frame,
        planner: Callable[[Frame, bytes | None], Layout],
        names: tuple[str, str],
        *,
        beside: bool,
    ) -> Sliced[None]:
        """Write a message's files, the sidecar first: in a thread of their own if
        ``beside`` and :meth:`FileStaging.write_rank` finds one free (a whole step's
        ranks, not a part, which nothing would overlap)."""
        assert isinstance(staging, FileStaging)
        layout = planner(frame, placeholder_checksums(frame) if self.checksum else None)
        hashers = [xxhash.xxh3_64() for _ in range(len(frame.buffers) + 1)] if self.checksum else []
        head = envelope(layout, hashers) if self.checksum else None  # called once hashed
        files: list[RankFile] = []
        env = layout.envelope
        if layout.sidecar:
            side = -1 if env.sidecar_size is None else env.sidecar_size
            files.append((names[1], layout.sidecar, layout.sidecar_segments, None, False, side))
        files.append((names[0], layout.main, layout.main_segments, head, True, env.size))
        yield from staging.write_rank(files, hashers, frame.nbytes, beside=beside)


def _plan_with(
    step: int, rank: int, part: PartInfo | None, ranks: int | None = None
) -> Callable[[Frame, bytes | None], Layout]:
    """What lays a frame out for ``step`` and ``rank`` (as ``part``, if given; else a
    whole step's message, of a step sent to ``ranks`` ranks), given its checksums."""
    return lambda frame, sums: plan(frame, step, rank, sums, part=part, ranks=ranks)


def _kind(name: str) -> str:
    """What a step's file holds apart from its step: ``rank-0001.sidecar.rlw`` for
    ``step-00000007.rank-0001.sidecar.rlw``; the pool's key."""
    return name[name.index(".") + 1 :]
