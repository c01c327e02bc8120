"""A sender opened with ``on_existing="resume"`` on a finished ``ray://`` run leaves the
end of the stream until it makes something new visible (a step's or a part's commit, a
seal; ``finish()`` records its own), as the stored sinks do
(tests/transport/stored/test_resume_keeps_end.py): one that closes, or is killed,
without sending leaves the stream ended where it was, so receivers short of the end
still get ``EndOfStream`` and the next resume goes on at the end the run recorded, also
one far past the stored steps. The board's open deleted the end: those receivers waited
for ever, and the next resume went on right after the last stored step. Once the
resumed sender commits, a receiver past its new step waits for the next one."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from helpers import make_batch
from ray_cluster import spare

import rlwire

pytestmark = pytest.mark.anyio

FAR = 10**9
#: A call to an actor the test starts: the start itself took 10-30 s, and once more than
#: 60, under the loaded test command on 2 cores (as tests/transport/ray/test_ray.py).
ACTOR_CALL = 180.0


async def finished(url: str, steps: int) -> None:
    async with rlwire.open_sender(url) as sender:
        for _ in range(steps):
            await sender.send(make_batch(1))
        await sender.finish()


def resume(url: str) -> Any:
    return rlwire.open_sender(url, on_existing="resume")


def assert_ended(url: str, at: int) -> None:
    """A receiver at ``at`` (the end) raises EndOfStream at once, not a timeout."""
    with rlwire.open_receiver(url, start_step=at) as receiver:
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=5)


async def test_a_resumed_sender_that_sends_nothing_leaves_the_end(ray_url: str) -> None:
    await finished(ray_url, 3)
    async with resume(ray_url) as sender:
        assert sender.next_step == 3
    assert_ended(ray_url, 3)
    async with resume(ray_url) as sender:
        assert sender.next_step == 3
        assert await sender.send(make_batch(1)) == 3
        await sender.finish()
    assert_ended(ray_url, 4)


async def test_the_end_far_past_the_steps_outlives_a_resume_that_sends_nothing(
    ray_url: str,
) -> None:
    await finished(ray_url, 2)
    async with rlwire.open_sender(ray_url, on_existing="truncate", start_step=FAR) as sender:
        await sender.finish()
    for _ in range(2):
        async with resume(ray_url) as sender:
            assert sender.next_step == FAR  # the second one said 2: the end was gone
    assert_ended(ray_url, FAR)


def test_a_resumed_producer_killed_before_sending_leaves_the_end(ray_url: str) -> None:
    """A producer actor opens the finished run with ``"resume"`` and is killed (Ray's
    kill: its process ends) before it sends anything."""
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(make_batch(1))
        sender.send(make_batch(1))
        sender.finish()
    producer = spare("HeldProducer")  # started early: it is killed
    assert ray.get(producer.open.remote(ray_url, 1, "resume"), timeout=ACTOR_CALL) == 2
    ray.kill(producer)
    assert_ended(ray_url, 2)
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as sender:
        assert sender.next_step == 2


async def test_fields_appended_by_a_resumed_sender_leave_the_end(ray_url: str) -> None:
    """Fields appended to a stored step make no new step visible: the end stays, as
    on files and S3, where their commit deleted the end mark."""
    await finished(ray_url, 2)
    async with resume(ray_url) as sender:
        await sender.add_fields(1, {"values": [0.5]}, rank=0)
        assert_ended(ray_url, 2)
    assert_ended(ray_url, 2)
    with rlwire.open_receiver(ray_url, start_step=1) as receiver:
        assert receiver.receive(timeout=5).samples[0].extras["values"] == 0.5
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=5)
    async with resume(ray_url) as sender:
        assert sender.next_step == 2


async def test_a_receiver_past_the_first_new_step_waits_for_the_next(ray_url: str) -> None:
    """The end goes as the step becomes visible: a receiver that read it and asks for
    the next waits, as for any step not sent yet, and ends at the new end."""
    await finished(ray_url, 2)
    async with resume(ray_url) as sender:
        assert await sender.send(make_batch(1)) == 2
        with rlwire.open_receiver(ray_url, start_step=2) as receiver:
            assert receiver.receive(timeout=10) is not None
            with pytest.raises(rlwire.ReceiveTimeout):
                receiver.receive(timeout=0.3)
            await sender.finish()
            with pytest.raises(rlwire.EndOfStream):
                receiver.receive(timeout=10)


async def test_a_resumed_step_filled_part_by_part_reopens_the_stream_at_its_first_part(
    ray_url: str,
) -> None:
    await finished(ray_url, 1)
    async with resume(ray_url) as sender:
        async with sender.open_step(ranks=1) as writer:
            with rlwire.open_receiver(ray_url, start_step=1) as receiver:
                with pytest.raises(rlwire.EndOfStream):  # nothing new is visible yet
                    receiver.receive(timeout=5)
            await writer.put(make_batch(1).samples, key="a")
            with rlwire.open_receiver(ray_url, start_step=1) as receiver:
                with pytest.raises(rlwire.ReceiveTimeout):  # the step is open: no end
                    receiver.receive(timeout=0.3)
    with rlwire.open_receiver(ray_url, start_step=1) as receiver:
        assert [part.key for part in receiver.parts(timeout=10)] == ["a"]


async def test_a_resumed_empty_seal_reopens_the_stream(ray_url: str) -> None:
    """A step sealed with no parts is new too: the end goes with its seal."""
    await finished(ray_url, 1)
    async with resume(ray_url) as sender:
        async with sender.open_step(ranks=1):
            pass
        with rlwire.open_receiver(ray_url, start_step=2) as receiver:
            with pytest.raises(rlwire.ReceiveTimeout):
                receiver.receive(timeout=0.3)
