"""The Ray actor tests/transport/ray/test_ray_fence.py starts: a producer that holds one
sender open across calls, as a producer that hung and woke up does, so that a test can
send a step with it after another producer opened the destination. Kept in a module of
its own that Ray's workers import by name (tests/ray_cluster.py puts the tests' folder
on their path)."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

import rlwire
from rlwire.testing import make_batch

__all__ = ["HeldProducer", "run_of"]


def _batch(run: int, step: int) -> rlwire.TrainingBatch:
    """Step ``step`` of run ``run``: its first sample's env_name says both (see
    :func:`run_of`)."""
    return make_batch(2, n=8, seed=1000 * run + step)


def run_of(env_name: str) -> tuple[int, int]:
    """The (run, step) a sample of :func:`_batch` was made for, from its env_name."""
    seed = int(env_name.removeprefix("env"))
    return divmod(seed, 1000)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@ray.remote(num_cpus=0)
class HeldProducer:
    """An async actor, as a framework's rollout worker: :meth:`open` opens a sender and
    keeps it open; each later call sends (or appends, finishes, prunes) with it. Calls
    answer the error they raised as ``"Kind: message"``."""

    def __init__(self) -> None:
        self.sender: Any = None

    async def open(
        self, url: str, run: int, on_existing: str = "error", start_step: int | None = None
    ) -> int:
        """Open a sender for run ``run`` (its batches say so), closing the one before
        (a test's); its next step."""
        if self.sender is not None:
            await self.close()
        self.run = run
        self.sender = rlwire.open_sender(url, on_existing=on_existing, start_step=start_step)
        await self.sender.__aenter__()
        return int(self.sender.next_step)

    async def send(self, count: int = 1) -> list[int] | str:
        """Send ``count`` steps: the steps sent, or the error."""
        sent = []
        try:
            for _ in range(count):
                sent.append(await self.sender.send(_batch(self.run, self.sender.next_step)))
        except rlwire.RlwireError as exc:
            return _error(exc)
        return sent

    async def add_fields(self, step: int, name: str) -> str:
        """Append a field ``name`` to ``step``: "ok", or the error."""
        try:
            await self.sender.add_fields(step, {name: np.ones(2)})
        except rlwire.RlwireError as exc:
            return _error(exc)
        return "ok"

    async def finish(self) -> str:
        try:
            await self.sender.finish()
        except rlwire.RlwireError as exc:
            return _error(exc)
        return "ok"

    async def close(self) -> str:
        try:
            await self.sender.aclose()
        except rlwire.RlwireError as exc:
            return _error(exc)
        return "ok"
