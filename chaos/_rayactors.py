"""The actors of the ``ray://`` kill campaign (:mod:`chaos.raykills`), in a module of
their own that Ray's workers import by name, and that only the campaign's child
process imports (it imports Ray)."""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from typing import Any

import ray
from ray_actors import fingerprint

import rlwire

from ._model import describe, payload

#: Where a producer is killed: ``module:attribute`` of the functions of the ray:// sink
#: that run in the producer's process while it sends.
POINTS = (
    "rlwire.transport.ray._handing:offer",  # a rank's values left for the board to pull
    "rlwire.transport.ray._handover:hand_over",  # the board's pull, run by the producer
    "rlwire.transport.ray._handing:submit",  # the stage and prune calls submitted
    "rlwire.transport.ray._handing:answer_of",  # waiting for the board's answer to one
    "rlwire.transport.ray._staged:call",  # the commit (and a discard)
    "rlwire.transport.ray._sink:call",  # reading the marks, the end of the stream
    "rlwire.transport.ray._staged:RayStaged.commit",
    "rlwire.transport.ray._handing:HandingSink.prune",
)
#: Tokens a sample of a step's batches has, about.
TOKENS = 400


def batches(step: int, ranks: int) -> list[rlwire.TrainingBatch]:
    """Each rank's batch of ``step``: the same bits every time."""
    return [payload(step, rank, n=TOKENS) for rank in range(ranks)]


def expected(rank: int, steps: int) -> list[tuple[int, list[str]]]:
    """What rank ``rank`` must get of steps 0 to ``steps - 1``: each step and the
    fingerprint of its batch."""
    return [(step, fingerprint(payload(step, rank, n=TOKENS))) for step in range(steps)]


@ray.remote(num_cpus=0)
class Producer:
    """An async producer actor that can be told to kill itself at a hooked call."""

    def __init__(self) -> None:
        self.calls: list[str] = []  # every hooked call, in order
        self.nth = 0
        self.after = False
        self.note = ""

    async def hook(self, nth: int, after: bool, note: str = "") -> None:
        """Kill this process at the ``nth`` hooked call of :data:`POINTS` (0: never),
        before it or once it returned (``after``), first writing the function's name to
        the file ``note``; count the calls either way (the board's pulls run beside the
        sends: their order varies from run to run)."""
        self.nth, self.after, self.note = nth, after, note
        lock = threading.Lock()
        for point in POINTS:
            module_name, attribute = point.split(":")
            owner: Any = importlib.import_module(module_name)
            *path, name = attribute.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = owner.__dict__[name]
            setattr(owner, name, self._wrapped(point, original, lock))

    def _wrapped(self, point: str, original: Any, lock: threading.Lock) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                self.calls.append(point)
                hit = len(self.calls) == self.nth
            if hit and not self.after:
                self._die(point)
            result = original(*args, **kwargs)
            if hit and self.after:
                self._die(point)
            return result

        return call

    def _die(self, point: str) -> None:
        if self.note:
            with open(self.note, "w") as file:
                file.write(point.removeprefix("rlwire.transport.ray.").replace(":", "."))
        os.kill(os.getpid(), signal.SIGKILL)

    async def kill_in(self, seconds: float) -> None:
        """Kill this process ``seconds`` from now, wherever it is."""

        def later() -> None:
            time.sleep(seconds)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=later, daemon=True).start()

    async def send(
        self, url: str, steps: int, keep_last: int | None, finish: bool = False, ranks: int = 2
    ) -> dict[str, Any]:
        """Resume ``url`` and send ``steps`` more steps (and the end, with ``finish``):
        the first step sent, the hooked calls made, the seconds the sends took."""
        options: dict[str, Any] = {"keep_last": keep_last} if keep_last else {}
        async with rlwire.open_sender(
            url, sidecar="routed_experts", on_existing="resume", **options
        ) as sender:
            first = sender.next_step
            start = time.monotonic()
            for _ in range(steps):
                step = sender.next_step
                await sender.send_ranks(batches(step, ranks))
            if finish:
                await sender.finish()
            took = time.monotonic() - start
            owned = sender.sink.board_owned  # type: ignore[attr-defined]
        return {"first": first, "calls": list(self.calls), "seconds": took, "owned": owned}


@ray.remote(num_cpus=0)
class Trainer:
    """A trainer actor reading one rank from step 0 to the end of the stream."""

    async def take(self, url: str, rank: int, timeout: float) -> dict[str, Any]:
        """Every step of rank ``rank``, each as its step and fingerprint, up to the end
        of the stream or the error that stopped it (each receive waits ``timeout``)."""
        got: list[tuple[int, list[str]]] = []
        try:
            with rlwire.open_receiver(url, rank=rank) as receiver:
                while True:
                    try:
                        batch = await receiver.areceive(timeout=timeout)
                    except rlwire.EndOfStream:
                        break
                    assert receiver.last_step is not None
                    got.append((receiver.last_step, fingerprint(batch)))
        except rlwire.RlwireError as exc:
            return {"got": got, "error": describe(exc), "typed": True}
        except Exception as exc:
            return {"got": got, "error": describe(exc), "typed": False}
        return {"got": got, "error": None, "typed": True}
