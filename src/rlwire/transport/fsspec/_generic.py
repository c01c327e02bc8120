"""Every fsspec filesystem but S3 (``memory://``, ``gs://``, ...): each object is written
under a hidden temporary key beside its final one and moved into place at commit.

Temporary keys (:func:`~rlwire.transport.layout.temp_name`) never match the names
readers look for, so a step is invisible until its main objects are moved; a killed
sender's temporary keys are removed by the next ``on_existing="resume"`` or
``"overwrite"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from ..._slicing import Sliced, SliceTimer
from ...errors import transport_error
from .._names import temp_name
from ._store import Staging, Store

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

    def get(self, path: str) -> bytes | None:
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

    def add(self, path: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        head, _, name = path.rpartition("/")
        tmp = f"{head}/{temp_name(name)}"
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
        ranks: list[int] = []
        moved: list[str] = []
        try:
            for tmp, final in self.sidecars:
                fs.mv(tmp, final)
                moved.append(final)
            for rank, (tmp, final) in enumerate(self.mains):
                fs.mv(tmp, final)
                ranks.append(rank)
                self.visible = True
        except Exception as exc:
            self.discard()
            if ranks:
                raise transport_error(
                    exc, f"commit the step in full (visible for ranks {ranks} only)", where=url
                ) from exc
            _remove(fs, moved)
            raise transport_error(
                exc, "commit the step (nothing was made visible)", where=url
            ) from exc
        finally:
            fs.invalidate_cache(self.store.root)

    def discard(self) -> None:
        _remove(self.store.fs, [tmp for tmp, _ in (*self.mains, *self.sidecars)])


def _remove(fs: Any, paths: Sequence[str]) -> None:
    """Delete ``paths``, best effort: missing ones and failures are ignored."""
    for path in paths:
        with contextlib.suppress(Exception):
            fs.rm_file(path)
