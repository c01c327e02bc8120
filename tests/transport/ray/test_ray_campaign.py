"""ray:// against what an adversarial campaign tried: values another client puts on a
board, handles kept across a new run on the same board, fields appended across one, a
cancelled receive's wait, another program's actor under a board's name, a handle opened
by another job."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import anyio
import numpy as np
import pytest
import ray
from ray_actors import Trainer

import rlwire
from rlwire import CorruptFrameError, TransportError
from rlwire.testing import assert_batches_equal, make_batch, make_sample
from rlwire.transport.ray import create_board, drop_board
from rlwire.transport.ray._actors import call
from rlwire.transport.ray._appended import RayFieldsSink

TIMEOUT = 30.0


def _name(url: str) -> str:
    return url.removeprefix("ray://")


def test_values_another_client_puts_on_the_board_are_typed_errors(ray_url: str) -> None:
    board = create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender, sender.open_step(0) as writer:
        writer.put([make_sample(8)], key="a")
    main = ray.get(board.read_part.remote(0, 0, 0), timeout=TIMEOUT)[1][0]
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


def test_a_handle_never_opens_another_run_of_its_step(ray_url: str) -> None:
    """The board is the same after an overwrite, and the step number too: the handle
    names the commit, and the new run's message under its number is an error."""
    create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(make_batch(1, n=8, seed=1))
        with sender.open_step(1) as writer:
            writer.put([make_sample(8, seed=2)], key="a")
        handles = [sender.sink.handle(0), sender.sink.handle(1)]
        for step in (0, 1):  # each step went to rank 0 alone: a handle of rank 1 would wait
            with pytest.raises(rlwire.ConfigError, match="no message of rank 1"):
                sender.sink.handle(step, 1)
    for handle, want in zip(handles, ("whole", "a"), strict=True):
        with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
            part = next(receiver.parts(timeout=TIMEOUT))
        assert (part.step, part.key or "whole") == (handle.step, want)
    with rlwire.open_sync_sender(ray_url, on_existing="overwrite") as sender:  # another run
        sender.send(make_batch(1, n=8, seed=11))
        with sender.open_step(1) as writer:
            writer.put([make_sample(8, seed=12)], key="a")
    for handle in handles:
        with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
            with pytest.raises(TransportError, match="not the one the StepHandle names"):
                receiver.receive(timeout=TIMEOUT)


@pytest.mark.long
def test_an_actor_that_is_not_a_board_under_its_name_is_a_typed_error(ray_cluster: None) -> None:
    name = f"impostor-{uuid.uuid4().hex[:12]}"
    impostor = Trainer.options(name=f"rlwire-board:{name}").remote()
    try:
        ray.get(impostor.node.remote(), timeout=180)
        not_a_board = r"is not an rlwire board but a ray_actors\.Trainer"
        with pytest.raises(TransportError, match=not_a_board):
            rlwire.open_sync_sender(f"ray://{name}")
        with rlwire.open_receiver(f"ray://{name}") as receiver:
            with pytest.raises(TransportError, match="is not an rlwire board"):
                receiver.receive(timeout=TIMEOUT)
    finally:
        ray.kill(impostor)


