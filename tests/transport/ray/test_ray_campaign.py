"""ray:// against what an adversarial campaign tried: values another client puts on a
board, handles kept across a new run on the same board."""

from __future__ import annotations

import pytest
import ray

import rlwire
from rlwire import CorruptFrameError
from rlwire.testing import make_sample
from rlwire.transport.ray import create_board

TIMEOUT = 30.0


def _name(url: str) -> str:
    return url.removeprefix("ray://")


def test_values_another_client_puts_on_the_board_are_typed_errors(ray_url: str) -> None:
    board = create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender, sender.open_step(0) as writer:
        writer.put([make_sample(8)], key="a")
    _, (main, _), _, _ = ray.get(board.read_part.remote(0, 0, 0), timeout=TIMEOUT)
    # A whole step whose objects are not object references, one whose checksums are no
    # bytes, a part whose cost is a string, a seal that lists a string for a cost.
    ray.get(board.stage.remote(1, "k1", 0, None, False, [1], 1.0), timeout=TIMEOUT)
    ray.get(board.commit.remote("k1", 1, None), timeout=TIMEOUT)
    ray.get(board.stage.remote(2, "k2", 0, None, False, [main], 1.0), timeout=TIMEOUT)
    ray.get(board.commit.remote("k2", 1, [7]), timeout=TIMEOUT)
    for step, cost, key in ((3, "x", "a"), (4, 1.0, "a"), (5, 1.0, None)):
        ray.get(board.stage_part.remote(step, f"p{step}", 0, 0, None, False, [main], 1.0))
        ray.get(board.commit_part.remote(f"p{step}", 0, 0, key, cost), timeout=TIMEOUT)
    ray.get(board.seal.remote(4, [["a"]], [["zz"]]), timeout=TIMEOUT)
    expected = {
        1: "not object references",
        2: "checksums, not bytes",
        3: "cost, not a number",
        4: "malformed seal",
        5: "a part's key",
    }
    for step, says in expected.items():
        with rlwire.open_receiver(ray_url, start_step=step) as receiver:
            with pytest.raises(CorruptFrameError, match=says) as caught:
                if step <= 2:
                    receiver.receive(timeout=TIMEOUT)
                else:
                    list(receiver.parts(timeout=TIMEOUT))
        assert f"step {step}" in str(caught.value)
