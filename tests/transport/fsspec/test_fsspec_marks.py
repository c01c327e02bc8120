"""The fsspec sink reads a consumption mark as the file sink does: one byte past a mark
at most, so a large object at a mark's name is refused by its length without being
read whole, and named with its size (it was named 'this one 4096', the bytes read)."""

from __future__ import annotations

import fsspec
import pytest
from helpers import make_batch

import rlwire

pytestmark = pytest.mark.anyio


async def test_a_huge_object_at_a_mark_is_read_capped_and_refused() -> None:
    url = "memory://fsspec-huge-mark"
    async with rlwire.open_sender(url, keep_last=1, on_existing="overwrite") as sender:
        await sender.send(make_batch(1))
        fsspec.filesystem("memory").pipe("/fsspec-huge-mark/consumed.rank-0000.rlw", bytes(8 << 20))
        words = "at most 16 bytes, this one 8388608: not read"
        with pytest.raises(rlwire.CorruptFrameError, match=words) as caught:
            await sender.send(make_batch(1))
    assert "consumed.rank-0000.rlw" in str(caught.value)
