"""A step's ranks written beside one another (the directory's storage option
``writers``, FileStaging.write_rank): a large rank's files are written by a thread of
the shared executor while the next rank's are. On 2 cores the default is one writer, so
each test here asks for more; the writes, the failures and the cancellations are
real."""

from __future__ import annotations

import functools
import os
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import anyio
import forked
import msgspec
import numpy as np
import pytest

import rlwire
from rlwire import TrainingBatch, TrainingSample
from rlwire.testing import assert_batches_equal, make_sample
from rlwire.transport._file import staging
from rlwire.transport._stored.names import POOL_RE

RANKS = 4


@functools.cache
def _random_sample(rank: int, i: int) -> TrainingSample:
    return make_sample(4096, layers=48, topk=8, seed=10 * rank + i)


def rank_batch(rank: int, step: int, samples: int = 7) -> TrainingBatch:
    """About 11 MB a rank, most of it routed experts (the sidecar): over BESIDE_BYTES.

    The rank's random samples, made once (making them anew took most of these tests'
    time), with ``step`` added to every token id and routed expert: the batches of two
    steps (under 256 apart) differ in every one of them."""
    return TrainingBatch(
        samples=[
            msgspec.structs.replace(
                sample,
                token_ids=sample.token_ids + step,
                routed_experts=sample.routed_experts + np.uint8(step % 256),
                env_name=f"{sample.env_name}-step{step}",
            )
            for sample in map(functools.partial(_random_sample, rank), range(samples))
        ]
    )


def leftovers(root: Path) -> list[str]:
    """Temporary files in ``root`` other than the recycling pool's."""
    return sorted(n for n in os.listdir(root) if ".tmp" in n and not POOL_RE.fullmatch(n))


