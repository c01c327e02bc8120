"""Tests of the stored byte layout (rlwire.transport._stored.layout) and of how FileSink and
FileSource handle corrupt files."""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import xxhash
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire import CorruptFrameError, Frame, RlwireError, StepGapError, UnsupportedVersionError
from rlwire._core.slicing import run_sliced
from rlwire._frame import checksums
from rlwire._frame.checksums import CHECKSUM, checksum_segments, verify_segments
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink, FileSource
from rlwire.transport._stored.layout import ALIGN, FORMAT_VERSION, Layout, parse_main, plan
from rlwire.transport.layout import main_name, sidecar_name

SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

PRELUDE = struct.Struct("<8sHHIQ")  # magic, major, minor, envelope length, its xxh3-64
SIDECAR_PRELUDE = struct.Struct("<8sHHI16s")  # magic, major, minor, reserved, message id
MAGIC = b"\x89RLW\r\n\x1a\n"
STEP, RANK = 7, 3


# -- helpers --------------------------------------------------------------------------


def join(chunks: list[bytes | memoryview]) -> bytes:
    return b"".join(chunks)


def laid_out(frame: Frame, step: int = STEP, rank: int = RANK) -> tuple[bytes, bytes]:
    layout = plan(frame, step, rank)
    assert isinstance(layout, Layout)
    return join(layout.main), join(layout.sidecar)


def parse(
    main: bytes | bytearray | memoryview,
    side: bytes | bytearray | memoryview | None = None,
    *,
    step: int = STEP,
    rank: int = RANK,
    calls: list[int] | None = None,
) -> Frame:
    def load_sidecar(size: int) -> memoryview:
        if calls is not None:
            calls.append(1)
        if side is None:
            raise CorruptFrameError("msg sidecar: missing; the main file refers to it")
        return memoryview(side)

    return parse_main(
        memoryview(main), step=step, rank=rank, load_sidecar=load_sidecar, where="msg"
    )


def addr(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def assert_same_frame(got: Frame, want: Frame) -> None:
    assert bytes(got.header) == bytes(want.header)
    assert len(got.buffers) == len(want.buffers)
    for g, w in zip(got.buffers, want.buffers, strict=True):
        assert isinstance(g, memoryview)
        assert bytes(g) == bytes(w)
    assert got.sidecar == want.sidecar


def make_frame(
    header: bytes = b"header-bytes",
    buffers: tuple[bytes, ...] = (b"a" * 100, b"", b"b" * 7, b"c" * 64, b"d" * 130),
    sidecar: frozenset[int] = frozenset({1, 2}),
) -> Frame:
    return Frame(header, tuple(memoryview(b) for b in buffers), sidecar)


FRAME = make_frame()
FRAME_NO_SIDE = make_frame(sidecar=frozenset())


def forge(envelope: dict[str, object], body: bytes = b"") -> bytes:
    """A main file with this envelope, its checksum right, followed by ``body``."""
    env = msgspec.msgpack.encode(envelope)
    return (
        PRELUDE.pack(MAGIC, *FORMAT_VERSION, len(env), xxhash.xxh3_64_intdigest(env)) + env + body
    )


def envelope_end(main: bytes) -> int:
    return PRELUDE.size + PRELUDE.unpack_from(main)[3]


def rehash(data: bytearray) -> bytearray:
    """Make the prelude's envelope checksum match the envelope bytes in ``data`` again, so
    that a test reaches the checks behind it."""
    struct.pack_into(
        "<Q", data, 16, xxhash.xxh3_64_intdigest(data[PRELUDE.size : envelope_end(data)])
    )
    return data


def check_round_trip(frame: Frame, step: int = STEP, rank: int = RANK) -> None:
    layout = plan(frame, step, rank)
    main, side = join(layout.main), join(layout.sidecar)
    for chunks, joined in ((layout.main, main), (layout.sidecar, side)):
        assert all(isinstance(p, bytes | memoryview) for p in chunks)
        assert sum(memoryview(p).nbytes for p in chunks) == len(joined)
    assert bool(side) == bool(frame.sidecar)
    # The layout refers to the frame's buffers instead of copying them.
    for buf in frame.buffers:
        if buf.nbytes:
            assert any(
                np.shares_memory(np.frombuffer(p, np.uint8), np.frombuffer(buf, np.uint8))
                for p in (*layout.main, *layout.sidecar)
            )
    main_data, side_data = bytearray(main), bytearray(side)
    main_view, side_view = memoryview(main_data), memoryview(side_data)
    calls: list[int] = []
    got = parse(main_view, side_view, step=step, rank=rank, calls=calls)
    assert_same_frame(got, frame)
    assert len(calls) == (1 if frame.sidecar else 0)
    magic, major, _minor, env_len, _env_sum = PRELUDE.unpack_from(main)
    assert (magic, major) == (b"\x89RLW\r\n\x1a\n", FORMAT_VERSION[0])
    covered = [(0, PRELUDE.size + env_len)]
    side_covered = [(0, SIDECAR_PRELUDE.size)] if side else []
    # Header and every buffer start at a multiple of 64 from the start of their file.
    header_offset = addr(got.header) - addr(main_view)
    assert header_offset % ALIGN == 0
    assert header_offset >= PRELUDE.size + env_len
    covered.append((header_offset, header_offset + len(got.header)))
    for i, buf in enumerate(got.buffers):
        in_side = i in frame.sidecar
        start = addr(buf) - addr(side_view if in_side else main_view)
        assert start % ALIGN == 0, (i, start)
        assert start >= (ALIGN if in_side else PRELUDE.size + env_len)
        (side_covered if in_side else covered).append((start, start + buf.nbytes))
    # Ranges do not overlap and everything else is zero padding.
    for ranges, data in ((covered, main), (side_covered, side)):
        ranges = sorted(r for r in ranges if r[1] > r[0])
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert end <= start
        mask = np.ones(len(data), bool)
        for start, end in ranges:
            mask[start:end] = False
        assert not np.frombuffer(data, np.uint8)[mask].any()


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        FRAME,
        FRAME_NO_SIDE,
        make_frame(sidecar=frozenset(range(5))),
        make_frame(header=b"", buffers=(), sidecar=frozenset()),
        make_frame(header=b"h" * 64, buffers=(b"x" * 64,) * 3, sidecar=frozenset({0})),
        make_frame(buffers=(b"",) * 4, sidecar=frozenset({0, 3})),
        make_frame(header=b"h" * 5000, buffers=(b"y" * 100_000,), sidecar=frozenset()),
    ],
    ids=["mixed", "no-sidecar", "all-sidecar", "empty", "aligned-sizes", "empty-buffers", "large"],
)
def test_plan_then_parse_round_trips(frame: Frame) -> None:
    check_round_trip(frame)


