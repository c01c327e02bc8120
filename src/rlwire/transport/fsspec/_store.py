"""The strategy the fsspec sink and source call instead of asking "is this S3?".

A :class:`Store` is a ready fsspec filesystem together with how rlwire finds, stages and
reads its objects there. The connection (``_connection``) chooses one, once, when it
makes the filesystem: ``S3Store`` (``_s3``) for S3 through s3fs, with streamed multipart
uploads and ranged reads, and ``GenericStore`` (``_generic``) for every other
filesystem, with hidden temporary keys moved into place.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

from rlwire._core.slicing import Sliced, run_sliced
from rlwire.transport._stored.names import LEFTOVER_RE
from rlwire.transport._stored.selected import Ranged, WholeFile
from rlwire.transport._stored.sink import StoredStaging

__all__ = ["Staging", "Store"]

#: Part size for :meth:`Store.save`'s marks (a few bytes: a single PUT).
_SMALL_PART_BYTES = 5 << 20
#: Listings of the root before a failure stands (see :meth:`Store.names`).
_LIST_ATTEMPTS = 5


class Staging(StoredStaging):
    """A step being written where readers cannot see it yet, one object at a time: each
    rank's sidecar object (if it has one), then its main object, named as files are and
    put directly under the store's root.

    :meth:`commit` makes the objects visible, sidecar objects first and main objects
    last; :meth:`discard` removes everything staged, including what is still in flight.
    """


class Store(abc.ABC):
    """A ready filesystem, where under it the messages live, and how to reach them.

    Blocking methods run in worker threads and raise whatever the backend raises
    (``FileNotFoundError`` aside where said); callers turn that into a TransportError
    naming the URL.

    Args:
        fs: the fsspec filesystem.
        url: the URL as users wrote it, for messages.
        root: the filesystem path of the directory or key prefix, without a trailing
            ``/``.
    """

    #: The verb naming what :meth:`staging` does, in error messages.
    stage_verb: ClassVar[str] = "write"

    def __init__(self, fs: Any, url: str, root: str) -> None:
        self.fs = fs
        self.url = url
        self.root = root

    def path(self, name: str) -> str:
        """The filesystem path of the object ``name`` directly under the root."""
        return f"{self.root}/{name}"

    def check(self) -> None:  # noqa: B027 - optional hook
        """Make sure the destination can be reached; called once, by the connection.

        Raises:
            ConfigError: the filesystem rejects its options.
            TransportError: the destination does not exist or cannot be reached.
        """

    def names_an_object(self) -> bool:
        """Whether the root is itself an object (a file), not a directory or prefix: a
        URL that names one by mistake (``memory://run/notes.txt``). False when the
        store cannot say (the request fails): the destination's own requests will."""
        try:
            return bool(self.fs.isfile(self.root))
        except Exception:
            return False

    def names(self) -> list[str]:
        """Names directly under the root, fresh from the store (not fsspec's listing
        cache); none if the root does not exist."""
        self.fs.invalidate_cache(self.root)
        for attempt in range(_LIST_ATTEMPTS):
            try:
                paths = self.list_root()
                break
            except FileNotFoundError:
                return []
            except KeyError:
                # fsspec's memory filesystem lists its keys, then reads each one's
                # size: an object another thread deletes in between raises KeyError.
                # Listing again no longer sees it.
                if attempt == _LIST_ATTEMPTS - 1:
                    raise
        return [str(p).rstrip("/").rpartition("/")[2] for p in paths]

    def list_root(self) -> list[str]:
        """The paths directly under the root (FileNotFoundError: there is no root)."""
        return list(self.fs.ls(self.root, detail=False))

    def remove(self, names: Sequence[str]) -> None:
        """Delete the objects ``names`` directly under the root."""
        if names:
            self.fs.rm([self.path(n) for n in names])
            self.fs.invalidate_cache(self.root)

    def save(self, name: str, data: bytes) -> None:
        """Write the small object ``name`` directly under the root so that it appears
        whole (staged like a main object: one PUT, or a move into place)."""
        staging = self.staging(part_bytes=_SMALL_PART_BYTES, max_concurrency=1)
        try:
            run_sliced(staging.add(name, [data], main=True))
            run_sliced(staging.drain())
            staging.commit()
        except BaseException:
            staging.discard()
            raise

    def head(self, path: str, limit: int) -> bytes | None:
        """At most the first ``limit`` bytes of the object at ``path`` (one ranged read),
        or None if it does not exist: how a sink reads a mark, whose size it does not
        trust."""
        try:
            data: bytes = self.fs.cat_file(path, start=0, end=limit)
        except FileNotFoundError:
            return None
        return data

    def size(self, path: str) -> int | None:
        """The size of the object at ``path`` (None: not known, or gone)."""
        try:
            return int(self.fs.size(path))
        except (FileNotFoundError, TypeError):
            return None

    def heads(self, paths: Sequence[str], limit: int) -> list[bytes | Exception | None]:
        """:meth:`head` of each of ``paths``, the error a read raised in its place: one
        ranged read each, concurrent on an async filesystem (fsspec's ``cat_ranges``)."""
        got = self.fs.cat_ranges(list(paths), 0, limit, on_error="return")
        return [None if isinstance(g, FileNotFoundError) else g for g in got]

    def clean_leftovers(self, names: Sequence[str]) -> None:
        """Remove what a killed sender left behind, invisible to readers: the temporary
        keys among ``names`` (the root's listing)."""
        self.remove([n for n in names if LEFTOVER_RE.fullmatch(n)])

    def settle_leftovers(self) -> str | None:
        """Called when the sink closes: remove what failed sends may have left behind,
        invisible to readers (S3's unfinished multipart uploads). Never raises.

        Returns:
            None, or what is left behind and why.
        """
        return None

    @abc.abstractmethod
    def existing(self, paths: Sequence[str]) -> list[int]:
        """Indices of ``paths`` that exist."""

    def existing_in_slices(self, paths: Sequence[str]) -> Sliced[list[int]]:
        """:meth:`existing` as a sliced generator; by default one call."""
        yield from ()
        return self.existing(paths)

    @abc.abstractmethod
    def staging(self, *, part_bytes: int, max_concurrency: int | None) -> Staging:
        """A new, empty :class:`Staging` for one step. ``part_bytes`` and
        ``max_concurrency`` are the sink's multipart options, for stores that use them.
        """

    def ranged(self, path: str, size: int | None = None) -> Ranged | None:
        """The object at ``path`` to read by byte ranges (a partial read), or ``None``
        if it does not exist; by default, :meth:`get` whole (a sidecar's ``size`` passed
        on, to refuse one of another size unread).

        Raises:
            CorruptFrameError: as :meth:`get`.
        """
        data = self.get(path, size)
        return None if data is None else WholeFile(memoryview(data).toreadonly())

    @abc.abstractmethod
    def get(self, path: str, size: int | None = None) -> bytes | bytearray | None:
        """The whole object at ``path``, or None if it does not exist; a sidecar whose
        ``size`` its main object's envelope says, which a store that learns the size
        first (S3) refuses unread when it is another.

        Raises:
            CorruptFrameError: the object cannot be read as a whole (empty, short), or
                is not ``size`` bytes long.
        """
