"""Consumption marks, keep_last and max_ahead beyond the contract: bad marks, bad
options, and a trainer in another process moving on while the sender deletes."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import forked
import pytest
from helpers import make_batch

import rlwire
from rlwire.abc import Sink
from rlwire.codecs import MsgpackCodec
from rlwire.transport import FileSink
from rlwire.transport.layout import consumed_mark, main_name

pytestmark = pytest.mark.anyio

#: A main file of a step and rank (docs/format.md); groups: step, rank.
MAIN_FILE = re.compile(r"step-(\d+)\.rank-(\d+)\.rlw")


def stored_steps(path: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in path.glob("step-*.rank-0000.rlw"))


@pytest.mark.parametrize(
    ("mark", "message"),
    [
        (b"garbage", "a consumption mark is 16 bytes, this one 7"),
        (b"RLWE" + bytes(12), "not an rlwire consumption mark"),
    ],
)
async def test_a_bad_mark_is_an_error_naming_it_and_deletes_nothing(
    tmp_path: Path, mark: bytes, message: str
) -> None:
    async with rlwire.open_sender(tmp_path, keep_last=1) as sender:
        for _ in range(3):
            await sender.send(make_batch(1))
        assert stored_steps(tmp_path) == [0, 1, 2]  # no mark yet: nothing consumed
        (tmp_path / "consumed.rank-0000.rlw").write_bytes(mark)
        with pytest.raises(rlwire.CorruptFrameError, match=message) as caught:
            await sender.send(make_batch(1))
        assert "consumed.rank-0000.rlw" in str(caught.value)
        assert sender.next_step == 3
    assert stored_steps(tmp_path) == [0, 1, 2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"keep_last": 0}, "keep_last must be an int of at least 1, got 0"),
        ({"max_ahead": -1}, "max_ahead must be an int of at least 0, got -1"),
        ({"keep_last": True}, "keep_last must be an int"),
    ],
)
def test_bad_retention_options(tmp_path: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(rlwire.ConfigError, match=message):
        rlwire.open_sender(tmp_path, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["keep_last", "max_ahead"])
def test_streams_refuse_retention(option: str) -> None:
    with pytest.raises(rlwire.ConfigError, match=f"{option}|keep_last and max_ahead.*hwm"):
        rlwire.open_sender("zmq+tcp://127.0.0.1:0", **{option: 1})  # type: ignore[arg-type]


async def test_truncate_forgets_the_marks_of_the_steps_it_deletes(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        for _ in range(4):
            await sender.send(make_batch(1))
    with rlwire.open_receiver(tmp_path) as receiver:
        for _ in range(4):
            receiver.receive(timeout=5)
        receiver.wait_next(timeout=0)  # moved past step 3
    assert (tmp_path / "consumed.rank-0000.rlw").read_bytes() == consumed_mark(4)
    # Restart from step 1: the old mark (4) would let keep_last delete the new steps.
    async with rlwire.open_sender(
        tmp_path, start_step=1, on_existing="truncate", keep_last=1
    ) as sender:
        await sender.send(make_batch(1))
        await sender.send(make_batch(1))
    assert not (tmp_path / "consumed.rank-0000.rlw").exists()
    assert stored_steps(tmp_path) == [0, 1, 2]


TRAINER = textwrap.dedent("""
    import sys, rlwire
    from rlwire.testing import make_batch
    path, steps = sys.argv[1], int(sys.argv[2])
    with rlwire.open_receiver(path, poll_interval=0.002) as receiver:
        for step, batch in enumerate(receiver):
            want = make_batch(2, 512, seed=step)
            assert batch.samples[0].token_ids.tobytes() == want.samples[0].token_ids.tobytes()
            assert batch.samples[1].routed_experts.sum() == want.samples[1].routed_experts.sum()
    print(receiver.last_step, flush=True)
