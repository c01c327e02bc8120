"""The actors of the ``ray://`` kill campaign (:mod:`chaos.raykills`), in a module of
their own that Ray's workers import by name, and that only the campaign's child
process imports (it imports Ray)."""

from __future__ import annotations

import importlib
import json
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
#: Where a trainer is killed: the functions of the ray:// source its receiver calls.
TRAINER_POINTS = (
    "rlwire.transport.ray._source:RaySource.read_consumption",  # resume: the rank's marks
    "rlwire.transport.ray._source:RaySource.wait",  # waiting on the board for a step
    "rlwire.transport.ray._source:RaySource.read",  # asking the board for a step
    "rlwire.transport.ray._source:RaySource._fetch",  # getting the step's objects
    "rlwire.transport.ray._source:RaySource.mark_consumed",  # recording consumption
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


def _patch(point: str, wrap: Any) -> None:
    """Replace the function ``point`` (``module:attribute``) by ``wrap(original)``."""
    module_name, attribute = point.split(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, wrap(owner.__dict__[name]))


class _Killable:
    """An actor that can be told to kill its own process at a hooked call of
    ``points``, or at a time."""

    points: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.calls: list[str] = []  # every hooked call, in order
        self.nth = 0
        self.after = False
        self.note = ""

    async def hook(self, nth: int, after: bool, note: str = "") -> None:
        """Kill this process at the ``nth`` hooked call of ``points`` (0: never),
        before it or once it returned (``after``), first writing the function's name to
        the file ``note``; count the calls either way (calls that run beside one
        another, as the board's pulls beside the sends, come in an order that varies
        from run to run)."""
        self.nth, self.after, self.note = nth, after, note
        lock = threading.Lock()
        for point in self.points:
            _patch(point, lambda original, point=point: self._wrapped(point, original, lock))

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


@ray.remote(num_cpus=0)
class Producer(_Killable):
    """An async producer actor that can be told to kill itself at a hooked call of
    :data:`POINTS`."""

    points = POINTS

    async def send(
        self,
        url: str,
        steps: int,
        keep_last: int | None,
        finish: bool = False,
        ranks: int = 2,
        max_ahead: int | None = None,
    ) -> dict[str, Any]:
        """Resume ``url`` and send ``steps`` more steps (and the end, with ``finish``):
        the first step sent, the hooked calls made, the seconds the sends took."""
        options: dict[str, Any] = {"keep_last": keep_last} if keep_last else {}
        if max_ahead is not None:
            options["max_ahead"] = max_ahead
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
class Trainer(_Killable):
    """A trainer actor reading one rank to the end of the stream, which can be told to
    kill itself at a hooked call of :data:`TRAINER_POINTS`, and to log what it got."""

    points = TRAINER_POINTS
    log = -1  # the descriptor of the log, once keep_log opened one

    async def keep_log(self, path: str) -> None:
        """Append to the file ``path``, as they happen, each step :meth:`take` gets and
        each consumption mark the board recorded (its call returned): what a trainer
        killed midway leaves to judge it by. Call it before :meth:`hook`, so that a kill
        just after a mark's call comes after its line."""
        self.log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def noting(original: Any) -> Any:
            def mark_consumed(source: Any, next_step: int) -> None:
                original(source, next_step)
                self._line(["mark", next_step])

            return mark_consumed

        _patch("rlwire.transport.ray._source:RaySource.mark_consumed", noting)

    def _line(self, item: list[Any]) -> None:
        if self.log >= 0:
            os.write(self.log, (json.dumps(item) + "\n").encode())

    async def take(
        self, url: str, rank: int, timeout: float, resume: bool = False
    ) -> dict[str, Any]:
        """Every step of rank ``rank`` from step 0 (or, with ``resume``, from where its
        marks say), each as its step and fingerprint, up to the end of the stream or the
        error that stopped it (each receive waits ``timeout``); and the hooked calls."""
        got: list[tuple[int, list[str]]] = []
        out: dict[str, Any] = {"got": got, "error": None, "typed": True}
        try:
            with rlwire.open_receiver(url, rank=rank, resume=resume) as receiver:
                while True:
                    try:
                        batch = await receiver.areceive(timeout=timeout)
                    except rlwire.EndOfStream:
                        break
                    assert receiver.last_step is not None
                    got.append((receiver.last_step, fingerprint(batch)))
                    self._line(["step", *got[-1]])
        except rlwire.RlwireError as exc:
            out["error"] = describe(exc)
        except Exception as exc:
            out.update(error=describe(exc), typed=False)
        return {**out, "calls": list(self.calls)}
