"""Consumption marks part by part on ray://, on a real local Ray cluster: the board
records each rank's position (step, next part) as its receiver moves through a step's
parts; a trainer actor killed mid-step is followed by one opened with ``resume=True``
that is handed the parts after the mark, none twice, none lost; ``max_ahead`` is
released once the slowest rank's parts() pass its last part."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import ray
from ray_actors import part_samples
from ray_mark_actors import PartTaker

import rlwire
from rlwire.testing import make_batch
from rlwire.transport.ray import create_board
from rlwire.transport.ray._board import board_name

TIMEOUT = 60.0


def _name(url: str) -> str:
    return url.removeprefix("ray://")


def position(url: str, rank: int = 0) -> tuple[int, int] | None:
    answer = ray.get(ray.get_actor(board_name(_name(url))).position.remote(rank), timeout=TIMEOUT)
    return None if answer is None else (answer[0], answer[1])


def resumed_at(url: str, rank: int = 0) -> tuple[int, int]:
    with rlwire.open_receiver(url, rank=rank, resume=True, record_consumed=False) as receiver:
        return receiver.next_step, receiver.next_part


def put(writer: Any, keys: list[int]) -> None:
    for key in keys:
        writer.put(part_samples(key), key=key)


def settles(check: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def dead(actor: Any) -> bool:
    try:
        ray.get(actor.seen.remote(), timeout=TIMEOUT)
    except ray.exceptions.RayActorError:
        return True
    return False


def test_the_board_records_the_part_mark(ray_url: str) -> None:
    with rlwire.open_sync_sender(ray_url) as sender:
        with sender.open_step() as writer:
            put(writer, [0, 1, 2])
        with rlwire.open_receiver(ray_url) as receiver:
            parts = receiver.parts(timeout=TIMEOUT)
            seen = []
            for _ in parts:
                seen.append(position(ray_url))
            seen.append(position(ray_url))
        assert seen == [None, (0, 1), (0, 2), (1, 0)]
        assert resumed_at(ray_url) == (1, 0)
    # An overwrite deletes the marks with the steps, part marks included.
    with rlwire.open_sync_sender(ray_url, on_existing="overwrite"):
        assert position(ray_url) is None
        assert ray.get(ray.get_actor(board_name(_name(ray_url))).steps.remote()) == []


@pytest.mark.long
def test_a_trainer_actor_killed_mid_step_is_resumed_at_the_next_part(ray_url: str) -> None:
    create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender:
        first = PartTaker.remote()
        ray.get(first.begin.remote(ray_url, 0, True), timeout=TIMEOUT)
        with sender.open_step() as writer:
            put(writer, [0, 1, 2])
            settles(lambda: len(ray.get(first.seen.remote(), timeout=TIMEOUT)[1]) == 3)
            settles(lambda: position(ray_url) == (0, 3))  # waiting for part 3
            ray.kill(first)  # its process, mid-step
            settles(lambda: dead(first))
            second = PartTaker.remote()
            ray.get(second.begin.remote(ray_url, 0, True), timeout=TIMEOUT)
            put(writer, [3, 4])
        with sender.open_step() as writer:
            put(writer, [5])
        sender.finish()
    settles(lambda: ray.get(second.seen.remote(), timeout=TIMEOUT)[2] is not None)
    start, keys, state = ray.get(second.seen.remote(), timeout=TIMEOUT)
    assert state == "ended" and start == (0, 3)
    assert keys == [(0, 3), (0, 4), (1, 5)]  # with the first's 0, 1, 2: each once
    assert position(ray_url) == (2, 0)
    ray.kill(second)


def test_max_ahead_is_released_as_parts_pass_the_last_part(ray_url: str) -> None:
    with (
        rlwire.open_sync_sender(ray_url, max_ahead=0) as sender,
        rlwire.open_receiver(ray_url) as receiver,
    ):
        with sender.open_step() as writer:
            put(writer, [0, 1])
        parts = receiver.parts(timeout=TIMEOUT)
        assert [next(parts).key, next(parts).key] == [0, 1]  # holds its last part
        opened = threading.Event()

        def next_step() -> None:
            with sender.open_step() as writer:
                opened.set()
                put(writer, [2])

        thread = threading.Thread(target=next_step)
        thread.start()
        try:
            assert not opened.wait(0.5)  # max_ahead=0: waits for rank 0 to pass step 0
            assert list(parts) == []  # asks past its last part
            assert opened.wait(TIMEOUT)
        finally:
            thread.join(TIMEOUT)
        assert [p.key for p in receiver.parts(timeout=TIMEOUT)] == [2]


def test_a_receiver_waiting_across_an_overwrite_writes_its_mark_again(ray_url: str) -> None:
    """As on files and S3 (tests/api/test_marks_rewrite.py): the overwrite deletes the
    board's marks while a receiver of the run before waits for step 4; it records its
    mark 4 again, so a new producer with ``max_ahead=1`` is not held at step 2 for
    ever, and the receiver gets the new run's step 4."""
    with rlwire.open_sync_sender(ray_url) as old:
        for step in range(4):
            old.send(make_batch(1, seed=step))
    with rlwire.open_receiver(ray_url) as receiver:
        for _ in range(4):
            receiver.receive(timeout=TIMEOUT)
        assert receiver.poll() is None and position(ray_url) == (4, 0)
        got: list[Any] = []
        waiting = threading.Thread(target=lambda: got.append(receiver.receive(timeout=TIMEOUT)))
        waiting.start()
        sent: list[int] = []

        def new_run() -> None:
            with rlwire.open_sync_sender(ray_url, on_existing="overwrite", max_ahead=1) as new:
                sent.extend(new.send(make_batch(1, seed=10 + step)) for step in range(5))

        sending = threading.Thread(target=new_run, daemon=True)  # held for ever: left
        sending.start()
        sending.join(TIMEOUT)
        waiting.join(TIMEOUT)
        assert sent == [0, 1, 2, 3, 4]
    assert receiver.last_step == 4
    want = make_batch(1, seed=14).samples[0].token_ids
    assert got[0].samples[0].token_ids.tobytes() == want.tobytes()
