"""``skip()`` of a step not sent yet (a trainer giving up on a late step): the rank's
mark never says it moved past a step the producer has not sent, so the producer's
sends with ``keep_last`` and ``max_ahead`` go on."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from helpers import make_batch

import rlwire
from rlwire.transport.layout import consumed_mark

pytestmark = pytest.mark.anyio

MARK = "consumed.rank-0000.rlw"


def stored_steps(path: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in path.glob("step-*.rank-0000.rlw"))


def tokens(step: int) -> bytes:
    return bytes(make_batch(1, 100, seed=step).samples[0].token_ids.tobytes())


def test_a_late_step_skipped_is_marked_once_a_later_step_is_read(tmp_path: Path) -> None:
    """Recorded at the next look, the mark said the rank moved past step 1 before step
    1 was sent, and every later send failed ("a mark left by another run?")."""
    with (
        rlwire.open_sync_sender(tmp_path, keep_last=2) as sender,
        rlwire.open_receiver(tmp_path) as receiver,
    ):
        sender.send(make_batch(1, 100, seed=0))
        receiver.receive(timeout=5)
        with pytest.raises(rlwire.ReceiveTimeout):
            receiver.receive(timeout=0.05)  # step 1 is late
        assert receiver.skip() == 1
        assert receiver.poll() is None
        assert (tmp_path / MARK).read_bytes() == consumed_mark(1)  # not past step 1 yet
        assert sender.send(make_batch(1, 100, seed=1)) == 1
        assert sender.send(make_batch(1, 100, seed=2)) == 2
        got = receiver.receive(timeout=5)
        assert receiver.last_step == 2 and got.samples[0].token_ids.tobytes() == tokens(2)
        assert (tmp_path / MARK).read_bytes() == consumed_mark(2)  # read step 2: past 1
        assert receiver.poll() is None
        assert (tmp_path / MARK).read_bytes() == consumed_mark(3)
        assert sender.send(make_batch(1, 100, seed=3)) == 3  # deletes the steps before 2
    assert stored_steps(tmp_path) == [2, 3]


async def test_a_late_step_skipped_holds_max_ahead_back_only_until_a_later_one_is_read(
    tmp_path: Path,
) -> None:
    """With ``max_ahead=1`` the producer sends the skipped step and the next, and goes
    on once the trainer reads that next one."""
    async with (
        rlwire.open_sender(tmp_path, keep_last=1, max_ahead=1) as sender,
        rlwire.open_receiver(tmp_path) as receiver,
    ):
        await sender.send(make_batch(1, 100, seed=0))
        await receiver.areceive(timeout=5)
        with pytest.raises(rlwire.ReceiveTimeout):
            await receiver.areceive(timeout=0.05)
        assert receiver.skip() == 1
        assert await receiver.await_next(timeout=0) is False  # looks for step 2
        with anyio.fail_after(10):
            for step in (1, 2):
                assert await sender.send(make_batch(1, 100, seed=step)) == step
            got = await receiver.areceive(timeout=5)
            assert receiver.last_step == 2 and got.samples[0].token_ids.tobytes() == tokens(2)
            assert await sender.send(make_batch(1, 100, seed=3)) == 3
            got = await receiver.areceive(timeout=5)
            assert got.samples[0].token_ids.tobytes() == tokens(3)
    assert (tmp_path / MARK).read_bytes() == consumed_mark(3)
    assert stored_steps(tmp_path) == [2, 3]


async def test_a_step_skipped_after_a_look_at_it_is_not_received(tmp_path: Path) -> None:
    """``skip()`` after ``wait_next()`` / ``await_next()`` found the step: the step the
    look read and kept for the next receive was returned all the same (labelled with
    its own step, which put ``next_step`` back), and by ``parts()`` as the step after."""
    async with rlwire.open_sender(tmp_path) as sender:
        for step in range(4):
            await sender.send(make_batch(1, 100, seed=step))
    with rlwire.open_receiver(tmp_path) as receiver:
        assert receiver.wait_next(timeout=5)
        assert receiver.skip() == 0
        got = receiver.receive(timeout=5)
        assert receiver.last_step == 1 and got.samples[0].token_ids.tobytes() == tokens(1)
        assert await receiver.await_next(timeout=5)
        assert receiver.skip() == 2
        [part] = list(receiver.parts(timeout=5))
        assert part.step == 3 and part.value.samples[0].token_ids.tobytes() == tokens(3)
        assert receiver.last_step == 3 and receiver.next_step == 4


def test_a_step_skipped_without_a_look_is_marked_only_once_it_is_sent(tmp_path: Path) -> None:
    """``skip()`` of a step the receiver never looked for (no ``ReceiveTimeout`` first):
    its next read said the rank moved past it though it was not sent, and the sender's
    next send failed ("a mark left by another run?"). A skipped step that was sent is
    passed at once, as before (a sender with ``max_ahead=0`` goes on)."""
    with (
        rlwire.open_sync_sender(tmp_path, keep_last=1, max_ahead=1) as sender,
        rlwire.open_receiver(tmp_path) as receiver,
    ):
        for step in range(2):
            sender.send(make_batch(1, 100, seed=step))
            receiver.receive(timeout=5)
        assert receiver.skip() == 2  # not sent yet, never looked for
        assert receiver.poll() is None
        assert (tmp_path / MARK).read_bytes() == consumed_mark(2)  # past step 1, not 2
        assert sender.send(make_batch(1, 100, seed=2)) == 2
        assert sender.send(make_batch(1, 100, seed=3)) == 3
        assert receiver.receive(timeout=5).samples[0].token_ids.tobytes() == tokens(3)
        assert (tmp_path / MARK).read_bytes() == consumed_mark(3)
        assert sender.send(make_batch(1, 100, seed=4)) == 4
        assert receiver.skip() == 4  # sent, never looked at
        assert receiver.poll() is None
        assert (tmp_path / MARK).read_bytes() == consumed_mark(5)
    assert stored_steps(tmp_path) == [3, 4]


def test_skip_on_a_closed_receiver_raises_and_moves_nothing(tmp_path: Path) -> None:
    """As every other method of a closed receiver: before, skip() moved it on and
    returned the step."""
    receiver = rlwire.open_receiver(tmp_path)
    receiver.close()
    with pytest.raises(rlwire.ClosedError):
        receiver.skip()
    assert receiver.next_step == 0
