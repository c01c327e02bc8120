"""A step filled part by part, deleted and sent again (another run: a producer restarted
with ``overwrite``) while a receiver reads it: never parts of two runs as one step.
``parts()`` refuses the first part of the new run with a ``StepGapError``; a ``receive``
of the sealed step reads it again and gets the new run's, whole. Files and S3 (each
later part names the part 0 it follows, format 1.6); asyncio and trio."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import numpy as np
import pytest

import rlwire
from rlwire.transport import FileSource

pytestmark = pytest.mark.anyio


def _fill(url: str, options: dict[str, Any], first: int) -> None:
    """Step 0 of three parts of one sample each, the first token ids ``first``,
    ``first + 1``, ``first + 2``; ``first`` other than 0 is another run (overwrite)."""
    with rlwire.open_sync_sender(
        url, storage_options=options, on_existing="overwrite" if first else "error"
    ) as sender:
        with sender.open_step() as writer:
            for k in range(3):
                writer.put([{"token_ids": np.arange(first + k, first + k + 4)}], key=f"k{k}")


async def _handed_out_until_refused(
    url: str, options: dict[str, Any], at: int, another_run: Any, match: str = "sent again"
) -> list[int]:
    """The first token id of each part a receiver handed out before it refused the
    next with StepGapError (``match``); ``another_run()`` runs once part ``at`` is
    handed out. The receiver stays at the step."""
    firsts = []
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        with anyio.fail_after(30), pytest.raises(rlwire.StepGapError, match=match):
            async for part in receiver.aparts(timeout=10):
                firsts.append(int(part.value[0]["token_ids"][0]))
                if part.index == at:
                    await anyio.to_thread.run_sync(another_run)
        assert receiver.next_step == 0
    return firsts


async def test_parts_of_a_step_sent_again_midway_are_refused(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    _fill(url, options, 0)
    firsts = await _handed_out_until_refused(url, options, 0, lambda: _fill(url, options, 100))
    assert firsts == [0]  # never 101 beside 0
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        with anyio.fail_after(30):
            got = await receiver.areceive(timeout=10)
    assert [int(s["token_ids"][0]) for s in got] == [100, 101, 102]


def test_a_receive_of_a_sealed_step_sent_again_midway_reads_it_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other run lands between the reads of part 0 and part 1 (forced: the files'
    read_part runs it once, after part 0): the receive returns the new run's step."""
    url = str(tmp_path / "run")
    _fill(url, {}, 0)
    read_part = FileSource.read_part
    once = threading.Event()

    def then_another_run(self: FileSource, step: int, index: int) -> Any:
        got = read_part(self, step, index)
        if index == 0 and not once.is_set():
            once.set()
            _fill(url, {}, 100)
        return got

    monkeypatch.setattr(FileSource, "read_part", then_another_run)
    with rlwire.open_receiver(url, type=list, record_consumed=False) as receiver:
        got = receiver.receive(timeout=10)
    assert once.is_set()
    assert [int(s["token_ids"][0]) for s in got] == [100, 101, 102]


def _fill_keys(url: str, first: int, keys: list[str]) -> None:
    """Step 0 sent again (overwrite) in parts ``keys``, the first token ids from ``first``."""
    with rlwire.open_sync_sender(url, on_existing="overwrite") as sender:
        with sender.open_step() as writer:
            for k, key in enumerate(keys):
                writer.put([{"token_ids": np.arange(first + k, first + k + 4)}], key=key)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (["j0", "j1", "j2"], [100, 101, 102]),  # other keys: was a CorruptFrameError
        (["k0", "k1", "k2", "k3"], [100, 101, 102, 103]),  # one more: was its first three
        (["k0", "k1"], [100, 101]),  # one fewer: was a CorruptFrameError
    ],
)
def test_a_receive_of_a_step_sent_again_right_after_its_seal_was_read_reads_it_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, keys: list[str], expected: list[int]
) -> None:
    """The other run, sealed, lands between the reads of the seal and of part 0: every
    part read is of the new run, the seal read of the earlier one. The receive reads the
    step again, and returns the new run's parts, all of them."""
    url = str(tmp_path / "run")
    _fill(url, {}, 0)  # keys k0, k1, k2
    read_seal = FileSource.read_seal
    once = threading.Event()

    def then_another_run(self: FileSource, step: int) -> Any:
        got = read_seal(self, step)
        if got is not None and not once.is_set():
            once.set()
            _fill_keys(url, 100, keys)
        return got

    monkeypatch.setattr(FileSource, "read_seal", then_another_run)
    with rlwire.open_receiver(url, type=list, record_consumed=False) as receiver:
        got = receiver.receive(timeout=10)
    assert once.is_set()
    assert [int(s["token_ids"][0]) for s in got] == expected


