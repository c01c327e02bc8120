"""A rank's message as Ray objects and back: what ``ray.get`` returns is checked before
it becomes a Frame (no cluster needed: the objects are lists of buffers either way)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from rlwire import CorruptFrameError, Frame, UnsupportedVersionError
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.pieces import Pieces
from rlwire.aio import run_sliced
from rlwire.transport.ray._payload import Envelope, make_payload, parse_payload, runs_fit


def _frame() -> Frame:
    buffers = (
        memoryview(np.arange(10, dtype=np.int32)).cast("B"),
        memoryview(b"sidecar bytes"),
        memoryview(b""),
    )
    return Frame(b"header", buffers, sidecar=frozenset({1}), codec="msgpack")


def _stored(frame: Frame, *, checksum: bool = True) -> tuple[list[Any], list[Any] | None]:
    """What ray.get hands back for the objects of ``frame``: read-only views."""
    sums = run_sliced(checksum_segments(frame)) if checksum else None
    main, side = make_payload(frame, sums)
    views = [view.toreadonly() for view in main]
    return views, None if side is None else [view.toreadonly() for view in side]


def _parse(main: object, side: object, verify: bool = True) -> Frame:
    return parse_payload(main, side, verify=verify, writable=False, where="ray://t")


def test_round_trip_without_a_copy() -> None:
    frame = _frame()
    main, side = _stored(frame)
    got = _parse(main, side)
    assert bytes(got.header) == b"header"
    assert [bytes(b) for b in got.buffers] == [bytes(b) for b in frame.buffers]
    assert got.sidecar == frozenset({1}) and got.codec == "msgpack"
    assert got.buffers[0].obj is main[2].obj  # a view of what the store handed out
    assert got.stored_size == main[0].nbytes + frame.nbytes


def test_writable_copies() -> None:
    main, side = _stored(_frame())
    got = parse_payload(main, side, verify=True, writable=True, where="ray://t")
    assert not got.buffers[0].readonly


def test_a_changed_byte_fails_its_checksum() -> None:
    main, side = _stored(_frame())
    assert side is not None
    side[0] = memoryview(b"sidecar bytez")
    with pytest.raises(CorruptFrameError, match="buffer 1") as info:
        _parse(main, side)
    assert info.value.segment == 2
    _parse(main, side, verify=False)  # not checked when not asked


def test_a_damaged_sidecar_is_named() -> None:
    """A buffer of the sidecar object that fails its checksum, or is not the size the
    envelope gives, names the sidecar object, as the files and S3 name the sidecar file
    or object; the main object's own buffers name the message. Both named the message."""
    main, side = _stored(_frame())
    assert side is not None
    side[0] = memoryview(b"sidecar bytez")
    with pytest.raises(CorruptFrameError) as info:
        _parse(main, side)
    assert str(info.value).startswith(
        "ray://t sidecar object, segment 2: buffer 1 (13 bytes, in the sidecar) does not match"
    )
    side[0] = memoryview(b"sidecar byte")
    with pytest.raises(CorruptFrameError) as info:
        _parse(main, side)
    assert str(info.value) == (
        "ray://t sidecar object, segment 2: buffer 1 is 12 bytes, the envelope says 13"
    )
    main, side = _stored(_frame())
    main[2] = memoryview(bytes(40))
    with pytest.raises(CorruptFrameError) as info:
        _parse(main, side)
    assert str(info.value).startswith("ray://t, segment 1: buffer 0 (40 bytes) does not match")


def test_without_checksums_nothing_is_verified() -> None:
    main, side = _stored(_frame(), checksum=False)
    assert side is not None
    side[0] = memoryview(b"sidecar bytez")
    assert bytes(_parse(main, side).buffers[1]) == b"sidecar bytez"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m, s: ("not a list", s), "not a list of buffers"),
        (lambda m, s: ([m[0]], s), "at least 2"),
        (lambda m, s: ([*m, memoryview(b"x")], s), "the objects hold"),
        (lambda m, s: (m, None), "no sidecar object"),
        (lambda m, s: ([m[0], m[1], m[3], m[2]], s), "buffer 0 is 0 bytes"),
        (lambda m, s: ([memoryview(b"\xc1"), *m[1:]], s), "envelope cannot be read"),
        (lambda m, s: ([1, *m[1:]], s), "not a buffer"),
    ],
)
def test_garbled_objects_are_corrupt_frames(change: Any, match: str) -> None:
    main, side = _stored(_frame())
    with pytest.raises(CorruptFrameError, match=match):
        _parse(*change(main, side))


def test_an_unknown_envelope_version_is_refused() -> None:
    main, side = _stored(_frame())
    envelope = msgspec.msgpack.decode(main[0], type=Envelope)
    newer = msgspec.structs.replace(envelope, version=99)
    main[0] = memoryview(msgspec.msgpack.encode(newer))
    with pytest.raises(UnsupportedVersionError, match="envelope version 99"):
        _parse(main, side)


