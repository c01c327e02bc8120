"""Ray actors the tests start: a producer that sends, a trainer that receives. Kept in
a module of their own that Ray's workers import by name (tests/ray_cluster.py puts the
tests' folder on their path)."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
import xxhash

import rlwire
from rlwire import EndOfStream, TrainingBatch
from rlwire.testing import make_batch
from rlwire.transport.ray import StepHandle

__all__ = ["Producer", "SyncProducer", "Trainer", "fingerprint", "step_batches"]


def step_batches(step: int, ranks: int, n: int = 64) -> list[TrainingBatch]:
    """The batch of each rank of ``step`` (2 samples of about ``n`` tokens): its own
    data, the same bits every time."""
    return [make_batch(2, n=n, seed=100 * step + rank) for rank in range(ranks)]


def fingerprint(batch: TrainingBatch) -> list[str]:
    """Every field of every sample, arrays by the xxh3 of their dtype, shape and bytes:
    equal fingerprints, bit-exact batches."""
    out = []
    for sample in batch.samples:
        for field in sample.__struct_fields__:
            value = getattr(sample, field)
            if isinstance(value, np.ndarray):
                data = np.ascontiguousarray(value).tobytes()
                out.append(f"{field}:{value.dtype}:{value.shape}:{xxhash.xxh3_64_hexdigest(data)}")
            else:
                out.append(f"{field}:{value!r}")
    return out


async def _send(url: str, steps: int, ranks: int, finish: bool, n: int) -> dict[str, Any]:
    handles: list[list[StepHandle]] = []
    async with rlwire.open_sender(url, sidecar="routed_experts", on_existing="resume") as sender:
        for step in range(steps):
            sent = await sender.send_ranks(step_batches(step, ranks, n))
            sink = sender.sink
            handles.append([sink.handle(sent, rank) for rank in range(ranks)])  # type: ignore[attr-defined]
        if finish:
            await sender.finish()
        owned = sender.sink.board_owned  # type: ignore[attr-defined]
    return {"board_owned": owned, "handles": handles}


def canary() -> list[Any]:
    """An object this process puts and owns, large enough to live in the object store,
    in a list (so that the caller borrows its reference): once a get of it fails, the
    store has dropped what this process owned."""
    return [ray.put(np.zeros(1 << 20, np.uint8))]


@ray.remote(num_cpus=0)
class Producer:
    """An async actor, as a framework's rollout worker: the board pulls its steps."""

    async def canary(self) -> list[Any]:
        return canary()

    async def send(
        self, url: str, steps: int, ranks: int, finish: bool = False, n: int = 64
    ) -> dict[str, Any]:
        return await _send(url, steps, ranks, finish, n)

    async def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0, max_concurrency=1)
class SyncProducer:
    """A sync actor running one call at a time: it owns what it sends."""

    def canary(self) -> list[Any]:
        return canary()

    def send(self, url: str, steps: int, ranks: int, n: int) -> dict[str, Any]:
        with rlwire.open_sync_sender(url, on_existing="resume") as sender:
            for step in range(steps):
                sender.send_ranks(step_batches(step, ranks, n))
            owned = sender.sink.board_owned  # type: ignore[attr-defined]
        return {"board_owned": owned}


@ray.remote(num_cpus=0)
class Trainer:
    """An async trainer actor: receives with the receiver API."""

    async def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def open_handle(self, handle: StepHandle) -> tuple[int | None, list[str]]:
        with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
            batch = await receiver.areceive(timeout=30)
            return receiver.last_step, fingerprint(batch)

    async def take(
        self, url: str, rank: int, start_step: int | None, count: int | None
    ) -> list[tuple[int, list[str]]]:
        """Receive ``count`` steps (``None``: up to the end of the stream), each as its
        step and fingerprint."""
        got = []
        with rlwire.open_receiver(url, rank=rank, start_step=start_step or 0) as receiver:
            while count is None or len(got) < count:
                try:
                    batch = await receiver.areceive(timeout=30)
                except EndOfStream:
                    break
                assert receiver.last_step is not None
                got.append((receiver.last_step, fingerprint(batch)))
            if count is not None:
                await receiver.await_next(timeout=0)  # moves past the last one taken
        return got
