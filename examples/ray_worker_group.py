"""rlwire in a Ray framework: a rollout actor, a driver and two trainer actors.

Shaped like a verl or OpenRLHF worker group. The driver creates the board of
``ray://rollouts`` (so it lives as long as the driver), asks the rollout actor for a
step, and passes each trainer a small ``StepHandle``; the step's bytes go from the rollout
actor to the object store and from there to the trainers, never through the driver. The
rollout actor's event loop stays free while it sends: encoding and the copy into the
object store run in worker threads.
"""

import numpy as np
import ray

import rlwire
from rlwire.transport.ray import StepHandle, create_board

URL = "ray://rollouts"
RANKS = 2


@ray.remote(num_cpus=0)
class Rollout:
    """An async actor, as a framework's rollout worker."""

    def __init__(self) -> None:
        self.sender = rlwire.open_sender(URL, sidecar="routed_experts", keep_last=2)

    async def generate(self, step: int) -> list[StepHandle]:
        rng = np.random.default_rng(step)
        halves = [
            rlwire.TrainingBatch(
                samples=[
                    rlwire.TrainingSample(
                        token_ids=rng.integers(0, 32_000, n),
                        mask=np.ones(n, bool),
                        env_name="gsm8k",
                        logprobs=-rng.random(n, np.float32),
                        temperatures=np.ones(n, np.float32),
                        advantages=np.full(n, 0.5, np.float32),
                        routed_experts=rng.integers(0, 64, (n, 48, 8), np.uint8),
                    )
                    for n in (100, 250)
                ]
            )
            for _ in range(RANKS)
        ]
        sent = await self.sender.send_ranks(halves)  # one half per trainer rank
        return [self.sender.sink.handle(sent, rank) for rank in range(RANKS)]

    async def close(self) -> None:
        await self.sender.aclose()


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    async def train(self, handle: StepHandle) -> tuple[int, int]:
        async with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
            batch = await receiver.areceive()
        # Views over the object store; copy what must outlive the step.
        tokens = sum(len(s.token_ids) for s in batch.samples)
        return receiver.last_step, tokens


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        create_board("rollouts")  # owned by the driver: lives as long as it does
        rollout = Rollout.remote()
        trainers = [Trainer.remote(rank) for rank in range(RANKS)]
        for step in range(3):
            handles = ray.get(rollout.generate.remote(step))
            results = ray.get([t.train.remote(h) for t, h in zip(trainers, handles, strict=True)])
            print(f"step {step}: trainers got (step, tokens) {results}")
            assert all(got == (step, 350) for got in results)
        ray.get(rollout.close.remote())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
