"""JSON-lines rollout logs: write each step's rollouts as they come, read them back typed.

RL runs keep their rollouts (prompt, completion, reward, token ids) as JSON lines for
later analysis. ``rlwire.codecs.jsonl`` writes and reads them off the event loop, a
megabyte at a time, with numpy arrays as lists and NaN as ``null``; a step's file is
renamed into place whole, so a reader never sees half of it; ``append=True`` adds lines
to a growing log instead.

Run it: ``python examples/jsonl_rollouts.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import msgspec
import numpy as np

from rlwire.codecs.jsonl import adump_jsonl, aload_jsonl, load_jsonl


class Rollout(msgspec.Struct):
    step: int
    prompt: str
    completion: str
    reward: float | None  # NaN is written as null
    token_ids: list[int]


def rollouts(step: int, count: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(step)
    return [
        {
            "step": step,
            "prompt": f"What is {i} + {step}?",
            "completion": f"The answer is {i + step}.",
            "reward": float("nan") if i % 50 == 49 else float(rng.random()),
            "token_ids": rng.integers(0, 32_000, int(rng.integers(16, 64))),  # an array
        }
        for i in range(count)
    ]


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "rollouts.jsonl"
        for step in range(3):
            written = await adump_jsonl(rollouts(step, 500), log, append=True)
            print(f"step {step}: appended {written} rollouts to {log.name}")
        step_file = Path(directory) / "step-00000002.jsonl"
        await adump_jsonl(rollouts(2, 500), step_file)  # renamed into place whole

        rewards: list[float] = []
        async for rollout in aload_jsonl(log, type=Rollout):
            if rollout.reward is not None:
                rewards.append(rollout.reward)
        unscored = 3 * 500 - len(rewards)
        print(f"read back {len(rewards) + unscored} rollouts typed as Rollout")
        print(f"mean reward {sum(rewards) / len(rewards):.3f}; {unscored} without a reward (NaN)")

        last = list(load_jsonl(step_file, type=Rollout))  # the synchronous reader
        assert len(last) == 500 and last[0].completion == "The answer is 2."
        print(f"{step_file.name}: {len(last)} rollouts, first: {last[0].prompt!r}")


if __name__ == "__main__":
    anyio.run(main)
