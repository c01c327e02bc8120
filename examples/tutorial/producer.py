"""Tutorial, part 1: the producer. Sends five steps of rollouts to a directory, then marks
the end of the stream.

Run it: ``python examples/tutorial/producer.py /tmp/rlwire-tutorial``.
"""

from __future__ import annotations

import sys

import anyio
import numpy as np

import rlwire

PATH = sys.argv[1] if len(sys.argv) > 1 else "/tmp/rlwire-tutorial"


def rollout(rng: np.random.Generator) -> rlwire.TrainingSample:
    """One trainable sequence, as a rollout worker would produce it."""
    n = int(rng.integers(256, 1024))  # tokens
    return rlwire.TrainingSample(
        token_ids=rng.integers(0, 32_000, n),
        mask=np.arange(n) >= 64,  # the first 64 tokens are the prompt: not trained on
        logprobs=-rng.random(n, np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.full(n, rng.standard_normal(), np.float32),
        env_name="gsm8k",
        routed_experts=rng.integers(0, 64, (n, 24, 8), dtype=np.uint8),  # [tokens, layers, topk]
    )


async def main() -> None:
    rng = np.random.default_rng(0)
    # on_existing="overwrite": start afresh if an earlier run left steps there.
    async with rlwire.open_sender(
        PATH, sidecar=("routed_experts",), on_existing="overwrite"
    ) as sender:
        for step in range(5):
            batch = rlwire.TrainingBatch(samples=[rollout(rng) for _ in range(8)])
            await sender.send(batch)
            stats = sender.last_stats
            assert stats is not None
            ms = stats.total_seconds * 1e3
            print(f"sent step {step}: {stats.bytes / 1e6:.1f} MB in {ms:.0f} ms")
        await sender.finish()  # the trainer's loop ends after the last step


if __name__ == "__main__":
    anyio.run(main)
