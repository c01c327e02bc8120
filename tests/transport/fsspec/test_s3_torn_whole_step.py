"""A producer killed while committing a step sent whole to several ranks, without
sidecars, on S3: rank 0's main object landed, the others never did (they are put at
commit, from memory, so nothing of them is listed). When no other stored step tells how
many ranks the run has (the step is the first, or follows steps filled part by part),
the listing looks like a whole step of one rank; the resumed sender must refuse to go on
past it at its first step for more ranks (whole or part by part), naming the repair, not
leave the other ranks' receivers waiting for ever."""

from __future__ import annotations

from typing import Any

import pytest
from s3_server import s3_client

import rlwire
from rlwire.testing import make_sample

pytestmark = pytest.mark.anyio

RANKS = 3


def batch(step: int, rank: int) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[make_sample(40, seed=10 * step + rank)])


def tear(options: dict[str, Any], url: str, step: int) -> None:
    """Leave ``step`` as a commit killed after rank 0's main object: the others gone."""
    bucket = url.removeprefix("s3://")
    for rank in range(1, RANKS):
        key = f"step-{step:08d}.rank-{rank:04d}.rlw"
        s3_client(options).delete_object(Bucket=bucket, Key=key)


@pytest.mark.parametrize("parts_before", [False, True])
async def test_resume_refuses_to_go_on_after_a_torn_whole_step(
    s3_url: str, s3_endpoint: dict[str, Any], parts_before: bool
) -> None:
    """Its message records the ranks it was sent to (1.8): the resumed sender's open
    refuses it, naming the step, the ranks it has and the repair."""
    options = {"storage_options": s3_endpoint, "on_existing": "resume"}
    torn = 1 if parts_before else 0
    async with rlwire.open_sender(s3_url, **options) as sender:
        if parts_before:
            async with sender.open_step(ranks=RANKS) as writer:
                for key in range(4):
                    await writer.put([make_sample(30, seed=key)], key=key)
        await sender.send_ranks([batch(torn, r) for r in range(RANKS)])
    tear(s3_endpoint, s3_url, torn)

    incomplete = rf"step {torn} is incomplete \(ranks \[0\] of the {RANKS} it was sent to\)"
    with pytest.raises(rlwire.StepExistsError, match=incomplete) as info:
        async with rlwire.open_sender(s3_url, **options):
            pass
    assert f"start_step={torn}, on_existing='truncate'" in str(info.value)

    # Nothing of the next step was made visible.
    listed = s3_client(s3_endpoint).list_objects_v2(Bucket=s3_url.removeprefix("s3://"))
    names = [o["Key"] for o in listed.get("Contents", [])]
    assert not [n for n in names if n.startswith(f"step-{torn + 1:08d}.")], names

    # The repair it names gives every rank the step.
    repair = {"storage_options": s3_endpoint, "on_existing": "truncate", "start_step": torn}
    async with rlwire.open_sender(s3_url, **repair) as sender:
        await sender.send_ranks([batch(torn, r) for r in range(RANKS)])
    for rank in range(RANKS):
        with rlwire.open_receiver(
            s3_url, rank=rank, start_step=torn, storage_options=s3_endpoint
        ) as receiver:
            got = receiver.receive(timeout=10)
        rlwire.testing.assert_batches_equal(got, batch(torn, rank))


async def test_a_resumed_sender_may_send_to_as_many_or_fewer_ranks(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    """A whole last step is no reason to refuse a send to the ranks it has."""
    options = {"storage_options": s3_endpoint, "on_existing": "resume"}
    async with rlwire.open_sender(s3_url, **options) as sender:
        await sender.send_ranks([batch(0, r) for r in range(RANKS)])
    async with rlwire.open_sender(s3_url, **options) as sender:
        assert await sender.send_ranks([batch(1, r) for r in range(RANKS)]) == 1
    async with rlwire.open_sender(s3_url, **options) as sender:
        assert await sender.send(batch(2, 0)) == 2
