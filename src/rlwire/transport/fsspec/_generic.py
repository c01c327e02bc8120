"""Every fsspec filesystem but S3 (``memory://``, ``gs://``, ...): each object is written
under a hidden temporary key beside its final one and moved into place at commit.

Temporary keys (``.<name>.<hex>.tmp``, as the file sink's) never match the names
readers look for, so a step is invisible until its main objects are moved; a killed
sender's temporary keys are removed by the next ``on_existing="resume"`` or
``"overwrite"``.

Limit: fsspec's move replaces what is at the final key, and fsspec offers no move that
refuses to; two senders on one destination are told apart only by the check before the
step is written (:meth:`~rlwire.transport._stored.sink.StoredSink.stage`), so both can
succeed for a step they commit at the same moment. Use one sender per destination, or
the file sink, whose commit never replaces a file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NoReturn

from rlwire._core.errors import CorruptFrameError, transport_error
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire.transport._stored.names import temp_name
from rlwire.transport.fsspec._store import Staging, Store

__all__ = ["GenericStore", "TempStaging"]

#: Bytes handed to a generic fsspec file per write call.
_WRITE_BYTES = 8 << 20


class GenericStore(Store):
    """Any fsspec filesystem, through its synchronous API: temporary keys moved into
    place, whole-object reads."""

    def existing(self, paths: Sequence[str]) -> list[int]:
        self.fs.invalidate_cache(self.root)
        return [i for i, p in enumerate(paths) if self.fs.exists(p)]

    def staging(self, *, part_bytes: int, max_concurrency: int | None) -> TempStaging:
        return TempStaging(self)

    def get(self, path: str, size: int | None = None) -> bytes | None:
        if size is not None:  # a sidecar: its size asked first, as S3's first GET learns it
            found = self.size(path)  # None: gone (cat_file says so), or not told
            if found is not None and found != size:
                raise CorruptFrameError(
                    f"sidecar truncated or extended: expected {size} bytes, the object is "
                    f"{found}; not read",
                    where=f"{self.url}/{path.rpartition('/')[2]}",
                )
        try:
            data: bytes = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return data


class TempStaging(Staging):
    """Objects written under hidden temporary keys, moved into place at commit."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sidecars: list[tuple[str, str]] = []  # (temporary, final)
        self.mains: list[tuple[str, str]] = []

    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        path, tmp = self.store.path(name), self.store.path(temp_name(name))
        (self.mains if main else self.sidecars).append((tmp, path))  # discard() removes it
        f = self.store.fs.open(tmp, "wb")
        try:
            timer = SliceTimer()
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                for start in range(0, view.nbytes, _WRITE_BYTES):
                    f.write(view[start : start + _WRITE_BYTES])
                    if timer.due():
                        yield
                        timer.restart()
        except BaseException:
            # Do not let close() publish a partial temporary object if it can be avoided.
            with contextlib.suppress(Exception):
                (f.discard if hasattr(f, "discard") else f.close)()
            raise
        f.close()

    def commit(self) -> None:
        fs, url = self.store.fs, self.store.url
        moved: list[str] = []
        try:
            for tmp, final in self.sidecars:
                fs.mv(tmp, final)
                moved.append(final)
        except Exception as exc:
            self.discard()
            _remove(fs, moved)
            raise transport_error(
                exc, "commit the step (nothing was made visible)", where=url
            ) from exc
        finally:
            fs.invalidate_cache(self.store.root)
        ranks: list[int] = []
        for rank, (tmp, final) in enumerate(self.mains):
            try:
                fs.mv(tmp, final)
            except Exception as exc:
                # A move that failed may still have happened (a lost reply): ask. A step
                # is never guessed visible or not: the sender must neither reuse its
                # number nor skip it.
                landed = _exists(fs, self.store.root, final)
                if not landed:
                    self._failed(exc, ranks, unknown=landed is None)
            ranks.append(rank)
            self.visible = True
        fs.invalidate_cache(self.store.root)

    def _failed(self, exc: Exception, ranks: list[int], *, unknown: bool) -> NoReturn:
        fs, url = self.store.fs, self.store.url
        self.visible = True if ranks else None if unknown else False
        self.discard()
        if self.visible:
            unsure = "; whether the next one is too is unknown" if unknown else ""
            raise transport_error(
                exc, f"commit the step in full (visible for ranks {ranks} only{unsure})", where=url
            ) from exc
        if self.visible is None:
            # Sidecars stay: deleting them could tear a step that did become visible.
            raise transport_error(
                exc,
                "commit the step, and whether it became visible is unknown (the store could "
                "not be asked); a sender opened with on_existing='resume' settles it",
                where=url,
            ) from exc
        _remove(fs, [final for _, final in self.sidecars])
        raise transport_error(exc, "commit the step (nothing was made visible)", where=url) from exc

    def discard(self) -> None:
        _remove(self.store.fs, [tmp for tmp, _ in (*self.mains, *self.sidecars)])


def _exists(fs: Any, root: str, path: str) -> bool | None:
    """Whether ``path`` exists; None if the store cannot be asked."""
    try:
        fs.invalidate_cache(root)
        return bool(fs.exists(path))
    except Exception:
        return None


def _remove(fs: Any, paths: Sequence[str]) -> None:
    """Delete ``paths``, best effort: missing ones and failures are ignored."""
    for path in paths:
        with contextlib.suppress(Exception):
            fs.rm_file(path)
