"""A receiver stopped part way through a step filled part by part, then resumed
(``resume=True``) after a producer restarted with ``overwrite`` sent the step again:
its rank's part mark names the run of the parts it moved past (format 1.6), so the
resumed receiver never goes on with the later parts of another run. Files and S3,
asyncio and trio."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import rlwire
from rlwire.abc import PartInfo
from rlwire.transport import FileSink, FileSource
from rlwire.transport.layout import StoredSource

pytestmark = pytest.mark.anyio

#: A part mark as docs/format.md ("Marks") lays it out: magic, major and minor
#: version, the step, the next part; then, since 1.6, the run (part 0's id).
_HEAD = struct.Struct("<4sHHQQ")


def _fill(
    url: str, options: dict[str, Any], first: int, parts: int = 3, sealed: bool | None = None
) -> None:
    """Step 0 of ``parts`` parts of one sample each, the first token ids ``first``,
    ``first + 1``, ...; ``first`` other than 0 is another run (overwrite). Fewer than
    3 parts leave the step open (not sealed), as a producer still filling it, unless
    ``sealed``."""
    sender = rlwire.open_sync_sender(
        url, storage_options=options, on_existing="overwrite" if first else "error"
    )
    writer = sender.open_step()
    writer.__enter__()
    for k in range(parts):
        writer.put([{"token_ids": np.arange(first + k, first + k + 4)}], key=f"k{k}")
    if parts == 3 if sealed is None else sealed:
        writer.__exit__(None, None, None)
    sender.close()


async def _stop_after_part_0(url: str, options: dict[str, Any], meanwhile: Any = None) -> None:
    """A receiver that was handed part 0 and asked for part 1 (so its rank's marks say
    it moved past part 0), then stopped. ``meanwhile()`` runs between the two: a
    producer's ``overwrite`` removes the rank's marks, so a step sent again is one the
    receiver read while it ran; it refuses part 1 of the new run, as a receiver killed
    there would not."""
    async with rlwire.open_receiver(url, storage_options=options, type=list) as receiver:
        parts: Any = receiver.aparts(timeout=10)
        with anyio.fail_after(30):
            assert (await parts.__anext__()).index == 0
            if meanwhile is None:
                await parts.__anext__()
            else:
                await anyio.to_thread.run_sync(meanwhile)
                with pytest.raises(rlwire.StepGapError):
                    await parts.__anext__()
        await parts.aclose()


async def test_a_receiver_resumed_after_the_step_was_sent_again_refuses_its_later_parts(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """Part 0 of run A was consumed before the receiver stopped; run B replaced the
    step, sealed and whole. Going on at part 1 would hand out B's parts 1 and 2 after
    A's part 0, one step of two runs: the resumed receiver refuses at once."""
    url, options = file_or_s3
    _fill(url, options, 0)
    await _stop_after_part_0(url, options, lambda: _fill(url, options, 100))
    handed: list[int] = []
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        assert receiver.next_part == 1
        with (
            anyio.fail_after(30),
            pytest.raises(rlwire.StepGapError, match="sent again") as caught,
        ):
            async for part in receiver.aparts(timeout=10):
                handed.append(int(part.value[0]["token_ids"][0]))
        assert receiver.next_step == 0
    # The place named is the part refused, not the step's whole-step file (none here).
    assert caught.value.where is not None
    assert caught.value.where.endswith("step-00000000.rank-0000.part-000001.rlw")
    assert handed == []  # never 101 after the 0 consumed before the stop
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        with anyio.fail_after(30):
            got = [int(p.value[0]["token_ids"][0]) async for p in receiver.aparts(timeout=10)]
    assert got == [100, 101, 102]  # a receiver opened at the step reads the new run


