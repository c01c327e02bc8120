"""A received step of many samples is freed in a worker thread once its caller drops it,
and a list the caller kept is left whole."""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path

import msgspec
import numpy as np
import pytest

import rlwire
from rlwire._api import release
from rlwire._api.release import MANY_ITEMS
from rlwire._core.pools import EXECUTOR_THREADS, shared_executor

pytestmark = pytest.mark.anyio


def _batch(samples: int) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(
        samples=[
            rlwire.TrainingSample(
                token_ids=np.full(4, i, np.int64),
                mask=np.ones(4, bool),
                logprobs=np.zeros(4, np.float32),
                temperatures=np.ones(4, np.float32),
                advantages=np.zeros(4, np.float32),
                env_name="env",
            )
            for i in range(samples)
        ]
    )


def _send(path: Path, samples: int, steps: int = 1) -> None:
    with rlwire.open_sync_sender(path) as sender:
        for _ in range(steps):
            sender.send(_batch(samples))


def _watch_frees(batch: rlwire.TrainingBatch) -> tuple[list[int], threading.Event, list[object]]:
    """The threads that free the first and the last sample's arrays (numpy arrays take
    weak references, whose callbacks run where the array is freed)."""
    threads: list[int] = []
    freed = threading.Event()

    def gone(_: object) -> None:
        threads.append(threading.get_ident())
        if len(threads) == 2:
            freed.set()

    refs: list[object] = [
        weakref.ref(batch.samples[0].token_ids, gone),
        weakref.ref(batch.samples[-1].advantages, gone),
    ]
    return threads, freed, refs


def test_a_dropped_step_is_freed_by_a_worker_thread(tmp_path: Path) -> None:
    _send(tmp_path, MANY_ITEMS + 10)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        batch = receiver.receive(timeout=10)
        threads, freed, _refs = _watch_frees(batch)
        del batch
        assert freed.wait(10), f"the step's arrays were never freed (freed so far by {threads})"
    assert threading.get_ident() not in threads


async def test_a_step_replaced_by_the_next_areceive_is_freed_off_the_loop(tmp_path: Path) -> None:
    _send(tmp_path, MANY_ITEMS, steps=2)
    receiver = rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch)
    held = [await receiver.areceive(timeout=10)]
    threads, freed, _refs = _watch_frees(held[0])
    held[0] = await receiver.areceive(timeout=10)  # the step before is dropped here
    receiver.close()
    for _ in range(1000):
        if freed.is_set():
            break
        time.sleep(0.01)
    assert freed.is_set(), "the step before was never freed"
    assert threading.get_ident() not in threads
    assert held[0].samples[0].token_ids.tolist() == [0, 0, 0, 0]


def _drop_and_wait_for_the_release_thread(receiver: rlwire.TrainingBatchReceiver) -> None:
    """Receive a step, drop it and wait until the release thread freed it: it frees
    what it is given in order, so anything given before is freed by then."""
    batch = receiver.receive(timeout=10)
    threads, freed, _refs = _watch_frees(batch)
    del batch
    assert freed.wait(10), f"the step's arrays were never freed (freed so far by {threads})"


def test_a_list_the_caller_kept_is_left_whole(tmp_path: Path) -> None:
    _send(tmp_path, MANY_ITEMS + 10, steps=2)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        batch = receiver.receive(timeout=10)
        samples = batch.samples
        threads, _, _refs = _watch_frees(batch)
        del batch
        _drop_and_wait_for_the_release_thread(receiver)
    assert threads == []
    assert len(samples) == MANY_ITEMS + 10
    assert [int(s.token_ids[0]) for s in samples] == list(range(MANY_ITEMS + 10))
    del samples  # the caller's list is freed where the caller drops it
    assert threads == [threading.get_ident()] * 2


def test_a_list_that_replaced_the_received_one_is_freed_where_it_is_dropped(
    tmp_path: Path,
) -> None:
    _send(tmp_path, MANY_ITEMS)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        batch = receiver.receive(timeout=10)
    threads, freed, _refs = _watch_frees(batch)
    batch.samples = batch.samples[:1]  # the received list goes now, nothing holds it back
    assert threads == [threading.get_ident()]
    del batch
    assert freed.is_set() and threads == [threading.get_ident()] * 2


def test_a_short_step_is_freed_where_it_is_dropped(tmp_path: Path) -> None:
    _send(tmp_path, MANY_ITEMS - 1)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        batch = receiver.receive(timeout=10)
        threads, freed, _refs = _watch_frees(batch)
        del batch
        assert freed.is_set()
    assert threads == [threading.get_ident()] * 2


def test_a_step_the_caller_made_is_freed_where_it_is_dropped() -> None:
    batch = _batch(MANY_ITEMS + 10)
    threads, freed, _refs = _watch_frees(batch)
    del batch
    assert freed.is_set() and threads == [threading.get_ident()] * 2


class _OwnBatch(msgspec.Struct):
    samples: list[rlwire.TrainingSample]


def test_a_step_of_another_type_is_not_noted(tmp_path: Path) -> None:
    _send(tmp_path, MANY_ITEMS + 10)
    with rlwire.open_receiver(tmp_path, type=_OwnBatch) as receiver:
        got = receiver.receive(timeout=10)
        assert type(got) is _OwnBatch
        assert id(got) not in release._releaser.received
        threads, freed, _refs = _watch_frees(got)  # type: ignore[arg-type]
        del got
        assert freed.is_set()
    assert threads == [threading.get_ident()] * 2


def test_a_freed_step_is_forgotten(tmp_path: Path) -> None:
    _send(tmp_path, MANY_ITEMS, steps=2)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        batch = receiver.receive(timeout=10)
        key = id(batch)
        assert key in release._releaser.received
        del batch
        assert key not in release._releaser.received
        kept = receiver.receive(timeout=10)
        samples = kept.samples
        key = id(kept)
        del kept  # its list is the caller's: not handed over, and the step forgotten
        assert key not in release._releaser.received and len(samples) == MANY_ITEMS


class _NoThreads:
    """``threading`` where no thread starts (interpreter shutdown, a limit on threads)."""

    Lock = threading.Lock

    class Thread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't create new thread at interpreter shutdown")


def test_without_a_release_thread_steps_arrive_and_are_freed_where_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release, "threading", _NoThreads)
    monkeypatch.setattr(release, "_releaser", release._Releaser())
    _send(tmp_path, MANY_ITEMS, steps=2)
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        for step in range(2):  # no step lost to the failed start, and it is tried again
            batch = receiver.receive(timeout=10)
            assert receiver.last_step == step and not release._releaser.received
            threads, freed, _refs = _watch_frees(batch)
            del batch
            assert freed.is_set() and threads == [threading.get_ident()] * 2


def test_a_step_is_freed_by_the_release_thread_while_other_threads_are_busy(
    tmp_path: Path,
) -> None:
    """Every worker of the shared executor busy at the drop (a receive verifying, a
    send hashing): the step still goes to the release thread, not to the caller."""
    _send(tmp_path, MANY_ITEMS)
    release = threading.Event()
    with rlwire.open_receiver(tmp_path, type=rlwire.TrainingBatch) as receiver:
        batch = receiver.receive(timeout=10)
    busy = [shared_executor().submit(release.wait, 10) for _ in range(EXECUTOR_THREADS)]
    try:
        threads, freed, _refs = _watch_frees(batch)
        del batch
        assert freed.wait(10), f"the step's arrays were never freed (freed so far by {threads})"
        assert threading.get_ident() not in threads
    finally:
        release.set()
        for future in busy:
            future.result()
