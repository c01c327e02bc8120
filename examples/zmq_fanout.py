"""ZeroMQ fan-out: one producer, N trainer processes, no shared filesystem.

The producer binds a ZeroMQ socket (port 0: any free port) and sends each step with
``send_ranks``: trainer r receives only its own payload. The trainers are separate
processes that connect to ``sender.sink.url``; a send waits until every rank's trainer
has announced itself, so none misses step 0 however late it starts. Each message is
checksummed; a lost one is a ``StepGapError``, never a silent hole.

Run it: ``python examples/zmq_fanout.py`` (needs ``rlwire[zmq]``).
"""

from __future__ import annotations

import sys

import anyio
import numpy as np

import rlwire

RANKS, STEPS = 3, 4


def payload(step: int, rank: int) -> rlwire.TrainingBatch:
    rng = np.random.default_rng([step, rank])
    n = 1024
    sample = rlwire.TrainingSample(
        token_ids=rng.integers(0, 32_000, n),
        mask=np.ones(n, bool),
        logprobs=-rng.random(n, np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=rng.standard_normal(n, np.float32),
        env_name="chat",
        routed_experts=rng.integers(0, 64, (n, 24, 8), dtype=np.uint8),
    )
    return rlwire.TrainingBatch(samples=[sample] * 4)


def trainer(url: str, rank: int) -> None:
    """One trainer process: connect, receive every step of its rank, check it."""
    with rlwire.open_receiver(url, rank=rank) as receiver:
        for batch in receiver:  # ends when the producer calls finish()
            want = payload(receiver.last_step or 0, rank)
            assert np.array_equal(batch.samples[0].routed_experts, want.samples[0].routed_experts)
            print(
                f"rank {rank}: step {receiver.last_step}, {len(batch.samples)} samples", flush=True
            )


async def produce() -> None:
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0") as sender:
        url = sender.sink.url  # the port the sender bound
        trainers = [
            await anyio.open_process([sys.executable, __file__, "--trainer", url, str(rank)])
            for rank in range(RANKS)
        ]
        for step in range(STEPS):
            await sender.send_ranks([payload(step, rank) for rank in range(RANKS)])
            stats = sender.last_stats
            assert stats is not None
            print(f"sent step {step} to {RANKS} trainers: {stats.bytes / 1e6:.1f} MB", flush=True)
        await sender.finish()
    for rank, process in enumerate(trainers):
        assert process.stdout is not None
        output = b"".join([chunk async for chunk in process.stdout])
        code = await process.wait()
        assert code == 0, f"trainer {rank} exited with {code}"
        print(output.decode().strip())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--trainer"]:
        trainer(sys.argv[2], int(sys.argv[3]))
    else:
        anyio.run(produce)
        print(f"all {RANKS} trainers received their {STEPS} steps")