def test_sidecar_indices_out_of_range_are_corrupt() -> None:
    main, side = _stored(_frame())
    envelope = msgspec.msgpack.decode(main[0], type=Envelope)
    main[0] = memoryview(msgspec.msgpack.encode(msgspec.structs.replace(envelope, sidecar=(7,))))
    with pytest.raises(CorruptFrameError, match="sidecar indices"):
        _parse(main, side)


def _pieces_frame() -> tuple[Frame, bytes]:
    """A frame whose buffer 0 is the runs of three arrays (a column of per-sample rows):
    64-byte multiples but the last, one of them larger than Ray's threaded-copy size."""
    rows = [np.arange(n, dtype=np.uint8) for n in (1 << 18, (1 << 20) + (1 << 18), 5000)]
    pieces = Pieces(memoryview(r) for r in rows)
    return Frame(b"header", (pieces, memoryview(b"plain")), codec="msgpack"), b"".join(
        r.tobytes() for r in rows
    )


def test_runs_are_stored_one_value_each_and_read_as_one_buffer() -> None:
    frame, joined = _pieces_frame()
    assert runs_fit(frame.buffers[0])  # type: ignore[arg-type]
    main, side = _stored(frame)
    # envelope, header, the runs (the large one in 1 MiB values), the plain buffer
    assert [v.nbytes for v in main[2:]] == [1 << 18, 1 << 20, 1 << 18, 5000, 5]
    got = _parse(main, side)  # checksums verified over the buffer as a whole
    assert bytes(got.buffers[0]) == joined and bytes(got.buffers[1]) == b"plain"
    # Views of separate arrays do not lie back to back here: they are joined, read-only.
    assert got.buffers[0].readonly


def test_a_buffer_over_a_mib_is_stored_in_values_of_a_mib_and_read_as_one() -> None:
    """Ray copies a value over 1 MiB with threads of its own, which starve the sender's
    loop on a small machine: a packed column of 2.5 MiB goes in as 1 MiB values."""
    column = np.arange((5 << 20) // 16, dtype=np.int64)  # 2.5 MiB
    frame = Frame(b"header", (memoryview(column).cast("B"), memoryview(bytes(1 << 20))))
    main, side = _stored(frame)
    assert [v.nbytes for v in main[2:]] == [1 << 20, 1 << 20, 1 << 19, 1 << 20]
    got = _parse(main, side)  # checksums verified over each buffer as a whole
    assert np.array_equal(np.frombuffer(got.buffers[0], np.int64), column)
    assert bytes(got.buffers[1]) == bytes(1 << 20)


def test_runs_that_do_not_fit_are_refused_by_the_payload() -> None:
    odd = Pieces([memoryview(bytes(500_000)), memoryview(bytes(500_000))])  # not 64-byte multiples
    few = Pieces([memoryview(bytes(4096)), memoryview(bytes(4096))])  # too small for a value each
    assert not runs_fit(odd) and not runs_fit(few)
    with pytest.raises(TypeError, match="Pieces that fit"):
        make_payload(Frame(b"h", (odd,)), None)


def test_run_counts_that_do_not_fit_the_values_are_corrupt() -> None:
    main, side = _stored(_pieces_frame()[0])
    envelope = msgspec.msgpack.decode(main[0], type=Envelope)
    for runs, match in [((3,), "run counts"), ((0, 1), "run counts"), ((3, 1), "the objects hold")]:
        changed = msgspec.structs.replace(envelope, runs=runs)
        with pytest.raises(CorruptFrameError, match=match):
            _parse([memoryview(msgspec.msgpack.encode(changed)), *main[1:]], side)


def _on_board(frame: Frame) -> tuple[list[Any], list[Any] | None, bytes]:
    """The objects of ``frame`` with its checksums kept apart, as the board keeps them."""
    main, side = make_payload(frame, None, on_board=True)
    sums = run_sliced(checksum_segments(frame))
    return [v.toreadonly() for v in main], None if side is None else list(side), sums


def test_checksums_on_the_board_are_verified() -> None:
    main, side, sums = _on_board(_frame())
    assert msgspec.msgpack.decode(main[0], type=Envelope).checksums == b""
    got = parse_payload(main, side, verify=True, writable=False, where="ray://t", checksums=sums)
    assert bytes(got.buffers[1]) == b"sidecar bytes"
    assert side is not None
    side[0] = memoryview(b"sidecar bytez")
    with pytest.raises(CorruptFrameError, match="buffer 1"):
        parse_payload(main, side, verify=True, writable=False, where="ray://t", checksums=sums)


def test_checksums_said_to_be_on_the_board_must_be_given() -> None:
    main, side, sums = _on_board(_frame())
    with pytest.raises(CorruptFrameError, match="board holds the checksums"):
        _parse(main, side)
    with pytest.raises(CorruptFrameError, match="2 checksums for 4 segments"):
        parse_payload(main, side, verify=True, writable=False, where="ray://t", checksums=sums[:16])
