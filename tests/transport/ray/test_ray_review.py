"""ray:// against what a fourth adversarial review tried: two producers of one step,
pull_timeouts no thread can wait for, the end of a stream over a killed producer's open
step, handles of steps deleted and not sent again."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import pytest
import ray

import rlwire
from rlwire import EndOfStream, Frame, StepExistsError, StepOrderError, TransportError
from rlwire.abc import SinkOptions
from rlwire.aio import run_sliced
from rlwire.testing import make_batch, make_sample
from rlwire.transport import parse_url
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport.ray import RaySink, create_board

TIMEOUT = 30.0


def _frame() -> Frame:
    return Frame(b"header", (memoryview(bytearray(64)),))


def test_the_second_producer_to_commit_a_step_gets_step_exists(ray_url: str) -> None:
    """Two producers staged one step (a whole one; a part of one filled part by part):
    the first commits (seals), and the second's commit is a StepExistsError, as on every
    sink, not a TransportError saying the board no longer holds what it staged. The
    first names no epoch, as a sender of an rlwire before epochs does: the board cannot
    fence it (one that names its epoch is fenced once the second opened:
    test_ray_fence.py)."""
    first, second = (RaySink.from_url(parse_url(ray_url), SinkOptions()) for _ in range(2))
    assert first.open("error") == second.open("error") == 0
    first._fence = ()  # an rlwire before epochs
    mine, theirs = (run_sliced(sink.stage(0, [_frame()])) for sink in (first, second))
    mine.commit()
    with pytest.raises(StepExistsError, match="step 0 was committed by another sender"):
        theirs.commit()
    part = PartInfo(rank=0, index=0, key="a", cost=1.0)
    mine = run_sliced(first.stage_part(1, part, _frame()))
    theirs = run_sliced(second.stage_part(1, replace(part, key="b"), _frame()))
    mine.commit()
    first.seal(Seal(step=1, keys=(("a",),), costs=((1.0,),)))
    with pytest.raises(StepExistsError, match="step 1 is sealed already"):
        theirs.commit()
    for sink in (first, second):
        sink.close()


def test_a_pull_timeout_no_thread_can_wait_for_is_no_limit(ray_url: str, ray_producer: Any) -> None:
    """A sender in an actor waits pull_timeout (and the board's 10 s) for the board's
    answer: one beyond what a thread can wait for (inf; 1e10 s) was Python's
    OverflowError at every send. A NaN, which gave up at once, is a ConfigError."""
    create_board(ray_url.removeprefix("ray://"))  # the driver's: the board owns the steps
    for step, timeout in enumerate((math.inf, 1e10)):
        options = {"pull_timeout": timeout}
        sent = ray.get(ray_producer.send.remote(ray_url, 1, 1, options=options), timeout=60)
        assert sent["board_owned"] is True
        assert sent["handles"][0][0].step == step
    with pytest.raises(rlwire.ConfigError, match="pull_timeout"):
        rlwire.open_sender(ray_url, storage_options={"pull_timeout": math.nan})


def test_the_end_is_not_marked_at_a_step_a_killed_producer_left_open(ray_url: str) -> None:
    """As on every stored sink: the end of the stream at a step left open part by part
    (its producer killed) is a StepOrderError naming the repair. It was marked, and a
    receiver going through the step's parts waited for ever for the rest of them."""
    killed = rlwire.open_sync_sender(ray_url)
    writer = killed.open_step()
    writer.__enter__()
    writer.put([make_sample(8, seed=1)], key="a")
    killed.close()  # no seal
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as restarted:
        with pytest.raises(StepOrderError, match="step 0 is open part by part"):
            restarted.finish()
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as restarted:
        with restarted.open_step(0) as writer:  # the repair the error names
            writer.put([make_sample(8, seed=2)], key="b")
        restarted.finish()
    with rlwire.open_receiver(ray_url) as receiver:
        assert [part.key for part in receiver.parts(timeout=TIMEOUT)] == ["a", "b"]
        with pytest.raises(EndOfStream):
            receiver.receive(timeout=TIMEOUT)


def test_a_handle_of_a_step_deleted_since_fails_and_does_not_wait(ray_url: str) -> None:
    """A handle is made once its step is committed: a receiver that does not find its
    step (a whole one, or one filled part by part) after an overwrite raises a
    TransportError at once. It waited for ever, until the new run sent the step again."""
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(make_batch(1, n=4, seed=0))
        sender.send(make_batch(1, n=4, seed=1))
        with sender.open_step() as writer:
            writer.put([make_sample(8)], key="a")
        handles = [sender.sink.handle(1), sender.sink.handle(2)]  # type: ignore[attr-defined]
    with rlwire.open_sync_sender(ray_url, on_existing="overwrite") as again:
        again.send(make_batch(1, n=4, seed=5))  # another run, at step 0 yet
    for handle in handles:
        for read in ("receive", "parts"):
            started = time.monotonic()
            with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
                with pytest.raises(TransportError, match="StepHandle names was deleted"):
                    if read == "receive":
                        receiver.receive(timeout=TIMEOUT)
                    else:
                        list(receiver.parts(timeout=TIMEOUT))
            assert time.monotonic() - started < TIMEOUT / 2