@pytest.mark.parametrize(("step", "rank"), [(0, 0), (2**40, 65535), (2**63 - 1, 2**31)])
def test_round_trip_large_step_and_rank(step: int, rank: int) -> None:
    check_round_trip(FRAME, step, rank)


def test_round_trip_many_buffers() -> None:
    rng = np.random.default_rng(1)
    bufs = tuple(
        rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 300, 400)
    )
    check_round_trip(make_frame(buffers=bufs, sidecar=frozenset(range(0, 400, 3))))


def test_round_trip_of_non_byte_memoryviews() -> None:
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    frame = Frame(b"h", (memoryview(arr).cast("B"), memoryview(arr.tobytes())), frozenset({1}))
    check_round_trip(frame)


def test_each_plan_uses_a_fresh_message_id() -> None:
    _, side1 = laid_out(FRAME)
    _, side2 = laid_out(FRAME)
    assert SIDECAR_PRELUDE.unpack_from(side1)[4] != SIDECAR_PRELUDE.unpack_from(side2)[4]


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    header = draw(st.binary(max_size=200))
    bufs = draw(st.lists(st.binary(max_size=200), max_size=5))
    side = draw(st.sets(st.integers(0, len(bufs) - 1))) if bufs else set()
    return make_frame(header=header, buffers=tuple(bufs), sidecar=frozenset(side))


@SETTINGS
@given(frame=frames(), step=st.integers(0, 2**64 - 1), rank=st.integers(0, 2**32))
def test_random_frames_round_trip(frame: Frame, step: int, rank: int) -> None:
    check_round_trip(frame, step, rank)


# -- corruption of the main file ------------------------------------------------------


@pytest.mark.parametrize("frame", [FRAME, FRAME_NO_SIDE], ids=["sidecar", "no-sidecar"])
def test_every_truncation_is_detected(frame: Frame) -> None:
    main, side = laid_out(frame)
    for cut in range(len(main)):
        with pytest.raises(CorruptFrameError):
            parse(main[:cut], side)


@pytest.mark.parametrize("extra", [b"\x00", bytes(64), b"garbage"])
def test_extension_is_detected(extra: bytes) -> None:
    main, side = laid_out(FRAME)
    with pytest.raises(CorruptFrameError, match="msg"):
        parse(main + extra, side)


def test_error_messages_name_the_message() -> None:
    main, side = laid_out(FRAME)
    with pytest.raises(CorruptFrameError, match=re.escape("msg")):
        parse(main[:10], side)


@pytest.mark.parametrize("frame", [FRAME, FRAME_NO_SIDE], ids=["sidecar", "no-sidecar"])
def test_single_byte_flips_in_prelude_and_envelope(frame: Frame) -> None:
    main, side = laid_out(frame)
    end = envelope_end(main)
    raised = survived = 0
    for pos in range(end):
        for mask in (0x01, 0x80, 0xFF):
            data = bytearray(main)
            data[pos] ^= mask
            try:
                got = parse(data, side)
            except UnsupportedVersionError:
                assert pos in (8, 9)
                raised += 1
            except CorruptFrameError:
                raised += 1
            else:
                # The envelope's checksum leaves only the minor version unchecked.
                assert pos in (10, 11), pos
                assert_same_frame(got, frame)
                survived += 1
    assert survived == 2 * 3  # two minor-version bytes, three masks


@pytest.mark.parametrize("pos", range(8))
def test_wrong_magic(pos: int) -> None:
    main, side = laid_out(FRAME)
    data = bytearray(main)
    data[pos] ^= 0x20
    with pytest.raises(CorruptFrameError, match="magic"):
        parse(data, side)


def test_sidecar_given_as_main_part() -> None:
    _, side = laid_out(FRAME)
    with pytest.raises(CorruptFrameError):
        parse(side, side)


@pytest.mark.parametrize("major", [0, 2, 7, 65535])
def test_unknown_major_version(major: int) -> None:
    main, side = laid_out(FRAME)
    data = bytearray(main)
    struct.pack_into("<H", data, 8, major)
    with pytest.raises(UnsupportedVersionError) as info:
        parse(data, side)
    message = str(info.value)
    assert str(major) in message
    assert re.search(rf"version\D*{FORMAT_VERSION[0]}\b", message.replace(str(major), "")), message
    assert isinstance(info.value, CorruptFrameError)


@pytest.mark.parametrize("minor", [1, 99, 65535])
def test_newer_minor_version_still_parses(minor: int) -> None:
    main, side = laid_out(FRAME)
    data, side_data = bytearray(main), bytearray(side)
    struct.pack_into("<H", data, 10, minor)
    struct.pack_into("<H", side_data, 10, minor)
    assert_same_frame(parse(data, side_data), FRAME)


