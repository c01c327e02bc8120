"""Ray actors the tests start: a producer that sends, a trainer that receives. Kept in
a module of their own that Ray's workers import by name (tests/ray_cluster.py puts the
tests' folder on their path). Also the driver's helpers that go with them: killing an
actor for real, and the object store's figures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import ray
import xxhash

import rlwire
from rlwire import EndOfStream, TrainingBatch, TrainingSample
from rlwire.testing import make_batch, make_sample
from rlwire.transport.ray import StepHandle

__all__ = [
    "BusyThreadedProducer",
    "OneCallAsyncProducer",
    "Producer",
    "SyncProducer",
    "Trainer",
    "fingerprint",
    "kill_and_wait",
    "mixed_step",
    "part_samples",
    "quiet_store_bytes",
    "settles",
    "step_batches",
    "store_bytes",
]

_TIMEOUT = 30.0


def step_batches(step: int, ranks: int, n: int = 64) -> list[TrainingBatch]:
    """The batch of each rank of ``step`` (2 samples of about ``n`` tokens): its own
    data, the same bits every time."""
    return [make_batch(2, n=n, seed=100 * step + rank) for rank in range(ranks)]


def mixed_step(ranks: int) -> list[TrainingBatch]:
    """A step whose ranks 2, 4, ... are held packed (:class:`rlwire.Columns`: stored as
    they are, no join) and whose others are 48 samples of rows of 16-32 KiB (joined
    into the sink's join space, some 5 MB a rank): joined ranks side by side, and
    between packed ones. The same bits every time."""
    out = []
    for rank in range(ranks):
        packed = rank % 2 == 0 and rank > 0
        batch = make_batch(3 if packed else 48, n=30_000 if packed else 2048, seed=100 * rank)
        if packed:
            rows = batch.samples
            columns: dict[str, Any] = {
                name: rlwire.Ragged.from_arrays([getattr(s, name) for s in rows])
                for name in ("token_ids", "mask", "logprobs", "temperatures", "advantages")
            }
            columns["routed_experts"] = rlwire.Ragged.from_arrays([s.routed_experts for s in rows])
            columns["env_name"] = [s.env_name for s in rows]
            batch = TrainingBatch(samples=rlwire.Columns(columns))
        out.append(batch)
    return out


def part_samples(key: int, tokens: int = 16) -> list[TrainingSample]:
    """The samples of the part put with ``key``: one of ``tokens + 8 * key`` tokens,
    routed experts included, the same bits every time."""
    return [make_sample(tokens + 8 * key, seed=1000 + key)]


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


async def _send(
    url: str, steps: int, ranks: int, finish: bool, n: int, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    handles: list[list[StepHandle]] = []
    async with rlwire.open_sender(
        url, sidecar="routed_experts", on_existing="resume", storage_options=options
    ) as sender:
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


async def _append_at_once(url: str, step: int, names: list[str]) -> list[str]:
    """Append one field per name to rank 0 of ``step``, each its own stage (its own
    sender, never opened) and all at once, as concurrent stages of a framework append
    to one step; the error each raised (``type: message``), if any."""
    errors: list[str] = []

    async def append(i: int, name: str) -> None:
        sender = rlwire.open_sender(url)
        try:
            await sender.add_fields(step, {name: np.full(2, float(i))})
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
        finally:
            await sender.aclose()

    async with anyio.create_task_group() as tg:
        for i, name in enumerate(names):
            tg.start_soon(append, i, name)
    return errors


@ray.remote(num_cpus=0)
class Producer:
    """An async actor, as a framework's rollout worker: the board pulls its steps."""

    def __init__(self) -> None:
        self.puts = 0  # puts returned by fill, so far

    async def fill(
        self,
        url: str,
        keys: list[int],
        ranks: int,
        pause: float = 0.0,
        seal: bool = True,
        tokens: int = 16,
    ) -> dict[str, Any]:
        """Fill the next (or the open) step part by part, one part per key
        (:func:`part_samples`), ``pause`` seconds apart; never seals unless ``seal``
        (it waits to be killed instead). What it did, and when each put returned
        (``time.monotonic``, one clock for every process of the machine)."""
        put_at: dict[int, float] = {}
        skipped = []
        async with rlwire.open_sender(url, sidecar="routed_experts", on_existing="resume") as s:
            async with s.open_step(ranks=ranks) as writer:
                for key in keys:
                    if await writer.put(part_samples(key, tokens), key=key):
                        skipped.append(key)
                    put_at[key] = time.monotonic()
                    self.puts += 1
                    await anyio.sleep(pause)
                if not seal:
                    await anyio.sleep_forever()
            return {
                "board_owned": s.sink.board_owned,  # type: ignore[attr-defined]
                "step": writer.step,
                "resumed": sorted(writer.resumed),  # type: ignore[type-var]
                "skipped": skipped,
                "assignment": writer.assignment,
                "put_at": put_at,
            }

    async def done(self) -> int:
        """How many puts of :meth:`fill` returned."""
        return self.puts

    async def canary(self) -> list[Any]:
        return canary()

    async def send(
        self,
        url: str,
        steps: int,
        ranks: int,
        finish: bool = False,
        n: int = 64,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return await _send(url, steps, ranks, finish, n, options)

    async def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def append_at_once(self, url: str, step: int, names: list[str]) -> list[str]:
        return await _append_at_once(url, step, names)

    async def send_mixed(self, url: str, ranks: int) -> bool:
        """Send :func:`mixed_step` as step 0; whether the board owns it."""
        async with rlwire.open_sender(url) as sender:
            await sender.send_ranks(mixed_step(ranks))
            return bool(sender.sink.board_owned)  # type: ignore[attr-defined]

    async def send_blocking(self, url: str, steps: int, pull_timeout: float) -> dict[str, Any]:
        """Send with the sync sender on this actor's loop, which it blocks meanwhile."""
        options = {"pull_timeout": pull_timeout}
        with rlwire.open_sync_sender(url, on_existing="resume", storage_options=options) as s:
            for step in range(steps):
                s.send_ranks(step_batches(step, 1))
            return {"board_owned": s.sink.board_owned}  # type: ignore[attr-defined]


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


@ray.remote(num_cpus=0, max_concurrency=1)
class OneCallAsyncProducer:
    """An async actor that runs one call at a time: the board could not call it while
    it sends, so it owns what it sends."""

    async def send(self, url: str) -> dict[str, Any]:
        async with rlwire.open_sender(url, on_existing="resume") as sender:
            await sender.send_ranks(step_batches(0, 1))
            return {"board_owned": sender.sink.board_owned}  # type: ignore[attr-defined]


@ray.remote(num_cpus=0, max_concurrency=2)
class BusyThreadedProducer:
    """A threaded rollout worker: one thread generates, the other sends."""

    def __init__(self) -> None:
        self.generating, self.sent = threading.Event(), threading.Event()

    def generate(self) -> None:
        """Hold this actor's other thread until :meth:`send` is done."""
        self.generating.set()
        self.sent.wait(60)

    def send(self, url: str, pull_timeout: float) -> str:
        """Send once :meth:`generate` holds the other thread: the error, or "sent"."""
        options = {"pull_timeout": pull_timeout}
        try:
            assert self.generating.wait(60)
            with rlwire.open_sync_sender(url, storage_options=options) as sender:
                sender.send_ranks(step_batches(0, 1))
        except rlwire.TransportError as exc:
            return str(exc)
        finally:
            self.sent.set()
        return "sent"


@ray.remote(num_cpus=0)
class Trainer:
    """An async trainer actor: receives with the receiver API."""

    async def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def append_at_once(self, url: str, step: int, names: list[str]) -> list[str]:
        return await _append_at_once(url, step, names)

    async def open_handle(self, handle: StepHandle) -> tuple[int | None, list[str]]:
        with rlwire.open_receiver(handle.url, **handle.receiver_options()) as receiver:
            batch = await receiver.areceive(timeout=30)
            return receiver.last_step, fingerprint(batch)

    async def take_parts(
        self, url: str, rank: int, start_step: int = 0
    ) -> list[tuple[Any, int, list[str], float]]:
        """This rank's parts of ``start_step`` as they arrive: each part's key, index,
        fingerprint and when it was held (``time.monotonic``)."""
        got = []
        with rlwire.open_receiver(url, rank=rank, start_step=start_step) as receiver:
            async for part in receiver.aparts(timeout=60):
                held = time.monotonic()
                got.append((part.key, part.index, fingerprint(part.value), held))
        return got

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

    async def take_each(self, url: str, rank: int, count: int) -> list[list[Any]]:
        """Receive from the rank's mark until the end of the stream or ``count`` tries,
        skipping a step whose receive raised: each step's fingerprint, or the error it
        raised (its kind and message)."""
        got: list[list[Any]] = []
        with rlwire.open_receiver(url, rank=rank, resume=True) as receiver:
            for _ in range(count):
                try:
                    batch = await receiver.areceive(timeout=30)
                except EndOfStream:
                    break
                except rlwire.RlwireError as exc:
                    got.append(["error", type(exc).__name__, str(exc)])
                    receiver.skip()
                    continue
                got.append(["step", receiver.last_step, fingerprint(batch)])
        return got


def kill_and_wait(actor: Any) -> None:
    """Kill ``actor`` and wait until the object store has dropped what it owned (Ray
    does that a moment after the death): until then, even its own objects can be read."""
    canary = ray.get(actor.canary.remote(), timeout=_TIMEOUT)[0]
    ray.kill(actor)
    deadline = time.monotonic() + _TIMEOUT
    while time.monotonic() < deadline:
        try:
            ray.get(canary, timeout=_TIMEOUT)
        except (ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError):
            return
        time.sleep(0.05)
    raise AssertionError("what the killed actor owned is still in the object store")


def store_bytes() -> int:
    """Bytes in this node's object store, by the store's own figures."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(ray.get_runtime_context().gcs_address)
    return int(get_memory_info_reply(state).store_stats.object_store_bytes_used)


def quiet_store_bytes() -> int:
    """:func:`store_bytes` once the store has stopped shrinking: what earlier tests let go
    is freed asynchronously, and a baseline taken meanwhile would count it."""
    last = store_bytes()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = store_bytes()
        if now >= last:
            return now
        last = now
    return last


def settles(check: Callable[[], bool]) -> bool:
    """Whether ``check`` becomes true within a few seconds (the store frees after the
    last reference goes, asynchronously)."""
    deadline = time.monotonic() + 10
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
