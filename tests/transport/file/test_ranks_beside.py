"""A step's ranks written beside one another (FileStaging.write_rank): on a machine with
cores to spare, a large rank's files are written by a thread of the shared executor
while the next rank's are. These 2-core machines have no writer to spare
(beside_writers() is 0), so each test here grants some; the writes, the failures and
the cancellations are real."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

import rlwire
from rlwire import TrainingBatch
from rlwire.testing import assert_batches_equal, make_sample
from rlwire.transport._file import staging
from rlwire.transport._stored.names import POOL_RE

RANKS = 4


def rank_batch(rank: int, step: int, samples: int = 7) -> TrainingBatch:
    """About 11 MB a rank, most of it routed experts (the sidecar): over BESIDE_BYTES."""
    return TrainingBatch(
        samples=[
            make_sample(4096, layers=48, topk=8, seed=1000 * step + 10 * rank + i)
            for i in range(samples)
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
    """Three writers beside the staging thread, watched."""
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

    monkeypatch.setattr(staging, "beside_writers", lambda: 3)
    monkeypatch.setattr(staging, "run_sliced_beside", watched)
    return writers


@pytest.mark.anyio
@pytest.mark.parametrize("recycle", [False, True])
async def test_ranks_written_beside_arrive_bit_exact(
    tmp_path: Path, beside: Writers, recycle: bool
) -> None:
    options = {"storage_options": {"recycle": True}, "keep_last": 1} if recycle else {}
    receivers = [rlwire.open_receiver(tmp_path, rank=r) for r in range(RANKS)]
    try:
        async with rlwire.open_sender(tmp_path, sidecar="routed_experts", **options) as s:
            for step in range(3):  # with recycling, later steps reuse the pruned files
                sent = [rank_batch(r, step) for r in range(RANKS)]
                assert await s.send_ranks(sent) == step
                assert leftovers(tmp_path) == []
                for rank, receiver in enumerate(receivers):  # checksums verified
                    assert_batches_equal(await receiver.areceive(timeout=10), sent[rank])
                    assert receiver.last_step == step
    finally:
        for receiver in receivers:
            receiver.close()
    assert beside.names and all(name.startswith("rlwire-worker") for name in beside.names)


@pytest.mark.anyio
async def test_a_cancelled_send_leaves_nothing_and_no_writer_behind(
    tmp_path: Path, beside: Writers
) -> None:
    async with rlwire.open_sender(tmp_path, sidecar="routed_experts") as s:
        delays = [0.002 * i for i in range(1, 12)]
        for attempt, delay in enumerate(delays):
            sent = [rank_batch(r, attempt) for r in range(RANKS)]
            with anyio.move_on_after(delay):
                await s.send_ranks(sent)
            # Whether the send finished or not, no writer still writes into a file (whose
            # descriptor the next files may reuse) and no temporary file is left: the
            # step either is whole or was never made.
            assert beside.running == 0
            assert leftovers(tmp_path) == []
            committed = s.last_step
            assert s.next_step == (0 if committed is None else committed + 1)
        sent = [rank_batch(r, 99) for r in range(RANKS)]
        step = await s.send_ranks(sent)
    assert beside.names  # ranks were written beside before some cancellations
    for rank in range(RANKS):
        with rlwire.open_receiver(tmp_path, rank=rank, start_step=step) as receiver:
            assert_batches_equal(receiver.receive(timeout=10), sent[rank])


_FAIL_BESIDE = """
import os, resource, signal, sys
sys.path[:0] = {paths!r}
import rlwire
from rlwire.transport._file import staging
from test_ranks_beside import RANKS, leftovers, rank_batch

staging.beside_writers = lambda: {writers}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000_000, resource.RLIM_INFINITY))
root = {root!r}
sent = [rank_batch(r, 0, samples=14 if r == 2 else 7) for r in range(RANKS)]  # 22 MB
with rlwire.open_sync_sender(root, sidecar="routed_experts") as s:
    try:
        s.send_ranks(sent)
    except rlwire.TransportError as exc:
        print("error:", exc)
    print("visible:", sorted(n for n in os.listdir(root) if n.startswith("step-")))
    print("leftovers:", leftovers(__import__("pathlib").Path(root)))
    print("next:", s.send_ranks([rank_batch(r, 1) for r in range(RANKS)]))
"""


@pytest.mark.parametrize("writers", [1, 8])
def test_a_rank_that_fails_beside_fails_the_step_and_leaves_nothing(
    tmp_path: Path, writers: int
) -> None:
    # A real failure: rank 2's sidecar grows past the process's file size limit
    # (RLIMIT_FSIZE) and its write fails with EFBIG. With 8 writers every rank is written
    # beside; with 1, rank 2 is written beside or by the staging thread while a writer
    # beside still runs, as timing has it.
    here = str(Path(__file__).parent)
    paths = [here, *[p for p in sys.path if p]]
    script = textwrap.dedent(_FAIL_BESIDE).format(paths=paths, root=str(tmp_path), writers=writers)
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert "rank-0002.sidecar.rlw" in lines["error"] and "File too large" in lines["error"]
    assert lines["visible"] == "[]"
    assert lines["leftovers"] == "[]"
    assert lines["next"] == "0"  # the failed step's number was not used; the sender works
