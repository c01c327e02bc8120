"""A rank's marks after a rewrite: a producer restarted with ``overwrite`` (or
``truncate``) deletes the ranks' consumption marks while a receiver of the run before
waits at a later step. That receiver writes its mark again (at most about once a
second while it waits), so a new producer's ``max_ahead`` is not held at the new run's
first steps for ever by a rank that records nothing. Files and S3, asyncio and trio."""

from __future__ import annotations

import itertools
import time
from typing import Any

import anyio
import numpy as np
import pytest

import rlwire
from rlwire.transport.layout import StoredSource

pytestmark = pytest.mark.anyio

TIMEOUT = 30.0


def _samples(first: int) -> list[dict[str, Any]]:
    return [{"token_ids": np.arange(first, first + 4)}]


async def _fill(sender: rlwire.TrainingBatchSender[Any], first: int) -> None:
    """One step of two parts, their first token ids ``first`` and ``first + 1``."""
    async with sender.open_step() as writer:
        await writer.put(_samples(first), key="a")
        await writer.put(_samples(first + 1), key="b")


def _position(url: str, options: dict[str, Any]) -> tuple[int, int] | None:
    """Where the rank's marks say a resumed receiver starts; None: no mark at all."""
    with rlwire.open_receiver(
        url, storage_options=options, resume=True, record_consumed=False
    ) as receiver:
        at = receiver.next_step, receiver.next_part
    return None if at == (0, 0) else at


# Each case waits about a second for the receiver's look at its marks: each rewrite and
# each way of reading once, not every pair.
@pytest.mark.parametrize(("rewrite", "reads"), [("overwrite", "receive"), ("truncate", "parts")])
async def test_a_receiver_waiting_across_a_rewrite_does_not_hold_the_new_producer(
    file_or_s3: tuple[str, dict[str, Any]], rewrite: str, reads: str
) -> None:
    """The old run sent steps 0-3; the receiver read them and waits for step 4 (its
    mark says 4). A new producer opens with ``overwrite`` (from step 0) or ``truncate``
    (from step 2), which deletes the marks, and sends with ``max_ahead=1``: with the
    rank's mark gone it counted the rank at its first step, and waited for ever at
    its third step for a receiver that writes nothing until it moves. The receiver
    writes its mark 4 again, the producer sends up to step 4, and the receiver gets
    the new run's step 4 (a receiver reading on across a rewrite, as before)."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as old:
        for step in range(4):
            await _fill(old, step * 10)
    first = 0 if rewrite == "overwrite" else 2
    got: list[int] = []
    async with rlwire.open_receiver(url, storage_options=options, type=list) as receiver:
        for _ in range(4):
            await receiver.areceive(timeout=TIMEOUT)
        assert await receiver.await_next(timeout=0.01) is False  # asks for 4: its mark says 4
        assert await anyio.to_thread.run_sync(_position, url, options) == (4, 0)

        async def wait_for_step_4() -> None:
            if reads == "receive":
                batch = await receiver.areceive()  # (the test's deadline bounds it)
                got.extend(int(sample["token_ids"][0]) for sample in batch)
            else:
                got.extend([int(p.value[0]["token_ids"][0]) async for p in receiver.aparts()])

        with anyio.fail_after(2 * TIMEOUT):  # the receiver's wait, should the test fail
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(wait_for_step_4)
                start = {"start_step": first} if rewrite == "truncate" else {}
                async with rlwire.open_sender(
                    url, storage_options=options, on_existing=rewrite, max_ahead=1, **start
                ) as new:
                    with anyio.fail_after(TIMEOUT):  # it waited for ever
                        for step in range(first, 5):
                            await _fill(new, 100 + step * 10)
                    assert new.next_step == 5
        assert receiver.last_step == 4
    assert got == [140, 141]  # the new run's step 4, whole


def _open_step_1(url: str, options: dict[str, Any]) -> None:
    """Step 0 sealed, then parts ``a`` and ``b`` of step 1, left open (its producer
    stopped while filling it)."""
    sender = rlwire.open_sync_sender(url, storage_options=options)
    with sender.open_step() as writer:
        writer.put(_samples(0), key="x")
    writer = sender.open_step()
    writer.__enter__()
    writer.put(_samples(10), key="a")
    writer.put(_samples(11), key="b")
    sender.close()


async def test_a_receiver_waiting_for_a_part_writes_both_marks_again(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A receiver was handed parts ``a`` and ``b`` of step 1 and waits for the next
    (its rank's position: step 1, part 2). A ``truncate`` from step 2 keeps step 1 and
    deletes the marks. The receiver writes both again, as it recorded them (the
    consumption mark alone would say part 0: a receiver resumed would hand ``a`` and
    ``b`` out again); a producer resumed at step 1 finishes it, and a receiver resumed
    at the marks gets its last part only."""
    url, options = file_or_s3
    await anyio.to_thread.run_sync(_open_step_1, url, options)
    async with rlwire.open_receiver(url, storage_options=options, type=list) as receiver:
        await receiver.areceive(timeout=TIMEOUT)
        parts: Any = receiver.aparts()
        with anyio.fail_after(TIMEOUT):
            assert [(await parts.__anext__()).key for _ in range(2)] == ["a", "b"]
        async with anyio.create_task_group() as tasks:

            async def wait_for_part_2() -> None:
                with anyio.fail_after(2 * TIMEOUT):
                    await parts.__anext__()  # cancelled below: no part comes
                pytest.fail("step 1 got a part no producer put")

            tasks.start_soon(wait_for_part_2)
            await anyio.sleep(0.1)
            assert await anyio.to_thread.run_sync(_position, url, options) == (1, 2)
            truncated = rlwire.open_sync_sender(
                url, storage_options=options, start_step=2, on_existing="truncate"
            )
            truncated.close()
            began = time.monotonic()
            with anyio.fail_after(TIMEOUT):
                while await anyio.to_thread.run_sync(_position, url, options) != (1, 2):
                    await anyio.sleep(0.05)
            assert time.monotonic() - began < 10  # looked for at most every second
            tasks.cancel_scope.cancel()
        await parts.aclose()
    sender = rlwire.open_sync_sender(
        url, storage_options=options, start_step=1, on_existing="resume"
    )
    with sender.open_step(1) as writer:
        writer.put(_samples(12), key="c")
    sender.close()
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        with anyio.fail_after(TIMEOUT):
            assert [p.key async for p in receiver.aparts(timeout=TIMEOUT)] == ["c"]


