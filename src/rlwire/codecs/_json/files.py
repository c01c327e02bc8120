"""The files JSON lines go to and come from: a path or a binary file object, and the
output made visible only when it is complete (a temporary file renamed into place)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Protocol, TypeAlias

from rlwire._core.atomic import AtomicFile
from rlwire._core.errors import ConfigError, transport_error

__all__ = [
    "BinaryReader",
    "BinaryWriter",
    "JsonlDestination",
    "JsonlSource",
    "OutputFile",
    "check_binary",
    "name_of",
]


class BinaryWriter(Protocol):
    """A binary file object open for writing."""

    def write(self, data: bytes, /) -> int | None: ...


class BinaryReader(Protocol):
    """A binary file object open for reading."""

    def read(self, size: int = -1, /) -> bytes: ...


#: What :func:`dump_jsonl` writes to: a path or a binary file object.
JsonlDestination: TypeAlias = "str | os.PathLike[str] | BinaryWriter"
#: What :func:`load_jsonl` reads from: a path or a binary file object.
JsonlSource: TypeAlias = "str | os.PathLike[str] | BinaryReader"


def check_binary(file: object, method: str, caller: str) -> None:
    """Refuse text file objects and anything without ``method`` (``read`` or ``write``)."""
    if isinstance(file, io.TextIOBase) or not callable(getattr(file, method, None)):
        raise ConfigError(f"{caller} needs a path or a binary file object, got {file!r}")


def name_of(fileobj: object) -> object:
    """What errors call a file object: its ``name``, else ``<its type>``."""
    return getattr(fileobj, "name", None) or f"<{type(fileobj).__name__}>"


class OutputFile:
    """The file JSON lines are written to, made visible by :meth:`commit`: for a path, a
    temporary file beside it that is renamed into place (so a reader never sees part of
    it); for ``append=True``, the file itself, opened for appending; otherwise the
    caller's binary file object, written at its position and never closed.

    Raises ``TransportError`` for OSErrors and ``ConfigError`` for a bad ``file``.
    """

    def __init__(self, file: JsonlDestination, append: bool) -> None:
        self.fd = -1
        self.atomic: AtomicFile | None = None
        self.path: Path | None = None
        self.fileobj: BinaryWriter | None = None
        if isinstance(file, str | os.PathLike):
            self.path = Path(os.fspath(file))
            target = self.path
            try:
                if append:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                    self.fd = os.open(target, flags, 0o644)
                else:
                    self.atomic = AtomicFile(self.path)
                    target = self.atomic.tmp
                    self.fd = self.atomic.create().fd
            except OSError as exc:
                raise transport_error(exc, "create a file", where=target) from exc
            return
        if append:
            raise ConfigError(
                "append=True applies to paths; a file object is written at its position"
            )
        check_binary(file, "write", "dump_jsonl")
        self.fileobj = file

    @property
    def name(self) -> object:
        """What errors call the destination: its path, or the file object's name."""
        return self.path if self.path is not None else name_of(self.fileobj)

    def write(self, data: bytes | bytearray) -> None:
        """Write all of ``data``."""
        view = memoryview(data)
        try:
            while view:
                if self.fileobj is not None:
                    n = self.fileobj.write(view)  # type: ignore[arg-type]
                    if n is None:  # buffered streams write everything or raise
                        break
                    if n <= 0:
                        raise OSError(f"write() wrote {n} bytes")
                else:
                    n = os.write(self.fd, view)
                view = view[n:]
        except OSError as exc:
            where = self.atomic.tmp if self.atomic is not None else self.name
            raise transport_error(exc, "write", where=where) from exc
        finally:
            view.release()

    def commit(self) -> None:
        """Close the file (or flush the file object) and rename it into place."""
        try:
            if self.fileobj is not None:
                flush = getattr(self.fileobj, "flush", None)
                if flush is not None:
                    flush()
                return
            if self.atomic is not None:
                self.fd = -1  # the atomic file closes it
                self.atomic.rename()
                self.atomic = None
            else:
                os.close(self.fd)
                self.fd = -1
        except OSError as exc:
            self.abort()
            raise transport_error(exc, "write", where=self.name) from exc

    def abort(self) -> None:
        """Close the file and remove the temporary file, if any; safe to call twice."""
        if self.atomic is not None:
            self.fd = -1
            self.atomic.discard()
            self.atomic = None
        elif self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
