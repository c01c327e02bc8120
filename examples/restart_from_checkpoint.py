"""Restart from a checkpoint: the producer rewinds to the checkpointed step.

A run writes steps 0-5, then the trainer crashes; its last checkpoint is from step 3.
The restarted producer opens its sender with ``start_step=3, on_existing="truncate"``:
steps 3-5 of the old run are deleted (main parts first, so no reader meets half a
step), steps 0-2 stay, and the trainer, reopened at ``start_step=3``, gets the new
steps 3, 4, 5 and never an old one. ``keep_last`` bounds the disk meanwhile.

Run it: ``python examples/restart_from_checkpoint.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import numpy as np

import rlwire

CHECKPOINT = 3


def make_batch(step: int, run: str) -> dict[str, object]:
    """A payload that says which run made it (any msgspec-encodable tree works)."""
    return {"run": run, "step": step, "advantages": np.full(1024, step, np.float32)}


async def first_run(path: str) -> None:
    async with rlwire.open_sender(path) as sender:
        for step in range(6):
            await sender.send(make_batch(step, "first"))
    print(f"first run wrote steps 0-5, then its trainer crashed at step {CHECKPOINT + 1}")


async def restarted_run(path: str) -> None:
    # A plain open would be refused (StepExistsError names the steps and this call).
    try:
        async with rlwire.open_sender(path, start_step=CHECKPOINT) as sender:
            pass
    except rlwire.StepExistsError as exc:
        print(f"refused without on_existing: {exc}")
    async with rlwire.open_sender(path, start_step=CHECKPOINT, on_existing="truncate") as sender:
        for step in range(CHECKPOINT, 6):
            await sender.send(make_batch(step, "restarted"), step=step)
        await sender.finish()
    print(f"restarted run wrote steps {CHECKPOINT}-5 again")


def trainer(path: str) -> None:
    with rlwire.open_receiver(path, start_step=CHECKPOINT, type=dict) as receiver:
        for batch in receiver:
            assert batch["run"] == "restarted", batch["run"]
            assert batch["step"] == receiver.last_step
            print(f"trainer: step {batch['step']} from the {batch['run']} run")


def main() -> None:
    with tempfile.TemporaryDirectory() as path:
        anyio.run(first_run, path)
        anyio.run(restarted_run, path)
        trainer(path)
        kept = sorted(p.name for p in Path(path).glob("step-*.rlw"))
        print(f"on disk now: {len(kept)} step files ({kept[0]} .. {kept[-1]})")


if __name__ == "__main__":
    main()