async def test_a_receiver_resumed_while_the_new_run_is_filled_never_waits_for_its_parts(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """Run B holds only part 0 so far (its producer still filling the step): the
    resumed receiver, waiting for part 1, finds the rank's part 0 is not the one its
    mark names, and refuses instead of waiting for B's part 1."""
    url, options = file_or_s3
    _fill(url, options, 0)
    await _stop_after_part_0(url, options, lambda: _fill(url, options, 100, parts=1))
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        with (
            anyio.fail_after(30),
            pytest.raises(rlwire.StepGapError, match="no longer the one") as caught,
        ):
            async for _ in receiver.aparts(timeout=10):
                pass
    assert caught.value.where is not None
    assert caught.value.where.endswith("step-00000000.rank-0000.part-000000.rlw")


async def test_a_receiver_resumed_on_the_same_run_goes_on(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    _fill(url, options, 0)
    await _stop_after_part_0(url, options)
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        with anyio.fail_after(30):
            got = [int(p.value[0]["token_ids"][0]) async for p in receiver.aparts(timeout=10)]
        assert receiver.next_step == 1
    assert got == [1, 2]


@pytest.mark.parametrize("sealed_before", [True, False], ids=["sealed-first", "sealed-after"])
async def test_a_receiver_resumed_as_the_step_is_sent_again_never_ends_it_at_the_new_seal(
    file_or_s3: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, sealed_before: bool
) -> None:
    """Part 0 of run A (whose producer died before sealing) was handed out; a resumed
    receiver reads its rank's position (part 1 of run A), and a producer's
    ``overwrite`` deletes the marks and the step before the receiver has read the run
    its part mark names. Run B seals the step with one part (before or after the
    receiver is made): ending at that seal would make A's part 0 the whole step (the
    readers campaign's one wrong data on S3). The receiver goes by marks that agree,
    here none: it starts over, at B's part 0."""
    url, options = file_or_s3
    _fill(url, options, 0, parts=2)
    await _stop_after_part_0(url, options)
    read = StoredSource.read_consumption

    def overwritten_after_the_read(self: StoredSource) -> tuple[int, int] | None:
        found = read(self)
        monkeypatch.setattr(StoredSource, "read_consumption", read)
        if sealed_before:
            _fill(url, options, 100, parts=1, sealed=True)
        else:
            rlwire.open_sync_sender(url, storage_options=options, on_existing="overwrite").close()
        return found

    monkeypatch.setattr(StoredSource, "read_consumption", overwritten_after_the_read)
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        if not sealed_before:
            await anyio.to_thread.run_sync(_fill, url, options, 100, 1, True)
        with anyio.fail_after(30):
            got = [int(p.value[0]["token_ids"][0]) async for p in receiver.aparts(timeout=10)]
        assert receiver.next_step == 1
    assert got == [100]  # B's step whole: never its seal after A's part 0


def test_the_part_mark_names_the_run_of_part_0(tmp_path: Any) -> None:
    """What the receiver wrote is the id of the part 0 it was handed (its message id)."""
    url = str(tmp_path / "run")
    _fill(url, {}, 0)
    with rlwire.open_receiver(url, type=list) as receiver:
        parts = iter(receiver.parts(timeout=10))
        run = next(parts).message_id
        next(parts)
    data = (tmp_path / "run" / "consumed.rank-0000.part.rlw").read_bytes()
    assert _HEAD.unpack_from(data) == (b"RLWP", 1, 6, 0, 1)
    assert data[_HEAD.size :] == run
    assert len(run) == 16


async def test_a_part_mark_without_a_run_is_read_as_before(tmp_path: Any) -> None:
    """A part mark of format 1.2 (24 bytes, no run, as a receiver before 1.6 wrote
    it): the resumed receiver goes by the part 0 stored now, as before."""
    url = str(tmp_path / "run")
    _fill(url, {}, 0)
    await _stop_after_part_0(url, {}, lambda: _fill(url, {}, 100))
    mark = tmp_path / "run" / "consumed.rank-0000.part.rlw"
    assert len(mark.read_bytes()) == 40
    mark.write_bytes(_HEAD.pack(b"RLWP", 1, 2, 0, 1))
    async with rlwire.open_receiver(url, type=list, resume=True) as receiver:
        with anyio.fail_after(30):
            got = [int(p.value[0]["token_ids"][0]) async for p in receiver.aparts(timeout=10)]
    assert got == [101, 102]  # what it did before 1.6: it cannot tell


def test_a_garbled_part_mark_names_itself(tmp_path: Any) -> None:
    url = str(tmp_path / "run")
    _fill(url, {}, 0)
    with rlwire.open_receiver(url, type=list) as receiver:
        parts = iter(receiver.parts(timeout=10))
        next(parts)
        next(parts)
    mark = tmp_path / "run" / "consumed.rank-0000.part.rlw"
    data = mark.read_bytes()
    assert len(data) == 40
    for garbled, what in [
        (data[:6] + (2).to_bytes(2, "little") + data[8:], "of version 1.2 is 24 bytes"),
        (data[:10], "is 24 to 4096 bytes, this one 10"),
        (data + bytes(4096), "this one 4136"),
    ]:
        mark.write_bytes(garbled)
        with pytest.raises(rlwire.CorruptFrameError, match=what) as caught:
            rlwire.open_receiver(url, type=list, resume=True)
        assert "consumed.rank-0000.part.rlw" in str(caught.value)


def test_a_plugin_source_written_before_runs_is_called_as_before() -> None:
    """A source overriding ``mark_part(step, next_part)`` (before the run was passed)
    is still called by the receiver, which passes ``of``: the base wraps it."""
    calls: list[tuple[int, int]] = []

    class OldSource(FileSource):
        def mark_part(self, step: int, next_part: int) -> None:  # type: ignore[override]
            calls.append((step, next_part))

    OldSource.mark_part(object(), 3, 2, b"run")  # type: ignore[arg-type]
    assert calls == [(3, 2)]


def test_a_plugin_sink_written_before_ranks_were_checked_is_called_as_before(
    tmp_path: Path,
) -> None:
    """A sink overriding ``committed_parts(step)`` (before the step writer passed its
    ranks) is still called by the step writer, which passes ``ranks``: the base wraps
    it."""
    calls: list[int] = []

    class OldSink(FileSink):
        def committed_parts(self, step: int) -> list[PartInfo]:  # type: ignore[override]
            calls.append(step)
            return []

    assert OldSink(tmp_path).committed_parts(3, 2) == []
    assert calls == [3]