@pytest.mark.parametrize("who", ["a stage", "the producer"])
def test_fields_never_land_on_another_run_of_their_step(
    ray_url: str, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    """Another run overwrites the step and sends it again between add_fields reading the
    step (to check the fields against it) and staging them: the fields are refused, not
    appended to the new run's step. A stage that never opened the destination is told
    the step was sent again; the producer that sent it, that another opened the
    destination since (it is fenced)."""
    create_board(_name(ray_url))

    def other_run() -> None:
        with rlwire.open_sync_sender(ray_url, on_existing="overwrite") as sender:
            sender.send(make_batch(2, n=8, seed=99))

    read = RayFieldsSink.read_committed

    def read_then_another_run(self: RayFieldsSink, *args: Any, **kwargs: Any) -> Any:
        frames = read(self, *args, **kwargs)
        thread = threading.Thread(target=other_run)
        thread.start()
        thread.join()
        return frames

    monkeypatch.setattr(RayFieldsSink, "read_committed", read_then_another_run)
    fields = {"ref_logprob": np.array([1.5, 2.5])}

    async def append() -> None:  # a stage of its own, that never opens the destination
        stage = rlwire.open_sender(ray_url)
        try:
            await stage.add_fields(0, fields)
        finally:
            await stage.aclose()

    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(make_batch(2, n=8, seed=1))
        if who == "the producer":
            with pytest.raises(rlwire.ClosedError, match="another sender opened the destinat"):
                sender.add_fields(0, fields)
        else:
            with pytest.raises(rlwire.ConfigError, match="deleted and sent again"):
                anyio.run(append)
    with rlwire.open_receiver(ray_url, fields=["ref_logprob"]) as receiver:
        with pytest.raises(rlwire.ReceiveTimeout, match="ref_logprob"):
            receiver.receive(timeout=0.2)


def test_a_cancelled_receive_leaves_no_answer_for_the_next(ray_url: str) -> None:
    """The worker thread of a cancelled areceive goes on waiting on the board, and gets
    the step's objects when it is sent; the step is then overwritten by another run: the
    next receive reads the board again, and gets the new run's message."""
    old, new = make_batch(1, n=8, seed=1), make_batch(1, n=8, seed=2)
    create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url):
        pass

    def send(batch: Any, **options: Any) -> None:
        with rlwire.open_sync_sender(ray_url, **options) as sender:
            sender.send(batch)

    with rlwire.open_receiver(ray_url) as receiver:
        with pytest.raises(rlwire.ReceiveTimeout):  # it has found the board, and asked it
            receiver.receive(timeout=0.01)

        async def cancelled() -> None:
            with anyio.move_on_after(0.1):
                await receiver.areceive()  # its thread waits on for up to 0.5 s
            await anyio.to_thread.run_sync(send, old)  # the thread gets its objects
            await anyio.sleep(0.05)

        anyio.run(cancelled)
        send(new, on_existing="overwrite")
        assert_batches_equal(receiver.receive(timeout=TIMEOUT), new)


def test_a_handle_names_the_namespace_its_board_is_in(ray_url: str) -> None:
    with rlwire.open_sync_sender(ray_url) as sender:  # the job's own namespace
        sender.send(make_batch(1, n=8))
        handle = sender.sink.handle(0)
    assert handle.namespace == ray.get_runtime_context().namespace


_OTHER_JOB = """
import json, sys, ray, rlwire
from rlwire.transport.ray import StepHandle
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
handle = StepHandle(**json.loads(sys.argv[2]))
with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
    print(len(receiver.receive(timeout=30).samples))
"""


@pytest.mark.long
def test_another_job_opens_a_handle_of_a_board_in_the_job_namespace(ray_cluster: None) -> None:
    """A detached board is made so that another driver can read it: a handle made
    without a ``namespace`` option still names the board's."""
    name = f"job-{uuid.uuid4().hex[:12]}"
    create_board(name, detached=True)
    try:
        with rlwire.open_sync_sender(f"ray://{name}") as sender:
            sender.send(make_batch(3, n=8))
            handle = sender.sink.handle(0)
        address = ray.get_runtime_context().gcs_address
        run = subprocess.run(
            [sys.executable, "-c", _OTHER_JOB, address, json.dumps(dataclasses.asdict(handle))],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RAY_ADDRESS": ""},
            check=False,
        )
        assert run.stdout.strip().splitlines()[-1:] == ["3"], run.stderr[-2000:]
    finally:
        drop_board(name)


def test_the_board_refuses_marks_no_receiver_records(ray_url: str) -> None:
    """Marks another client records reached a resuming receiver and a pruning sender as
    ValueError or TypeError (or, 1.5, held a max_ahead sender forever)."""
    board = create_board(_name(ray_url))
    for args in ((0, "x"), (0, 1.5), (0, None), (-1, 2), (True, 2)):
        with pytest.raises(ray.exceptions.RayTaskError, match="must be an int >= 0"):
            ray.get(board.mark.remote(*args), timeout=TIMEOUT)
    with pytest.raises(ray.exceptions.RayTaskError, match="must be an int >= 0"):
        ray.get(board.mark_part.remote(0, 0, "x"), timeout=TIMEOUT)
    with pytest.raises(ray.exceptions.RayTaskError, match="a part mark's run is bytes"):
        ray.get(board.mark_part.remote(0, 0, 1, "run"), timeout=TIMEOUT)
    with pytest.raises(ray.exceptions.RayTaskError, match="must be an int >= 0"):
        ray.get(board.finish.remote("end"), timeout=TIMEOUT)
    with rlwire.open_sync_sender(ray_url, keep_last=1) as sender:
        sender.send(make_batch(1, n=8))
    with rlwire.open_receiver(ray_url) as receiver:
        receiver.receive(timeout=TIMEOUT)