class Writers:
    """The writers beside: the names of the threads that ran a rank's files, and how
    many run now."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.running = 0
        self.lock = threading.Lock()


@pytest.fixture
def beside(monkeypatch: pytest.MonkeyPatch) -> Writers:
    """The threads that write ranks beside the staging thread, watched."""
    writers = Writers()
    real = staging.run_sliced_beside

    def watched(slices: Any, stop: threading.Event) -> None:
        with writers.lock:
            writers.names.append(threading.current_thread().name)
            writers.running += 1
        try:
            real(slices, stop)
        finally:
            with writers.lock:
                writers.running -= 1

    monkeypatch.setattr(staging, "run_sliced_beside", watched)
    return writers


@pytest.mark.anyio
@pytest.mark.parametrize("recycle", [False, True, "tmpfs"])
async def test_ranks_written_beside_arrive_bit_exact(
    tmp_path: Path, beside: Writers, recycle: bool | str, request: pytest.FixtureRequest
) -> None:
    # "tmpfs": recycled on tmpfs, where the writers copy into the files' kept mappings.
    root = request.getfixturevalue("shm_dir") if recycle == "tmpfs" else tmp_path
    options: dict[str, Any] = {"storage_options": {"writers": 4}}
    if recycle:
        options = {"storage_options": {"writers": 4, "recycle": True}, "keep_last": 1}
    receivers = [rlwire.open_receiver(root, rank=r) for r in range(RANKS)]
    try:
        async with rlwire.open_sender(root, sidecar="routed_experts", **options) as s:
            for step in range(4):  # with recycling, later steps reuse the pruned files
                sent = [rank_batch(r, step) for r in range(RANKS)]
                assert await s.send_ranks(sent) == step
                assert leftovers(root) == []
                for rank, receiver in enumerate(receivers):  # checksums verified
                    assert_batches_equal(await receiver.areceive(timeout=10), sent[rank])
                    assert receiver.last_step == step
    finally:
        for receiver in receivers:
            receiver.close()
    assert beside.names and all(name.startswith("rlwire-worker") for name in beside.names)


@pytest.mark.anyio
@pytest.mark.parametrize("recycle", [False, "tmpfs"])
async def test_a_cancelled_send_leaves_nothing_and_no_writer_behind(
    tmp_path: Path, beside: Writers, recycle: bool | str, request: pytest.FixtureRequest
) -> None:
    # "tmpfs": recycled on tmpfs, a cancelled writer copying into a kept mapping.
    root = request.getfixturevalue("shm_dir") if recycle else tmp_path
    writers: dict[str, Any] = {"writers": 4}
    options: dict[str, Any] = {"storage_options": writers}
    if recycle:
        options = {"storage_options": {**writers, "recycle": True}, "keep_last": 1}
    receivers = [rlwire.open_receiver(root, rank=r) for r in range(RANKS)]
    async with rlwire.open_sender(root, sidecar="routed_experts", **options) as s:
        for warm_up in range(3):  # with recycling, the cancelled sends then write over
            sent = [rank_batch(r, 100 + warm_up) for r in range(RANKS)]  # pooled files
            await s.send_ranks(sent)
            for rank, receiver in enumerate(receivers):
                assert_batches_equal(await receiver.areceive(timeout=10), sent[rank])
        warm = getattr(s.sink, "_warm", None)
        assert (warm is not None and len(warm) > 0) == bool(recycle)  # files were mapped
        delays = [0.002 * i for i in range(1, 12)]
        for attempt, delay in enumerate(delays):
            sent = [rank_batch(r, attempt) for r in range(RANKS)]
            with anyio.move_on_after(delay):
                await s.send_ranks(sent)
            # Whether the send finished or not, no writer still writes into a file (whose
            # descriptor the next files may reuse) and no temporary file is left: the
            # step either is whole or was never made.
            assert beside.running == 0
            assert leftovers(root) == []
            committed = s.last_step
            assert s.next_step == (0 if committed is None else committed + 1)
            if committed is not None and receivers[0].last_step != committed:
                for rank, receiver in enumerate(receivers):  # consumed: then recycled
                    assert_batches_equal(await receiver.areceive(timeout=10), sent[rank])
        sent = [rank_batch(r, 99) for r in range(RANKS)]
        step = await s.send_ranks(sent)
    assert beside.names  # ranks were written beside before some cancellations
    for rank, receiver in enumerate(receivers):
        assert_batches_equal(await receiver.areceive(timeout=10), sent[rank])
        assert receiver.last_step == step
        receiver.close()


_FAIL_BESIDE = """
import os, resource, signal, sys
sys.path[:0] = {paths!r}
import rlwire
from test_ranks_beside import RANKS, leftovers, rank_batch

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000_000, resource.RLIM_INFINITY))
root = {root!r}
sent = [rank_batch(r, 0, samples=14 if r == 2 else 7) for r in range(RANKS)]  # 22 MB
writers = {{"writers": {writers}}}
with rlwire.open_sync_sender(root, sidecar="routed_experts", storage_options=writers) as s:
    try:
        s.send_ranks(sent)
    except rlwire.TransportError as exc:
        print("error:", exc)
    print("visible:", sorted(n for n in os.listdir(root) if n.startswith("step-")))
    print("leftovers:", leftovers(__import__("pathlib").Path(root)))
    print("next:", s.send_ranks([rank_batch(r, 1) for r in range(RANKS)]))
"""


@pytest.mark.parametrize("writers", [2, 9])
def test_a_rank_that_fails_beside_fails_the_step_and_leaves_nothing(
    tmp_path: Path, writers: int
) -> None:
    # A real failure: rank 2's sidecar grows past the process's file size limit
    # (RLIMIT_FSIZE) and its write fails with EFBIG. With 9 writers every rank is written
    # beside; with 2, rank 2 is written beside or by the staging thread while a writer
    # beside still runs, as timing has it.
    here = str(Path(__file__).parent)
    paths = [here, *[p for p in sys.path if p]]
    script = textwrap.dedent(_FAIL_BESIDE).format(paths=paths, root=str(tmp_path), writers=writers)
    run = forked.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert "rank-0002.sidecar.rlw" in lines["error"] and "File too large" in lines["error"]
    assert lines["visible"] == "[]"
    assert lines["leftovers"] == "[]"
    assert lines["next"] == "0"  # the failed step's number was not used; the sender works


@pytest.mark.parametrize("bad", [0, -1, 2.0, "2", True])
def test_writers_must_be_a_whole_number_of_at_least_one(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(rlwire.ConfigError, match=r"'writers' must be a whole number.*got"):
        rlwire.open_sender(tmp_path, storage_options={"writers": bad})
    assert os.listdir(tmp_path) == []  # nothing made


def test_writers_default_to_the_cores_less_one(tmp_path: Path) -> None:
    from rlwire.transport import FileSink

    assert FileSink(tmp_path).writers == max(1, min((os.cpu_count() or 1) - 1, 8))
    assert FileSink(tmp_path, writers=3).writers == 3
