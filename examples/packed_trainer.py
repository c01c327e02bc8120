"""A packed trainer loop: each step arrives as columns, and micro-batches are cut from
them by a token budget without copying a sample.

The producer sends ordinary ``TrainingBatch`` steps (a list of samples; rlwire stores
them column by column). The trainer opens its receiver with ``as_columns=True``: each
step's samples come back as an ``rlwire.Columns`` whose per-token fields are
``rlwire.Ragged`` arrays (``values`` and ``offsets``, the ``cu_seqlens`` of varlen
attention), views of the received files. A micro-batch of samples ``a:b`` is
``ragged[a:b]``: its values are one contiguous slice, its offsets rebased to 0, ready
for ``torch.from_numpy`` and a varlen kernel.

Run it: ``python examples/packed_trainer.py``.
"""

from __future__ import annotations

import tempfile

import anyio
import numpy as np

import rlwire

TOKEN_BUDGET = 4096  # tokens per micro-batch


def make_step(step: int) -> rlwire.TrainingBatch:
    rng = np.random.default_rng(step)
    samples = []
    for _ in range(64):
        n = int(rng.integers(16, 512))
        samples.append(
            rlwire.TrainingSample(
                token_ids=rng.integers(0, 32_000, n),
                mask=rng.random(n) > 0.2,
                logprobs=-rng.random(n, np.float32),
                temperatures=np.ones(n, np.float32),
                advantages=np.full(n, rng.normal(), np.float32),
                env_name="gsm8k",
            )
        )
    return rlwire.TrainingBatch(samples=samples)


async def produce(path: str, steps: int) -> None:
    async with rlwire.open_sender(path) as sender:
        for step in range(steps):
            await sender.send(make_step(step))
        await sender.finish()


def micro_batches(lengths: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive sample ranges ``(a, b)`` of at most ``budget`` tokens (a longer sample
    alone)."""
    cuts, start, used = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if used and used + n > budget:
            cuts.append((start, i))
            start, used = i, 0
        used += n
    cuts.append((start, len(lengths)))
    return cuts


def train(path: str) -> None:
    with rlwire.open_receiver(path, as_columns=True) as receiver:
        for batch in receiver:  # ends at the sender's finish()
            cols = batch.samples  # an rlwire.Columns: one row per sample
            ids, adv, mask = cols["token_ids"], cols["advantages"], cols["mask"]
            for a, b in micro_batches(ids.lengths, TOKEN_BUDGET):
                packed = ids[a:b]  # a Ragged: no copy
                cu_seqlens = packed.offsets.astype(np.int32)  # what varlen kernels take
                tokens = packed.values  # torch.from_numpy(tokens) shares this memory
                weights = adv[a:b].values * mask[a:b].values  # per-token, still views
                assert np.shares_memory(tokens, ids.values)
                loss = float(weights.sum()) / max(int(cu_seqlens[-1]), 1)
            print(
                f"step {receiver.last_step}: {len(cols)} samples, "
                f"{len(ids.values)} tokens, last micro-batch {b - a} samples, loss {loss:+.4f}"
            )


def main() -> None:
    with tempfile.TemporaryDirectory() as path:
        anyio.run(produce, path, 3)
        train(path)


if __name__ == "__main__":
    main()