async def test_a_receiver_resumed_part_way_through_a_step_refuses_a_part_of_another_run(
    tmp_path: Any,
) -> None:
    """A receiver opened with resume=True at part 1 never read part 0: the part 0 its
    first part names is the one the later parts must follow."""
    url = str(tmp_path / "run")
    _fill(url, {}, 0)
    async with rlwire.open_receiver(url, type=list) as receiver:
        parts = receiver.aparts(timeout=10)
        with anyio.fail_after(30):
            assert (await parts.__anext__()).index == 0
            await parts.__anext__()  # asking for part 1 marks part 0 consumed
        await parts.aclose()
    firsts = []
    async with rlwire.open_receiver(url, type=list, resume=True) as receiver:
        assert receiver.next_part == 1
        with anyio.fail_after(30), pytest.raises(rlwire.StepGapError, match="sent again"):
            async for part in receiver.aparts(timeout=10):
                firsts.append(int(part.value[0]["token_ids"][0]))
                await anyio.to_thread.run_sync(_fill, url, {}, 100)
    assert firsts == [1]  # never 102 after 1


def _fill_unsealed(url: str, options: dict[str, Any]) -> None:
    """Step 0's parts k0 and k1, the producer dying before the seal."""
    sender = rlwire.open_sync_sender(url, storage_options=options)
    writer = sender.open_step()
    writer.__enter__()
    for k in range(2):
        writer.put([{"token_ids": np.arange(k, k + 4)}], key=f"k{k}")
    sender.close()  # the step stays open: no seal


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
async def test_a_seal_of_another_run_never_ends_the_parts_read(
    file_or_s3: tuple[str, dict[str, Any]], sealed: bool
) -> None:
    """The receiver went through parts of one run (an open step a dead producer left,
    or a sealed one of three parts); another run, sent and sealed meanwhile, has as
    many parts or fewer, so no part of it is read: its seal must not end the step as
    if the parts handed out were all of it, nor call one of them missing."""
    url, options = file_or_s3
    if sealed:
        _fill(url, options, 0)
    else:
        _fill_unsealed(url, options)
    firsts = await _handed_out_until_refused(
        url,
        options,
        0 if sealed else 1,
        lambda: _fill_other(url, options, 1 if sealed else 2),
        "its seal is of",
    )
    assert firsts == ([0] if sealed else [0, 1])


def _fill_other(url: str, options: dict[str, Any], parts: int) -> None:
    with rlwire.open_sync_sender(url, storage_options=options, on_existing="overwrite") as sender:
        with sender.open_step() as writer:
            for k in range(parts):
                writer.put([{"token_ids": np.arange(100 + k, 104 + k)}], key=f"k{k}")


def _fill_as(url: str, options: dict[str, Any], how: str) -> None:
    """Step 0 sent again (overwrite) with no part for rank 0: an empty step, all its
    parts put to rank 1, or sent whole."""
    with rlwire.open_sync_sender(url, storage_options=options, on_existing="overwrite") as sender:
        if how == "whole":
            sender.send([{"token_ids": np.arange(100, 104)}])
            return
        with sender.open_step(ranks=2) as writer:
            if how == "rank1":
                for k in range(3):
                    writer.put([{"token_ids": np.arange(100 + k, 104 + k)}], key=f"k{k}", rank=1)


@pytest.mark.parametrize("how", ["empty", "rank1", "whole"])
async def test_another_run_with_no_part_for_the_rank_never_ends_the_parts_read(
    file_or_s3: tuple[str, dict[str, Any]], how: str
) -> None:
    """The receiver took part 0 of three; the other run gives its rank no part (sealed
    with none for it, or sent whole): its seal must not end the step after the one part
    (it did: the check found no part 0 and passed), nor the receiver wait for a part 1
    that never comes (it did, until the timeout: forever without one)."""
    url, options = file_or_s3
    _fill(url, options, 0)
    firsts = await _handed_out_until_refused(url, options, 0, lambda: _fill_as(url, options, how))
    assert firsts == [0]


