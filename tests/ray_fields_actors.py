"""A Ray actor the appended-fields tests start: a reference stage that appends fields to
steps a producer committed (kept in a module Ray's workers import by name, as
tests/ray_actors.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
from ray_actors import canary

import rlwire

__all__ = ["RefStage"]


@ray.remote(num_cpus=0)
class RefStage:
    """An async actor, as a framework's reference-model worker: it appends
    ``ref_logprobs`` through a sender it never opens, so the board pulls them from it."""

    async def append(self, url: str, step: int, lengths: list[int], start: float) -> None:
        values = np.arange(sum(lengths), dtype=np.float32) + np.float32(start)
        ragged = rlwire.Ragged.from_lengths(values, lengths)
        sender = rlwire.open_sender(url)
        try:
            await sender.add_fields(step, {"ref_logprobs": ragged})
        finally:
            await sender.aclose()

    async def canary(self) -> list[Any]:
        return canary()
