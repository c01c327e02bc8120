"""Pieces (rlwire._frame.pieces): runs of one buffer, merged when adjacent, hashed and
compressed as the joined bytes would be."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import xxhash
from depth import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import Compressor, Frame
from rlwire._core.slicing import run_sliced
from rlwire._frame import checksums
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.compression import compress, decompress
from rlwire._frame.frame import joined_pieces
from rlwire._frame.pieces import Pieces
from rlwire.abc import Pieces as PublicPieces

SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
KiB = 1 << 10


def view(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")


def independent(lengths: list[int], seed: int = 0) -> list[memoryview]:
    """One new array per run: nothing to merge."""
    rng = np.random.default_rng(seed)
    return [view(rng.integers(0, 256, n, dtype=np.uint8)) for n in lengths]


def joined(runs: list[memoryview]) -> bytes:
    return b"".join(bytes(r) for r in runs)


def test_the_face_exports_the_same_class() -> None:
    assert PublicPieces is Pieces
    assert Pieces.__module__ == "rlwire.abc"


def test_adjacent_views_of_one_array_become_one_run() -> None:
    values = np.arange(40, dtype=np.int64)
    runs = [view(values[0:5]), view(values[5:9]), view(values[9:20])]
    pieces = Pieces(runs)
    assert len(pieces.runs) == 1
    assert pieces.nbytes == 20 * 8
    assert bytes(pieces.runs[0]) == values[0:20].tobytes()
    assert pieces.runs[0].readonly


def test_a_gap_or_another_block_starts_a_new_run() -> None:
    values = np.arange(40, dtype=np.int64)
    other = np.arange(40, dtype=np.int64)
    runs = [
        view(values[0:5]),
        view(values[5:9]),  # adjacent: merged with the first
        view(values[10:12]),  # a gap of one element
        view(other[12:14]),  # another array at another address
        view(values[14:16]),  # back to the first block, not adjacent to `other`
        view(values[16:18]),  # adjacent to the one before: merged
        view(values[0:2]),  # the same block again, backwards
    ]
    pieces = Pieces(runs)
    assert [r.nbytes for r in pieces.runs] == [72, 16, 16, 32, 16]
    assert bytes(pieces.joined()) == joined(runs)


def test_adjacent_slices_of_bytes_a_bytearray_and_an_mmap_merge() -> None:
    data = bytes(range(100))
    whole = memoryview(data)
    assert len(Pieces([whole[0:10], whole[10:11], whole[11:50]]).runs) == 1
    buf = bytearray(range(50))
    assert len(Pieces([memoryview(buf)[:7], memoryview(buf)[7:]]).runs) == 1
    with mmap.mmap(-1, 4096) as m:
        m[:3] = b"xyz"
        pieces = Pieces([memoryview(m)[:1], memoryview(m)[1:3]])
        assert len(pieces.runs) == 1 and bytes(pieces.joined()) == b"xyz"
        del pieces  # let the mmap close


def test_views_of_views_of_one_array_merge_through_their_bases() -> None:
    block = np.arange(64, dtype=np.uint8)
    rows = block.reshape(8, 8)
    runs = [view(rows[0]), memoryview(view(rows[1])), view(rows[2][:4]), view(rows[2][4:])]
    pieces = Pieces(runs)
    assert len(pieces.runs) == 1
    assert bytes(pieces.joined()) == block[:24].tobytes()


def test_runs_over_a_block_that_is_not_c_contiguous_stay_as_they_are() -> None:
    block = np.asfortranarray(np.arange(16, dtype=np.uint8).reshape(4, 4))
    columns = [view(block[:, 0]), view(block[:, 1])]  # contiguous, back to back
    pieces = Pieces(columns)
    assert len(pieces.runs) == 2  # the block cannot be viewed as bytes: no merge
    assert bytes(pieces.joined()) == joined(columns)


def test_empty_runs_are_dropped_and_do_not_break_a_stretch() -> None:
    values = np.arange(10, dtype=np.uint8)
    pieces = Pieces([view(values[0:3]), memoryview(b""), view(values[3:3]), view(values[3:10])])
    assert len(pieces.runs) == 1 and pieces.nbytes == 10
    assert Pieces([]).nbytes == 0 and bytes(Pieces([]).joined()) == b""


@pytest.mark.parametrize(
    "bad",
    [
        memoryview(np.zeros((2, 2), np.uint8)),
        memoryview(np.zeros(3, np.int32)),
        memoryview(np.zeros(6, np.uint8))[::2],
    ],
    ids=["2-d", "int32", "strided"],
)
def test_a_run_that_is_not_flat_contiguous_bytes_is_refused(bad: memoryview) -> None:
    with pytest.raises(rlwire.ConfigError, match="flat, contiguous byte view, got format"):
        Pieces([bad])


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 300), max_size=40),
    cuts=st.lists(st.booleans(), max_size=40),
)
def test_merging_never_changes_the_bytes(lengths: list[int], cuts: list[bool]) -> None:
    """Runs cut from one block, some skipping a byte: the bytes are always the runs'."""
    block = np.random.default_rng(len(lengths)).integers(0, 256, sum(lengths) * 2 + 1, np.uint8)
    runs, at = [], 0
    for i, n in enumerate(lengths):
        at += 1 if i < len(cuts) and cuts[i] else 0
        runs.append(view(block[at : at + n]))
        at += n
    pieces = Pieces(runs)
    assert bytes(pieces.joined()) == joined(runs)
    assert pieces.nbytes == sum(lengths)
    gaps = sum(cuts[: len(lengths)])
    assert len(pieces.runs) <= gaps + 1


