"""Which board holds a run's steps. A receiver (or a StepHandle) reads one board: once
that board is gone, and every step with it, it fails with a TransportError, also when a
new run's sender has made a new board under the same name; it never reads that run's
steps as its own. A board a producer actor made itself dies with it, and its sender
says so (``board_owned`` is False)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
import ray
from ray_actors import Producer, fingerprint, step_batches

import rlwire
from rlwire import TransportError
from rlwire.transport.ray import RaySink, StepHandle, create_board, drop_board
from rlwire.transport.ray._actors import BOARD_START_SECONDS

TIMEOUT = 30.0


def _name(url: str) -> str:
    return url.removeprefix("ray://")


def _run(url: str, steps: int, n: int) -> list[StepHandle]:
    """A run on a new board under ``url``'s name: ``steps`` steps of one rank whose
    samples have about ``n`` tokens; the handle of each."""
    create_board(_name(url))
    with rlwire.open_sync_sender(url, on_existing="resume") as sender:
        sink = sender.sink
        assert isinstance(sink, RaySink)
        for step in range(steps):
            sender.send(step_batches(step, 1, n=n)[0])
        return [sink.handle(step) for step in range(steps)]


# The next board under the name starts a Ray worker process of its own: on a loaded
# machine the test took 68 s alone, and more than 120 s in a full run (in that board's
# first call). A sender gives a new board BOARD_START_SECONDS to answer; so does the test.
@pytest.mark.timeout(BOARD_START_SECONDS + 60)
def test_a_receiver_or_handle_whose_board_died_never_reads_the_next_board_under_its_name(
    ray_url: str,
) -> None:
    """One run's board dies and another run makes a new board under the name (a board
    is an actor: one death and one start serve both the receiver and the handles)."""
    old = _run(ray_url, 2, n=64)[1]
    assert old.board  # the sink's handles name their board
    with rlwire.open_receiver(ray_url) as receiver:
        for step in range(2):
            got = receiver.receive(timeout=TIMEOUT)
            assert fingerprint(got) == fingerprint(step_batches(step, 1, n=64)[0])
        drop_board(_name(ray_url))  # the board dies, and its steps
        with pytest.raises(TransportError):  # its call on the board that died
            receiver.receive(timeout=TIMEOUT)
        with pytest.raises(TransportError, match="is gone"):  # then: no board at all
            receiver.receive(timeout=TIMEOUT)
        with (
            rlwire.open_receiver(old.url, **old.receiver_options()) as by_handle,
            pytest.raises(TransportError, match="is gone"),
        ):
            by_handle.receive(timeout=TIMEOUT)
        new = _run(ray_url, 4, n=99)[1]  # another run, on a new board under the name
        assert new.board != old.board
        for _ in range(2):  # every time: no step of the new run as step 2 of the old
            with pytest.raises(TransportError, match="not the one this receiver reads"):
                receiver.receive(timeout=TIMEOUT)
    with (
        rlwire.open_receiver(old.url, **old.receiver_options()) as by_handle,
        pytest.raises(TransportError, match="not the one this receiver reads"),
    ):
        by_handle.receive(timeout=TIMEOUT)
    with rlwire.open_receiver(new.url, **new.receiver_options()) as by_handle:
        got = by_handle.receive(timeout=TIMEOUT)
    assert fingerprint(got) == fingerprint(step_batches(1, 1, n=99)[0])
    # A handle that names no board (made by hand) reads whichever board holds the name.
    unchecked = dataclasses.replace(old, board="")
    with rlwire.open_receiver(unchecked.url, **unchecked.receiver_options()) as by_handle:
        got = by_handle.receive(timeout=TIMEOUT)
    assert fingerprint(got) == fingerprint(step_batches(1, 1, n=99)[0])
    with rlwire.open_receiver(ray_url) as fresh:  # a new receiver reads the new run
        assert fingerprint(fresh.receive(timeout=TIMEOUT)) == fingerprint(
            step_batches(0, 1, n=99)[0]
        )


def test_the_board_option_must_be_a_board_id(ray_url: str) -> None:
    with pytest.raises(rlwire.ConfigError, match="storage option 'board'"):
        rlwire.open_receiver(ray_url, storage_options={"board": 7})


@pytest.mark.long
def test_a_board_the_producer_actor_made_itself_dies_with_it_and_its_sender_says_so(
    ray_cluster: None,
) -> None:
    ray_url = f"ray://own-{uuid.uuid4().hex[:12]}"  # no board under it (ray_url may have one)
    producer = Producer.remote()
    sent = ray.get(producer.send.remote(ray_url, 2, 1), timeout=60)  # no board before it
    assert sent["board_owned"] is False  # pulled by the board, but the board is its own
    with rlwire.open_receiver(ray_url) as receiver:
        got = receiver.receive(timeout=TIMEOUT)
        assert fingerprint(got) == fingerprint(step_batches(0, 1)[0])
        ray.kill(producer)  # the board goes with it (Ray's fate sharing), and step 1
        with pytest.raises(TransportError):
            for _ in range(3):  # a call on the dying board, then: no board
                receiver.receive(timeout=TIMEOUT)
    # Made by the driver first, the board outlives the producer: its sender says True.
    create_board(_name(ray_url))
    again = Producer.remote()
    assert ray.get(again.send.remote(ray_url, 1, 1), timeout=60)["board_owned"] is True
    ray.kill(again)
    drop_board(_name(ray_url))


def test_a_run_resumed_on_its_board_goes_on_to_more_ranks_then_fewer(ray_url: str) -> None:
    """The board commits a step for every rank at once, so each step it holds was sent
    to the ranks it has: a sender resumed after a step of two ranks sends the next to
    four, and one resumed after that to one; a rank left out gets StepGapError once the
    stream ends, not a wait."""
    create_board(_name(ray_url))
    widths = (2, 4, 1)  # step 0 to two ranks, step 1 to four, step 2 to one
    for step, width in enumerate(widths):
        with rlwire.open_sync_sender(ray_url, on_existing="resume") as sender:
            assert sender.next_step == step
            sender.send_ranks(step_batches(step, width))
    for step, width in enumerate(widths):
        with rlwire.open_receiver(ray_url, rank=width - 1, start_step=step) as receiver:
            got = receiver.receive(timeout=TIMEOUT)
            assert fingerprint(got) == fingerprint(step_batches(step, width)[width - 1])
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as sender:
        sender.finish()
    with rlwire.open_receiver(ray_url, rank=3, start_step=2) as left_out:
        with pytest.raises(rlwire.StepGapError, match="step 2"):
            left_out.receive(timeout=TIMEOUT)
