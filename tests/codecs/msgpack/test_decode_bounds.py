"""The decode bound is one allowance computed from the stored bytes, for typed and ``Any``
reads alike (defects 3 and 5).

Each message is written by rlwire's own FileSink and received in a subprocess (under a
3 GiB address-space limit, so that a regression fails instead of swamping the machine)
whose peak RSS is measured.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard
from helpers import receive_in_child
from msgspec.msgpack import Ext
from msgspec.msgpack import encode as mp

from rlwire import Frame, FrameTooLargeError
from rlwire._core.slicing import run_sliced
from rlwire._frame import bounds
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink

MiB = 1 << 20


def chunks_of_empty_lists(chunks: int, per_chunk: int) -> tuple[bytes, bytes]:
    """A header holding one chunked list, and its bulk buffer: ``chunks`` chunks, each a
    msgpack array of ``per_chunk`` empty arrays (a byte each, 64 bytes of heap each)."""
    chunk = b"\xdd" + struct.pack(">I", per_chunk) + b"\x90" * per_chunk
    ranges = [bound for i in range(chunks) for bound in (i * len(chunk), (i + 1) * len(chunk))]
    header = mp(Ext(4, mp([0, chunks * per_chunk, ranges])))
    return header, chunk * chunks


def write_zstd(root: Path, header: bytes, bulk: bytes) -> int:
    """Store a frame of ``header`` and ``bulk``, the bulk zstd-compressed; the file's size."""
    packed = zstandard.ZstdCompressor(level=19).compress(bulk)
    frame = Frame(
        header,
        (memoryview(packed),),
        compression=(0, 2),
        raw_sizes=(len(header), len(bulk)),
    )
    sink = FileSink(root)
    sink.open("resume")
    run_sliced(sink.stage(0, [frame])).commit()
    return sum(p.stat().st_size for p in root.glob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["typed", "any"])
def test_a_small_zstd_file_of_empty_lists_is_refused_within_the_stored_bound(
    tmp_path: Path, kind: str
) -> None:
    """Defects 3 and 5: 64 MiB of empty lists in chunks, zstd-compressed to a few kB.
    Typed, the chunks were not charged at all (an untyped MemoryError, or gigabytes);
    as ``Any`` the allowance was 16 times the decompressed size (1.3 GB). Now both
    draw on 256 MiB + 16 times the few stored kB, and the list's 63M slots (504 MB)
    are charged before its first chunk is built: chunks were built until the allowance
    ran out (1.8 s, a peak of 400 MB; now 0.07 s, under 100 MB)."""
    header, bulk = chunks_of_empty_lists(60, MiB)
    assert write_zstd(tmp_path, header, bulk) < 64 << 10
    out, peak, _ = receive_in_child(tmp_path, kind, timeout=5)
    assert peak < 200, f"the receiver reached {peak:.0f} MB ({out})"
    assert out.startswith("FrameTooLargeError: "), out
    assert "Python objects" in out and "stored" in out
    assert "a chunked container of 62914560 items" in out


def test_typed_chunks_are_charged_like_plain_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 3 in one process: chunks decoded straight into ``list[list[int]]`` draw on
    the message's allowance (here a floor lowered to 16 MiB, + 16 x 2 MB: 2 MB of empty
    lists is 128 MB; the floor of 256 MiB would take millions more lists to reach)."""
    monkeypatch.setattr(bounds, "HEAP_FLOOR", 16 * MiB)
    header, bulk = chunks_of_empty_lists(2, MiB)
    frame = Frame(header, (memoryview(bulk),))
    for annotation in (Any, list[list[int]]):
        with pytest.raises(FrameTooLargeError, match="Python objects"):
            MsgpackCodec().decode(frame, annotation)


def test_honest_chunks_still_decode_typed_and_plain() -> None:
    value = {"ids": [list(range(i % 50)) for i in range(20_000)]}
    frame = MsgpackCodec().encode(value)
    assert msgspec.msgpack.decode(frame.header)  # the encoder chunked it
    assert MsgpackCodec().decode(frame) == value
    assert MsgpackCodec().decode(frame, dict[str, list[list[int]]]) == value
