"""Concurrency on ray://, on a real local Ray cluster: a second sender that opens the
destination while the first is in the middle of a step takes the step over, and the
first is told so with a StepExistsError at its commit (as the loser of two producers is
on every sink; its later calls are fenced: test_ray_fence.py); stages appending fields
to one step at once all commit (the board numbers them, in one call), one appending a
field another did gets a SchemaError; a receiver whose awaits are cancelled in a loop
keeps one wait on the board, not one per cancellation. asyncio and trio where the test is async."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import anyio
import pytest
import ray
from ray_actors import settles, step_batches

import rlwire
from rlwire import Frame
from rlwire.abc import PartInfo, PendingFrame, Seal, SinkOptions, Sliced, SourceOptions
from rlwire.aio import run_sliced
from rlwire.transport import parse_url
from rlwire.transport.ray import RaySink, RaySource, create_board
from rlwire.transport.ray._board import Board

TIMEOUT = 60.0

#: What the first sender's commit says once the second took its step over.
TAKEN = r"step {step} was taken over by another sender: it {did}"


def _sink(url: str) -> RaySink:
    return RaySink.from_url(parse_url(url), SinkOptions())


def _frame(header: bytes) -> Frame:
    return Frame(header, (memoryview(bytearray(64)),))


def _on_board(board: Any, look: Any) -> Any:
    """What ``look(board)`` says, run in the board actor (its state as it is)."""
    return ray.get(board.__ray_call__.remote(look), timeout=TIMEOUT)


@pytest.mark.parametrize("mode", ["resume", "overwrite", "truncate"])
@pytest.mark.parametrize("when", ["staged", "between its ranks"])
def test_a_second_sender_takes_over_the_step_the_first_is_sending(
    ray_url: str, mode: str, when: str
) -> None:
    """The first sender has staged step 1 (or its rank 0 of two) when a second opens the
    destination: the first's commit (or its next rank's stage) is a StepExistsError
    naming the step and the second's ``on_existing``, and the second's step 1 is what a
    receiver reads. Before, the first failed with a TransportError guessing at a
    restarted board."""
    board = create_board(ray_url.removeprefix("ray://"))
    first, second = _sink(ray_url), _sink(ray_url)
    first.open("error")
    run_sliced(first.stage(0, [_frame(b"first 0")])).commit()
    starts = 0 if mode == "overwrite" else 1

    def second_opens() -> None:
        assert second.open(mode, 1 if mode == "truncate" else None) == starts

    def then_second_opens() -> Sliced[Frame]:
        # rank 0 of the first's step 1 is on the board: the second opens now
        assert settles(lambda: _on_board(board, lambda b: len(b.staged)) == 1)
        second_opens()
        return _frame(b"first 1")
        yield

    ranks: list[PendingFrame] = [_frame(b"first 1"), _frame(b"first 1")]
    if when != "staged":
        ranks[1] = then_second_opens()
    taken = TAKEN.format(step=1, did=rf"opened the destination \(on_existing='{mode}'\)")
    with pytest.raises(rlwire.StepExistsError, match=taken):
        staged = run_sliced(first.stage(1, ranks))
        second_opens()
        staged.commit()
    for step in range(starts, 2):
        run_sliced(second.stage(step, [_frame(b"second %d" % step)])).commit()
    source = RaySource.from_url(parse_url(ray_url), SourceOptions())
    got = source.read(1)
    assert got is not None and bytes(got.header) == b"second 1"
    for done in (source, first, second):
        done.close()


def test_a_second_sender_takes_over_the_part_the_first_is_filling(ray_url: str) -> None:
    """The first fills step 0 part by part: part "b" staged when a second resumes the
    destination, part "c" staged after that (by a sender that names no epoch, as one of
    an rlwire before epochs: the board cannot fence it) but before the second resumes
    the step. Each of the first's commits is a StepExistsError saying which (a first
    that names its epoch is fenced at its stage of "c": test_ray_fence.py); the second's
    step is sealed with its own parts."""
    first, second = _sink(ray_url), _sink(ray_url)
    first.open("error")
    run_sliced(first.stage_part(0, PartInfo(0, 0, "a", 1.0), _frame(b"a"))).commit()
    b = run_sliced(first.stage_part(0, PartInfo(0, 1, "b", 1.0), _frame(b"b")))
    assert second.open("resume") == 0
    with pytest.raises(rlwire.ClosedError, match="another sender opened the destination"):
        run_sliced(first.stage_part(0, PartInfo(0, 1, "c", 1.0), _frame(b"c")))
    first._fence = ()  # an rlwire before epochs
    c = run_sliced(first.stage_part(0, PartInfo(0, 1, "c", 1.0), _frame(b"c")))
    assert second.committed_parts(0) == [PartInfo(0, 0, "a", 1.0)]
    opened = TAKEN.format(step=0, did=r"opened the destination \(on_existing='resume'\)")
    with pytest.raises(rlwire.StepExistsError, match=opened):
        b.commit()
    with pytest.raises(rlwire.StepExistsError, match=TAKEN.format(step=0, did="resumed the step")):
        c.commit()
    run_sliced(second.stage_part(0, PartInfo(0, 1, "d", 1.0), _frame(b"d"))).commit()
    second.seal(Seal(0, (("a", "d"),), ((1.0, 1.0),)))
    first.close()
    second.close()


def test_the_board_numbers_appended_messages_at_their_commit() -> None:
    """Messages of fields staged at once, each naming its fields: every one commits, in
    commit order, whatever the others did meanwhile (before, the second of two staged
    against the same count was refused, and add_fields gave up after 8 such tries); one
    holding a field another committed meanwhile is refused, saying which."""

    async def run() -> list[tuple[Any, ...]]:
        board = Board("ray://logic")
        await board.stage(0, "s", 0, None, False, ["main"], 1.0)
        await board.commit("s", 1)
        for key in "abc":
            await board.stage_fields(0, key, 0, None, False, [f"refs {key}"], 1.0)
        answers = [
            await board.commit_fields("a", 0, None, None, ["x"]),
            await board.commit_fields("b", 0, None, None, ["y", "z"]),
            await board.commit_fields("c", 0, None, None, ["w", "z"]),
        ]
        answers.append(await board.read_fields(0, 0))
        return answers

    *answers, fields = asyncio.run(run())
    assert answers[:2] == [("ok",), ("ok",)]
    assert answers[2] == (
        "appended",
        "field 'z' was appended to step 0 rank 0 already (by another stage, meanwhile)",
    )
    assert [refs[0] for refs in fields[1]] == ["refs a", "refs b"]


def test_stages_appending_to_one_step_at_once_all_commit(ray_url: str, ray_producer: Any) -> None:
    """Twenty stages in a producer actor append to rank 0 of one step at once (the board
    pulls each from the actor): all commit, but the one of two appending the same field
    that comes second, which gets a SchemaError naming it. Before, some stages gave up
    with StepExistsError after 8 tries."""
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(step_batches(0, 1)[0])
    names = [f"f{i}" for i in range(18)] + ["twice", "twice"]
    errors = ray.get(ray_producer.append_at_once.remote(ray_url, 0, names), timeout=TIMEOUT)
    assert len(errors) == 1, errors
    assert errors[0].startswith("twice: SchemaError") and "'twice' was appended" in errors[0]
    with rlwire.open_receiver(ray_url, as_columns=True) as receiver:
        got = receiver.receive(timeout=TIMEOUT).samples
    assert set(got.names) >= set(names)
    assert sorted(float(got[f"f{i}"][0]) for i in range(18)) == [float(i) for i in range(18)]


@pytest.mark.anyio
async def test_receives_cancelled_in_a_loop_keep_one_wait_on_the_board(ray_url: str) -> None:
    """Fifty receives, each cancelled 10 ms in (in its wait on the board): at most one
    wait stays on the board and no worker threads pile up, where each cancelled wait
    used to leave its thread and its board call for up to half a second (some forty of
    each here); the receiver then gets the next step as soon as it is sent."""
    board = create_board(ray_url.removeprefix("ray://"))
    async with rlwire.open_sender(ray_url) as sender:
        async with rlwire.open_receiver(ray_url) as receiver:
            with anyio.move_on_after(0.2):
                await receiver.areceive()  # the board has answered: it has started
            threads = threading.active_count()
            most = 0
            for _ in range(50):
                with anyio.move_on_after(0.01):
                    await receiver.areceive()
                most = max(most, threading.active_count())
            waits = _on_board(board, lambda b: len(b.changed._waiters))
            assert waits <= 1, waits
            assert most - threads <= 2, (threads, most)
            await sender.send(step_batches(0, 1)[0])
            with anyio.fail_after(5):
                await receiver.areceive()
