"""A torch trainer: received arrays become tensors without a copy, and a tiny model trains.

The producer sends three steps; the trainer receives each with ``writable=True`` (the
arrays are views of the mapped files, and a page is copied only when something writes
to it), turns them into tensors with ``torch.from_numpy`` (no copy, no warning), pads
the samples into a batch and takes an optimizer step on an advantage-weighted loss.

Run it: ``python examples/torch_trainer.py`` (needs torch; without it, it says so and
exits with status 0).
"""

from __future__ import annotations

import sys
import tempfile

import anyio
import numpy as np

import rlwire

try:
    import torch
except ImportError:
    print("skipped: torch is not installed (pip install torch)")
    sys.exit(0)

VOCAB, STEPS = 1000, 3


def make_batch(step: int) -> rlwire.TrainingBatch:
    rng = np.random.default_rng(step)
    samples = []
    for _ in range(8):
        n = int(rng.integers(32, 128))
        samples.append(
            rlwire.TrainingSample(
                token_ids=rng.integers(0, VOCAB, n),
                mask=rng.random(n) > 0.2,
                logprobs=-rng.random(n, np.float32),
                temperatures=np.ones(n, np.float32),
                advantages=rng.standard_normal(n, np.float32),
                env_name="math",
            )
        )
    return rlwire.TrainingBatch(samples=samples)


async def produce(path: str) -> None:
    async with rlwire.open_sender(path) as sender:
        for step in range(STEPS):
            await sender.send(make_batch(step))
        await sender.finish()


def pad(arrays: list[torch.Tensor], value: float = 0) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(arrays, batch_first=True, padding_value=value)


def train(path: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with rlwire.open_receiver(path, writable=True) as receiver:
        for batch in receiver:
            ids = pad([torch.from_numpy(s.token_ids) for s in batch.samples])  # no copies
            mask = pad([torch.from_numpy(s.mask) for s in batch.samples], False)
            advantages = pad([torch.from_numpy(s.advantages) for s in batch.samples])
            logits = model(ids[:, :-1])
            logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
            weight = (advantages[:, 1:] * mask[:, 1:]).float()
            loss = -(logprobs * weight).sum() / mask[:, 1:].sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {receiver.last_step}: {tuple(ids.shape)} tokens, loss {loss.item():+.4f}")


def main() -> None:
    with tempfile.TemporaryDirectory() as path:
        anyio.run(produce, path)
        train(path)


if __name__ == "__main__":
    main()
