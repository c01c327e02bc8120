"""ray:// on a real local Ray cluster: steps owned by the board outlive the producer
actor, handles open in trainer actors, a restarted trainer resumes, keep_last frees the
object store. The contract itself runs in tests/transport/test_contract.py (TestRay)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from pickle import PickleBuffer
from types import TracebackType
from typing import Any

import numpy as np
import pytest
import ray
from ray_actors import (
    BusyThreadedProducer,
    SyncProducer,
    fingerprint,
    kill_and_wait,
    mixed_step,
    quiet_store_bytes,
    settles,
    step_batches,
    store_bytes,
)
from ray_cluster import spare

import rlwire
from rlwire import Frame, TrainingBatch, TrainingSample, TransportError
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.pieces import Pieces
from rlwire.abc import SinkOptions, SourceOptions
from rlwire.aio import run_sliced
from rlwire.testing import assert_batches_equal, make_sample
from rlwire.transport.ray import RaySink, create_board, drop_board
from rlwire.transport.ray._payload import make_payload, out_of_band, parse_payload
from rlwire.transport.ray._staged import RayStaged
from rlwire.transport.ray._url import PULL_TIMEOUT

TIMEOUT = 30.0
#: A call to an actor the test starts: the start itself took 10-30 s, and once more than
#: 60, under the loaded test command on 2 cores.
ACTOR_CALL = 180.0


def _name(url: str) -> str:
    return url.removeprefix("ray://")


def test_committed_steps_outlive_the_producer_actor(ray_url: str, ray_trainers: list[Any]) -> None:
    create_board(_name(ray_url))  # the driver's: it outlives the producer
    producer = spare("Producer")
    sent = ray.get(producer.send.remote(ray_url, 3, 2), timeout=ACTOR_CALL)
    assert sent["board_owned"] is True
    kill_and_wait(producer)
    # Every committed step reaches every rank, bit-exact, after the producer died.
    for rank in range(2):
        with rlwire.open_receiver(ray_url, rank=rank) as receiver:
            for step in range(3):
                assert_batches_equal(receiver.receive(timeout=TIMEOUT), step_batches(step, 2)[rank])
            assert receiver.poll() is None
    # A driver hands each trainer actor a handle; the trainer opens it.
    handles = sent["handles"][1]
    got = ray.get([t.open_handle.remote(h) for t, h in zip(ray_trainers, handles, strict=True)])
    for rank, (step, prints) in enumerate(got):
        assert step == 1
        assert prints == fingerprint(step_batches(1, 2)[rank])


def test_every_rank_of_a_many_rank_step_arrives_exact(ray_url: str, ray_producer: Any) -> None:
    """The producer hashes each rank while the board pulls it, and joins the next into
    the same space once the board has it: every rank of many arrives as it was sent."""
    create_board(_name(ray_url))
    sent = ray.get(ray_producer.send.remote(ray_url, 2, 5), timeout=ACTOR_CALL)
    assert sent["board_owned"] is True
    for rank in range(5):
        with rlwire.open_receiver(ray_url, rank=rank) as receiver:
            for step in range(2):
                got = receiver.receive(timeout=TIMEOUT)
                assert fingerprint(got) == fingerprint(step_batches(step, 5)[rank])


def test_ranks_stored_as_they_are_and_joined_ranks_alternate_exact(
    ray_url: str, ray_producer: Any
) -> None:
    """A packed rank is handed to the board without waiting for the ranks before; a
    joined rank waits until the board holds the rank it would overwrite: packed and
    joined ranks in turn all arrive as sent, every checksum verified."""
    create_board(_name(ray_url))
    assert ray.get(ray_producer.send_mixed.remote(ray_url, 5), timeout=ACTOR_CALL) is True
    for rank, sent in enumerate(mixed_step(5)):
        if isinstance(sent.samples, rlwire.Columns):
            sent = TrainingBatch(samples=[TrainingSample(**row) for row in sent.samples.rows()])
        with rlwire.open_receiver(ray_url, rank=rank) as receiver:
            assert fingerprint(receiver.receive(timeout=TIMEOUT)) == fingerprint(sent)


def test_a_join_space_holds_one_rank_until_it_is_stored_and_hashed(ray_url: str) -> None:
    """Ranks of one size, rows too small to store one by one (they are joined): a rank
    joined into the space before the rank it held is hashed would give that rank its
    checksums."""
    from rlwire.transport import parse_url

    sink = RaySink.from_url(parse_url(ray_url), SinkOptions())
    sink.open("error")
    rows = [[np.full(1000, 10 * rank + i, np.uint8) for i in range(8)] for rank in range(4)]
    frames = [Frame(b"header", (Pieces(memoryview(r) for r in ranks),)) for ranks in rows]
    run_sliced(sink.stage(0, frames)).commit()
    for rank, ranks in enumerate(rows):
        source = RaySink.open_source(parse_url(ray_url), SourceOptions(rank=rank))
        frame = source.read(0)
        assert frame is not None
        assert bytes(frame.buffers[0]) == b"".join(r.tobytes() for r in ranks)


def test_the_checksums_the_board_holds_are_verified(ray_url: str) -> None:
    """A whole step's checksums go to the board with its commit, not into its objects
    (they are hashed while Ray copies the objects in): a receiver checks against them."""
    from rlwire.transport import parse_url

    sink = RaySink.from_url(parse_url(ray_url), SinkOptions())
    sink.open("error")
    frame = Frame(b"header", (memoryview(bytes(range(256)) * 64),))
    staged = run_sliced(sink.stage(0, [frame]))
    assert isinstance(staged, RayStaged) and staged.checksums is not None
    sums = staged.checksums[0]
    assert sums is not None and len(sums) == 16  # the header's and the buffer's
    staged.checksums[0] = bytes(8) + sums[8:]  # the header's is wrong now
    staged.commit()
    with rlwire.open_receiver(ray_url) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match="header"):
            receiver.receive(timeout=TIMEOUT)


@pytest.mark.long
def test_a_producer_that_owns_its_steps_takes_them_along(ray_url: str) -> None:
    """The fallback, and a check that the kill above is real: an actor that runs one call
    at a time cannot hand its objects to the board, owns them, and they die with it.
    (Large ones: Ray copies objects under 100 KB into the references it passes on.)"""
    create_board(_name(ray_url))
    producer = SyncProducer.remote()
    sent = ray.get(producer.send.remote(ray_url, 1, 1, 1 << 14), timeout=ACTOR_CALL)
    assert sent == {"board_owned": False}
    with rlwire.open_receiver(ray_url) as receiver:
        assert receiver.wait_next(timeout=TIMEOUT)
    kill_and_wait(producer)
    with rlwire.open_receiver(ray_url) as receiver:
        with pytest.raises(TransportError, match=r"OwnerDiedError|ObjectLostError"):
            receiver.receive(timeout=TIMEOUT)


def test_a_sync_sender_on_an_async_actors_loop_puts_its_steps_itself(
    ray_url: str, ray_producer: Any
) -> None:
    """The board cannot call an actor whose loop a sync send blocks: the sender owns what
    it sends instead of waiting ``pull_timeout`` for a call that cannot run."""
    create_board(_name(ray_url))
    sent = ray.get(ray_producer.send_blocking.remote(ray_url, 2, 3.0), timeout=ACTOR_CALL)
    assert sent == {"board_owned": False}
    with rlwire.open_receiver(ray_url) as receiver:
        for step in range(2):
            got = receiver.receive(timeout=TIMEOUT)
            assert fingerprint(got) == fingerprint(step_batches(step, 1)[0])


def test_a_restarted_trainer_gets_every_later_step_once(
    ray_url: str, ray_producer: Any, ray_trainers: list[Any]
) -> None:
    create_board(_name(ray_url))
    ray.get(ray_producer.send.remote(ray_url, 5, 1, True), timeout=ACTOR_CALL)
    trainer = spare("Trainer")  # the one killed; a session's trainer stands in for its restart
    first = ray.get(trainer.take.remote(ray_url, 0, None, 2), timeout=ACTOR_CALL)
    assert [step for step, _ in first] == [0, 1]
    ray.kill(trainer)  # restarted from its checkpoint, which says it consumed step 1
    again = ray_trainers[0]
    rest = ray.get(again.take.remote(ray_url, 0, first[-1][0] + 1, None), timeout=ACTOR_CALL)
    assert [step for step, _ in rest] == [2, 3, 4]  # each once, then the end of the stream
    for step, prints in first + rest:
        assert prints == fingerprint(step_batches(step, 1)[0])


def test_keep_last_frees_object_store_memory(ray_url: str) -> None:
    pytest.importorskip("grpc")  # the store's figures come over gRPC
    batch = TrainingBatch(samples=[make_sample(1 << 18, layers=16, topk=2, seed=3)])
    steps = 4
    baseline = quiet_store_bytes()
    with (
        rlwire.open_sync_sender(ray_url, keep_last=1) as sender,
        rlwire.open_receiver(ray_url) as receiver,
    ):
        for _ in range(steps):
            sender.send(batch)
            assert_batches_equal(receiver.receive(timeout=TIMEOUT), batch)
            receiver.wait_next(timeout=0)  # moves past it: the next send deletes it
        stats = sender.last_stats
        assert stats is not None
        step_bytes = stats.bytes
        # One step kept (the newest), and at most one on its way: never all four.
        assert settles(lambda: store_bytes() - baseline <= 2.2 * step_bytes), (
            store_bytes() - baseline,
            step_bytes,
        )
        # The newest step is kept (objects of the baseline may have gone meanwhile).
        assert store_bytes() >= step_bytes
    assert isinstance(sender.sink, RaySink)
    drop_board(_name(ray_url))
    assert settles(lambda: store_bytes() - baseline < step_bytes / 2)


def test_keep_last_drops_a_step_held_for_a_rank_left_out_once_it_moved_past(
    ray_url: str,
) -> None:
    """Step 0 goes to both ranks, the later steps to rank 0 alone, which stays at step
    1: the board keeps step 0 while rank 1 has not moved past it, and drops it at the
    first send after rank 1 did (the sender asks again: the board held it back)."""
    board = create_board(_name(ray_url))

    def steps() -> list[int]:
        return list(ray.get(board.steps.remote(), timeout=TIMEOUT))

    with (
        rlwire.open_sync_sender(ray_url, keep_last=1) as sender,
        rlwire.open_receiver(ray_url, rank=0) as r0,
        rlwire.open_receiver(ray_url, rank=1) as r1,
    ):
        sender.send_ranks(step_batches(0, 2))
        assert fingerprint(r0.receive(timeout=TIMEOUT)) == fingerprint(step_batches(0, 2)[0])
        r0.wait_next(timeout=0)  # rank 0 moved past step 0, and stays at step 1
        sender.send(step_batches(1, 1)[0])
        sender.send(step_batches(2, 1)[0])  # the prune of step 1's send is answered
        assert steps() == [0, 1, 2]  # held for rank 1
        assert fingerprint(r1.receive(timeout=TIMEOUT)) == fingerprint(step_batches(0, 2)[1])
        # Rank 1 moved past step 0; step 1 went to rank 0 alone, and step 2 is there.
        with pytest.raises(rlwire.StepGapError, match=r"sent to rank 0 only"):
            r1.wait_next(timeout=0)
        sender.send(step_batches(3, 1)[0])
        assert settles(lambda: steps() == [1, 2, 3]), steps()


@pytest.mark.long
def test_two_nodes_producer_on_one_trainers_on_the_other(tmp_path: Path) -> None:
    """Two raylets and object stores on this machine; the producer is killed after its
    commits, and the trainers on the other node still get every step, bit-exact."""
    seen = _run_cluster_script("ray_two_nodes", tmp_path)
    producer, *trainers = seen["nodes"]
    assert all(node != producer for node in trainers)
    assert seen["board_owned"] is True
    assert seen["exact"] is True
    assert seen["boards_on_driver_node"] is True, seen["placed"]


def _run_cluster_script(module: str, cwd: Path) -> Any:
    """Run ``module`` (a script in tests/ that starts a cluster of its own) in a child
    process; the JSON it printed last."""
    tests = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tests.parent / "src"), str(tests)])
    result = subprocess.run(
        [sys.executable, "-m", module],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_steps_stored_only_on_a_lost_node_fail_to_read_with_the_step_named(
    tmp_path: Path,
) -> None:
    """The producer's node is removed after the trainers (on another node) read step 0:
    a step whose objects lived on that node alone is a TransportError naming the step
    and that no copy is left (not a hang, not another step's data), skip() passes it,
    and the receivers go on to the end of the stream."""
    seen = _run_cluster_script("ray_lost_node", tmp_path)
    assert seen["board_owned"] is True
    assert seen["first_exact"] == [True, True]
    for rank, taken in enumerate(seen["rest"]):
        # Step 1 may have been fetched to the trainers' node by the first read's
        # look ahead (await_next): then it survives; step 2 was never read.
        assert taken[0] == ["exact", 1] or taken[0][:2] == ["error", "TransportError"]
        kind, name, message = taken[-1]
        assert (kind, name) == ("error", "TransportError"), taken
        assert f"step 2 rank {rank}" in message and "no copy of them is left" in message
        assert "skip() it" in message
        assert len(taken) == 2  # then the end of the stream


def _pickle_buffers_in(tb: TracebackType | None) -> list[str]:
    """The locals of ``tb``'s frames that hold a PickleBuffer, alone or in a list."""
    found = []
    while tb is not None:
        for name, value in tb.tb_frame.f_locals.items():
            items = value if isinstance(value, list) else [value]
            for item in items:
                inner = item if isinstance(item, list) else [item]
                if any(isinstance(x, PickleBuffer) for x in inner):
                    found.append(f"{tb.tb_frame.f_code.co_name}: {name}")
        tb = tb.tb_next
    return found


def test_a_failed_store_leaves_no_pickle_buffer_to_the_garbage_collector(ray_url: str) -> None:
    """A traceback kept in a reference cycle must not hold PickleBuffers over memoryviews:
    the cyclic collector cannot clear such a memoryview (it exports a buffer) and was
    seen to crash CPython 3.11."""
    from rlwire.transport import parse_url

    sink = RaySink.from_url(parse_url(ray_url), SinkOptions())
    sink.open("error")
    assert drop_board(_name(ray_url))
    frame = Frame(b"header", (memoryview(bytearray(1 << 20)),))
    with pytest.raises(TransportError) as info:
        run_sliced(sink.stage(0, [frame]))
    assert _pickle_buffers_in(info.value.__traceback__) == []


@pytest.mark.parametrize("then", ["commit it", "prune it", "only resume"])
def test_a_step_staged_and_never_committed_is_freed(ray_url: str, then: str) -> None:
    """A producer that died between staging a step and committing it leaves its objects
    on the board: they go when its restart opens the destination at that step (it
    stages the step anew), commits it, or retention prunes it, not only with the
    board."""
    pytest.importorskip("grpc")  # the store's figures come over gRPC
    from rlwire.transport import parse_url

    size = 64 << 20
    baseline = quiet_store_bytes()
    dead = RaySink.from_url(parse_url(ray_url), SinkOptions())
    dead.open("resume")
    run_sliced(dead.stage(0, [Frame(b"header", (memoryview(bytearray(size)),))]))
    # ... and it dies here, its step staged; its restart sends step 0 again:
    assert settles(lambda: store_bytes() >= size)  # (the baseline's objects may go meanwhile)
    restarted = RaySink.from_url(parse_url(ray_url), SinkOptions())
    assert restarted.open("resume") == 0
    if then == "only resume":
        restarted.finish(0)
        assert settles(lambda: store_bytes() - baseline < size / 2), store_bytes() - baseline
        return
    step = 0 if then == "commit it" else 1
    frame = Frame(b"header", (memoryview(bytearray(size)),))
    run_sliced(restarted.stage(step, [frame])).commit()
    if then == "prune it":
        restarted.prune(1)
    assert settles(lambda: store_bytes() - baseline < 1.5 * size), store_bytes() - baseline
    with rlwire.open_receiver(ray_url, start_step=step) as receiver:
        assert receiver.wait_next(timeout=TIMEOUT)


def test_a_namespace_keeps_boards_apart(ray_cluster: None) -> None:
    name = f"ns-{time.monotonic_ns()}"
    url, ours = f"ray://{name}", {"namespace": "rlwire-tests"}
    batch = step_batches(0, 1)[0]
    try:
        with rlwire.open_sync_sender(url, storage_options=ours) as sender:
            sender.send(batch)
        with rlwire.open_receiver(url, storage_options=ours) as receiver:
            assert_batches_equal(receiver.receive(timeout=TIMEOUT), batch)
        with rlwire.open_receiver(url) as elsewhere:  # the job's own namespace: no board
            assert elsewhere.poll() is None
    finally:
        assert drop_board(name, namespace="rlwire-tests")


_DETACHED_DRIVER = """
import sys, ray, rlwire
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
options = {"namespace": "rlwire-tests", "detached": True}
with rlwire.open_sync_sender(sys.argv[2], storage_options=options) as sender:
    sender.finish()
"""


@pytest.mark.long
def test_a_detached_board_outlives_the_driver_that_made_it(ray_cluster: None) -> None:
    name = f"detached-{time.monotonic_ns()}"
    url = f"ray://{name}"
    address = ray.get_runtime_context().gcs_address
    env = dict(os.environ)  # PYTHONPATH as the cluster's workers have it
    result = subprocess.run(
        [sys.executable, "-c", _DETACHED_DRIVER, address, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    try:  # the driver is gone; its board, and the end mark on it, are not
        with rlwire.open_receiver(url, storage_options={"namespace": "rlwire-tests"}) as receiver:
            with pytest.raises(rlwire.EndOfStream):
                receiver.receive(timeout=TIMEOUT)
    finally:
        assert drop_board(name, namespace="rlwire-tests")


def test_runs_reach_the_receiver_as_one_view_of_the_store_without_a_copy(
    ray_cluster: None,
) -> None:
    # A column of per-sample rows goes into the object store run by run (no join at the
    # sender); Ray lays them back to back, so the receiver's buffer is a view of them.
    # So does a packed column, cut in 1 MiB values.
    rows = [np.full(n, i, np.uint8) for i, n in enumerate((4096, (1 << 20) + 4096, 8192, 100))]
    packed = np.arange(3 << 18, dtype=np.int32)  # 3 MiB
    frame = Frame(b"header", (Pieces(memoryview(r) for r in rows), memoryview(packed).cast("B")))
    main, _ = make_payload(frame, run_sliced(checksum_segments(frame)))
    values = out_of_band(main)
    try:
        ref = ray.put(values)
    finally:
        values = []
    stored = ray.get(ref)
    got = parse_payload(stored, None, verify=True, writable=False, where="ray://t")
    assert bytes(got.buffers[0]) == b"".join(r.tobytes() for r in rows)
    first_run = np.frombuffer(stored[2], np.uint8)
    assert np.frombuffer(got.buffers[0], np.uint8).ctypes.data == first_run.ctypes.data
    del stored, first_run
    assert bytes(got.buffers[0][-100:]) == bytes([3] * 100)  # still mapped: the view holds it
    column = np.frombuffer(got.buffers[1], np.int32)
    assert np.array_equal(column, packed)
    assert column.ctypes.data == np.frombuffer(ray.get(ref)[7], np.uint8).ctypes.data


@pytest.mark.parametrize("writable", [False, True])
def test_a_write_into_a_received_array_reaches_no_later_reader(
    ray_url: str, writable: bool
) -> None:
    """A received array is a view of the object store's shared memory, read-only to
    numpy; a write that ignores the flag (torch's in-place ops do) changes the step in
    the store. A later read of it (a trainer restarted on the step) then fails its
    checksums, and never hands on the written bytes. With ``writable=True`` the
    receiver's arrays are its own copy, and the stored step stays as it was sent."""
    batch = TrainingBatch(samples=[make_sample(1 << 16, layers=4, topk=2, seed=5)])
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(batch)
    with rlwire.open_receiver(ray_url, writable=writable) as receiver:
        experts = receiver.receive(timeout=TIMEOUT).samples[0].routed_experts
        assert experts is not None and experts.flags.writeable is writable
        ctypes.memmove(experts.ctypes.data, b"\x5a" * 4096, 4096)
        assert experts.reshape(-1)[0] == 0x5A
    with rlwire.open_receiver(ray_url) as again:
        if writable:
            assert_batches_equal(again.receive(timeout=TIMEOUT), batch)
        else:
            with pytest.raises(rlwire.CorruptFrameError, match="checksum"):
                again.receive(timeout=TIMEOUT)


def test_a_damaged_sidecar_object_is_named(ray_url: str) -> None:
    """A write into an array stored in the step's sidecar object (as above) fails its
    checksum at the next read, whose error names the sidecar object, as the files and
    S3 name the sidecar file or object. It named the message only."""
    batch = TrainingBatch(samples=[make_sample(1 << 16, layers=4, topk=2, seed=5)])
    with rlwire.open_sync_sender(ray_url, sidecar=("routed_experts",)) as sender:
        sender.send(batch)
    with rlwire.open_receiver(ray_url) as receiver:
        experts = receiver.receive(timeout=TIMEOUT).samples[0].routed_experts
        assert experts is not None
        ctypes.memmove(experts.ctypes.data, b"\x5a" * 4096, 4096)
    with rlwire.open_receiver(ray_url) as again:
        with pytest.raises(rlwire.CorruptFrameError) as info:
            again.receive(timeout=TIMEOUT)
    assert str(info.value).startswith(f"{ray_url}: step 0 rank 0 sidecar object, segment ")
    assert "in the sidecar) does not match its checksum" in str(info.value)


def test_steps_read_through_handles_are_freed_by_keep_last(ray_url: str) -> None:
    """The single-controller pattern: a trainer opens each step's StepHandle, reads it
    and closes. Its receiver opened at step ``s`` records that the rank moved past the
    steps before ``s``, so ``keep_last`` frees them and ``max_ahead`` lets sends go."""
    board = create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url, keep_last=2, max_ahead=1) as sender:
        sink = sender.sink
        assert isinstance(sink, RaySink)
        for step in range(6):
            assert sender.send_ranks(step_batches(step, 2)) == step
            for rank in range(2):
                handle = sink.handle(step, rank)
                with rlwire.open_receiver(handle.url, **handle.receiver_options()) as rx:
                    got = rx.receive(timeout=TIMEOUT)
                assert fingerprint(got) == fingerprint(step_batches(step, 2)[rank])
            assert ray.get(board.steps.remote(), timeout=TIMEOUT) == list(
                range(max(0, step - 1), step + 1)
            )


def test_an_async_actor_running_one_call_at_a_time_owns_its_steps(ray_url: str) -> None:
    """The board cannot call in while such an actor sends: the sender puts its steps
    itself at once, rather than waiting ``pull_timeout`` for a call that cannot run."""
    create_board(_name(ray_url))
    producer = spare("OneCallAsyncProducer")
    started = time.monotonic()
    assert ray.get(producer.send.remote(ray_url), timeout=ACTOR_CALL) == {"board_owned": False}
    assert time.monotonic() - started < PULL_TIMEOUT / 2  # no wait for a pull
    with rlwire.open_receiver(ray_url) as receiver:
        assert fingerprint(receiver.receive(timeout=TIMEOUT)) == fingerprint(step_batches(0, 1)[0])
    ray.kill(producer)


@pytest.mark.long
def test_a_pull_the_busy_producer_cannot_answer_says_so(ray_url: str) -> None:
    """A threaded actor whose other thread is busy cannot answer the board's pull: the
    send fails after ``pull_timeout`` with an error that says why and what to change."""
    create_board(_name(ray_url))
    producer = BusyThreadedProducer.remote()
    busy = producer.generate.remote()
    message = ray.get(producer.send.remote(ray_url, 1.0), timeout=ACTOR_CALL)
    assert "waited 1 s (pull_timeout)" in message and "max_concurrency" in message, message
    ray.get(busy, timeout=ACTOR_CALL)
    with rlwire.open_receiver(ray_url) as receiver:
        assert receiver.poll() is None  # nothing of the failed step is visible
    ray.kill(producer)


@pytest.mark.parametrize("waiting", [False, True])
def test_a_board_that_stops_answering_is_an_error_in_bounded_time(
    ray_url: str, monkeypatch: pytest.MonkeyPatch, waiting: bool
) -> None:
    """A board whose process stopped (its node cut off, not yet declared dead) would
    hold a receive past its timeout for as long as it stays so: each board call has
    ``BOARD_ANSWER_SECONDS`` (beyond a wait's own time), then a TransportError."""
    from rlwire.transport.ray import _actors

    monkeypatch.setattr(_actors, "BOARD_ANSWER_SECONDS", 1.0)
    board = create_board(_name(ray_url))
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(step_batches(0, 1)[0])
    pid = ray._private.state.actors(board._actor_id.hex())["Pid"]
    with rlwire.open_receiver(ray_url) as receiver:
        assert fingerprint(receiver.receive(timeout=TIMEOUT)) == fingerprint(step_batches(0, 1)[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(TransportError, match="did not answer within"):
                if waiting:
                    receiver.wait_next(timeout=1.0)
                else:
                    receiver.receive(timeout=0.5)
            assert time.monotonic() - started < 10
        finally:
            os.kill(pid, signal.SIGCONT)
        # Answering again, it is found again.
        assert receiver.poll() is None


def test_a_board_that_stops_answering_fails_a_send_in_bounded_time(
    ray_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender's board calls have ``BOARD_ANSWER_SECONDS`` too (a stage's, beyond its
    pull_timeout): the send fails with a TransportError rather than waiting for as long
    as the board stays stopped; once it answers again, a resumed sender goes on."""
    from rlwire.transport.ray import _actors

    monkeypatch.setattr(_actors, "BOARD_ANSWER_SECONDS", 1.0)
    board = create_board(_name(ray_url))
    pid = ray._private.state.actors(board._actor_id.hex())["Pid"]
    with rlwire.open_sync_sender(ray_url) as sender:
        sender.send(step_batches(0, 1)[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(TransportError, match="did not answer within 1 s"):
                sender.send(step_batches(1, 1)[0])
            assert time.monotonic() - started < 10
        finally:
            os.kill(pid, signal.SIGCONT)
    with rlwire.open_sync_sender(ray_url, on_existing="resume") as again:
        assert again.send(step_batches(1, 1)[0]) == 1
    with rlwire.open_receiver(ray_url) as receiver:
        for step in range(2):
            got = receiver.receive(timeout=TIMEOUT)
            assert fingerprint(got) == fingerprint(step_batches(step, 1)[0])
        assert receiver.poll() is None
