"""TransferQueue's loop, written with rlwire (docs/how-to/transferqueue.md).

A producer puts each GRPO group as soon as its rollouts finish (TransferQueue: ``put``);
two trainer ranks take their groups as they are committed (``get_meta`` + ``get_data``);
a second task (here a log-prob pass) reads the same steps on its own, as TransferQueue's
``task_name`` lets it, recording no consumption (only the trainer's position counts). Run it:
``python examples/from_transferqueue.py``.
"""

import random
import tempfile
import threading

import anyio
import numpy as np

import rlwire

path = tempfile.mkdtemp()  # a shared filesystem path (or s3://bucket/run) in real use
STEPS, GROUPS, GROUP_SIZE = 3, 6, 4
said = threading.Lock()


def say(line: str) -> None:
    with said:  # one line at a time from the reader threads
        print(line)


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
        for _ in range(STEPS):
            async with sender.open_step(ranks=2) as writer:  # a global step

                async def group(g: int) -> None:
                    await anyio.sleep(random.uniform(0, 0.2))  # generation time
                    samples = [rollout(random.randint(50, 400)) for _ in range(GROUP_SIZE)]
                    # One GRPO group is one part: never split across ranks.
                    await writer.put(samples, key=f"group-{g}")

                async with anyio.create_task_group() as tg:
                    for g in range(GROUPS):
                        tg.start_soon(group, g)
        await sender.finish()


def train(rank: int) -> None:
    """A trainer rank: its groups of each step, as they are committed."""
    with rlwire.open_receiver(path, rank=rank) as receiver:
        for _ in range(STEPS):
            parts = [part.key for part in receiver.parts(timeout=30)]
            say(f"rank {rank}: step {receiver.last_step}: {len(parts)} groups")


def log_probs(rank: int) -> None:
    """Another task reading the same steps on its own (its own receiver, its own place)."""
    # Marks are per rank, not per task: only the trainer's receiver records them, or,
    # with keep_last, this faster task would let the sender delete steps not trained on.
    with rlwire.open_receiver(path, rank=rank, record_consumed=False) as receiver:
        for _ in range(STEPS):
            samples = receiver.receive(timeout=30).samples  # a whole step: waits for its seal
            say(f"log-prob pass, rank {rank}: step {receiver.last_step}: {len(samples)} samples")


readers = [threading.Thread(target=train, args=(rank,)) for rank in range(2)]
readers += [threading.Thread(target=log_probs, args=(rank,)) for rank in range(2)]
for t in readers:
    t.start()
anyio.run(produce)
for t in readers:
    t.join()
