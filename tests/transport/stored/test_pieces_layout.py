"""Pieces in the stored layout: one table entry, its runs back to back in the chunk list,
and files byte for byte those of the same frame with every Pieces joined."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import pytest
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire import Compressor, Frame
from rlwire._core.slicing import run_sliced
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.compression import compress
from rlwire.abc import Pieces
from rlwire.transport import FileSink, FileSource
from rlwire.transport._stored.layout import ALIGN, parse_main, plan
from rlwire.transport._stored.sink import StoredSink, StoredStaging
from rlwire.transport.layout import main_name, sidecar_name

PRELUDE = struct.Struct("<8sHHIQ")
SETTINGS = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _view(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")


def mixed_frame(seed: int = 0) -> Frame:
    rng = np.random.default_rng(seed)
    odd = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 3, 63, 1, 64, 3, 63, 127)]
    big = [rng.integers(0, 3, n, dtype=np.uint8) for n in [500_001] * 9 + [3]]
    noise = [rng.integers(0, 256, n, dtype=np.uint8) for n in (300_001, 300_003)]
    return Frame(
        b"a header",
        (
            memoryview(b"x" * 70),
            Pieces([_view(rng.integers(0, 256, 65, dtype=np.uint8))]),
            Pieces([_view(a) for a in odd]),
            memoryview(b"abc"),
            Pieces([_view(a) for a in big]),
            Pieces([_view(a) for a in noise]),
            Pieces([]),
        ),
        frozenset({2, 4}),
    )


def joined(frame: Frame) -> Frame:
    return dataclasses.replace(frame, buffers=tuple(frame.views()))


def write(root: Path, frame: Frame) -> tuple[bytes, bytes]:
    """The main and sidecar files FileSink writes for ``frame``, with the random message
    id (and so the envelope's checksum) blanked: all that may differ between two writes."""
    sink = FileSink(root)
    sink.open("resume")
    run_sliced(sink.stage(0, [frame])).commit()
    main = (root / main_name(0, 0)).read_bytes()
    side_path = root / sidecar_name(0, 0)
    side = side_path.read_bytes() if side_path.exists() else b""
    env_len = PRELUDE.unpack_from(main)[3]
    msg_id = msgspec.msgpack.decode(main[PRELUDE.size : PRELUDE.size + env_len])["id"]
    blank = bytes(len(msg_id))
    main = main[:16] + bytes(8) + main[24:]
    return main.replace(msg_id, blank), side.replace(msg_id, blank)


@pytest.mark.parametrize("algorithm", [None, "lz4", "zstd"])
def test_files_are_byte_identical_to_those_of_the_joined_frame(
    tmp_path: Path, algorithm: str | None
) -> None:
    frame = mixed_frame()
    if algorithm is not None:
        frame = compress(frame, Compressor(algorithm), threads=2)
        assert any(isinstance(b, Pieces) for b in frame.buffers)  # the noise stays Pieces
        assert frame.compression[5] != 0  # the big one is compressed
    main, side = write(tmp_path / "pieces", frame)
    assert (main, side) == write(tmp_path / "joined", joined(frame))
    assert side  # buffers 2 and 4 are in the sidecar
    got = FileSource(tmp_path / "pieces").read(0)
    assert got is not None
    assert [bytes(b) for b in got.buffers] == [bytes(b) for b in joined(frame).buffers]  # type: ignore[arg-type]


def test_runs_are_consecutive_chunks_of_one_segment_with_no_padding_between() -> None:
    frame = mixed_frame(seed=1)
    layout = plan(frame, 0, 0, run_sliced(checksum_segments(frame)))
    for chunks, segments, indices in (
        (layout.main, layout.main_segments, [0, 1, 3, 5]),
        (layout.sidecar, layout.sidecar_segments, [2, 4]),
    ):
        at = 0
        starts: dict[int, int] = {}
        for chunk, seg in zip(chunks, segments, strict=True):
            starts.setdefault(seg, at)
            at += memoryview(chunk).nbytes
        for i in indices:
            buf = frame.buffers[i]
            mine = [c for c, s in zip(chunks, segments, strict=True) if s == i + 1]
            if isinstance(buf, Pieces):
                assert [memoryview(c).obj for c in mine] == [r.obj for r in buf.runs]
                first = segments.index(i + 1)
                assert segments[first : first + len(buf.runs)] == [i + 1] * len(buf.runs)
            assert starts[i + 1] % ALIGN == 0
    main = b"".join(bytes(c) for c in layout.main)
    side = b"".join(bytes(c) for c in layout.sidecar)
    got = parse_main(
        memoryview(main), step=0, rank=0, load_sidecar=lambda _: memoryview(side), where="t"
    )
    assert [bytes(b) for b in got.buffers] == [bytes(b) for b in joined(frame).buffers]  # type: ignore[arg-type]


@SETTINGS
@given(lengths=st.lists(st.lists(st.integers(0, 200), max_size=8), min_size=1, max_size=6))
def test_any_runs_lay_out_as_their_joined_bytes(lengths: Sequence[list[int]]) -> None:
    rng = np.random.default_rng(sum(map(sum, lengths)))
    buffers = tuple(
        Pieces([_view(rng.integers(0, 256, n, dtype=np.uint8)) for n in runs]) for runs in lengths
    )
    frame = Frame(b"h", buffers, frozenset(range(0, len(buffers), 2)))
    a, b = plan(frame, 1, 2), plan(joined(frame), 1, 2)
    assert a.envelope == msgspec.structs.replace(b.envelope, id=a.envelope.id)
    strip = a.envelope.id, bytes(16)
    for x, y in ((a.main[1:], b.main[1:]), (a.sidecar, b.sidecar)):
        assert b"".join(bytes(c) for c in x).replace(*strip) == b"".join(
            bytes(c) for c in y
        ).replace(b.envelope.id, bytes(16))


def test_a_stored_sink_that_writes_messages_its_own_way_does_not_gather() -> None:
    class Layouts(StoredSink):  # only the primitives: the shared layout gathers
        pass

    class OwnWriter(Layouts):
        def write_message(
            self, staging: StoredStaging, step: int, rank: int, frame: Frame
        ) -> object:
            raise NotImplementedError

    class OwnAndSaysSo(OwnWriter):
        gathers = True

    class FileKind(FileSink):
        pass

    assert StoredSink.gathers and Layouts.gathers and FileKind.gathers
    assert not OwnWriter.gathers
    assert OwnAndSaysSo.gathers