@SETTINGS
@given(lengths=st.lists(st.integers(0, 5000), max_size=30), header=st.binary(max_size=100))
def test_the_checksum_of_pieces_is_that_of_the_joined_bytes(
    lengths: list[int], header: bytes
) -> None:
    runs = independent(lengths, seed=len(lengths))
    data = joined(runs)
    frame = Frame(header, (Pieces(runs), memoryview(b"tail")))
    plain = Frame(header, (memoryview(data), memoryview(b"tail")))
    sums = run_sliced(checksum_segments(frame))
    assert sums == run_sliced(checksum_segments(plain))
    assert np.frombuffer(sums, "<u8")[1] == xxhash.xxh3_64_intdigest(data)


def test_pieces_are_hashed_in_chunks_across_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk smaller than the runs: each run is cut, and the hash is still the joined
    bytes'; the generator yields between chunks."""
    monkeypatch.setattr(checksums, "_CHECKSUM_CHUNK", 1000)
    runs = independent([2500, 1, 999, 3001], seed=3)
    big = memoryview(bytes(range(256)) * 20)  # a plain segment over the chunk, too
    frame = Frame(b"h", (Pieces(runs), big))
    slices = checksum_segments(frame)
    yields = 0
    while True:
        try:
            next(slices)
            yields += 1
        except StopIteration as stop:
            sums = np.frombuffer(stop.value, "<u8").tolist()
            break
    assert yields >= 6
    assert sums[1:] == [xxhash.xxh3_64_intdigest(joined(runs)), xxhash.xxh3_64_intdigest(big)]


def compressible_runs(count: int, size: int, seed: int = 0) -> list[memoryview]:
    rng = np.random.default_rng(seed)
    return [view(rng.integers(0, 4, size, dtype=np.uint8)) for _ in range(count)]


