"""Adversarial cases for the columnar layout (Ragged, Chunked, Columns) through a real
directory sink, and hostile columns values: each a defect found by trying to break it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlwire
from rlwire import Chunked

pytestmark = pytest.mark.anyio


async def send_and_receive(tmp_path: Path, obj: Any, **options: Any) -> Any:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send(obj)
    async with rlwire.open_receiver(tmp_path, type=Any, **options) as receiver:
        return await receiver.areceive(timeout=10)


@pytest.mark.parametrize("rows", [3, 3000], ids=["inline", "out-of-band"])
async def test_a_chunk_added_to_chunks_directly_is_sent_or_refused_never_unreadable(
    tmp_path: Path, rows: int
) -> None:
    """``Chunked.chunks`` is a public list: a chunk added to it directly (not through
    ``append``) was written under the row count ``append`` kept, a step whose array
    descriptor disagrees with its buffer, committed, that no receiver can read
    (CorruptFrameError at every receiver, for ever). It must arrive whole, or be refused
    at send."""
    chunked = Chunked([np.arange(rows)])
    chunked.chunks.append(np.arange(rows, 2 * rows))
    try:
        got = await send_and_receive(tmp_path, {"x": chunked})
    except rlwire.SchemaError:
        assert not any(tmp_path.glob("step-*"))  # refused at send: nothing written
        return
    assert np.array_equal(got["x"], np.arange(2 * rows))


@pytest.mark.parametrize("rows", [3, 3000], ids=["inline", "out-of-band"])
async def test_a_chunk_of_another_dtype_put_in_chunks_is_refused_not_reinterpreted(
    tmp_path: Path, rows: int
) -> None:
    """A chunk of another dtype put in ``chunks`` directly: its bytes were written as the
    first chunk's dtype (0.5 arrived as the int64 4602678819172646912), or cast to it
    (float64 into float32), and received as valid data. ``append`` refuses such a chunk
    with SchemaError; the encoder must too."""
    chunked = Chunked([np.arange(rows, dtype=np.float32), np.arange(rows, dtype=np.float32)])
    chunked.chunks[1] = np.full(rows, 0.1)  # float64: 0.1 has no float32 of its own
    with pytest.raises(rlwire.SchemaError, match=r"\$\.x: chunk 1 "):
        await send_and_receive(tmp_path, {"x": chunked})
    assert not any(tmp_path.glob("step-*"))
