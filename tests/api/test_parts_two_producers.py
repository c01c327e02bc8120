"""Two producers filling one step part by part on one store (docs/reliability.md, "Two
producers on one store"): a sender's open_step takes as its own only the parts it put
itself and, opened with ``resume``, those of the step it resumed (a producer before it,
fenced off by that open); a live producer's parts beside it are refused, so receivers
get one producer's step whole, never a mix, and the producer fenced off is told so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire.codecs import MsgpackCodec
from rlwire.testing import make_sample
from rlwire.transport import FileSink

pytestmark = pytest.mark.anyio

OTHERS = r"step 0, rank 0, part 0 \(key 'a-0'\) was put by another producer, after this sender"


async def received(url: str, options: dict[str, Any], rank: int) -> list[int]:
    """The lengths of the samples ``rank`` receives of step 0."""
    with rlwire.open_receiver(
        url, rank=rank, storage_options=options, record_consumed=False
    ) as receiver:
        batch = await receiver.areceive(timeout=5)
    return [len(sample.token_ids) for sample in batch.samples]


async def test_a_live_producers_parts_are_not_taken(file_or_s3: tuple[str, Any]) -> None:
    """B opens step 0 after A put a part of it: B takes none of it (it used to take A's
    part as its own, seal it with its own, and A's seal was refused: a mix)."""
    url, options = file_or_s3
    async with (
        rlwire.open_sender(url, storage_options=options) as a,
        rlwire.open_sender(url, storage_options=options) as b,
    ):
        await a.aopen()
        await b.aopen()  # both "error" on a new destination: no fence between them
        async with a.open_step(ranks=2) as writer:
            await writer.put([make_sample(4)], key="a-0", rank=0)
            with pytest.raises(rlwire.StepExistsError, match=OTHERS + r" opened the destina"):
                async with b.open_step(ranks=2):
                    pytest.fail("B took A's step")
            await writer.put([make_sample(5)], key="a-1", rank=1)
        assert writer.assignment == (("a-0",), ("a-1",))  # A sealed it
        with pytest.raises(rlwire.StepExistsError, match="sealed already"):
            async with b.open_step(ranks=2):
                pass
    assert [await received(url, options, rank) for rank in (0, 1)] == [[4], [5]]


async def test_racing_producers_never_seal_a_mix(file_or_s3: tuple[str, Any]) -> None:
    """Both open step 0 before either puts: each seal is refused (the other's part is
    there), and opening the step again takes nothing of the other's (it used to)."""
    url, options = file_or_s3
    async with (
        rlwire.open_sender(url, storage_options=options) as a,
        rlwire.open_sender(url, storage_options=options) as b,
    ):
        writers = [a.open_step(ranks=2), b.open_step(ranks=2)]
        for writer in writers:
            await writer.__aenter__()
        await writers[0].put([make_sample(4)], key="a-0", rank=0)
        await writers[1].put([make_sample(5)], key="b-0", rank=1)
        for writer in writers:
            with pytest.raises(rlwire.StepExistsError, match="another producer fills the step"):
                await writer.__aexit__(None, None, None)
        with pytest.raises(rlwire.StepExistsError, match=OTHERS):
            async with b.open_step(0, ranks=2):
                pass
        with pytest.raises(rlwire.StepExistsError, match=r"rank 1, part 0 \(key 'b-0'\) was put"):
            async with a.open_step(0, ranks=2):
                pass
        async with rlwire.open_receiver(
            url, storage_options=options, record_consumed=False
        ) as receiver:
            with pytest.raises(rlwire.ReceiveTimeout):
                await receiver.areceive(timeout=0.5)  # no seal: nothing delivered whole


async def test_a_resumed_step_is_taken_and_the_producer_before_is_told(
    file_or_s3: tuple[str, Any],
) -> None:
    """B opens with resume: the step A left open is B's to finish, A's part with it
    (resume); A, fenced off, gets ClosedError for every call, reopening its step too
    (which said 'sealed already' once B sealed it)."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as a:
        with pytest.raises(rlwire.ClosedError, match="another sender opened the destination"):
            async with a.open_step(ranks=2) as writer:
                await writer.put([make_sample(4)], key="a-0", rank=0)
                async with rlwire.open_sender(
                    url, on_existing="resume", storage_options=options
                ) as b:
                    async with b.open_step(ranks=2) as taken:
                        assert taken.resumed == {"a-0"}
                        assert await taken.put([make_sample(4)], key="a-0") is True  # skipped
                        await taken.put([make_sample(5)], key="b-0", rank=1)
                # leaving A's block seals: fenced off
        with pytest.raises(rlwire.ClosedError, match="cannot fill step 0 part by part: another"):
            async with a.open_step(0, ranks=2):
                pass
    assert [await received(url, options, rank) for rank in (0, 1)] == [[4], [5]]


async def test_a_part_of_undecided_commit_is_taken_by_the_same_sender(tmp_path: Path) -> None:
    """A part whose commit failed without knowing whether it became visible is the
    sender's own: opening the step again takes it (it was visible after all)."""

    class Undecided(FileSink):  # a real sink whose first part's commit loses its answer
        failed = False

        def stage_part(self, step: int, part: Any, frame: Any) -> Any:
            staged = yield from super().stage_part(step, part, frame)
            if not Undecided.failed:
                Undecided.failed, commit = True, staged.commit

                def lost() -> None:
                    commit()
                    staged.visible = None
                    raise rlwire.TransportError("the store did not answer")

                staged.commit = lost
            return staged

    async with rlwire.TrainingBatchSender(Undecided(tmp_path), MsgpackCodec()) as sender:
        with pytest.raises(rlwire.TransportError, match="the store did not answer"):
            async with sender.open_step(ranks=1) as writer:
                await writer.put([{"token_ids": [1, 2]}], key="a")
        async with sender.open_step(0, ranks=1) as writer:
            assert writer.resumed == {"a"}
            await writer.put([{"token_ids": [3]}], key="b")
        assert writer.assignment == (("a", "b"),)
