"""ray:// against what a fourth adversarial review tried: two producers of one step,
pull_timeouts no thread can wait for."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import ray

import rlwire
from rlwire import Frame, StepExistsError
from rlwire.abc import SinkOptions
from rlwire.aio import run_sliced
from rlwire.transport import parse_url
from rlwire.transport._parts import PartInfo, Seal
from rlwire.transport.ray import RaySink


def _frame() -> Frame:
    return Frame(b"header", (memoryview(bytearray(64)),))


def test_the_second_producer_to_commit_a_step_gets_step_exists(ray_url: str) -> None:
    """Two producers staged one step (a whole one; a part of one filled part by part):
    the first commits (seals), and the second's commit is a StepExistsError, as on every
    sink, not a TransportError saying the board no longer holds what it staged."""
    first, second = (RaySink.from_url(parse_url(ray_url), SinkOptions()) for _ in range(2))
    assert first.open("error") == second.open("error") == 0
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
    for step, timeout in enumerate((math.inf, 1e10)):
        options = {"pull_timeout": timeout}
        sent = ray.get(ray_producer.send.remote(ray_url, 1, 1, options=options), timeout=60)
        assert sent["board_owned"] is True
        assert sent["handles"][0][0].step == step
    with pytest.raises(rlwire.ConfigError, match="pull_timeout"):
        rlwire.open_sender(ray_url, storage_options={"pull_timeout": math.nan})
