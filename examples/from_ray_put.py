"""Coming from ray.put: one worker group, before and after (docs/how-to/from_ray_put.md).

A rollout actor makes, every step, one dict of batched numpy arrays per trainer rank; a
driver hands the step to two trainer actors, as verl's and OpenRLHF's worker groups do.

- before: the rollout actor ``ray.put``s each rank's dict and returns the references;
  the driver passes them on and each trainer awaits its own.
- after: the rollout actor sends the same dicts to ``ray://rollouts`` with
  ``send_ranks``; the driver passes a ``StepHandle`` where it passed a reference, and
  each trainer receives its rank's dict, checksums verified.

Then the rollout actor hands over one more step both ways and is killed before the
trainers take it: the ``ray.put`` objects die with it (``OwnerDiedError``), the step sent
through rlwire does not (the board owns it). Run it: ``python examples/from_ray_put.py``.
"""

import time

import numpy as np
import ray

import rlwire
from rlwire.transport.ray import StepHandle, create_board

RANKS, SAMPLES, TOKENS = 2, 4, 256


def rank_batches(step: int) -> list[dict[str, np.ndarray]]:
    """One dict of padded [samples, tokens] arrays per trainer rank, as before."""
    rng = np.random.default_rng(step)
    return [
        {
            "token_ids": rng.integers(0, 32_000, (SAMPLES, TOKENS)),
            "mask": np.ones((SAMPLES, TOKENS), bool),
            "logprobs": -rng.random((SAMPLES, TOKENS), np.float32),
            "advantages": rng.standard_normal((SAMPLES, TOKENS)).astype(np.float32),
            "routed_experts": rng.integers(0, 64, (SAMPLES, TOKENS, 48, 8), np.uint8),
        }
        for _ in range(RANKS)
    ]


def fingerprint(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """What a trainer reports of its batch: the sums of its token ids and expert ids."""
    return int(batch["token_ids"].sum()), int(batch["routed_experts"].sum())


@ray.remote(num_cpus=0)
class Rollout:
    """An async actor, as a framework's rollout worker."""

    def __init__(self) -> None:
        # after: one sender for the run; keep_last frees steps every rank has consumed
        self.sender = rlwire.open_sender("ray://rollouts", sidecar="routed_experts", keep_last=2)

    async def put_step(self, step: int) -> list[ray.ObjectRef]:
        # before: pickled on this actor's event loop, owned by this actor
        return [ray.put(rank_batch) for rank_batch in rank_batches(step)]

    async def send_step(self, step: int) -> list[StepHandle]:
        # after: encoded and copied into the object store in worker threads
        sent = await self.sender.send_ranks(rank_batches(step))
        return [self.sender.sink.handle(sent, rank) for rank in range(RANKS)]


@ray.remote(num_cpus=0)
class Trainer:
    async def train_before(self, refs: list[ray.ObjectRef]) -> tuple[int, int]:
        batch = await refs[0]  # a list, so that Ray hands over the reference, not the dict
        return fingerprint(batch)

    async def train_after(self, handle: StepHandle) -> tuple[int, int]:
        async with rlwire.open_receiver(
            handle.url, type=dict, **handle.receiver_options()
        ) as receiver:
            batch = await receiver.areceive()  # read-only views of the object store
        return fingerprint(batch)


def ownerless(ref: ray.ObjectRef) -> str:
    """The error ``ray.get(ref)`` raises once Ray has dropped what a dead owner held
    (a moment after the death: until then the object can still be read)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(ref, timeout=30)
        except ray.exceptions.ObjectLostError as exc:  # OwnerDiedError is one
            return type(exc).__name__
        time.sleep(0.05)
    raise AssertionError("the dead rollout actor's objects are still readable")


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        create_board("rollouts")  # owned by the driver: lives as long as it does
        rollout = Rollout.remote()
        trainers = [Trainer.remote() for _ in range(RANKS)]
        for step in range(2):
            refs = ray.get(rollout.put_step.remote(step))
            before = ray.get([trainers[r].train_before.remote([refs[r]]) for r in range(RANKS)])
            handles = ray.get(rollout.send_step.remote(step))
            after = ray.get([trainers[r].train_after.remote(handles[r]) for r in range(RANKS)])
            assert before == after == [fingerprint(b) for b in rank_batches(step)]
            print(f"step {step}: before and after, both ranks got their arrays")

        # One more step, handed over both ways; the rollout actor dies before the
        # trainers take it.
        refs = ray.get(rollout.put_step.remote(2))
        handles = ray.get(rollout.send_step.remote(2))
        ray.kill(rollout)
        print(f"before, after the rollout actor died: ray.get raises {ownerless(refs[0])}")
        after = ray.get([trainers[r].train_after.remote(handles[r]) for r in range(RANKS)])
        assert after == [fingerprint(b) for b in rank_batches(2)]
        print("after, after the rollout actor died: both ranks got step 2, checksums verified")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
