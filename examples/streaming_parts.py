"""Streaming a step part by part: rollouts finish at random times, each group is put as
soon as it is done, and two trainer ranks start on the first groups while the slowest
are still generating. Run it: ``python examples/streaming_parts.py``."""

import random
import tempfile
import threading

import anyio
import numpy as np

import rlwire

path = tempfile.mkdtemp()  # a shared filesystem path (or s3://bucket/run) in real use


def rollout(tokens: int) -> rlwire.TrainingSample:
    return rlwire.TrainingSample(
        token_ids=np.arange(tokens),
        mask=np.ones(tokens, bool),
        env_name="gsm8k",
        logprobs=np.zeros(tokens, np.float32),
        temperatures=np.ones(tokens, np.float32),
        advantages=np.zeros(tokens, np.float32),
    )


async def produce() -> None:
    async with rlwire.open_sender(path) as sender:
        async with sender.open_step(ranks=2) as writer:  # leaving the block seals the step

            async def group(g: int) -> None:
                await anyio.sleep(random.uniform(0, 0.3))  # generation time
                samples = [rollout(random.randint(50, 400)) for _ in range(4)]
                await writer.put(samples, key=f"group-{g}")  # visible when it returns

            async with anyio.create_task_group() as tg:
                for g in range(8):
                    tg.start_soon(group, g)
        print("sealed:", [len(keys) for keys in writer.assignment], "groups per rank")
        await sender.finish()


def train(rank: int) -> None:
    with rlwire.open_receiver(path, rank=rank) as receiver:
        tokens = 0
        for part in receiver.parts(timeout=30):  # each group as soon as it is committed
            tokens += sum(len(s.token_ids) for s in part.value.samples)
            print(f"rank {rank}: {part.key} ({len(part.value.samples)} samples)")
        print(f"rank {rank}: step {receiver.last_step} done, {tokens} tokens")


trainers = [threading.Thread(target=train, args=(rank,)) for rank in range(2)]
for t in trainers:
    t.start()
anyio.run(produce)
for t in trainers:
    t.join()