""")


async def test_a_trainer_process_moves_on_while_the_sender_deletes(tmp_path: Path) -> None:
    """Every step arrives intact in another process while the sender deletes behind it
    and waits for it; at the end only the newest steps are stored."""
    steps = 30
    trainer = forked.Popen(
        [sys.executable, "-c", TRAINER, str(tmp_path), str(steps)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        async with rlwire.open_sender(
            tmp_path, sidecar="routed_experts", keep_last=2, max_ahead=3
        ) as sender:
            most = 0
            for step in range(steps):
                await sender.send(make_batch(2, 512, seed=step))
                most = max(most, len(stored_steps(tmp_path)))
            await sender.finish()
        out, _ = trainer.communicate(timeout=60)
    finally:
        trainer.kill()
    assert trainer.returncode == 0 and out.strip() == str(steps - 1)
    assert most <= 2 + 3  # keep_last plus what max_ahead lets the sender run ahead
    # The last prune ran before step 29 was sent, by the marks the trainer had written
    # by then: the newest 2 steps and what the trainer had not yet moved past remain.
    kept = stored_steps(tmp_path)
    assert kept == list(range(steps - len(kept), steps)) and 2 <= len(kept) <= 2 + 3
    assert not list(tmp_path.glob("step-00000000.*"))
    assert (tmp_path / main_name(29, 0)).exists()


@pytest.mark.parametrize("url", ["file", "memory://retention-deleted-step"])
async def test_a_step_keep_last_deleted_is_a_gap_error_naming_the_oldest(
    tmp_path: Path, url: str
) -> None:
    where = str(tmp_path) if url == "file" else url
    async with rlwire.open_sender(where, keep_last=1, on_existing="overwrite") as sender:
        with rlwire.open_receiver(where) as receiver:
            for _ in range(6):
                await sender.send(make_batch(1))
                receiver.receive(timeout=5)
            receiver.wait_next(timeout=0)  # moved past step 5: the mark says 6
        await sender.send(make_batch(1))  # deletes the steps before 6
    with rlwire.open_receiver(where, start_step=2) as late:
        with pytest.raises(rlwire.StepGapError, match="step 2 is no longer stored") as caught:
            late.receive(timeout=10)
    assert "the oldest stored step is 6" in str(caught.value)
    assert "start_step=6" in str(caught.value)


async def test_a_deleted_step_a_rank_was_left_out_of_is_not_said_to_be_unread(
    tmp_path: Path,
) -> None:
    """Step 0 goes to ranks 0 and 1, steps 1-3 to rank 0 alone, which reads them all:
    keep_last deletes steps 0-2. Rank 1 asks for step 1, which was never its own:
    nothing tells it so once the step is gone, and the message must not say the rank
    failed to read it in time (as it did), but allow for a step sent to fewer ranks."""
    rank0 = rlwire.open_receiver(tmp_path, rank=0)
    rank1 = rlwire.open_receiver(tmp_path, rank=1)
    with rank0, rank1:
        async with rlwire.open_sender(tmp_path, keep_last=1) as sender:
            await sender.send_ranks([make_batch(1), make_batch(1)])
            await rank1.areceive(timeout=10)
            rank1.wait_next(timeout=0)  # at step 1
            for step in range(4):
                if step:
                    await sender.send(make_batch(1))
                await rank0.areceive(timeout=10)
                rank0.wait_next(timeout=0)
            await sender.send(make_batch(1))  # deletes steps 0-3 but the newest
        with pytest.raises(rlwire.StepGapError, match="step 1 is no longer stored") as caught:
            await rank1.areceive(timeout=10)
    message = str(caught.value)
    assert "if it was not sent to this rank (a step sent to fewer ranks)" in message
    assert "skip() it" in message


async def test_a_receiver_opened_at_each_step_lets_keep_last_and_max_ahead_go_on(
    tmp_path: Path,
) -> None:
    """The single-controller pattern (a StepHandle's receiver): each step is read by a
    receiver opened at it, which reads once and closes. Opened at step ``s``, it has
    moved past every step before ``s``, and its read records that: ``keep_last`` deletes
    the older steps, and ``max_ahead=1`` lets the next send go."""
    async with rlwire.open_sender(tmp_path, keep_last=2, max_ahead=1) as sender:
        for step in range(8):
            with anyio.fail_after(10):  # a rank that never moves on would block it
                assert await sender.send(make_batch(1, seed=step)) == step
            for _ in range(2):  # the trainer retried: the mark stays where it is
                async with rlwire.open_receiver(tmp_path, start_step=step) as receiver:
                    got = await receiver.areceive(timeout=5)
                assert got.samples[0].token_ids.tobytes() == (
                    make_batch(1, seed=step).samples[0].token_ids.tobytes()
                )
            if step:  # opened at step 0, it has moved past nothing: no mark yet
                mark = (tmp_path / "consumed.rank-0000.rlw").read_bytes()
                assert mark == consumed_mark(step)
            assert stored_steps(tmp_path) == list(range(max(0, step - 1), step + 1))


async def test_a_receiver_opened_at_a_step_not_sent_yet_records_nothing_until_it_reads_it(
    tmp_path: Path,
) -> None:
    """A handle made ahead of its step, or a trainer restored from a later checkpoint
    than the producer's: its receiver has moved past the steps before its start only
    once it has read that step. Recorded at its first look, the mark was past every step
    sent, and each later send with ``keep_last`` failed ("a mark left by another run?")."""
    async with rlwire.open_sender(tmp_path, keep_last=2) as sender:
        for step in range(2):
            await sender.send(make_batch(1, seed=step))
        async with rlwire.open_receiver(tmp_path, start_step=4) as early:
            assert early.poll() is None
        assert not (tmp_path / "consumed.rank-0000.rlw").exists()
        for step in range(2, 5):  # every send goes on, and the early receiver's step comes
            assert await sender.send(make_batch(1, seed=step)) == step
        async with rlwire.open_receiver(tmp_path, start_step=4) as receiver:
            got = await receiver.areceive(timeout=5)
        assert (
            got.samples[0].token_ids.tobytes()
            == make_batch(1, seed=4).samples[0].token_ids.tobytes()
        )
        assert (tmp_path / "consumed.rank-0000.rlw").read_bytes() == consumed_mark(4)
        await sender.send(make_batch(1, seed=5))  # deletes the steps before 4
    assert stored_steps(tmp_path) == [4, 5]


def _stored_files(url: str, options: dict[str, object]) -> list[tuple[int, int]]:
    """The (step, rank) of every main file stored under ``url``, read from the store."""
    if not url.startswith("s3://"):
        names = [p.name for p in Path(url).iterdir()]
    else:
        from s3_server import s3_client

        bucket, prefix = url.removeprefix("s3://").split("/", 1)
        listed = s3_client(options).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
        names = [item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", [])]
    found = [MAIN_FILE.fullmatch(name) for name in names]
    return sorted((int(m.group(1)), int(m.group(2))) for m in found if m)


@pytest.fixture(params=["file", "file-recycle", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, object]]:
    if request.param == "file":
        return str(tmp_path / "run"), {}
    if request.param == "file-recycle":
        return str(tmp_path / "run"), {"recycle": True}
    return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")


async def test_a_step_held_back_is_deleted_at_the_next_send_once_its_rank_moved_past(
    store: tuple[str, dict[str, object]],
) -> None:
    """keep_last=1; step 0 goes to ranks 0 and 1, the later steps to rank 0 only, whose
    trainer stays at step 1. The send of step 1 would delete step 0, but rank 1 has not
    read it: it is held back. Once rank 1 moved past it, the send of step 2 deletes it,
    though rank 0 (which bounds what may go) has not moved: no step is left that every
    rank moved past and that is not the newest."""
    url, options = store
    reading = {k: v for k, v in options.items() if k != "recycle"}  # a sender's option
    with (
        rlwire.open_receiver(url, rank=0, storage_options=reading) as r0,
        rlwire.open_receiver(url, rank=1, storage_options=reading) as r1,
    ):
        async with rlwire.open_sender(url, keep_last=1, storage_options=options) as sender:
            await sender.send_ranks([make_batch(1, seed=0), make_batch(1, seed=1)])
            assert (await r0.areceive(timeout=20)).samples[0].env_name == "env0"
            assert r0.poll() is None  # rank 0 moved past step 0, and stays at step 1
            await sender.send(make_batch(1, seed=2))
            assert _stored_files(url, options) == [(0, 0), (0, 1), (1, 0)]  # held for rank 1
            await r1.areceive(timeout=20)
            # Rank 1 moved past step 0 too, and is told at once that step 1 left it out.
            with pytest.raises(rlwire.StepGapError, match=r"step 1 was sent to rank 0 only"):
                r1.poll()
            await sender.send(make_batch(1, seed=3))
            assert _stored_files(url, options) == [(1, 0), (2, 0)]
            await sender.send(make_batch(1, seed=4))  # rank 0 still at step 1: nothing goes
            assert _stored_files(url, options) == [(1, 0), (2, 0), (3, 0)]


async def test_a_step_sealed_with_no_part_counts_as_sent_when_marks_are_read(
    store: tuple[str, dict[str, object]],
) -> None:
    """A step filled part by part that got no part at all (a producer that found
    nothing to send) is only a seal. A rank that moved past it has a mark beyond the
    newest step with files, and the next send that pruned took that mark for one of
    another run (``CorruptFrameError``, "a mark left by another run?")."""
    url, options = store
    reading = {k: v for k, v in options.items() if k != "recycle"}  # a sender's option
    with rlwire.open_receiver(url, storage_options=reading) as receiver:
        async with rlwire.open_sender(url, keep_last=1, storage_options=options) as sender:
            await sender.send(make_batch(1, seed=0))
            await receiver.areceive(timeout=20)
            async with sender.open_step() as writer:
                assert writer.step == 1  # sealed with no part
            assert [part async for part in receiver.aparts(timeout=20)] == []
            assert receiver.poll() is None  # moved past step 1: its mark says 2
            assert await sender.send(make_batch(1, seed=2)) == 2
            assert _stored_files(url, options) == [(2, 0)]
            assert (await receiver.areceive(timeout=20)).samples[0].env_name == "env2"


async def test_max_ahead_waits_for_a_rank_on_a_step_filled_part_by_part_without_it(
    store: tuple[str, dict[str, object]],
) -> None:
    """A step filled part by part for rank 0 alone still reaches rank 1 (the seal gives
    it the step, empty), which reads it and moves past: unlike a step sent whole to
    fewer ranks, it holds max_ahead for rank 1 until rank 1 has read it."""
    url, options = store
    reading = {k: v for k, v in options.items() if k != "recycle"}  # a sender's option
    with (
        rlwire.open_receiver(url, rank=0, storage_options=reading) as r0,
        rlwire.open_receiver(url, rank=1, storage_options=reading) as r1,
    ):
        # keep_last for recycle, which needs it; of three steps it deletes none.
        retention = rlwire.Retention(keep_last=8, max_ahead=0)
        async with rlwire.open_sender(url, retention=retention, storage_options=options) as sender:
            await sender.send_ranks([make_batch(1, seed=0), make_batch(1, seed=1)])
            for receiver in (r0, r1):
                await receiver.areceive(timeout=20)
                assert receiver.poll() is None  # moved past step 0
            async with sender.open_step(ranks=1) as writer:
                await writer.put(make_batch(1, seed=2).samples, key="a")
            assert len((await r0.areceive(timeout=20)).samples) == 1
            assert r0.poll() is None  # rank 0 moved past step 1, rank 1 has not
            both = [make_batch(1, seed=3), make_batch(1, seed=4)]
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.5):
                    await sender.send_ranks(both)  # waits for rank 1
            assert len((await r1.areceive(timeout=20)).samples) == 0  # its empty step 1
            assert r1.poll() is None
            with anyio.fail_after(20):
                assert await sender.send_ranks(both) == 2


class _NoPrune(FileSink):
    """A plugin's sink that records consumption (its marks are the file sink's) but
    deletes nothing: ``prune`` is the abstract sink's."""

    prune = Sink.prune


