"""Local or shared filesystem sink.

Each step and rank is one main file, ``step-00000042.rank-0000.rlw``, plus, when a
sidecar is asked for, the sidecar file ``step-00000042.rank-0000.sidecar.rlw``. Files are
written under hidden temporary names beside their final names and renamed into place,
sidecar files first and main files last, so a main file's appearance means the whole
message is there. Readers (:class:`~rlwire.transport._file.source.FileSource`) poll with
``stat``-free ``open`` calls (works on NFS, where inotify does not) and map files with
mmap, so arrays are views over the page cache.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote

import xxhash

from rlwire._core.atomic import write_atomic
from rlwire._core.errors import ConfigError, transport_error
from rlwire._core.slicing import Sliced
from rlwire._frame.checksums import placeholder_checksums
from rlwire._frame.frame import Frame
from rlwire.transport._base import SinkOptions, SourceOptions, reject_unknown
from rlwire.transport._file.source import FileSource, open_regular
from rlwire.transport._file.staging import FileStaging, envelope
from rlwire.transport._stored.layout import plan
from rlwire.transport._stored.marks import MAX_MARK_BYTES
from rlwire.transport._stored.names import main_name, sidecar_name
from rlwire.transport._stored.sink import StoredSink, StoredStaging
from rlwire.transport._url import URL

__all__ = ["FileSink", "FileSource", "local_path"]


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


class FileSink(StoredSink):
    """Writes each step's frames as files in a directory.

    Args:
        path: the directory; created if missing.
        fsync: fsync every file before it is renamed, and the directory after, so a
            committed step survives a power loss (slower).
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
    """

    gathers = True  # write_message writes the layout's chunks, runs of Pieces included

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

    def locate(self, name: str | None = None) -> str:
        return str(self.root if name is None else self.root / name)

    def prepare(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".rlwire-probe.{os.getpid()}.{os.urandom(4).hex()}.tmp"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as exc:
            raise transport_error(
                exc, "write to the destination directory", where=self.root
            ) from exc

    def names(self) -> list[str]:
        try:
            with os.scandir(self.root) as entries:
                return [e.name for e in entries]
        except FileNotFoundError:
            return []

    def load(self, name: str) -> bytes | None:
        fd = open_regular(self.root / name)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as file:
            return file.read(MAX_MARK_BYTES)

    def save(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data, fsync=self.fsync)

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)

    def existing(self, names: Sequence[str]) -> list[int]:
        return [i for i, name in enumerate(names) if (self.root / name).exists()]

    def staging(self, step: int) -> FileStaging:
        return FileStaging(self.root, self.fsync)

    def write_message(
        self, staging: StoredStaging, step: int, rank: int, frame: Frame
    ) -> Sliced[None]:
        """Write the files while hashing them: the envelope is planned with placeholder
        checksums and written last, at offset 0, with the real ones."""
        assert isinstance(staging, FileStaging)
        sums = placeholder_checksums(frame) if self.checksum else None
        layout = plan(frame, step, rank, sums)
        hashers = [xxhash.xxh3_64() for _ in range(len(frame.buffers) + 1)] if self.checksum else []
        if layout.sidecar:
            yield from staging.write(
                sidecar_name(step, rank),
                layout.sidecar,
                layout.sidecar_segments,
                hashers,
                main=False,
            )
        head = envelope(layout, hashers) if self.checksum else None
        yield from staging.write(
            main_name(step, rank), layout.main, layout.main_segments, hashers, head, main=True
        )