@pytest.mark.parametrize("env_len", [0, 1, 2**31, 2**32 - 1])
def test_bad_envelope_length(env_len: int) -> None:
    main, side = laid_out(FRAME)
    data = bytearray(main)
    struct.pack_into("<I", data, 12, env_len)
    with pytest.raises(CorruptFrameError):
        parse(data, side)


@pytest.mark.parametrize("fixed", [False, True], ids=["checksum-stale", "checksum-fixed"])
def test_garbage_envelope(fixed: bool) -> None:
    main, side = laid_out(FRAME)
    end = envelope_end(main)
    for fill in (0x00, 0xC1, 0xFF, 0x90):
        data = bytearray(main)
        data[PRELUDE.size : end] = bytes([fill]) * (end - PRELUDE.size)
        if fixed:
            rehash(data)
        expected = "malformed envelope" if fixed else "does not match its checksum"
        with pytest.raises(CorruptFrameError, match=expected):
            parse(data, side)


@pytest.mark.parametrize(("step", "rank"), [(STEP + 1, RANK), (STEP, RANK + 1), (0, 0)])
def test_wrong_step_or_rank(step: int, rank: int) -> None:
    main, side = laid_out(FRAME)
    with pytest.raises(CorruptFrameError) as info:
        parse(main, side, step=step, rank=rank)
    assert str(step) in str(info.value)
    assert str(rank) in str(info.value)


# -- corruption of the sidecar --------------------------------------------------------


def test_sidecar_from_another_message() -> None:
    main, _ = laid_out(FRAME)
    _, other_side = laid_out(FRAME)  # same frame, another plan: another message id
    with pytest.raises(CorruptFrameError, match=r"another message|id"):
        parse(main, other_side)


def test_every_sidecar_truncation_is_detected() -> None:
    main, side = laid_out(FRAME)
    for cut in range(len(side)):
        with pytest.raises(CorruptFrameError):
            parse(main, side[:cut])


def test_extended_sidecar_is_detected() -> None:
    main, side = laid_out(FRAME)
    with pytest.raises(CorruptFrameError):
        parse(main, side + bytes(64))


def test_missing_sidecar() -> None:
    main, _ = laid_out(FRAME)
    with pytest.raises(CorruptFrameError, match="missing"):
        parse(main, None)


def test_sidecar_is_not_loaded_without_sidecar_buffers() -> None:
    main, side = laid_out(FRAME_NO_SIDE)
    assert side == b""
    calls: list[int] = []
    assert_same_frame(parse(main, None, calls=calls), FRAME_NO_SIDE)
    assert calls == []


@pytest.mark.parametrize("pos", range(8))
def test_sidecar_wrong_magic(pos: int) -> None:
    main, side = laid_out(FRAME)
    data = bytearray(side)
    data[pos] ^= 0x01
    with pytest.raises(CorruptFrameError, match="magic"):
        parse(main, data)


def test_main_part_given_as_sidecar() -> None:
    main, _ = laid_out(FRAME)
    with pytest.raises(CorruptFrameError):
        parse(main, main)


@pytest.mark.parametrize("major", [0, 2, 300])
def test_sidecar_unknown_major_version(major: int) -> None:
    main, side = laid_out(FRAME)
    data = bytearray(side)
    struct.pack_into("<H", data, 8, major)
    with pytest.raises(UnsupportedVersionError, match=str(major)):
        parse(main, data)


@pytest.mark.parametrize("pos", range(16, 32))
def test_sidecar_message_id_flips(pos: int) -> None:
    main, side = laid_out(FRAME)
    data = bytearray(side)
    data[pos] ^= 0x04
    with pytest.raises(CorruptFrameError):
        parse(main, data)


# -- hypothesis: mutations only ever produce success or CorruptFrameError -------------

MAIN, SIDE = laid_out(FRAME)
MAIN_NS, _ = laid_out(FRAME_NO_SIDE)


def mutate(data: bytes, flips: list[tuple[int, int]], cut: int | None) -> bytearray:
    out = bytearray(data)
    for pos, mask in flips:
        out[pos % len(out)] ^= mask
    if cut is not None:
        del out[cut:]
    return out


def flips_and_cut(size: int) -> dict[str, st.SearchStrategy[object]]:
    return {
        "flips": st.lists(
            st.tuples(
                st.one_of(st.integers(0, 63), st.integers(0, size - 1)),  # favour the envelope
                st.integers(1, 255),
            ),
            min_size=0,
            max_size=4,
        ),
        "cut": st.one_of(st.none(), st.integers(0, size)),
    }


def assert_success_or_corrupt(run: Callable[[], Frame]) -> None:
    try:
        frame = run()
    except CorruptFrameError:
        return
    assert isinstance(frame, Frame)


@SETTINGS
@given(**flips_and_cut(len(MAIN)), sidecar=st.booleans())
def test_mutated_main_part_is_success_or_corrupt(
    flips: list[tuple[int, int]], cut: int | None, sidecar: bool
) -> None:
    base = MAIN if sidecar else MAIN_NS
    data = mutate(base, flips, cut)
    assert_success_or_corrupt(lambda: parse(data, SIDE))
    assert_success_or_corrupt(lambda: parse(bytes(data), None))


@SETTINGS
@given(**flips_and_cut(len(SIDE)))
def test_mutated_sidecar_is_success_or_corrupt(
    flips: list[tuple[int, int]], cut: int | None
) -> None:
    side = mutate(SIDE, flips, cut)
    assert_success_or_corrupt(lambda: parse(MAIN, side))


