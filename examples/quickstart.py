"""Quickstart: an async producer sends two steps; a synchronous trainer receives them."""

import tempfile

import anyio
import numpy as np

import rlwire

path = tempfile.mkdtemp()  # a shared filesystem path in real use


def make_sample(n: int) -> rlwire.TrainingSample:
    return rlwire.TrainingSample(
        token_ids=np.arange(n),
        mask=np.ones(n, bool),
        env_name="gsm8k",
        logprobs=np.zeros(n, np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.full(n, 0.5, np.float32),
        routed_experts=np.zeros((n, 48, 8), np.uint8),  # [seq_len, layers, topk]
    )


async def produce() -> None:
    async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
        for _ in range(2):
            await sender.send(rlwire.TrainingBatch(samples=[make_sample(128)] * 4))


anyio.run(produce)  # or trio.run / asyncio.run: rlwire runs on both

with rlwire.open_receiver(path) as receiver:  # in the trainer process
    for _ in range(2):
        batch = receiver.receive(timeout=10)
        print(
            f"step {receiver.last_step}: {len(batch.samples)} samples, "
            f"routed_experts {batch.samples[0].routed_experts.shape}"
        )
