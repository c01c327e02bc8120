"""The stored files of a step filled part by part: part names, the part's envelope, the
seal, where a resuming sender starts, and what a killed commit leaves."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
import xxhash

from rlwire import CorruptFrameError, Frame, StepExistsError, UnsupportedVersionError
from rlwire._core.slicing import run_sliced
from rlwire.transport import FileSink, FileSource
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport._stored.layout import parse_main
from rlwire.transport._stored.names import (
    LEFTOVER_RE,
    names_to_delete,
    part_name,
    part_sidecar_name,
    seal_name,
    start_step,
)
from rlwire.transport._stored.parts import parse_seal, seal_bytes
from rlwire.transport._stored.retention import steps_to_prune

SEAL = Seal(step=4, keys=(("a", 7), ()), costs=((3.0, 5.0), ()))


def put(sink: FileSink, step: int, part: PartInfo, *, sidecar: bool = False) -> None:
    frame = Frame(b"header", (memoryview(b"x" * 100),), frozenset({0} if sidecar else ()))
    staged = run_sliced(sink.stage_part(step, part, frame))
    staged.commit()


def test_a_part_is_a_message_under_its_own_name_with_its_key(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    put(sink, 4, PartInfo(rank=1, index=0, key="a", cost=3.0), sidecar=True)
    assert sorted(os.listdir(tmp_path)) == [part_name(4, 1, 0), part_sidecar_name(4, 1, 0)]
    data = (tmp_path / part_name(4, 1, 0)).read_bytes()
    assert struct.unpack_from("<HH", data, 8) == (1, 2)  # parts say version 1.2
    source = FileSource(tmp_path, rank=1)
    info, frame = source.read_part(4, 0) or pytest.fail("part 0 not visible")
    assert info == PartInfo(rank=1, index=0, key="a", cost=3.0)
    assert bytes(frame.header) == b"header" and bytes(frame.buffers[0]) == b"x" * 100
    assert source.read_part(4, 1) is None and source.read_seal(4) is None
    with pytest.raises(CorruptFrameError, match="holds part 0, not a whole step"):
        parse_main(
            memoryview(data), step=4, rank=1, load_sidecar=lambda _: memoryview(b""), where="p"
        )
    os.rename(tmp_path / part_name(4, 1, 0), tmp_path / part_name(4, 1, 1))
    with pytest.raises(CorruptFrameError, match="holds part 0 of rank 1, expected part 1"):
        source.read_part(4, 1)


def test_whole_steps_say_version_1_8_and_record_their_ranks(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    run_sliced(sink.stage(0, [Frame(b"h"), Frame(b"i")])).commit()
    data = (tmp_path / "step-00000000.rank-0001.rlw").read_bytes()
    assert struct.unpack_from("<HH", data, 8) == (1, 8)
    assert data[24] == 0x80 | 12  # a fixmap: the envelope's 15 fields, 12 of them written
    assert sink.sent_to(0, 1) == 2


def test_the_seal_round_trips_and_refuses_corruption() -> None:
    data = seal_bytes(SEAL)
    assert data[:4] == b"RLWS" and struct.unpack_from("<HH", data, 4) == (1, 2)
    assert parse_seal(data, step=4, where="s") == SEAL
    with pytest.raises(CorruptFrameError, match="seal of step 4, expected 5"):
        parse_seal(data, step=5, where="s")
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(CorruptFrameError, match="checksum"):
        parse_seal(flipped, step=4, where="s")
    with pytest.raises(CorruptFrameError, match=r"truncated|says its body"):
        parse_seal(data[:-1], step=4, where="s")
    future = bytearray(data)
    future[4:6] = (2).to_bytes(2, "little")
    with pytest.raises(UnsupportedVersionError):
        parse_seal(future, step=4, where="s")
    twice = seal_bytes(Seal(step=4, keys=(("a",), ("a",)), costs=((1.0,), (1.0,))))
    with pytest.raises(CorruptFrameError, match="twice"):
        parse_seal(twice, step=4, where="s")
    body = b"\x83\xa4step\x04\xa4keys\x91\x91\xa1a\xa5costs\x90"  # one key, no cost
    bad = b"RLWS" + struct.pack("<HHIQ", 1, 2, len(body), xxhash.xxh3_64_intdigest(body)) + body
    with pytest.raises(CorruptFrameError, match="disagree"):
        parse_seal(bad, step=4, where="s")


def test_sealing_twice_is_refused(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    sink.seal(SEAL)
    with pytest.raises(StepExistsError, match="sealed already"):
        sink.seal(SEAL)
    assert FileSource(tmp_path, rank=0).read_seal(4) == SEAL


def test_a_seal_written_since_the_check_is_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two producers sealing one step at once, both past the check that no seal is
    there: the later one's write refuses to replace the seal (a StepExistsError), which
    stays the first one's. The first read the fence before the second opened (the
    window the fence leaves), so it seals too."""
    first, second = FileSink(tmp_path), FileSink(tmp_path)
    first.open("error")
    second.open("resume")
    monkeypatch.setattr(first.fence, "check", lambda what: None)  # read before the open
    monkeypatch.setattr(second, "existing", lambda names: [])  # checked before the first
    other = Seal(step=4, keys=(("b",),), costs=((2.0,),))
    first.seal(SEAL)
    with pytest.raises(StepExistsError, match="sealed already"):
        second.seal(other)
    assert FileSource(tmp_path, rank=0).read_seal(4) == SEAL
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_committed_parts_removes_a_killed_commits_sidecar(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    sink.open("error")
    put(sink, 2, PartInfo(rank=0, index=0, key="a", cost=1.0), sidecar=True)
    # A commit killed between its sidecar's move and its main file's.
    shutil.copy(tmp_path / part_sidecar_name(2, 0, 0), tmp_path / part_sidecar_name(2, 0, 1))
    assert sink.committed_parts(2) == [PartInfo(rank=0, index=0, key="a", cost=1.0)]
    assert not (tmp_path / part_sidecar_name(2, 0, 1)).exists()
    put(sink, 2, PartInfo(rank=0, index=1, key="b", cost=1.0), sidecar=True)  # index 1 free
    os.remove(tmp_path / part_name(2, 0, 0))
    with pytest.raises(CorruptFrameError, match="part 0 of rank 0 is missing"):
        sink.committed_parts(2)
    sink.seal(Seal(step=2, keys=(("a", "b"),), costs=((1.0, 1.0),)))
    with pytest.raises(StepExistsError, match="sealed already"):
        sink.committed_parts(2)


def names(*steps: str) -> list[str]:
    """Stored names: ``"3w"`` step 3 whole (ranks 0, 1), ``"3p"`` parts of step 3,
    ``"3s"`` parts and seal."""
    out = []
    for spec in steps:
        step, kind = int(spec[:-1]), spec[-1]
        if kind == "w":
            out += [f"step-{step:08d}.rank-0000.rlw", f"step-{step:08d}.rank-0001.rlw"]
        else:
            out += [part_name(step, 0, 0), part_sidecar_name(step, 0, 0), part_name(step, 1, 0)]
        if kind == "s":
            out.append(seal_name(step))
    return out


@pytest.mark.parametrize(
    ("stored", "first", "expected"),
    [
        (["0w", "1s", "2w"], None, 3),  # a sealed step is a whole step
        (["0w", "1s", "2p"], None, 2),  # the open step is finished
        (["0w", "1p"], 1, 1),
        (["0p", "1w", "2s"], None, 3),  # the oldest, partly pruned (its seal went first)
    ],
)
def test_resume_starts_at_an_open_step(stored: list[str], first: int | None, expected: int) -> None:
    assert start_step("d", names(*stored), "resume", first) == expected


@pytest.mark.parametrize(
    ("stored", "first", "problem"),
    [
        (["0w", "1p", "2w"], None, "step 1 was filled part by part and never sealed"),
        (["0w", "1p"], 2, "step 1 was being filled part by part and is not sealed"),
        (["0w", "2s"], None, "step 1 is missing"),
    ],
)
def test_resume_refuses_an_open_step_it_would_leave(
    stored: list[str], first: int | None, problem: str
) -> None:
    with pytest.raises(StepExistsError, match=problem):
        start_step("d", names(*stored), "resume", first)


def test_error_mode_refuses_parts_and_seals() -> None:
    with pytest.raises(StepExistsError, match="step 0"):
        start_step("d", names("0p"), "error")


def test_deletion_takes_a_steps_seal_first_and_its_sidecars_last() -> None:
    stored = names("0w", "1s")
    batches = names_to_delete(stored, "overwrite")
    assert batches[0] == [seal_name(1), part_name(1, 0, 0), part_name(1, 1, 0)]
    assert batches[-1] == [part_sidecar_name(1, 0, 0)]
    pruned = steps_to_prune(stored, 2)
    assert pruned[1] == [
        [seal_name(1)],
        [part_name(1, 0, 0), part_name(1, 1, 0)],
        [part_sidecar_name(1, 0, 0)],
    ]


def test_leftovers_of_parts_and_seals_are_cleaned() -> None:
    assert LEFTOVER_RE.fullmatch(f".{part_name(1, 0, 3)}.0a1b.tmp")
    assert LEFTOVER_RE.fullmatch(f".{part_sidecar_name(1, 0, 3)}.0a1b.tmp")
    assert LEFTOVER_RE.fullmatch(f".{seal_name(1)}.0a1b.tmp")
    assert not LEFTOVER_RE.fullmatch(part_name(1, 0, 3))
