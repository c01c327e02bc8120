"""A generic fsspec store's sidecar object (every filesystem but S3) that is not the size
its main object's envelope says (junk appended, or cut short) is refused before it is
read: a CorruptFrameError naming the object and both sizes. It was read whole, then its
size checked (40 MiB of junk: 40 MiB read into memory first), as S3 did before its first
ranged GET learned the size. fsspec's real memory filesystem, its reads recorded."""

from __future__ import annotations

import uuid
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers import make_batch

import rlwire
from rlwire.transport.layout import sidecar_name

pytestmark = pytest.mark.anyio

#: Appended to the sidecar: far more than the message.
JUNK = 40 << 20


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the objects fsspec's memory filesystem reads from now on."""
    names: list[str] = []
    cat_file = MemoryFileSystem.cat_file

    def counted(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        names.append(path.rpartition("/")[2])
        return cat_file(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", counted)
    return names


@pytest.mark.parametrize("change", [JUNK, -10])
@pytest.mark.parametrize("fields", [None, ("token_ids",)], ids=["whole", "fields"])
async def test_a_sidecar_not_its_envelopes_size_is_refused_unread(
    reads: list[str], change: int, fields: tuple[str, ...] | None
) -> None:
    url = f"memory://sidecar-size-{uuid.uuid4().hex}"
    async with rlwire.open_sender(url, sidecar="token_ids") as sender:
        await sender.send(make_batch(1))
    side = sidecar_name(0, 0)
    path = f"{url.removeprefix('memory://')}/{side}"
    fs = fsspec.filesystem("memory")
    body = fs.cat_file(path)
    fs.pipe(path, body + bytes(change) if change > 0 else body[:change])
    reads.clear()
    async with rlwire.open_receiver(url, fields=fields) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await receiver.areceive(timeout=10)
    message = str(caught.value)
    assert f"{url}/{side}: " in message, message
    assert f"expected {len(body)} bytes, the object is {len(body) + change}" in message
    assert side not in reads, reads
    fs.rm(path)
