"""The one atomic file writer, shared by the file sink (messages and marks) and JSON
lines: a file is written under a fresh hidden name beside its final one,
``.<name>.<random hex>.tmp``, optionally fsynced, and renamed into place only when
complete, so that no reader ever sees part of it. On any failure or cancellation the
temporary file is removed. Object stores, which have no rename, use :func:`temp_name`
alone."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["AtomicFile", "fsync_dir", "temp_name", "write_atomic"]


def temp_name(name: str) -> str:
    """A fresh temporary name to write the file or object called ``name`` under.

    Example:
        >>> temp_name("step-00000007.rank-0000.rlw").endswith(".tmp")
        True
    """
    return f".{name}.{os.urandom(6).hex()}.tmp"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the directory ``path``, so that renames in it survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under ``tmp`` (a :func:`temp_name` beside ``final``) and
    renamed into place by :meth:`commit`.

    :meth:`create` (or entering the ``with`` block) makes the temporary file; write
    through :meth:`write` or the descriptor ``fd``. Leaving the ``with`` block by an
    exception (a cancelled sliced generator too) calls :meth:`discard`; leaving it
    normally keeps the temporary file for a later :meth:`rename` or :meth:`commit`,
    which lets a caller move several files into place together. Methods raise the
    ``OSError`` of the failing call; callers say what failed where.

    Args:
        final: the path the file gets once complete.
        fsync: fsync the file before it is renamed and the directory after.
        mode: permission bits of the new file (before the umask).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as root:
        ...     with AtomicFile(Path(root) / "out.txt") as out:
        ...         out.write(b"whole")
        ...         out.commit()
        ...     (Path(root) / "out.txt").read_bytes(), os.listdir(root)
        (b'whole', ['out.txt'])
    """

    def __init__(
        self, final: str | os.PathLike[str], *, fsync: bool = False, mode: int = 0o644
    ) -> None:
        self.final = Path(final)
        self.tmp = self.final.with_name(temp_name(self.final.name))
        self.fsync = fsync
        self.mode = mode
        #: The temporary file's descriptor while it is open, else -1.
        self.fd = -1

    def create(self) -> AtomicFile:
        """Create the temporary file (never an existing one) and open it for writing."""
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.mode)
        return self

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` at the current position."""
        with memoryview(data) as whole:
            view = whole.cast("B") if whole.ndim != 1 or whole.format != "B" else whole
            while view:
                view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        """fsync (if asked) and close the temporary file; it stays where it is."""
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self) -> None:
        """:meth:`close`, then move the file into place (the directory is not synced)."""
        self.close()
        os.replace(self.tmp, self.final)

    def commit(self) -> None:
        """:meth:`rename`, then fsync the directory if asked."""
        self.rename()
        if self.fsync:
            fsync_dir(self.final.parent)

    def discard(self) -> None:
        """Close and remove the temporary file; safe to call twice, and after a commit."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicFile:
        return self.create()

    def __exit__(self, exc_type: type[BaseException] | None, *details: object) -> None:
        if exc_type is not None:
            self.discard()


def write_atomic(
    final: str | os.PathLike[str], data: bytes, *, fsync: bool = False, mode: int = 0o666
) -> None:
    """Write ``data`` to ``final`` so that it appears whole, replacing any file there.

    Raises:
        OSError: the file cannot be written or renamed; nothing is left behind.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as root:
        ...     write_atomic(Path(root) / "mark", b"7")
        ...     (Path(root) / "mark").read_bytes()
        b'7'
    """
    with AtomicFile(final, fsync=fsync, mode=mode) as out:
        out.write(data)
        out.commit()