@pytest.mark.parametrize("algorithm", ["lz4", "zstd"])
def test_compressed_pieces_are_the_compressed_joined_bytes(algorithm: str) -> None:
    runs = compressible_runs(37, 10 * KiB + 3)
    small = compressible_runs(3, 30 * KiB)  # under 4 samples: tried whole
    frame = Frame(b"h" * 10, (Pieces(runs), Pieces(small), memoryview(b"x" * 100)))
    plain = Frame(
        b"h" * 10, (memoryview(joined(runs)), memoryview(joined(small)), frame.buffers[2])
    )
    out = compress(frame, Compressor(algorithm), threads=2)
    expected = compress(plain, Compressor(algorithm), threads=2)
    assert out.compression == expected.compression == (0, *(2 * [Compressor(algorithm).id]), 0)
    assert [bytes(b) for b in out.buffers] == [bytes(b) for b in expected.buffers]  # type: ignore[arg-type]
    assert [bytes(b) for b in decompress(out).buffers] == [  # type: ignore[arg-type]
        joined(runs),
        joined(small),
        b"x" * 100,
    ]


def test_pieces_that_do_not_compress_stay_pieces_uncopied() -> None:
    runs = independent([100 * KiB] * 5 + [7], seed=1)  # random bytes
    pieces = Pieces(runs)
    out = compress(Frame(b"h", (pieces,)), Compressor("zstd"))
    assert out.compression == () and out.buffers[0] is pieces


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 90 * KiB), min_size=1, max_size=12),
    noisy=st.lists(st.booleans(), min_size=1, max_size=12),
)
def test_the_decision_to_compress_is_the_joined_buffers(
    sizes: list[int], noisy: list[bool]
) -> None:
    """Runs of noise and of few values in any mix: whether a Pieces is kept compressed,
    and what it becomes, is what its joined bytes would get (the same middle sample)."""
    rng = np.random.default_rng(sum(sizes))
    runs = [
        view(rng.integers(0, 256 if noisy[i % len(noisy)] else 2, n, dtype=np.uint8))
        for i, n in enumerate(sizes)
    ]
    compressor = Compressor("lz4")
    out = compress(Frame(b"h", (Pieces(runs),)), compressor)
    expected = compress(Frame(b"h", (memoryview(joined(runs)),)), compressor)
    assert out.compression == expected.compression
    got = out.buffers[0]
    assert bytes(got.joined() if isinstance(got, Pieces) else got) == bytes(expected.buffers[0])  # type: ignore[arg-type]


def test_joined_pieces_turns_every_pieces_into_one_view() -> None:
    runs = independent([3, 2 << 20, 5], seed=2)  # over the 1 MiB of a plain copy
    frame = Frame(b"h", (memoryview(b"a"), Pieces(runs), Pieces(runs[:1])), frozenset({1}))
    out = run_sliced(joined_pieces(frame))
    assert all(isinstance(b, memoryview) for b in out.buffers)
    assert [bytes(b) for b in out.buffers] == [b"a", joined(runs), bytes(runs[0])]  # type: ignore[arg-type]
    assert out.sidecar == frame.sidecar and out.nbytes == frame.nbytes
    assert out.buffers[2] is runs[0]  # a single run is not copied
    plain = Frame(b"h", (memoryview(b"a"),))
    assert run_sliced(joined_pieces(plain)) is plain
    assert [bytes(b) for b in frame.views()] == [bytes(b) for b in out.buffers]  # type: ignore[arg-type]


def test_a_join_space_joins_every_message_into_the_same_warm_memory() -> None:
    """The second message's Pieces land where the first one's did (pages already
    faulted in); a larger one gets a larger block."""
    from rlwire._core.slicing import run_sliced
    from rlwire._frame.frame import Frame, JoinSpace

    space = JoinSpace()

    def join(*runs: bytes) -> memoryview:
        frame = Frame(b"h", (memoryview(b"x"), Pieces([memoryview(r) for r in runs])))
        joined = run_sliced(space.joined(frame))
        assert not any(isinstance(b, Pieces) for b in joined.buffers)
        assert bytes(joined.buffers[0]) == b"x" and joined.buffers[1].readonly
        return joined.buffers[1]

    first = join(b"ab", b"cd")
    address = np.frombuffer(first, np.uint8).ctypes.data
    second = join(b"ef", b"g")
    assert bytes(second) == b"efg" and np.frombuffer(second, np.uint8).ctypes.data == address
    assert bytes(join(b"0123456789")) == b"0123456789"
