"""The producer before, still alive after a restart, on a directory and on S3 (moto):
producer A sends steps 0-2; producer B opens the destination (``overwrite``,
``resume``, ``truncate``); A sends its step 3 and finishes; B sends on. Files and S3
have no fence (ray:// has: tests/transport/ray/test_ray_fence.py), so A's step 3 and
its end land in B's run, and trainers read them as B's: the test says what should hold,
and is expected to fail there until they have one (docs/reliability.md, "The producer
before, alive after a restart")."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire.testing import make_batch


def _batch(run: int, step: int) -> rlwire.TrainingBatch:
    return make_batch(2, n=8, seed=1000 * run + step)


def _received(url: str, options: Any) -> list[Any]:
    """(run, step made for) of each step a trainer reads from step 0, then "end"."""
    got: list[Any] = []
    with rlwire.open_receiver(url, storage_options=options, record_consumed=False) as receiver:
        while len(got) < 6:
            try:
                batch = receiver.receive(timeout=5)
            except rlwire.EndOfStream:
                return [*got, "end"]
            got.append(divmod(int(batch.samples[0].env_name.removeprefix("env")), 1000))
    return got


@pytest.mark.parametrize("store", ["files", "s3"])
@pytest.mark.parametrize(
    ("mode", "start"), [("overwrite", None), ("resume", None), ("truncate", 1)]
)
def test_the_producer_before_adds_nothing_to_the_new_run(
    tmp_path: Path, request: pytest.FixtureRequest, store: str, mode: str, start: int | None
) -> None:
    """What trainers get there now: B's steps, then A's step 3 with no error, then the
    end A marked (B's own step 3 failed with StepExistsError; with resume, all of A's)."""
    if store == "files":
        url, options = str(tmp_path / "run"), None
    else:
        url = request.getfixturevalue("s3_url") + "/run"
        options = request.getfixturevalue("s3_endpoint")
    late: list[str] = []  # what A's calls after B's open raised
    with contextlib.ExitStack() as stack:
        before = stack.enter_context(rlwire.open_sync_sender(url, storage_options=options))
        for step in range(3):
            before.send(_batch(1, step))
        after = stack.enter_context(
            rlwire.open_sync_sender(
                url, on_existing=mode, start_step=start, storage_options=options
            )
        )
        first = after.next_step
        for call in (lambda: before.send(_batch(1, 3)), before.finish):
            try:
                call()
            except rlwire.RlwireError as exc:
                late.append(type(exc).__name__)
        try:
            while after.next_step < 5:
                after.send(_batch(2, after.next_step))
            after.finish()
        except rlwire.StepExistsError:
            pass  # B's step 3 was A's: what trainers get says the rest
    expected = [(2 if step >= first else 1, step) for step in range(5)]
    assert _received(url, options) == [*expected, "end"]
    assert late == ["ClosedError", "ClosedError"]
