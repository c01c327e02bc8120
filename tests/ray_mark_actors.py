"""The Ray actor tests/transport/ray/test_part_marks.py starts: a trainer that takes
parts in the background (with ``resume=`` as asked) and says what it got. Kept in a
module of its own that Ray's workers import by name (tests/ray_cluster.py puts the
tests' folder on their path)."""

from __future__ import annotations

import asyncio
from typing import Any

import ray

import rlwire

__all__ = ["PartTaker"]


@ray.remote(num_cpus=0)
class PartTaker:
    """An async trainer actor: :meth:`begin` starts taking one rank's parts, step after
    step, until the end of the stream; :meth:`seen` says where it started, the ``(step,
    key)`` of each part it was handed, and whether it ended (or its error)."""

    def __init__(self) -> None:
        self.start: tuple[int, int] | None = None
        self.keys: list[tuple[int, Any]] = []
        self.task: asyncio.Task[None] | None = None

    async def begin(self, url: str, rank: int, resume: bool) -> None:
        async def run() -> None:
            async with rlwire.open_receiver(url, rank=rank, resume=resume) as receiver:
                self.start = (receiver.next_step, receiver.next_part)
                while True:
                    try:
                        async for part in receiver.aparts(timeout=60):
                            self.keys.append((part.step, part.key))
                    except rlwire.EndOfStream:
                        return

        self.task = asyncio.create_task(run())

    async def seen(self) -> tuple[tuple[int, int] | None, list[tuple[int, Any]], str | None]:
        assert self.task is not None
        if not self.task.done():
            state = None
        elif self.task.exception() is not None:
            state = repr(self.task.exception())
        else:
            state = "ended"
        return self.start, self.keys, state
