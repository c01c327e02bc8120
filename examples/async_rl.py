"""Asynchronous RL: rollouts stream in part by part, two trainer ranks start on the first
groups while the slowest are still generating, and a reference stage writes reference
log-probabilities back into each step (docs/how-to/streaming.md, fields.md).

Three stages share one destination and nothing else:

- the **producer** (this process) puts each GRPO group of a step as soon as its rollouts
  finish, at random times, as a part (``open_step`` / ``put``), balanced by tokens
  across the two trainer ranks; leaving the block seals the step;
- two **trainer ranks**, each a process of its own, train on their groups as they
  arrive (``aparts()``), then read the step's ``ref_logprobs`` for the KL term,
  waiting for the reference stage if it is not done yet;
- the **reference stage** (a task here, a GPU worker in real use) reads only the
  ``token_ids`` of each group as it arrives (``fields=``), runs the reference model,
  and appends ``ref_logprobs`` to each rank's samples of the step once it is sealed
  (``add_fields``), through a sender it never opens: it touches nothing the producer
  owns.

Run it: ``python examples/async_rl.py`` (a temporary directory; a few seconds), or with
``--url s3://bucket/run`` or ``--url ray://rollouts`` (this script then starts Ray, and
the trainers join its cluster).
"""

import argparse
import random
import subprocess
import sys
import tempfile
import time

import anyio
import numpy as np

import rlwire

RANKS, GROUPS, GROUP_SIZE = 2, 8, 4
RAY_NAMESPACE = "rlwire-async-rl"  # the trainers' processes find the board in it


def rollout(rng: np.random.Generator) -> rlwire.TrainingSample:
    n = int(rng.integers(50, 400))
    return rlwire.TrainingSample(
        token_ids=rng.integers(0, 32_000, n),
        mask=np.ones(n, bool),
        env_name="gsm8k",
        logprobs=-rng.random(n, np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.full(n, rng.standard_normal(), np.float32),
    )


async def produce(url: str, steps: int) -> None:
    async with rlwire.open_sender(url) as sender:
        for step in range(steps):
            async with sender.open_step(ranks=RANKS) as writer:

                async def group(g: int, step: int = step) -> None:
                    rng = np.random.default_rng([step, g])
                    await anyio.sleep(random.uniform(0.1, 1.0))  # generation time
                    samples = [rollout(rng) for _ in range(GROUP_SIZE)]
                    await writer.put(samples, key=f"group-{g}")  # one group, one part

                async with anyio.create_task_group() as tg:
                    for g in range(GROUPS):
                        tg.start_soon(group, g)
            counts = " + ".join(str(len(keys)) for keys in writer.assignment)
            print(f"producer: step {step} sealed, {counts} groups", flush=True)
        await sender.finish()


def reference_model(tokens: rlwire.Ragged) -> rlwire.Ragged:
    """Stands in for a reference model's forward pass: one log-probability per token."""
    values = -np.log1p(tokens.values % 97).astype(np.float32) / 8
    return rlwire.Ragged(values, tokens.offsets)


async def reference_rank(url: str, rank: int, stage: rlwire.TrainingBatchSender) -> None:
    async with rlwire.open_receiver(
        url, rank=rank, fields=("token_ids",), record_consumed=False
    ) as receiver:
        while True:
            rows: list[np.ndarray] = []
            computed_from = b""  # part 0's message: what the fields are tied to
            try:
                async for part in receiver.aparts(timeout=60):
                    computed_from = part.message_id if part.index == 0 else computed_from
                    tokens = part.value.samples["token_ids"]  # an rlwire.Ragged
                    await anyio.sleep(0.002)  # the reference model's forward pass
                    ref = reference_model(tokens)
                    rows += [ref[i] for i in range(len(ref))]
            except rlwire.EndOfStream:
                return
            step = receiver.last_step
            assert step is not None
            # The rank's rows of the step: its parts' samples, in the order they came.
            ref = rlwire.Ragged.from_lengths(
                np.concatenate(rows or [np.zeros(0, np.float32)]), [len(r) for r in rows]
            )
            # of=: stored only beside the step these rows came from, never another run's.
            await stage.add_fields(step, {"ref_logprobs": ref}, rank=rank, of=computed_from)


async def reference(url: str) -> None:
    stage = rlwire.open_sender(url)  # never opened: add_fields alone opens nothing
    try:
        async with anyio.create_task_group() as tg:
            for rank in range(RANKS):
                tg.start_soon(reference_rank, url, rank, stage)
    finally:
        await stage.aclose()


async def train(url: str, rank: int) -> None:
    """A trainer rank: its groups of each step as they arrive, then the step's reference
    log-probabilities (a second receiver, reading that field only)."""
    async with (
        rlwire.open_receiver(url, rank=rank) as receiver,
        rlwire.open_receiver(
            url, rank=rank, fields=("ref_logprobs",), record_consumed=False
        ) as refs,
    ):
        while True:
            first, logprobs = None, []
            try:
                async for part in receiver.aparts(timeout=60):
                    first = first or time.monotonic()
                    await anyio.sleep(0.005)  # forward and backward on the group
                    logprobs += [s.logprobs for s in part.value.samples]
            except rlwire.EndOfStream:
                return
            ahead = time.monotonic() - (first or time.monotonic())  # the seal came then
            ref = (await refs.areceive(timeout=60)).samples["ref_logprobs"]
            kl = float(np.mean(np.concatenate(logprobs) - ref.values)) if logprobs else 0.0
            print(
                f"rank {rank}: step {receiver.last_step}: {len(logprobs)} samples, "
                f"{sum(map(len, logprobs))} tokens, training from {ahead:.2f} s before the "
                f"seal; ref logprobs of {len(ref)} samples, KL (k1) {kl:.3f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the destination (default: a temporary directory)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--trainer", type=int, help=argparse.SUPPRESS)  # a trainer process
    parser.add_argument("--ray-address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.url or tempfile.mkdtemp()
    if url.startswith("ray://"):
        import ray

        ray.init(address=args.ray_address, namespace=RAY_NAMESPACE, log_to_driver=False)
        args.ray_address = ray.get_runtime_context().gcs_address
    if args.trainer is not None:
        anyio.run(train, url, args.trainer)
        return
    own = [sys.executable, __file__, "--url", url]
    if args.ray_address:
        own += ["--ray-address", args.ray_address]
    trainers = [subprocess.Popen([*own, "--trainer", str(rank)]) for rank in range(RANKS)]

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reference, url)
            await produce(url, args.steps)

    try:
        anyio.run(run)
        codes = [t.wait(timeout=120) for t in trainers]
    finally:
        for t in trainers:
            t.kill()
    if any(codes):
        sys.exit(f"a trainer failed: exit codes {codes}")


if __name__ == "__main__":
    main()