async def test_keep_last_on_a_sink_without_prune_is_refused_when_the_sender_is_made(
    tmp_path: Path,
) -> None:
    """Not at the first send that would delete a step, saying the sink does not track
    consumption (it does); max_ahead alone, which deletes nothing, works."""
    with pytest.raises(rlwire.ConfigError) as caught:
        rlwire.TrainingBatchSender(_NoPrune(tmp_path), MsgpackCodec(), keep_last=1)
    assert str(caught.value) == (
        f"keep_last needs a sink that deletes steps: {_NoPrune(tmp_path)!r} records what "
        "receivers consumed but implements no prune() (max_ahead alone works with it)"
    )
    async with rlwire.TrainingBatchSender(_NoPrune(tmp_path), MsgpackCodec(), max_ahead=1) as s:
        with rlwire.open_receiver(tmp_path) as receiver:
            for step in range(3):
                assert await s.send(make_batch(1, seed=step)) == step
                await receiver.areceive(timeout=20)
    assert stored_steps(tmp_path) == [0, 1, 2]


async def test_a_receiver_of_the_run_before_an_overwrite_neither_stops_nor_prunes_the_new_one(
    store: tuple[str, dict[str, object]],
) -> None:
    """A receiver of the run an ``overwrite`` deleted reads on: its next mark says it
    moved past steps the new run has not sent. Every send of the new run with
    ``keep_last`` or ``max_ahead`` failed on that mark (``CorruptFrameError``, "a mark
    left by another run?"): the producer could not go on. It now sends, deletes nothing
    on account of that rank while its mark is ahead, and the receiver gets the new
    run's step it waits for."""
    url, options = store
    reading = {k: v for k, v in options.items() if k != "recycle"}  # a sender's option
    async with rlwire.open_sender(url, storage_options=reading) as old:
        for step in range(3):
            await old.send(make_batch(1, seed=step))
    with rlwire.open_receiver(url, storage_options=reading) as receiver:
        for _ in range(2):
            await receiver.areceive(timeout=20)
        retention = rlwire.Retention(keep_last=1, max_ahead=1)
        async with rlwire.open_sender(
            url, on_existing="overwrite", retention=retention, storage_options=options
        ) as new:
            assert receiver.poll() is None  # moved past step 1: its mark says 2, none sent
            for step in range(2):
                assert await new.send(make_batch(1, seed=10 + step)) == step
            assert _stored_files(url, options) == [(0, 0), (1, 0)]  # the mark is ahead
            assert await new.send(make_batch(1, seed=12)) == 2  # the mark says 2: pruned
            assert _stored_files(url, options) == [(2, 0)]
            got = await receiver.areceive(timeout=20)
            assert receiver.last_step == 2
            want = make_batch(1, seed=12).samples[0].token_ids
            assert got.samples[0].token_ids.tobytes() == want.tobytes()


async def test_max_ahead_and_keep_last_take_steps_from_2_63_on(tmp_path: Path) -> None:
    """Steps are u64: the record of each step's ranks kept them as signed (OverflowError)."""
    async with rlwire.open_sender(tmp_path, start_step=2**63, max_ahead=1, keep_last=1) as sender:
        assert await sender.send(make_batch(1)) == 2**63
        assert await sender.send_ranks([make_batch(1), make_batch(1)]) == 2**63 + 1
    with rlwire.open_receiver(tmp_path, rank=1, start_step=2**63 + 1) as receiver:
        assert receiver.receive(timeout=10) is not None