def test_the_board_refuses_steps_and_ranks_no_sender_stages(ray_url: str) -> None:
    """A step staged by another client as a str (or a seal of one) broke every later
    open of the board, ``overwrite`` included (a TypeError comparing it with a step);
    a float step committed did too. The board refuses them, and stores nothing."""
    board = create_board(_name(ray_url))
    ref = ray.put([b"x"])
    for step, rank, key in (("x", 0, "k"), (1.5, 0, "k"), (-1, 0, "k"), (1, "r", "k"), (1, 0, 5)):
        with pytest.raises(ray.exceptions.RayTaskError, match=r"must be an int >= 0|a str"):
            ray.get(board.stage.remote(step, key, rank, None, False, [ref], 1.0), timeout=TIMEOUT)
        with pytest.raises(ray.exceptions.RayTaskError, match=r"must be an int >= 0|a str"):
            ray.get(board.stage_part.remote(step, key, rank, 0, None, False, [ref], 1.0))
    with pytest.raises(ray.exceptions.RayTaskError, match="must be an int >= 0"):
        ray.get(board.seal.remote("x", [], [], "t"), timeout=TIMEOUT)
    assert ray.get(board.commit.remote("k", 1, None), timeout=TIMEOUT) == ("missing",)
    for on_existing in ("overwrite", "resume"):
        with rlwire.open_sync_sender(ray_url, on_existing=on_existing) as sender:
            sender.send(make_batch(1, n=8))
    with rlwire.open_receiver(ray_url) as receiver:
        receiver.receive(timeout=TIMEOUT)


def test_a_board_call_that_raises_says_what_it_raised(ray_url: str) -> None:
    """A TransportError of a board call that raised names what it raised, not only
    the first line of Ray's RayTaskError (``ray::Board.mark() (pid=...)``)."""
    board = create_board(_name(ray_url))
    with pytest.raises(TransportError, match="raised ValueError: a rank, step or part") as e:
        call(board.mark, "x", 1, where=ray_url, action="record consumption")
    assert "cannot record consumption: RayTaskError" in str(e.value)


def test_fields_computed_from_another_run_of_their_step_are_refused(ray_url: str) -> None:
    """A stage computed its fields from step 0 as received (``of=`` its message id);
    another run then sent step 0 again, the same shape: those fields are refused, and
    the ones computed from the new step are stored."""
    create_board(_name(ray_url))
    message_ids = []
    for seed, existing in ((1, "error"), (99, "overwrite")):
        with rlwire.open_sync_sender(ray_url, on_existing=existing) as sender:
            sender.send(make_batch(2, n=8, seed=seed))
        with rlwire.open_receiver(ray_url, record_consumed=False) as receiver:
            receiver.receive(timeout=TIMEOUT)
            assert receiver.last_stats is not None
            message_ids.append(receiver.last_stats.message_id)
    old, new = message_ids
    assert old and new and old != new
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as stage:
        with pytest.raises(rlwire.ConfigError, match="not the message the fields were computed"):
            stage.add_fields(0, {"ref_logprob": np.array([1.5, 2.5])}, of=old)
        stage.add_fields(0, {"ref_logprob": np.array([3.5, 4.5])}, of=new)
    with rlwire.open_receiver(ray_url, fields=["ref_logprob"]) as receiver:
        got = receiver.receive(timeout=TIMEOUT)
    assert got.samples["ref_logprob"].tolist() == [3.5, 4.5]


@pytest.mark.parametrize(
    ("again", "refused"), [(3, "part 1 is of the new run"), (1, "its seal is")]
)
def test_parts_of_a_step_sent_again_midway_are_refused(
    ray_url: str, again: int, refused: str
) -> None:
    """A receiver reads a step part by part; after part 0 another run sends the step
    again: the next part (of the new run) is refused, never yielded beside part 0; with
    one part only, the new run's seal does not end the step either."""
    create_board(_name(ray_url))

    def fill(first: int, existing: str, parts: int) -> None:
        with rlwire.open_sync_sender(ray_url, on_existing=existing) as sender:  # type: ignore[arg-type]
            with sender.open_step() as writer:
                for k in range(parts):
                    writer.put([{"token_ids": np.arange(first + k, first + k + 4)}], key=f"k{k}")

    fill(0, "error", 3)
    firsts = []
    with rlwire.open_receiver(ray_url, type=list, record_consumed=False) as receiver:
        with pytest.raises(rlwire.StepGapError, match=refused):
            for part in receiver.parts(timeout=TIMEOUT):
                firsts.append(int(part.value[0]["token_ids"][0]))
                if part.index == 0:
                    fill(100, "overwrite", again)
    assert firsts == [0]
    with rlwire.open_receiver(ray_url, type=list, record_consumed=False) as receiver:
        got = receiver.receive(timeout=TIMEOUT)
    assert [int(s["token_ids"][0]) for s in got] == [100, 101, 102][:again]