@SETTINGS
@given(data=st.binary(max_size=300))
def test_random_bytes_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptFrameError):
        parse(data, SIDE)


@SETTINGS
@given(
    envelope=st.dictionaries(
        st.sampled_from(
            [
                "id",
                "step",
                "rank",
                "size",
                "header",
                "buffers",
                "parts",
                "offsets",
                "lengths",
                "sidecar_size",
                "codec",
                "checksum",
                "checksums",
                "compression",
                "raw_sizes",
            ]
        ),
        st.one_of(
            st.integers(-(2**63), 2**64 - 1),
            st.binary(max_size=40),
            st.text(max_size=10),
            st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3),
            st.none(),
        ),
    ),
    body=st.binary(max_size=200),
)
def test_forged_envelopes_are_success_or_corrupt(envelope: dict[str, object], body: bytes) -> None:
    data = forge(envelope, body)
    assert_success_or_corrupt(lambda: parse(data, SIDE))


# -- files: FileSink and FileSource ---------------------------------------------------


def write_step(root: Path, step: int, frames: list[Frame]) -> None:
    sink = FileSink(root)
    sink.open("resume")
    staged = run_sliced(sink.stage(step, frames))
    staged.commit()


def test_file_round_trip_views_over_mmap(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    assert sink.open("error") == 0
    other = make_frame(header=b"rank one", buffers=(b"z" * 3,), sidecar=frozenset())
    run_sliced(sink.stage(4, [FRAME, other])).commit()
    assert (tmp_path / main_name(4, 0)).exists()
    assert (tmp_path / sidecar_name(4, 0)).exists()
    assert not (tmp_path / sidecar_name(4, 1)).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    got = FileSource(tmp_path, rank=0).read(4)
    assert got is not None
    assert_same_frame(got, FRAME)
    for view in (got.header, *got.buffers):
        assert isinstance(view, memoryview)
        assert isinstance(view.obj, mmap.mmap)
        assert view.readonly
    for i, buf in enumerate(got.buffers):
        if buf.nbytes:
            assert addr(buf) % ALIGN == 0, i  # mmaps are page-aligned

    got1 = FileSource(tmp_path, rank=1).read(4)
    assert got1 is not None
    assert_same_frame(got1, other)


def test_file_source_writable_is_copy_on_write(tmp_path: Path) -> None:
    frame = make_frame(buffers=(b"abcdef",), sidecar=frozenset())
    write_step(tmp_path, 0, [frame])
    got = FileSource(tmp_path, writable=True).read(0)
    assert got is not None
    buf = got.buffers[0]
    assert not buf.readonly
    buf[0] = ord("X")
    again = FileSource(tmp_path).read(0)
    assert again is not None
    assert bytes(again.buffers[0]) == b"abcdef"


def test_missing_step_returns_none(tmp_path: Path) -> None:
    write_step(tmp_path, 0, [FRAME])
    source = FileSource(tmp_path)
    assert source.read(1) is None
    # Step 0 went to rank 0 alone, as its envelope records: rank 5 is told, not left waiting.
    with pytest.raises(StepGapError, match=r"step 0 was sent to rank 0 only"):
        FileSource(tmp_path, rank=5).read(0)
    assert FileSource(tmp_path / "nowhere").read(0) is None


def test_codec_arrays_are_aligned_views_over_the_file(tmp_path: Path) -> None:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    obj = {
        "ids": np.arange(10_000, dtype=np.int64),
        "routed_experts": np.arange(3 * 7, dtype=np.uint8).reshape(3, 7),
        "logprobs": np.linspace(0, 1, 5000, dtype=np.float32),
    }
    write_step(tmp_path, 2, [codec.encode(obj)])
    frame = FileSource(tmp_path).read(2)
    assert frame is not None
    out = codec.decode(frame)
    for key, arr in obj.items():
        got = out[key]
        assert got.dtype == arr.dtype
        assert np.array_equal(got, arr)
        assert not got.flags.writeable
        assert got.ctypes.data % ALIGN == 0
        assert any(np.shares_memory(got, np.frombuffer(b, np.uint8)) for b in frame.buffers)


def _paths(root: Path, step: int = 1) -> tuple[Path, Path]:
    return root / main_name(step, 0), root / sidecar_name(step, 0)


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    write_step(tmp_path, 1, [FRAME])
    return tmp_path


def read(root: Path, step: int = 1) -> Frame | None:
    return FileSource(root).read(step)


def test_stored_step_reads_back(stored: Path) -> None:
    got = read(stored)
    assert got is not None
    assert_same_frame(got, FRAME)


@pytest.mark.parametrize("keep", [0, 1, 15, 16, 40, 64, -64, -1])
def test_truncated_main_file(stored: Path, keep: int) -> None:
    main, _ = _paths(stored)
    size = main.stat().st_size
    os.truncate(main, keep % size if keep else 0)
    with pytest.raises(CorruptFrameError):
        read(stored)


def test_extended_main_file(stored: Path) -> None:
    main, _ = _paths(stored)
    with main.open("ab") as f:
        f.write(b"\x00" * 10)
    with pytest.raises(CorruptFrameError):
        read(stored)


def test_empty_main_file(stored: Path) -> None:
    main, _ = _paths(stored)
    main.write_bytes(b"")
    with pytest.raises(CorruptFrameError, match="empty"):
        read(stored)


@pytest.mark.parametrize(
    ("offset", "data", "fixed", "message"),
    [
        (0, b"NOTRLWIR", False, "magic"),
        (8, b"\x09\x00", False, "major version 9"),
        (12, b"\xff\xff\xff\x7f", False, "envelope length"),
        (16, b"\x00", False, "does not match its checksum"),
        (24, b"\xc1", False, "does not match its checksum"),
        (24, b"\xc1", True, "malformed envelope"),
        (24, b"\xff" * 20, True, "malformed envelope"),
    ],
    ids=[
        "magic",
        "major",
        "envelope-length",
        "envelope-checksum",
        "envelope-opcode",
        "envelope-opcode-checksum-fixed",
        "envelope-garbage-checksum-fixed",
    ],
)
def test_overwritten_envelope(
    stored: Path, offset: int, data: bytes, fixed: bool, message: str
) -> None:
    main, _ = _paths(stored)
    raw = bytearray(main.read_bytes())
    if raw[offset : offset + len(data)] == data:  # the checksum (of a random id) held it
        data = bytes(b ^ 0xFF for b in data)
    raw[offset : offset + len(data)] = data
    main.write_bytes(rehash(raw) if fixed else raw)
    with pytest.raises(CorruptFrameError, match=message) as info:
        read(stored)
    assert str(main) in str(info.value)


def test_every_envelope_byte_flip_on_disk(stored: Path) -> None:
    main, _ = _paths(stored)
    original = main.read_bytes()
    for pos in range(envelope_end(original)):
        data = bytearray(original)
        data[pos] ^= 0xFF
        main.write_bytes(data)
        try:
            got = read(stored)
        except CorruptFrameError:
            continue
        assert pos in (10, 11) and got is not None


def test_main_file_of_another_step(stored: Path) -> None:
    main, _ = _paths(stored)
    os.rename(main, _paths(stored, 2)[0])
    with pytest.raises(CorruptFrameError, match="step"):
        read(stored, 2)


def test_main_file_of_another_rank(tmp_path: Path) -> None:
    write_step(tmp_path, 0, [FRAME_NO_SIDE, FRAME_NO_SIDE])
    os.replace(tmp_path / main_name(0, 1), tmp_path / main_name(0, 0))
    with pytest.raises(CorruptFrameError, match="rank"):
        FileSource(tmp_path, rank=0).read(0)


def test_missing_sidecar_file(stored: Path) -> None:
    _, side = _paths(stored)
    side.unlink()
    with pytest.raises(CorruptFrameError, match="missing"):
        read(stored)


def test_empty_sidecar_file(stored: Path) -> None:
    _, side = _paths(stored)
    side.write_bytes(b"")
    with pytest.raises(CorruptFrameError):
        read(stored)


@pytest.mark.parametrize("keep", [1, 39, 40, 64, -1])
def test_truncated_sidecar_file(stored: Path, keep: int) -> None:
    _, side = _paths(stored)
    os.truncate(side, keep % side.stat().st_size)
    with pytest.raises(CorruptFrameError):
        read(stored)


def test_stale_sidecar_file(stored: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("other")
    write_step(other, 1, [FRAME])  # the same step and frame, written again elsewhere
    _, side = _paths(stored)
    os.replace(_paths(other)[1], side)
    with pytest.raises(CorruptFrameError, match=r"another message|stale"):
        read(stored)


def test_corrupt_errors_are_rlwire_errors(stored: Path) -> None:
    main, _ = _paths(stored)
    main.write_bytes(b"x")
    with pytest.raises(RlwireError):
        read(stored)


# -- checksums, codec name and compression tables ---------------------------------------


def sums_of(frame: Frame) -> bytes:
    return run_sliced(checksum_segments(frame))


def with_sums(frame: Frame, step: int = STEP, rank: int = RANK) -> tuple[bytes, bytes]:
    layout = plan(frame, step, rank, sums_of(frame))
    return join(layout.main), join(layout.sidecar)


def decoded_envelope(main: bytes) -> dict[str, object]:
    env: dict[str, object] = msgspec.msgpack.decode(main[PRELUDE.size : envelope_end(main)])
    return env


def reforged(main: bytes, **changes: object) -> bytes:
    """``main`` with envelope keys changed (None deletes one) and its checksum made right;
    the header and main buffers move down by whole multiples of 64 if the envelope grows."""
    env = decoded_envelope(main)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    h_off, h_len = env["header"]  # type: ignore[misc]
    files = np.frombuffer(env["parts"], np.uint8)  # type: ignore[call-overload]
    delta = 0
    while True:
        offsets = np.frombuffer(env["offsets"], "<u8").copy()  # type: ignore[call-overload]
        offsets[files == 0] += np.uint64(delta)
        moved = {**env, "header": [h_off + delta, h_len], "offsets": offsets.tobytes()}
        moved["size"] = env["size"] + delta  # type: ignore[operator]
        new = msgspec.msgpack.encode(moved)
        need = -(-(PRELUDE.size + len(new)) // ALIGN) * ALIGN - h_off
        if need <= delta:
            break
        delta = need
    head = PRELUDE.pack(MAGIC, *FORMAT_VERSION, len(new), xxhash.xxh3_64_intdigest(new))
    return head + new + bytes(h_off + delta - PRELUDE.size - len(new)) + main[h_off:]


def segment_positions(main: bytes, side: bytes) -> list[tuple[int, int, int]]:
    """(file, start, end) of the header and each buffer, in segment order."""
    env = decoded_envelope(main)
    n = len(env["parts"])  # type: ignore[arg-type]
    offsets = struct.unpack(f"<{n}Q", env["offsets"])  # type: ignore[arg-type]
    lengths = struct.unpack(f"<{n}Q", env["lengths"])  # type: ignore[arg-type]
    h_off, h_len = env["header"]  # type: ignore[misc]
    out = [(0, h_off, h_off + h_len)]
    out += [
        (p, o, o + n_)
        for p, o, n_ in zip(env["parts"], offsets, lengths, strict=True)  # type: ignore[call-overload]
    ]
    return out


def test_checksum_slices_hash_every_segment() -> None:
    sums = struct.unpack(f"<{len(FRAME.buffers) + 1}Q", sums_of(FRAME))
    segments = [FRAME.header, *FRAME.buffers]
    assert list(sums) == [xxhash.xxh3_64_intdigest(bytes(s)) for s in segments]


def test_checksum_slices_stream_large_segments() -> None:
    big = np.random.default_rng(0).integers(0, 256, (64 << 20) + 5, dtype=np.uint8)
    frame = Frame(b"h", (memoryview(big),))
    sliced = checksum_segments(frame)
    yields = 0
    while True:
        try:
            next(sliced)
            yields += 1
        except StopIteration as stop:
            sums = struct.unpack("<2Q", stop.value)
            break
    assert yields >= 2  # the 64 MiB + 5 byte buffer took two sliced
    assert sums[1] == xxhash.xxh3_64_intdigest(memoryview(big))


def test_checksums_round_trip_and_record_the_algorithm() -> None:
    main, side = with_sums(FRAME)
    env = decoded_envelope(main)
    assert env["checksum"] == "xxh3-64" and env["checksums"] == sums_of(FRAME)
    assert_same_frame(parse(main, side), FRAME)
    # Without checksums the keys are absent and the message still parses.
    plain, _ = laid_out(FRAME)
    assert "checksum" not in decoded_envelope(plain)
    assert "checksums" not in decoded_envelope(plain)


@pytest.mark.parametrize("segment", [0] + [i + 1 for i, b in enumerate(FRAME.buffers) if b.nbytes])
def test_flipped_segment_byte_names_step_rank_and_segment(segment: int) -> None:
    main, side = with_sums(FRAME)
    part, start, end = segment_positions(main, side)[segment]
    data = [bytearray(main), bytearray(side)]
    data[part][(start + end) // 2] ^= 0x10
    what = "the header" if segment == 0 else rf"buffer {segment - 1} \("
    where = "msg sidecar" if part else "msg"  # a buffer in the sidecar names it
    with pytest.raises(
        CorruptFrameError, match=rf"^{where}, step {STEP}, rank {RANK}, segment {segment}: {what}"
    ) as caught:
        parse(data[0], data[1])
    err = caught.value
    assert (err.where, err.step, err.rank, err.segment) == (where, STEP, RANK, segment)
    got = parse_main(
        memoryview(data[0]),
        step=STEP,
        rank=RANK,
        load_sidecar=lambda _: memoryview(data[1]),
        where="msg",
        verify=False,
    )
    flipped = got.header if segment == 0 else got.buffers[segment - 1]
    original = FRAME.header if segment == 0 else FRAME.buffers[segment - 1]
    assert bytes(flipped) != bytes(original) and len(flipped) == len(original)


def patched(main: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``main`` with its envelope edited in place by ``change`` and its checksum made
    right; the header and buffers stay where they were (the edit must fit the padding)."""
    env = decoded_envelope(main)
    change(env)
    new = msgspec.msgpack.encode(env)
    h_off = decoded_envelope(main)["header"][0]  # type: ignore[index]
    assert PRELUDE.size + len(new) <= h_off, "the edited envelope overlaps the header"
    head = PRELUDE.pack(MAGIC, *FORMAT_VERSION, len(new), xxhash.xxh3_64_intdigest(new))
    return head + new + bytes(h_off - PRELUDE.size - len(new)) + main[h_off:]


def set_u64(key: str, index: int, value: int | Callable[[int], int]) -> Callable[[Any], None]:
    def change(env: dict[str, Any]) -> None:
        table = list(struct.unpack(f"<{len(env[key]) // 8}Q", env[key]))
        table[index] = value(table[index]) if callable(value) else value
        env[key] = struct.pack(f"<{len(table)}Q", *table)

    return change


def setitem(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda env: env.__setitem__(key, value)


# FRAME stored with checksums: a 768-byte main file (header at 320) and a 128-byte
# sidecar holding buffers 1 and 2; buffers 0, 3 and 4 are in the main file.
DEEPER = {
    "step": (setitem("step", STEP + 1), rf"holds step {STEP + 1} rank {RANK}, expected step"),
    "rank": (setitem("rank", RANK + 1), rf"holds step {STEP} rank {RANK + 1}, expected"),
    "size": (setitem("size", 768 + 64), "the envelope says 832 bytes, found 768"),
    "header-outside": (setitem("header", [768, 12]), "header at offset 768 length 12 lies outside"),
    "header-too-long": (setitem("header", [320, 449]), "header at offset 320 length 449"),
    "header-moved": (
        setitem("header", [0, 12]),
        r"lays the prelude and envelope and the header over the same bytes",
    ),
    "offset-outside-main": (
        set_u64("offsets", 0, 768),
        "buffer 0 at offset 768 length 100 lies outside the 768-byte main file",
    ),
    "length-outside-main": (
        set_u64("lengths", 4, 2**64 - 1),
        "buffer 4 at offset \\d+ length 18446744073709551615 lies outside the 768-byte main",
    ),
    "offset-outside-sidecar": (
        set_u64("offsets", 2, 2**64 - 1),
        "buffer 2 at offset 18446744073709551615 length 7 lies outside the 128-byte sidecar",
    ),
    "length-outside-sidecar": (
        set_u64("lengths", 2, 65),
        "buffer 2 at offset 64 length 65 lies outside the 128-byte sidecar",
    ),
    "offset-moved-inside": (
        set_u64("offsets", 0, lambda off: off + 64),
        r"lays buffer 0 and buffer 3 over the same bytes of the main file",
    ),
    "offset-moved-inside-padding": (
        set_u64("offsets", 4, lambda off: off + 32),
        r"step 7, rank 3, segment 5: buffer 4 \(130 bytes\) does not match its checksum",
    ),
    "unknown-part": (setitem("parts", b"\x02\x01\x01\x00\x00"), "buffer 0 is in unknown file 2"),
    "undeclared-sidecar": (
        lambda env: env.pop("sidecar_size"),
        "buffers refer to a sidecar the message does not declare",
    ),
    "sidecar-size": (
        setitem("sidecar_size", 192),
        "sidecar truncated or extended: expected 192 bytes, found 128",
    ),
    "sidecar-id": (setitem("id", bytes(16)), "sidecar belongs to another message"),
    "parts-table": (setitem("parts", bytes(6)), "6 buffers, 40 bytes of offsets"),
    "lengths-table": (
        lambda env: env.__setitem__("lengths", env["lengths"] + bytes(8)),
        "5 buffers, 48 bytes of lengths",
    ),
    "step-type": (setitem("step", "7"), "malformed envelope"),
    "header-shape": (setitem("header", [320, 12, 0]), "malformed envelope"),
    "codec-missing": (lambda env: env.pop("codec"), "malformed envelope.*codec"),
}


@pytest.mark.parametrize(("change", "message"), DEEPER.values(), ids=DEEPER.keys())
def test_deeper_checks_behind_a_valid_envelope_checksum(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    main, side = with_sums(FRAME)
    assert (decoded_envelope(main)["header"], len(main), len(side)) == ([320, 12], 768, 128)
    place = "msg sidecar" if message.startswith("sidecar ") else "msg"  # what is damaged
    with pytest.raises(CorruptFrameError, match=rf"^{place}[:,] .*{message}"):
        parse(patched(main, change), side)


@pytest.mark.parametrize("frame", [FRAME, FRAME_NO_SIDE], ids=["sidecar", "no-sidecar"])
def test_single_byte_flips_in_envelope_with_its_checksum_fixed(frame: Frame) -> None:
    # Behind a valid envelope checksum, the envelope's own checks and the segment
    # checksums still catch nearly every flip; whatever survives must not change data.
    main, side = with_sums(frame)
    raised = survived = 0
    for pos in range(PRELUDE.size, envelope_end(main)):
        for mask in (0x01, 0x80, 0xFF):
            data = bytearray(main)
            data[pos] ^= mask
            try:
                got = parse(rehash(data), side)
            except CorruptFrameError:
                raised += 1
            else:
                # The data is intact; only an empty buffer may have changed parts.
                nonempty = {i for i, b in enumerate(frame.buffers) if b.nbytes}
                assert bytes(got.header) == bytes(frame.header)
                assert [bytes(b) for b in got.buffers] == [bytes(b) for b in frame.buffers]
                assert got.sidecar & nonempty == frame.sidecar & nonempty
                survived += 1
    assert raised > 4 * survived


def str_value_range(main: bytes, key: str) -> tuple[int, int]:
    """Where the str value of envelope ``key`` lies in ``main`` (a fixstr: 1-byte tag)."""
    value = msgspec.msgpack.encode(decoded_envelope(main)[key])
    start = main.index(msgspec.msgpack.encode(key) + value, PRELUDE.size) + len(key) + 1
    return start + 1, start + len(value)


@pytest.mark.parametrize("key", ["codec", "checksum"])
def test_envelope_string_that_is_not_utf8_is_corrupt(key: str) -> None:
    main, side = with_sums(FRAME)
    start, _ = str_value_range(main, key)
    data = bytearray(main)
    data[start] = 0xFF  # never valid in UTF-8
    with pytest.raises(CorruptFrameError, match="malformed envelope"):
        parse(rehash(data), side)


def test_unknown_checksum_algorithm() -> None:
    main, side = with_sums(FRAME)
    data = reforged(main, checksum="crc64")
    with pytest.raises(UnsupportedVersionError, match=r"checksum algorithm 'crc64'.*xxh3-64"):
        parse(data, side)
    got = parse_main(
        memoryview(data),
        step=STEP,
        rank=RANK,
        load_sidecar=lambda _: memoryview(side),
        where="msg",
        verify=False,
    )
    assert_same_frame(got, FRAME)


@pytest.mark.parametrize(
    "change",
    [
        {"checksums": b"\0" * 8},
        {"compression": b"\0\1"},
        {"compression": bytes(6), "raw_sizes": bytes(8)},
        {"compression": None, "raw_sizes": bytes(48)},
    ],
    ids=["checksums", "compression", "raw-sizes", "raw-sizes-alone"],
)
def test_per_segment_tables_of_the_wrong_length(change: dict[str, object]) -> None:
    main, side = with_sums(FRAME)
    with pytest.raises(CorruptFrameError, match="the buffer table disagrees with itself"):
        parse(reforged(main, **change), side)


def test_codec_and_compression_tables_round_trip() -> None:
    frame = Frame(
        b"h" * 10,
        (memoryview(b"x" * 70), memoryview(b"y" * 3)),
        frozenset({1}),
        "json",
        (2, 0, 1),
        (1000, 70, 9),
    )
    got = parse(*with_sums(frame))
    assert (got.codec, got.compression, got.raw_sizes) == ("json", (2, 0, 1), (1000, 70, 9))


def test_unknown_envelope_keys_from_a_newer_minor_version_are_ignored() -> None:
    main, side = with_sums(FRAME)
    data = bytearray(reforged(main, future_field=[1, 2, 3]))
    struct.pack_into("<H", data, 10, FORMAT_VERSION[1] + 1)
    assert_same_frame(parse(data, side), FRAME)


# -- hypothesis: with checksums, every flipped byte is caught or harmless -----------------


@st.composite
def frames_with_sums(draw: st.DrawFn) -> tuple[Frame, bytes, bytes]:
    frame = draw(frames())
    segments = len(frame.buffers) + 1
    tables = st.tuples(
        st.lists(st.integers(0, 255), min_size=segments, max_size=segments).map(tuple),
        st.lists(st.integers(0, 2**64 - 1), min_size=segments, max_size=segments).map(tuple),
    )
    compression, raw_sizes = draw(st.just(((), ())) | tables)
    codec = draw(st.sampled_from(["msgpack", "json", "my-codec"]))
    frame = dataclasses.replace(frame, codec=codec, compression=compression, raw_sizes=raw_sizes)
    main, side = with_sums(frame)
    return frame, main, side


def significant(data: bytes, ranges: list[tuple[int, int]]) -> np.ndarray:
    mask = np.zeros(len(data), bool)
    for start, end in ranges:
        mask[start:end] = True
    return mask


@settings(max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=frames_with_sums(),
    where=st.integers(0, 2**32),
    mask=st.integers(1, 255),
    in_side=st.booleans(),
)
def test_every_flip_is_caught_unless_it_is_padding(
    case: tuple[Frame, bytes, bytes], where: int, mask: int, in_side: bool
) -> None:
    frame, main, side = case
    part = 1 if in_side and side else 0
    data = [bytearray(main), bytearray(side)]
    pos = where % len(data[part])
    data[part][pos] ^= mask
    # What a reader checks: magic and major version (not the minor), the envelope
    # length, checksum and envelope, the sidecar's message id, and every segment.
    ranges: list[list[tuple[int, int]]] = [[(0, 10), (12, envelope_end(main))], [(0, 10), (16, 32)]]
    for p, start, end in segment_positions(main, side):
        ranges[p].append((start, end))
    matters = significant(bytes(data[part]), ranges[part])[pos]
    try:
        got = parse(data[0], data[1])
    except CorruptFrameError:
        assert matters, pos
    else:
        assert not matters, pos
        assert_same_frame(got, frame)
        assert (got.codec, got.compression, got.raw_sizes) == (
            frame.codec,
            frame.compression,
            frame.raw_sizes,
        )


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=frames_with_sums(), cut=st.integers(0, 2**32), in_side=st.booleans())
def test_every_truncation_with_checksums_is_caught(
    case: tuple[Frame, bytes, bytes], cut: int, in_side: bool
) -> None:
    _, main, side = case
    part = 1 if in_side and side else 0
    data = [main, side]
    data[part] = data[part][: cut % len(data[part])]
    with pytest.raises(CorruptFrameError):
        parse(data[0], data[1])


@pytest.mark.parametrize("bad", [0, 1, 17, 39])
def test_parallel_verification_names_the_damaged_segment(
    monkeypatch: pytest.MonkeyPatch, bad: int
) -> None:
    """A large message's segments are hashed by several threads, in groups: the
    mismatch found is still the right segment's, and an intact message passes."""
    monkeypatch.setattr(checksums, "PARALLEL_HASH_BYTES", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # three hashing threads
    segments = [memoryview(bytes([i]) * (1000 + 97 * i)) for i in range(40)]
    sums = struct.pack("<40Q", *(xxhash.xxh3_64_intdigest(s) for s in segments))
    assert run_sliced(checksum_segments(Frame(segments[0], tuple(segments[1:])))) == sums
    verify_segments(CHECKSUM, sums, segments, "here")
    damaged = list(segments)
    damaged[bad] = memoryview(b"\xff" + bytes(segments[bad][1:]))
    with pytest.raises(CorruptFrameError, match="does not match its checksum") as info:
        verify_segments(CHECKSUM, sums, damaged, "here")
    assert info.value.segment == bad


@pytest.mark.parametrize(("cores", "groups"), [(1, 1), (2, 1), (4, 3)])
def test_hashing_leaves_a_core_to_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, cores: int, groups: int
) -> None:
    """A large message's segments are hashed in a group per core but one, each group by
    a thread of its own: with every core hashing, a receiver's loop waited for a core."""
    monkeypatch.setattr(checksums, "PARALLEL_HASH_BYTES", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    hashed: list[int] = []  # the size of each group hashed
    hash_group = checksums._hashed

    def recording(segments: Any) -> list[int]:
        hashed.append(len(segments))
        return hash_group(segments)

    monkeypatch.setattr(checksums, "_hashed", recording)
    segments = [memoryview(bytes([i]) * (300_000 + i)) for i in range(12)]
    sums = struct.pack("<12Q", *(xxhash.xxh3_64_intdigest(s) for s in segments))
    verify_segments(CHECKSUM, sums, segments, "here")
    assert len(hashed) == groups and sum(hashed) == 12


@pytest.mark.parametrize("parallel_bytes", [0, 1 << 40])
def test_many_small_segments_are_hashed_in_order(
    monkeypatch: pytest.MonkeyPatch, parallel_bytes: int
) -> None:
    """A thousand small segments, hashed inline or in groups by several threads: every
    digest is still its own segment's, and a mismatch names the right one."""
    monkeypatch.setattr(checksums, "PARALLEL_HASH_BYTES", parallel_bytes)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    segments = [memoryview(i.to_bytes(2, "little") * (1 + i % 7)) for i in range(1000)]
    sums = struct.pack("<1000Q", *(xxhash.xxh3_64_intdigest(s) for s in segments))
    verify_segments(CHECKSUM, sums, segments, "here")
    damaged = list(segments)
    damaged[700] = memoryview(b"\xff" + bytes(segments[700][1:]))
    with pytest.raises(CorruptFrameError, match="buffer 699 ") as info:
        verify_segments(CHECKSUM, sums, damaged, "here")
    assert info.value.segment == 700