async def test_a_waiting_receiver_looks_at_its_marks_at_most_every_second(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost of the looks: a receiver that waits 2.5 s for a step reads its rank's
    marks at most 3 times (the store's own calls, counted)."""
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await _fill(sender, 0)
    looks: list[float] = []
    read = StoredSource.read_consumption

    def counted(self: StoredSource) -> tuple[int, int] | None:
        looks.append(time.monotonic())
        return read(self)

    monkeypatch.setattr(StoredSource, "read_consumption", counted)
    async with rlwire.open_receiver(url, type=list) as receiver:
        await receiver.areceive(timeout=TIMEOUT)
        looks.clear()
        with pytest.raises(rlwire.ReceiveTimeout):
            await receiver.areceive(timeout=2.5)
    assert 1 <= len(looks) <= 3
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(looks))


def _fill_sync(sender: rlwire.SyncSender, first: int) -> None:
    """One step of parts ``a``, ``b``, ``c``, their first token ids from ``first``."""
    with sender.open_step() as writer:
        for k, key in enumerate("abc"):
            writer.put(_samples(first + k), key=key)


async def test_a_restart_from_a_checkpoint_as_a_truncate_deletes_the_marks_lowers_nothing(
    file_or_s3: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank's marks say step 3, part 2 (run A's parts ``a`` and ``b`` handed out);
    ``keep_last`` deleted steps 0-2. A trainer restarted from a checkpoint at step 1
    reads its rank's marks to lower them, and a producer's ``truncate`` from step 3
    (which deletes the marks) and its new run of step 3 come just after that read.
    The receiver read the run of the part mark in a second read: none (deleted), beside
    the position of the first, and its ``StepGapError`` (step 1 is gone) put back step
    3, part 2 with no run. A receiver resumed there took run B's step 3 as the run of
    the parts handed out and went on at B's part ``c``: B's ``a`` and ``b`` were never
    read, and one pass of the step held parts of two runs. The two reads now agree:
    here no marks, so nothing is lowered or put back."""
    url, options = file_or_s3

    def old_run() -> None:
        with rlwire.open_sync_sender(url, storage_options=options, keep_last=2) as sender:
            for step in range(4):
                _fill_sync(sender, step * 10)
            with rlwire.open_receiver(url, storage_options=options, type=list) as receiver:
                for _ in range(3):
                    receiver.receive(timeout=TIMEOUT)
                parts = receiver.parts(timeout=TIMEOUT)
                assert [next(parts).key for _ in range(3)] == ["a", "b", "c"]  # c held
            _fill_sync(sender, 40)  # step 4: deletes steps 0-2

    await anyio.to_thread.run_sync(old_run)
    assert await anyio.to_thread.run_sync(_position, url, options) == (3, 2)
    read = StoredSource.read_consumption

    def truncated_after_the_read(self: StoredSource) -> tuple[int, int] | None:
        found = read(self)
        monkeypatch.setattr(StoredSource, "read_consumption", read)
        with rlwire.open_sync_sender(
            url, storage_options=options, start_step=3, on_existing="truncate"
        ) as new:
            _fill_sync(new, 130)  # run B's step 3
        return found

    monkeypatch.setattr(StoredSource, "read_consumption", truncated_after_the_read)
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, start_step=1
    ) as restarted:
        with pytest.raises(rlwire.StepGapError, match="step 1"):
            await restarted.areceive(timeout=TIMEOUT)
    assert StoredSource.read_consumption is read  # the truncate ran
    handed: list[str | None] = []
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as resumed:
        try:
            with anyio.fail_after(TIMEOUT):
                handed.extend([p.key async for p in resumed.aparts(timeout=TIMEOUT)])
        except rlwire.StepGapError as exc:  # no marks: from step 0, deleted
            assert "step 0" in str(exc)
    assert handed == []  # never B's c alone
    assert await anyio.to_thread.run_sync(_position, url, options) is None  # as it left them
