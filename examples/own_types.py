"""Your own types: framework-shaped Structs with list fields, a grid of micro-batches per
rank, and a synchronous trainer per rank.

The producer builds, for each data-parallel rank, a list of micro-batches: msgspec
Structs whose per-token fields are plain ``list[int]`` / ``list[float]`` (as RL
frameworks keep them) and whose MoE routing is raw ``bytes``. ``send_ranks`` sends
rank r its own list; the ``routed_experts`` bytes travel raw in a sidecar. Each trainer
(a thread here, a process in a real run) receives its rank's list, typed, and checks it.

Run it: ``python examples/own_types.py``.
"""

from __future__ import annotations

import random
import tempfile
import threading

import anyio
import msgspec
import numpy as np

import rlwire

RANKS, MICRO_BATCHES, STEPS = 4, 4, 3
LAYERS, TOPK = 24, 8


class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes  # uint8 [seq_len, layers, topk], raw
    shape: list[int]
    dtype: str = "uint8"


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    routed_experts: RoutedExperts | None = None


def micro_batch(step: int, rank: int, index: int) -> MicroBatch:
    rng = random.Random(f"{step}/{rank}/{index}")  # the trainer rebuilds the same one
    n = rng.randint(200, 400)
    experts = np.random.default_rng(rng.getrandbits(32)).integers(0, 64, (n, LAYERS, TOPK))
    return MicroBatch(
        input_ids=[rng.randrange(32_000) for _ in range(n)],
        loss_mask=[i >= 32 for i in range(n)],  # the prompt is not trained on
        advantages=[rng.uniform(-1, 1) for _ in range(n)],
        inference_logprobs=[-rng.random() for _ in range(n)],
        routed_experts=RoutedExperts(experts.astype(np.uint8).tobytes(), [n, LAYERS, TOPK]),
    )


def grid(step: int) -> list[list[MicroBatch]]:
    """One list of micro-batches per rank."""
    return [[micro_batch(step, r, i) for i in range(MICRO_BATCHES)] for r in range(RANKS)]


# Validation for your own types: every float finite, per-token lists of one length.
CHECKS = rlwire.Checks(
    finite=("advantages", "inference_logprobs"),
    same_length=(("input_ids", "loss_mask", "advantages", "inference_logprobs"),),
)


async def produce(path: str) -> None:
    async with rlwire.open_sender(path, sidecar=("routed_experts",), validate=CHECKS) as sender:
        for step in range(STEPS):
            await sender.send_ranks(grid(step))
            stats = sender.last_stats
            assert stats is not None
            print(
                f"sent step {step}: {RANKS} ranks x {MICRO_BATCHES} micro-batches, "
                f"{stats.bytes / 1e6:.1f} MB ({stats.sidecar_bytes / 1e6:.1f} MB raw in "
                f"sidecars) in {stats.total_seconds * 1e3:.0f} ms"
            )
        await sender.finish()


def train(path: str, rank: int, seen: list[str]) -> None:
    """A synchronous trainer: for every step, its rank's micro-batches, typed."""
    with rlwire.open_receiver(path, rank=rank, type=list[MicroBatch]) as receiver:
        for micro_batches in receiver:  # ends at the producer's finish()
            step = receiver.last_step
            assert micro_batches == [micro_batch(step, rank, i) for i in range(MICRO_BATCHES)]
            tokens = sum(len(mb.input_ids) for mb in micro_batches)
            seen.append(
                f"rank {rank} step {step}: {len(micro_batches)} micro-batches, {tokens} tokens"
            )


def main() -> None:
    with tempfile.TemporaryDirectory() as path:  # a shared filesystem path in real use
        anyio.run(produce, path)
        seen: list[str] = []
        trainers = [threading.Thread(target=train, args=(path, r, seen)) for r in range(RANKS)]
        for t in trainers:
            t.start()
        for t in trainers:
            t.join()
        assert len(seen) == RANKS * STEPS, seen
        print("\n".join(sorted(seen)))
        print(f"every rank received its {STEPS} steps, equal to what was sent")


if __name__ == "__main__":
    main()
