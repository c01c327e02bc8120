"""A responsive orchestrator: CPU work beside an event loop that must keep answering.

An RL orchestrator scores rollouts, builds batches and sends them, on the same event
loop that talks to its inference servers. This example does that work three ways and
prints how late the loop woke up (rlwire.aio.LagMonitor at 10 Hz, and at 1 kHz for the
short stalls):

1. scoring inline, on the loop: every rollout's scoring holds the loop;
2. scoring as a sliced generator through ``offload_sliced``: the loop gets the GIL
   between slices;
3. the same, plus a real ``TrainingBatchSender`` sending each batch, with the tokenizer
   loaded once through ``Once`` by every task that needs it (one caller gives up while
   it loads, the others still get it).

Run it: ``python examples/responsive_orchestrator.py``. Figures depend on the machine.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Awaitable, Callable

import anyio
import numpy as np

import rlwire
from rlwire.aio import LagMonitor, Once, Sliced, SliceTimer, offload, offload_sliced

ROLLOUTS = [f"step {i}: the answer is {i * 7 % 13} because {'x' * 400}" for i in range(3000)]
ANSWER = re.compile(r"the answer is (\d+)")


def load_tokenizer() -> dict[str, int]:
    """Stands for an expensive initialisation (a tokenizer, a client, a connection pool)."""
    time.sleep(0.2)
    return {"vocab_size": 32_000}


def score_one(text: str) -> float:
    """Pure-Python CPU work that holds the GIL, as reward functions do."""
    match = ANSWER.search(text)
    reward = float(match is not None and int(match.group(1)) % 2 == 0)
    return reward + sum(ord(c) for c in text[:200]) * 1e-9


def score_inline(rollouts: list[str]) -> list[float]:
    return [score_one(text) for text in rollouts]


def score_sliced(rollouts: list[str]) -> Sliced[list[float]]:
    """The same work, cut into slices: yield whenever the SliceTimer says the slice is over."""
    timer, out = SliceTimer(), []
    for text in rollouts:
        out.append(score_one(text))
        if timer.due():
            yield
            timer.restart()
    return out


def make_batch(rewards: list[float], tokenizer: dict[str, int]) -> rlwire.TrainingBatch:
    rng = np.random.default_rng(0)
    samples = []
    for reward in rewards[:64]:
        n = 256
        samples.append(
            rlwire.TrainingSample(
                token_ids=rng.integers(0, tokenizer["vocab_size"], n),
                mask=np.ones(n, bool),
                logprobs=np.zeros(n, np.float32),
                temperatures=np.ones(n, np.float32),
                advantages=np.full(n, reward - 0.5, np.float32),
                env_name="math",
                routed_experts=rng.integers(0, 64, (n, 24, 8), dtype=np.uint8),
            )
        )
    return rlwire.TrainingBatch(samples=samples)


async def under_watch(name: str, work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work`` while two LagMonitors watch the loop; print what they saw."""
    async with LagMonitor(interval=0.1) as slow, LagMonitor(interval=0.001) as fast:
        began = time.perf_counter()
        await work()
        seconds = time.perf_counter() - began
    print(
        f"{name:<32} {seconds:5.2f} s   10 Hz: worst {slow.max * 1e3:6.1f} ms"
        f"   1 kHz: p99 {fast.percentile(99) * 1e3:6.1f} ms, worst {fast.max * 1e3:6.1f} ms"
    )


async def main() -> None:
    limiter = anyio.CapacityLimiter(2)  # CPU work of this process: at most two threads
    tokenizer = Once(load_tokenizer)

    async def inline() -> None:
        for _ in range(3):
            score_inline(ROLLOUTS)

    async def sliced() -> None:
        for _ in range(3):
            await offload_sliced(score_sliced(ROLLOUTS), limiter=limiter)

    async def orchestrate() -> None:
        async def impatient() -> None:
            with anyio.move_on_after(0.05):  # gives up while the tokenizer loads
                await tokenizer.aget()

        with tempfile.TemporaryDirectory() as path:
            async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(impatient)
                    for step in range(3):
                        rewards = await offload_sliced(score_sliced(ROLLOUTS), limiter=limiter)
                        vocab = await tokenizer.aget()  # loaded once, for every task
                        batch = await offload(make_batch, rewards, vocab, limiter=limiter)
                        await sender.send(batch, step=step)
                stats = sender.last_stats
                assert stats is not None
                print(
                    f"{'':<32} last send: {stats.bytes / 1e6:.1f} MB in "
                    f"{stats.total_seconds * 1e3:.0f} ms, the loop resumed within "
                    f"{stats.worst_loop_lag_seconds * 1e3:.1f} ms of each trip"
                )

    await under_watch("1. scoring on the loop", inline)
    await under_watch("2. scoring with offload_sliced", sliced)
    await under_watch("3. score, build and send batches", orchestrate)


if __name__ == "__main__":
    anyio.run(main)
