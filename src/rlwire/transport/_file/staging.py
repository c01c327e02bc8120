"""A step of the file sink being written: each rank's files under temporary names
(:class:`~rlwire._core.atomic.AtomicFile`), hashed while written, renamed into place at
commit, sidecar files first and main files last. A sink that recycles hands it pooled
files of pruned steps to write over instead of new files."""

from __future__ import annotations

import concurrent.futures
import errno
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlwire._core.atomic import AtomicFile, fsync_dir
from rlwire._core.errors import StepExistsError, transport_error
from rlwire._core.pools import shared_executor
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire.transport._file.writev import batches, hash_batch, writev_all
from rlwire.transport._stored.layout import Layout
from rlwire.transport._stored.sink import StoredStaging

__all__ = ["SLICE_BYTES", "FileStaging", "envelope"]

#: Bytes written per slice. os.write releases the GIL, so large slices cost the event
#: loop nothing; they only bound how long a cancelled send takes to stop (tens of ms).
SLICE_BYTES = 64 << 20


class FileStaging(StoredStaging):
    """The files of one step, written under temporary names in ``root``.

    ``take(name)``, when given, returns a pooled file to write the file ``name`` into (or
    ``None``): it is moved to the temporary name, written over and cut to size.
    """

    def __init__(
        self, root: Path, fsync: bool, take: Callable[[str], Path | None] | None = None
    ) -> None:
        self.root = root
        self.fsync = fsync
        self.take = take
        self.sidecars: list[AtomicFile] = []
        self.mains: list[AtomicFile] = []

    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        yield from self.write(name, chunks, [-1] * len(chunks), [], main=main)

    def write(
        self,
        name: str,
        chunks: Sequence[bytes | memoryview],
        segments: Sequence[int],
        hashers: Sequence[Any],
        head: Callable[[], bytes] | None = None,
        *,
        main: bool,
    ) -> Sliced[None]:
        """Write ``chunks`` to a temporary file beside ``name``, hashing each chunk of a
        segment into ``hashers[segment]`` as it goes; then write ``head()`` at offset 0.

        Raises:
            TransportError: the file cannot be created or written (nothing is left).
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
                pooled = None
                out.create()
        except OSError as exc:
            raise transport_error(exc, "create a file", where=out.tmp) from exc
        try:
            size = yield from _write_hashed(out.fd, chunks, segments, hashers)
            if head is not None:
                data = head()
                if os.pwrite(out.fd, data, 0) != len(data):
                    raise OSError(errno.EIO, "short write of the envelope")
            if pooled is not None:  # every byte up to size is written: drop the rest
                os.ftruncate(out.fd, size)
            out.close()
        except OSError as exc:
            out.discard()
            raise transport_error(exc, "write", where=out.tmp) from exc
        except BaseException:
            out.discard()
            raise
        (self.mains if main else self.sidecars).append(out)

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
        except OSError as exc:
            self.discard()
            if not ranks:
                for out in moved:  # only this sender's: nothing replaced them
                    out.final.unlink(missing_ok=True)
            if isinstance(exc, FileExistsError):
                raise StepExistsError(
                    "another sender committed this step first (two senders on one "
                    "destination)" + (f"; ranks {ranks} are this sender's" if ranks else ""),
                    where=exc.filename or self.root,
                ) from exc
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
        for out in (*self.mains, *self.sidecars):
            out.discard()


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


def _write_hashed(
    fd: int,
    chunks: Sequence[bytes | memoryview],
    segments: Sequence[int],
    hashers: Sequence[Any],
) -> Sliced[int]:
    """Write ``chunks`` to ``fd`` with ``writev``, hashing each chunk of a segment into
    ``hashers[segment]``; the number of bytes written. The hashing thread has finished
    whenever this returns or raises."""
    hashing: concurrent.futures.Future[None] | None = None
    total = 0
    try:
        written = 0
        slicer = SliceTimer()
        for batch in batches(chunks, segments):
            if hashing is not None:  # segments are hashed in order, a batch at a time
                hashing.result()  # a wait with the GIL let go: not part of the slice
                hashing = None
                slicer.restart()
            if hashers:
                # Another core hashes the batch while this one writes it (xxhash and the
                # write both release the GIL), the hash reading it from cache.
                hashing = shared_executor().submit(hash_batch, hashers, batch)
            # Only the work between writes holds the GIL (many small buffers to hash make
            # it long); the writes themselves leave the event loop free.
            busy = slicer.due()
            n = writev_all(fd, [view for view, _ in batch])
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
        if hashing is not None:  # stopped midway: let the hashing thread finish first
            concurrent.futures.wait([hashing])