def test_a_receiver_resumed_after_its_step_was_sent_again_refuses_the_new_run(
    ray_url: str,
) -> None:
    """A receiver was handed part 0, then the step was sent again (an overwrite, which
    drops the marks) and the receiver stopped as it asked for part 1: its part mark
    names the run of part 0, so once resumed it refuses the new run's part 1 instead
    of handing it out after the old run's part 0."""
    create_board(_name(ray_url))

    def fill(first: int, existing: str) -> None:
        with rlwire.open_sync_sender(ray_url, on_existing=existing) as sender:  # type: ignore[arg-type]
            with sender.open_step() as writer:
                for k in range(3):
                    writer.put([{"token_ids": np.arange(first + k, first + k + 4)}], key=f"k{k}")

    fill(0, "error")
    with rlwire.open_receiver(ray_url, type=list) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        assert next(parts).index == 0
        fill(100, "overwrite")
        with pytest.raises(rlwire.StepGapError):
            next(parts)
    with rlwire.open_receiver(ray_url, type=list, resume=True) as receiver:
        assert receiver.next_part == 1
        with pytest.raises(rlwire.StepGapError, match="part 1 is of the new run"):
            next(iter(receiver.parts(timeout=TIMEOUT)))


def test_parts_of_an_open_step_sent_again_are_refused_and_ties_hold(ray_url: str) -> None:
    """Parts read as they come, before any seal (no commit token yet): after part 0
    the step is sent again, so the next part is another run's and is refused; a stage
    that appends with part 0's message id is refused too, one with the new run's is
    not."""
    create_board(_name(ray_url))
    producer = rlwire.open_sync_sender(ray_url)
    writer = producer.open_step()
    writer.__enter__()
    writer.put([{"token_ids": np.arange(0, 4)}], key="k0")
    with rlwire.open_receiver(ray_url, type=list, record_consumed=False) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        first = next(parts)
        assert first.index == 0 and first.message_id
        writer.__exit__(None, None, None)
        producer.close()
        with rlwire.open_sync_sender(ray_url, on_existing="overwrite") as again:
            with again.open_step() as other:
                for k in range(2):
                    other.put([{"token_ids": np.arange(100 + k, 104 + k)}], key=f"k{k}")
        with pytest.raises(rlwire.StepGapError, match="part 1 is of the new run"):
            next(parts)
    with rlwire.open_receiver(ray_url, type=list, record_consumed=False) as receiver:
        new = list(receiver.parts(timeout=TIMEOUT))
    assert new[0].message_id not in (b"", first.message_id)
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as stage:
        with pytest.raises(rlwire.ConfigError, match="not the message"):
            stage.add_fields(0, {"score": np.array([1.0, 2.0])}, of=first.message_id)
        stage.add_fields(0, {"score": np.array([1.0, 2.0])}, of=new[0].message_id)


def test_a_wait_for_a_part_the_new_run_has_not_ends(ray_url: str) -> None:
    """The receiver took both parts a producer committed and waits for a third; the
    step is then sent again whole (another run): the wait ends in a StepGapError, not
    at its timeout."""
    create_board(_name(ray_url))
    producer = rlwire.open_sync_sender(ray_url)
    writer = producer.open_step()
    writer.__enter__()
    for k in range(2):
        writer.put([{"token_ids": np.arange(k, k + 4)}], key=f"k{k}")
    with rlwire.open_receiver(ray_url, type=list, record_consumed=False) as receiver:
        parts = receiver.parts(timeout=TIMEOUT)
        assert [next(parts).index, next(parts).index] == [0, 1]
        producer.close()  # the step stays open: no seal
        with rlwire.open_sync_sender(ray_url, on_existing="overwrite") as again:
            again.send({"samples": [{"token_ids": np.arange(100, 104)}]})
        started = time.monotonic()
        with pytest.raises(rlwire.StepGapError, match="part 0 is no longer"):
            next(parts)
        assert time.monotonic() - started < TIMEOUT / 2
