"""The one atomic file writer, shared by the file sink (messages and marks) and JSON
lines: a file is written under a fresh hidden name beside its final one,
``.<name>.<random hex>.tmp``, optionally fsynced, and renamed into place only when
complete, so that no reader ever sees part of it. On any failure or cancellation the
temporary file is removed. Object stores, which have no rename, use :func:`temp_name`
alone.

A file that must never replace another (a step's files: two senders on one directory
must not both succeed) is moved into place by :func:`move_no_replace`: ``os.link`` of
the temporary file to the final name, then ``os.unlink`` of the temporary name. A hard
link fails with ``EEXIST`` when the name is taken, atomically, on every POSIX local
filesystem and on NFS (where ``O_EXCL`` and ``RENAME_NOREPLACE`` were long unreliable
or missing); being plain ``os`` calls, it is also what the kill campaigns can
interrupt. Filesystems without hard links (FAT, some FUSE and SMB mounts) fall back to
Linux's ``renameat2(RENAME_NOREPLACE)`` through ctypes, and where that is missing too, to
a check then a rename, which two writers can still race: the one limit left."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

__all__ = ["AtomicFile", "fsync_dir", "move_no_replace", "temp_name", "write_atomic"]


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

    def reuse(self, old: str | os.PathLike[str]) -> AtomicFile:
        """Take the existing file ``old`` as the temporary file instead of creating one:
        move it to ``tmp`` and open it for reading and writing (so that it can be mapped)
        without truncating it, so that writing over it lands in the pages it already
        has. The caller writes every byte the file will hold and then cuts it to size
        (``os.ftruncate(fd, size)``).

        Raises:
            FileNotFoundError: ``old`` is gone; nothing changed.
        """
        os.rename(old, self.tmp)
        try:
            self.fd = os.open(self.tmp, os.O_RDWR)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise
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

    def rename(self, *, replace: bool = True) -> None:
        """:meth:`close`, then move the file into place (the directory is not synced).
        With ``replace=False`` a file already at the final name stays and
        ``FileExistsError`` is raised (:func:`move_no_replace`); the temporary file stays
        too, for :meth:`discard`."""
        self.close()
        if replace:
            os.replace(self.tmp, self.final)
        else:
            move_no_replace(self.tmp, self.final)

    def commit(self, *, replace: bool = True) -> None:
        """:meth:`rename` (``replace`` as there), then fsync the directory if asked."""
        self.rename(replace=replace)
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


#: errno values of a filesystem that cannot make hard links.
_NO_LINKS = frozenset(
    e for e in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS) if e is not None
)
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _renameat2(src: Path, dst: Path) -> bool:
    """``renameat2(src, dst, RENAME_NOREPLACE)``; False where the C library or the
    filesystem lacks it. Raises ``FileExistsError`` when ``dst`` exists."""
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, *_NO_LINKS):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def move_no_replace(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Move the file ``tmp`` to ``final`` unless something is there already (see the
    module docstring for how). After a kill, a link of ``final`` may remain at ``tmp``.

    Raises:
        FileExistsError: ``final`` exists; ``tmp`` is left where it is.
        OSError: the move failed otherwise.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as root:
        ...     for name, data in (("a", b"1"), ("b", b"2"), ("c", b"3")):
        ...         _ = (Path(root) / name).write_bytes(data)
        ...     move_no_replace(Path(root) / "a", Path(root) / "final")
        ...     try:
        ...         move_no_replace(Path(root) / "b", Path(root) / "final")
        ...     except FileExistsError:
        ...         print("taken")
        ...     (Path(root) / "final").read_bytes(), sorted(os.listdir(root))
        taken
        (b'1', ['b', 'c', 'final'])
    """
    tmp, final = Path(tmp), Path(final)
    try:
        os.link(tmp, final)
    except OSError as exc:
        if exc.errno not in _NO_LINKS or isinstance(exc, FileExistsError):
            raise
        if _renameat2(tmp, final):
            return
        if os.path.lexists(final):  # the last resort; two writers can race here
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final)) from exc
        os.rename(tmp, final)
        return
    os.unlink(tmp)


def write_atomic(
    final: str | os.PathLike[str],
    data: bytes,
    *,
    fsync: bool = False,
    mode: int = 0o666,
    replace: bool = True,
) -> None:
    """Write ``data`` to ``final`` so that it appears whole, replacing any file there
    (with ``replace=False``, none: :func:`move_no_replace`).

    Raises:
        FileExistsError: ``replace`` is False and ``final`` exists; nothing is left.
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
        out.commit(replace=replace)
