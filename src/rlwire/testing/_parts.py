"""The contract on steps filled part by part: a sink stores them whole and in order, or
says at once that it cannot."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.step_writer import StepWriter
from rlwire._api.synthetic import assert_batches_equal, make_sample
from rlwire._core.errors import ConfigError
from rlwire.testing._fixtures import RANKS, TIMEOUT, ContractFixtures, Endpoint

__all__ = ["PartsContract"]


class PartsContract(ContractFixtures):
    """``open_step`` / ``put`` / seal, read part by part and whole; for a sink without
    :attr:`~rlwire.abc.Sink.stores_parts`, ``open_step`` must raise ConfigError."""

    async def test_parts_arrive_in_commit_order_or_open_step_is_refused(
        self, endpoint: Endpoint
    ) -> None:
        sender = endpoint.open_sender(sidecar="routed_experts")
        if not sender.sink.stores_parts:
            with pytest.raises(ConfigError, match="cannot store a step part by part"):
                sender.open_step()
            await sender.aclose()
            return
        groups = {f"g{i}": [make_sample(4 + 3 * i, seed=i)] for i in range(5)}
        if not self.persistent:
            await _over_a_stream(sender, endpoint, groups)
            return
        async with sender:
            async with sender.open_step(ranks=RANKS) as writer:
                for key, samples in groups.items():
                    assert await writer.put(samples, key=key) is False
        for rank in range(RANKS):
            keys = writer.assignment[rank]
            with endpoint.open_receiver(rank=rank) as receiver:
                got = [part async for part in receiver.aparts(timeout=TIMEOUT)]
                assert [(p.key, p.index) for p in got] == [(k, i) for i, k in enumerate(keys)]
                for part in got:
                    assert_batches_equal(
                        part.value, type(part.value)(samples=groups[str(part.key)])
                    )
                assert receiver.next_step == 1
            with endpoint.open_receiver(rank=rank) as receiver:
                whole = await receiver.areceive(timeout=TIMEOUT)
                assert [len(s.token_ids) for s in whole.samples] == [
                    len(s.token_ids) for k in keys for s in groups[str(k)]
                ]


async def _over_a_stream(
    sender: TrainingBatchSender, endpoint: Endpoint, groups: dict[str, list[Any]]
) -> None:
    """A stream carries parts to receivers that are there: each rank reads step 0 part
    by part and step 1 whole, while the sender fills both."""
    receivers = [endpoint.open_receiver(rank=rank) for rank in range(RANKS)]
    writers: list[StepWriter] = []
    parts: dict[int, list[Any]] = {}
    wholes: dict[int, Any] = {}

    async def produce() -> None:
        async with sender:
            for _ in range(2):
                async with sender.open_step(ranks=RANKS) as writer:
                    for key, samples in groups.items():
                        assert await writer.put(samples, key=key) is False
                writers.append(writer)

    async def consume(rank: int) -> None:
        parts[rank] = [part async for part in receivers[rank].aparts(timeout=TIMEOUT)]
        wholes[rank] = await receivers[rank].areceive(timeout=TIMEOUT)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            for rank in range(RANKS):
                tg.start_soon(consume, rank)
    finally:
        for receiver in receivers:
            receiver.close()
    for rank in range(RANKS):
        keys = writers[0].assignment[rank]
        assert writers[1].assignment[rank] == keys
        assert [(p.step, p.key, p.index) for p in parts[rank]] == [
            (0, k, i) for i, k in enumerate(keys)
        ]
        for part in parts[rank]:
            assert_batches_equal(part.value, type(part.value)(samples=groups[str(part.key)]))
        expected = [s for k in keys for s in groups[str(k)]]
        assert_batches_equal(wholes[rank], type(wholes[rank])(samples=expected))
        assert receivers[rank].next_step == 2