def test_a_step_peeked_whole_then_sent_again_in_parts_is_not_received_after_them(
    tmp_path: Any,
) -> None:
    """wait_next() read step 0, sent whole; another run sent it in parts, which parts()
    yields: the step read by wait_next() is not returned by the next receive() (it was,
    as if it were the step after)."""
    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url) as sender:
        sender.send([{"token_ids": np.arange(0, 4)}])
    with rlwire.open_receiver(url, type=list, record_consumed=False) as receiver:
        assert receiver.wait_next(timeout=10)
        _fill(url, {}, 100)
        with rlwire.open_sync_sender(url, on_existing="resume") as sender:
            sender.send([{"token_ids": np.arange(7, 11)}])
        got = [int(part.value[0]["token_ids"][0]) for part in receiver.parts(timeout=10)]
        assert got == [100, 101, 102]
        after = receiver.receive(timeout=10)
        assert (receiver.last_step, int(after[0]["token_ids"][0])) == (1, 7)


def _fill_sidecar(url: str, first: int) -> None:
    """Step 0 of three parts whose token ids travel in sidecars; ``first`` other than 0
    is another run (overwrite)."""
    with rlwire.open_sync_sender(
        url, sidecar=("token_ids",), on_existing="overwrite" if first else "error"
    ) as sender:
        with sender.open_step() as writer:
            for k in range(3):
                writer.put([{"token_ids": np.arange(first + k, first + k + 4)}], key=f"k{k}")


@pytest.mark.parametrize("how", ["parts", "receive"])
def test_a_step_sent_again_between_a_parts_main_file_and_sidecar_is_no_corrupt_frame(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The other run lands between the loads of part 1's main file and its sidecar
    (forced): the sidecar is the new run's. That was a CorruptFrameError ("a stale
    sidecar from an earlier run?"); the part is read again: parts() refuses the new
    run's part 1, a receive returns the new run's step."""
    url = str(tmp_path / "run")
    _fill_sidecar(url, 0)
    load = FileSource.load
    once = threading.Event()

    def then_another_run(self: FileSource, name: str, **options: Any) -> Any:
        got = load(self, name, **options)
        if name.endswith("part-000001.rlw") and not once.is_set():
            once.set()
            _fill_sidecar(url, 100)
        return got

    monkeypatch.setattr(FileSource, "load", then_another_run)
    with rlwire.open_receiver(url, type=list, record_consumed=False) as receiver:
        if how == "parts":
            firsts = []
            with pytest.raises(rlwire.StepGapError, match="sent again"):
                for part in receiver.parts(timeout=10):
                    firsts.append(int(part.value[0]["token_ids"][0]))
            assert firsts == [0]
        else:
            got = receiver.receive(timeout=10)
            assert [int(s["token_ids"][0]) for s in got] == [100, 101, 102]
    assert once.is_set()


def test_a_source_that_cannot_tell_the_run_checks_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Source.first_part`` is None by default (a plugin's source that stores parts
    and does not say which run is there): its parts end at their seal as before."""
    url = str(tmp_path / "run")
    _fill(url, {}, 0)
    monkeypatch.setattr(FileSource, "first_part", lambda self, step: None)
    with rlwire.open_receiver(url, type=list, record_consumed=False) as receiver:
        got = [int(p.value[0]["token_ids"][0]) for p in receiver.parts(timeout=10)]
        assert receiver.next_step == 1
    assert got == [0, 1, 2]


async def test_a_receiver_resumed_part_way_through_refuses_a_seal_of_another_run(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """Opened with resume=True at part 1 (part 0 handed out by its earlier process);
    before it reads anything, another run seals the step with one part: the receiver
    never takes that seal as the end of the step (it read no part of the new run)."""
    url, options = file_or_s3
    _fill(url, options, 0)
    async with rlwire.open_receiver(url, storage_options=options, type=list) as receiver:
        parts: Any = receiver.aparts(timeout=10)
        with anyio.fail_after(30):
            assert (await parts.__anext__()).index == 0
            await parts.__anext__()  # asking for part 1 marks part 0 consumed
        await parts.aclose()
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        assert receiver.next_part == 1
        await anyio.to_thread.run_sync(_fill_other, url, options, 1)
        with anyio.fail_after(30), pytest.raises(rlwire.StepGapError, match="its seal is of"):
            async for _ in receiver.aparts(timeout=10):
                pass
        assert receiver.next_step == 0
