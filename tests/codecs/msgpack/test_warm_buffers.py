"""The codec joins small rows into buffers it keeps, and writes one again only once
nothing holds what it held: a message still held (by the caller, a ZeroMQ queue, another
thread) never changes under it, and one let go gives its memory to the next."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import numpy as np
import pytest

import rlwire
from rlwire.codecs import MsgpackCodec
from rlwire.codecs._msgpack.warm_buffers import WarmBuffers
from rlwire.testing import assert_batches_equal, make_sample


def small_batch(seed: int, count: int = 3000) -> rlwire.TrainingBatch:
    """Samples of 64 tokens: every column's rows are small enough to be joined."""
    return rlwire.TrainingBatch(samples=[make_sample(64, seed=seed + i) for i in range(count)])


def addresses(frame: rlwire.Frame) -> set[int]:
    """Where the runs of ``frame``'s buffers start in memory."""
    found = set()
    for buffer in frame.buffers:
        for run in getattr(buffer, "runs", (buffer,)):
            if run.nbytes:
                found.add(np.frombuffer(run, np.uint8).ctypes.data)
    return found


def test_a_held_message_never_changes_and_one_let_go_gives_its_memory_to_the_next() -> None:
    codec = MsgpackCodec()
    first = codec.encode(small_batch(0))
    held = addresses(first)
    # Encoded while the first is held: other memory, and the first stays as it was.
    second = codec.encode(small_batch(10_000))
    assert not held & addresses(second)
    assert_batches_equal(codec.decode(first, rlwire.TrainingBatch), small_batch(0))
    del first
    third = codec.encode(small_batch(20_000))
    assert held & addresses(third), "the memory the first let go was not used again"
    assert_batches_equal(codec.decode(second, rlwire.TrainingBatch), small_batch(10_000))
    assert_batches_equal(codec.decode(third, rlwire.TrainingBatch), small_batch(20_000))


def test_an_array_decoded_from_a_message_holds_its_memory() -> None:
    """A receiver in the same process (the memory sink) keeps arrays over the sent
    buffers, not the frame: those arrays hold the memory as the frame would."""
    codec = MsgpackCodec()
    kept = codec.decode(codec.encode(small_batch(0)), rlwire.TrainingBatch)
    for seed in range(1, 4):
        codec.encode(small_batch(seed * 10_000))
    assert_batches_equal(kept, small_batch(0))
    assert not kept.samples[0].token_ids.flags.writeable  # the views are read-only


def test_threads_joining_at_once_never_share_a_buffer() -> None:
    warm = WarmBuffers()
    rows = {t: [np.full(100, t * 1000 + i, np.int32) for i in range(50)] for t in range(8)}
    views: dict[int, list[memoryview]] = {t: [] for t in rows}
    start = threading.Barrier(len(rows))

    def join(t: int) -> None:
        start.wait()
        for _ in range(40):
            views[t].append(warm.join(rows[t]))
            if len(views[t]) > 3:
                views[t].pop(0)  # let some go, so that buffers are taken again

    threads = [threading.Thread(target=join, args=(t,)) for t in rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for t, held in views.items():
        for view in held:
            assert bytes(view) == b"".join(rows[t]), f"thread {t}'s rows were overwritten"


def test_beyond_the_most_kept_a_join_is_new_bytes_and_still_right() -> None:
    warm = WarmBuffers()
    held = [warm.join([np.full(10, i, np.int16)]) for i in range(300)]
    assert len(warm) < 300  # a cap, reached
    assert all(bytes(view) == np.full(10, i, np.int16).tobytes() for i, view in enumerate(held))


def test_a_row_that_is_not_one_run_refuses() -> None:
    warm = WarmBuffers()
    with pytest.raises((TypeError, ValueError)):
        warm.join([np.arange(10, dtype=np.int32)[::2]])
    assert bytes(warm.join([b"ab", b"c"])) == b"abc"  # and the buffer serves again


@pytest.mark.anyio
async def test_steps_queued_in_zeromq_are_not_changed_by_the_steps_after(tmp_path: Path) -> None:
    """ZeroMQ sends the groups without a copy and holds them until they are on the wire:
    steps queued for a receiver that has not read yet keep their bytes while the sender
    encodes the next ones into warm buffers."""
    url = f"zmq+ipc://{tmp_path / 'warm.sock'}"
    got: list[rlwire.TrainingBatch] = []

    async def read_late(receiver: rlwire.Receiver) -> None:
        await anyio.sleep(1)  # the sender queues what the socket takes, and encodes on
        for _ in range(4):
            got.append(await receiver.areceive(timeout=30))

    async with rlwire.open_sender(url) as sender:
        with rlwire.open_receiver(url, rank=0) as receiver:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_late, receiver)
                for step in range(4):
                    await sender.send(small_batch(step * 10_000))
    for step, batch in enumerate(got):
        assert_batches_equal(batch, small_batch(step * 10_000))
