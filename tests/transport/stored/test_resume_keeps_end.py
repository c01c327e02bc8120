"""A sender opened with ``on_existing="resume"`` on a finished run leaves its end mark
until it makes something new visible (a step's or a part's commit, a seal; ``finish()``
writes its own): one that closes, or is killed, without sending leaves the stream ended
where it was, so receivers short of the end still get ``EndOfStream`` and the next
resume goes on at the end the run recorded, also one far past the stored steps. The
resumed open deleted the mark: those receivers waited for ever, and the next resume went
on right after the last stored step. Once the resumed sender commits, a receiver past
its new step waits for the next one. On files and S3, under asyncio and trio."""

from __future__ import annotations

import json
import sys
from typing import Any

import forked
import pytest
from helpers import make_batch

import rlwire

pytestmark = pytest.mark.anyio

FAR = 10**9

#: A resumed sender killed (SIGKILL) right after it opened, before sending anything.
KILLED = """
import json, os, signal, sys, rlwire
options = json.loads(sys.argv[2])
sender = rlwire.open_sync_sender(sys.argv[1], on_existing="resume", storage_options=options)
print(sender.next_step, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


async def finished(url: str, options: dict[str, Any], steps: int) -> None:
    async with rlwire.open_sender(url, storage_options=options) as sender:
        for _ in range(steps):
            await sender.send(make_batch(1))
        await sender.finish()


def resume(url: str, options: dict[str, Any]) -> Any:
    return rlwire.open_sender(url, on_existing="resume", storage_options=options)


def assert_ended(url: str, options: dict[str, Any], at: int) -> None:
    """A receiver at ``at`` (the end) raises EndOfStream at once, not a timeout."""
    with rlwire.open_receiver(url, start_step=at, storage_options=options) as receiver:
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=5)


async def test_a_resumed_sender_that_sends_nothing_leaves_the_end(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    await finished(url, options, 3)
    async with resume(url, options) as sender:
        assert sender.next_step == 3
    assert_ended(url, options, 3)
    async with resume(url, options) as sender:
        assert sender.next_step == 3
        assert await sender.send(make_batch(1)) == 3
        await sender.finish()
    assert_ended(url, options, 4)


async def test_the_end_far_past_the_steps_outlives_a_resume_that_sends_nothing(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    await finished(url, options, 2)
    async with rlwire.open_sender(
        url, on_existing="truncate", start_step=FAR, storage_options=options
    ) as sender:
        await sender.finish()
    for _ in range(2):
        async with resume(url, options) as sender:
            assert sender.next_step == FAR  # the second one said 2: the mark was gone
    assert_ended(url, options, FAR)


async def test_a_resumed_sender_killed_before_sending_leaves_the_end(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    await finished(url, options, 2)
    done = forked.run(
        [sys.executable, "-c", KILLED, url, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr
    assert int(done.stdout) == 2
    assert_ended(url, options, 2)
    async with resume(url, options) as sender:
        assert sender.next_step == 2


async def test_a_receiver_past_the_first_new_step_waits_for_the_next(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """The mark goes before the step is visible: a receiver that read it and asks for
    the next waits, as for any step not sent yet, and ends at the new end."""
    url, options = file_or_s3
    await finished(url, options, 2)
    async with resume(url, options) as sender:
        assert await sender.send(make_batch(1)) == 2
        with rlwire.open_receiver(url, start_step=2, storage_options=options) as receiver:
            assert receiver.receive(timeout=10) is not None
            with pytest.raises(rlwire.ReceiveTimeout):
                receiver.receive(timeout=0.3)
            await sender.finish()
            with pytest.raises(rlwire.EndOfStream):
                receiver.receive(timeout=10)


async def test_a_resumed_step_filled_part_by_part_reopens_the_stream_at_its_first_part(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    await finished(url, options, 1)
    async with resume(url, options) as sender:
        async with sender.open_step(ranks=1) as writer:
            with rlwire.open_receiver(url, start_step=1, storage_options=options) as receiver:
                with pytest.raises(rlwire.EndOfStream):  # nothing new is visible yet
                    receiver.receive(timeout=5)
            await writer.put(make_batch(1).samples, key="a")
            with rlwire.open_receiver(url, start_step=1, storage_options=options) as receiver:
                with pytest.raises(rlwire.ReceiveTimeout):  # the step is open: no end
                    receiver.receive(timeout=0.3)
    with rlwire.open_receiver(url, start_step=1, storage_options=options) as receiver:
        assert [part.key for part in receiver.parts(timeout=10)] == ["a"]


async def test_fields_appended_by_a_resumed_sender_leave_the_end(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """Fields appended to a stored step make no new step visible: the end stays, and a
    receiver at it still ends. The commit of the fields deleted the mark, so once the
    resumed sender closed without sending, receivers at the end waited for ever."""
    url, options = file_or_s3
    await finished(url, options, 2)
    async with resume(url, options) as sender:
        await sender.add_fields(1, {"values": [0.5]}, rank=0)
        assert_ended(url, options, 2)
    assert_ended(url, options, 2)
    with rlwire.open_receiver(url, start_step=1, storage_options=options) as receiver:
        assert receiver.receive(timeout=5).samples[0].extras["values"] == 0.5
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=5)
    async with resume(url, options) as sender:
        assert sender.next_step == 2
