"""A trio producer and a trio trainer: the same rlwire API as under asyncio.

rlwire runs on anyio, so a trio program uses the same ``open_sender`` and
``areceive``: the producer sends a step while the trainer, another task of the same
nursery, receives it; ``LagMonitor`` shows the loop stayed responsive meanwhile.

Run it: ``python examples/trio_producer.py``.
"""

from __future__ import annotations

import tempfile

import numpy as np
import trio

import rlwire
from rlwire.aio import LagMonitor

STEPS = 4


def make_batch(step: int) -> rlwire.TrainingBatch:
    rng = np.random.default_rng(step)
    samples = []
    for _ in range(16):
        n = int(rng.integers(512, 2048))
        samples.append(
            rlwire.TrainingSample(
                token_ids=rng.integers(0, 32_000, n),
                mask=np.ones(n, bool),
                logprobs=-rng.random(n, np.float32),
                temperatures=np.ones(n, np.float32),
                advantages=rng.standard_normal(n, np.float32),
                env_name="code",
                routed_experts=rng.integers(0, 64, (n, 24, 8), dtype=np.uint8),
            )
        )
    return rlwire.TrainingBatch(samples=samples)


async def produce(path: str) -> None:
    async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
        for step in range(STEPS):
            batch = await trio.to_thread.run_sync(make_batch, step)
            async with LagMonitor() as lag:
                await sender.send(batch)
            print(
                f"sent step {step}; the trio loop's worst stall meanwhile: {lag.max * 1e3:.1f} ms"
            )
        await sender.finish()


async def train(path: str) -> None:
    with rlwire.open_receiver(path) as receiver:
        async for batch in receiver:  # ends at the producer's finish()
            want = make_batch(receiver.last_step or 0)
            for got, sent in zip(batch.samples, want.samples, strict=True):
                assert np.array_equal(got.routed_experts, sent.routed_experts)
                assert np.array_equal(got.advantages, sent.advantages)
            tokens = sum(len(s.token_ids) for s in batch.samples)
            step, samples = receiver.last_step, len(batch.samples)
            print(f"trained on step {step}: {samples} samples, {tokens} tokens")


async def main() -> None:
    with tempfile.TemporaryDirectory() as path:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(train, path)
            nursery.start_soon(produce, path)


if __name__ == "__main__":
    trio.run(main)
