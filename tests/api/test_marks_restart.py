"""A trainer restarted from a checkpoint (``start_step`` at or before its rank's mark)
while the producer goes on sending with ``keep_last``: the step it restarts at must not
be deleted, or its files written over (``recycle``), while it reads it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import make_batch

import rlwire
from rlwire.transport import FileSink, FileSource
from rlwire.transport.layout import consumed_mark, main_name, sidecar_name

MARK = "consumed.rank-0000.rlw"


class PausedSource(FileSource):
    """A directory's source whose first load of ``name`` waits, once it began, until
    the test lets it go on: the moment a receiver starts to read a step, held open."""

    def __init__(self, path: Path, name: str) -> None:
        super().__init__(path)
        self.name, self.reading, self.go = name, threading.Event(), threading.Event()

    def load(self, name: str, advice: int | None = None) -> memoryview | None:
        if name == self.name and not self.reading.is_set():
            self.reading.set()
            assert self.go.wait(10)
        return super().load(name, advice)


def token_bytes(batch: Any) -> bytes:
    return bytes(batch.samples[0].token_ids.tobytes())


def moved_past_three(path: Path, sender: Any) -> None:
    """Steps 0-3 sent; the rank read 0-2, asked for 3 (its mark says 3), crashed."""
    with rlwire.open_receiver(path) as receiver:
        for step in range(3):
            sender.send(make_batch(1, 5000, seed=step))
            receiver.receive(timeout=5)
        assert receiver.poll() is None
    sender.send(make_batch(1, 5000, seed=3))
    assert (path / MARK).read_bytes() == consumed_mark(3)


@pytest.mark.parametrize("recycle", [True, False])
def test_a_restart_lowers_the_mark_before_it_reads_its_first_step(
    tmp_path: Path, recycle: bool
) -> None:
    """Restarted at step 2, the receiver says so before it reads step 2: a send while
    it reads keeps step 2 (with ``recycle`` it wrote step 4 into step 2's files, under
    the reader: SIGBUS, checksum errors, or arrays that changed after the receive)."""
    options = {"recycle": True} if recycle else {}
    with rlwire.open_sync_sender(tmp_path, storage_options=options, keep_last=2) as sender:
        moved_past_three(tmp_path, sender)
        source = PausedSource(tmp_path, main_name(2, 0))
        got: dict[str, Any] = {}
        receiver: rlwire.TrainingBatchReceiver[rlwire.TrainingBatch]
        receiver = rlwire.TrainingBatchReceiver(source, rlwire.TrainingBatch, start_step=2)
        with receiver:

            def receive() -> None:
                try:
                    got["batch"] = receiver.receive(timeout=10)
                except BaseException as exc:
                    got["error"] = exc

            reader = threading.Thread(target=receive)
            reader.start()
            try:
                assert source.reading.wait(10)
                assert (tmp_path / MARK).read_bytes() == consumed_mark(2)
                assert sender.send(make_batch(1, 5000, seed=4)) == 4  # keeps step 2
            finally:
                source.go.set()
                reader.join(10)
            assert "error" not in got, got
            assert token_bytes(got["batch"]) == token_bytes(make_batch(1, 5000, seed=2))
            assert (tmp_path / main_name(2, 0)).exists()
            sender.send(make_batch(1, 5000, seed=5))  # the rank holds step 2: it stays
            assert token_bytes(got["batch"]) == token_bytes(make_batch(1, 5000, seed=2))
            assert (tmp_path / MARK).read_bytes() == consumed_mark(2)
            assert receiver.poll() is not None  # step 3; the rank moved past step 2
        assert (tmp_path / MARK).read_bytes() == consumed_mark(3)


def test_a_restart_at_a_step_already_deleted_is_a_gap_and_puts_the_mark_back(
    tmp_path: Path,
) -> None:
    """A receiver restarted at a step ``keep_last`` deleted gets the ``StepGapError``
    naming the oldest step, as before, and leaves the rank's mark as it found it; the
    one reopened where the error says goes on from there."""
    with rlwire.open_sync_sender(tmp_path, keep_last=2) as sender:
        moved_past_three(tmp_path, sender)
        sender.send(make_batch(1, 5000, seed=4))  # deletes the steps before 3
        with rlwire.open_receiver(tmp_path, start_step=1) as late:
            with pytest.raises(rlwire.StepGapError, match="start_step=3"):
                late.receive(timeout=5)
            assert (tmp_path / MARK).read_bytes() == consumed_mark(3)
            late.skip()  # step 2 is gone too
            with pytest.raises(rlwire.StepGapError, match="start_step=3"):
                late.receive(timeout=5)
            assert (tmp_path / MARK).read_bytes() == consumed_mark(3)
            late.skip()
            assert token_bytes(late.receive(timeout=5)) == token_bytes(make_batch(1, 5000, seed=3))
            assert (tmp_path / MARK).read_bytes() == consumed_mark(3)
        with rlwire.open_receiver(tmp_path, start_step=3) as receiver:
            assert receiver.wait_next(timeout=5)
            assert (tmp_path / MARK).read_bytes() == consumed_mark(3)


class PausedPrune(FileSink):
    """A sink whose first read of the marks, in a prune, waits until the test lets it go
    on: a send that read the marks just before a trainer restarted."""

    def __init__(self, path: Path, *, recycle: bool) -> None:
        super().__init__(path, recycle=recycle)
        self.read, self.go = threading.Event(), threading.Event()

    def read_consumption(self, ranks: int, sent: int) -> list[int | None]:
        marks = super().read_consumption(ranks, sent)
        if not self.read.is_set():
            self.read.set()
            assert self.go.wait(10)
        return marks


class PausedSidecar(FileSource):
    """A source that, once it opened the main file of ``step``, waits before it opens
    the sidecar until the test lets it go on."""

    def __init__(self, path: Path, step: int) -> None:
        super().__init__(path)
        self.side = sidecar_name(step, 0)
        self.opened, self.go = threading.Event(), threading.Event()

    def load(self, name: str, advice: int | None = None) -> memoryview | None:
        if name == self.side and not self.opened.is_set():
            self.opened.set()
            assert self.go.wait(10)
        return super().load(name, advice)


@pytest.mark.parametrize("recycle", [True, False])
@pytest.mark.parametrize("step", [1, 2])
def test_a_step_pruned_between_its_main_file_and_sidecar_is_read(
    tmp_path: Path, recycle: bool, step: int
) -> None:
    """A prune that read the marks just before a trainer restarted at ``step`` lowered
    its rank's mark deletes the step's main file (or, the newest step it prunes with
    ``recycle``, pools it) after the receiver opened it and before it opened the
    sidecar. The prune reads the marks again once the main files went, and keeps the
    sidecar: the step is read (that was a ``CorruptFrameError`` once, "missing; the main
    file refers to it"; then, with ``recycle``, a ``StepGapError``: the step's sidecar
    went into the pool, or was deleted with its main file, under the reader); with
    ``recycle`` nothing pooled is written into while it may be held."""
    with rlwire.open_sync_sender(tmp_path, keep_last=3, sidecar="routed_experts") as sender:
        moved_past_three(tmp_path, sender)  # steps 1-3 stored; prune(3) lets 1 and 2 go
    sink = PausedPrune(tmp_path, recycle=recycle)
    pruned: list[int] = []
    prune = threading.Thread(target=lambda: pruned.append(sink.prune(3)))
    prune.start()
    source = PausedSidecar(tmp_path, step)
    try:
        assert sink.read.wait(10)  # the marks say the rank moved past the step
        with rlwire.TrainingBatchReceiver(source, rlwire.TrainingBatch, start_step=step) as late:
            got: dict[str, Any] = {}
            reader = threading.Thread(target=lambda: _receive(late, got))
            reader.start()
            assert source.opened.wait(10)  # lowered the mark, opened the main file
            assert (tmp_path / MARK).read_bytes() == consumed_mark(step)
            sink.go.set()
            prune.join(10)
            assert not (tmp_path / main_name(step, 0)).exists()
            assert (tmp_path / sidecar_name(step, 0)).exists()
            assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pool.")]
            source.go.set()
            reader.join(10)
            assert pruned == [step] and "error" not in got, got
            assert token_bytes(got["batch"]) == token_bytes(make_batch(1, 5000, seed=step))
            assert (tmp_path / MARK).read_bytes() == consumed_mark(step)
    finally:
        sink.go.set()
        source.go.set()
        prune.join(10)
        sink.close()


def _receive(receiver: rlwire.TrainingBatchReceiver[Any], got: dict[str, Any]) -> None:
    try:
        got["batch"] = receiver.receive(timeout=5)
    except BaseException as exc:
        got["error"] = exc
