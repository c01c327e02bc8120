"""Test data shared by the test modules (the same helpers plugin authors get), a capture
of what a ZeroMQ sender sends, for the wire tests, and a receive in a fresh process that
reports its peak memory, for the bounds tests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import numpy as np

import rlwire
from rlwire.testing import assert_batches_equal, make_batch, make_sample
from rlwire.transport import FileSink

__all__ = [
    "Received",
    "append_at_once",
    "assert_batches_equal",
    "capture_zmq_message",
    "make_batch",
    "make_sample",
    "receive_in_child",
    "send_a_part_of_two_rows",
    "stat_type",
    "store_frame",
]


def capture_zmq_message(directory: str, obj: Any, **options: Any) -> list[list[bytes]]:
    """The packets a real ZeroMQ sender, opened with ``options``, sends for ``obj`` to a
    raw DEALER socket that announces itself as rank 0: its data packets, then its seal
    (acknowledged, so the sender closes at once). ``directory`` holds the socket."""
    import threading
    import time

    import anyio
    import msgspec
    import zmq

    import rlwire

    endpoint = f"ipc://{directory}/capture.sock"
    got: list[list[bytes]] = []

    def dealer() -> None:
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.connect(endpoint)
        sock.send_multipart([b"ready", msgspec.msgpack.encode([2, 0])])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if sock.poll(100):
                parts = sock.recv_multipart()
                if parts[0][:4] == b"RLWZ" or parts[0] == b"seal":
                    got.append(parts)
                if parts[0] == b"seal":
                    sock.send_multipart([b"ack", parts[1][:16]])  # its session and seq
                    sock.send_multipart([b"bye", b""])
                    break
        sock.close(linger=1000)
        context.term()

    thread = threading.Thread(target=dealer)
    thread.start()

    async def send() -> None:
        async with rlwire.open_sender(f"zmq+{endpoint}", **options) as sender:
            await sender.send(obj)

    anyio.run(send)
    thread.join()
    return got


# The peak is VmHWM, the high-water mark of the child's own memory since exec: its
# ru_maxrss would start at the test process's (Linux carries it over a vfork and exec).
_RECEIVE = textwrap.dedent(
    """
    import json, resource, sys, time
    from typing import Any
    if int(sys.argv[3]):
        resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]),) * 2)
    import rlwire
    kind = {"object": object, "any": Any, "typed": list[list[int]]}[sys.argv[2]]
    began = time.monotonic()
    try:
        with rlwire.open_receiver(sys.argv[1], type=kind) as receiver:
            value = receiver.receive(timeout=float(sys.argv[4]))
        out = "received " + str(len(value)) if hasattr(value, "__len__") else "received"
    except rlwire.RlwireError as exc:
        out = type(exc).__name__ + ": " + str(exc)
    except BaseException as exc:
        out = "UNTYPED " + type(exc).__name__ + ": " + str(exc)[:200]
    seconds = time.monotonic() - began
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps([out, peak / 1024, seconds]))
    """
)


class Received(NamedTuple):
    out: str  #: "received N", or the error's class and message ("UNTYPED ..." if untyped)
    peak_mb: float  #: the child's peak resident memory, MiB
    seconds: float  #: how long the receive took


def receive_in_child(
    root: Path, kind: str = "object", *, address_space: int = 3 << 30, timeout: float = 10
) -> Received:
    """Receive step 0 of ``root`` in a new Python process, as ``kind`` ("object", "any"
    or "typed", i.e. ``list[list[int]]``), under an ``address_space`` limit (0: none)."""
    args = [str(root), kind, str(address_space), str(timeout)]
    proc = subprocess.run(
        [sys.executable, "-c", _RECEIVE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return Received(*json.loads(proc.stdout))


def store_frame(path: Path, frame: rlwire.Frame) -> Path:
    """Commit ``frame`` as step 0 of the directory ``path`` (rank 0), as it is: a hostile
    writer's frame, its checksums right."""
    sink = FileSink(path)
    sink.open("overwrite")
    stage = sink.stage(0, [frame])
    while True:
        try:
            next(stage)
        except StopIteration as stop:
            stop.value.commit()
            return path


def stat_type(path: Path) -> str:
    """The filesystem type of ``path`` by coreutils' ``stat -f`` ("" if unknown): an
    oracle beside rlwire's own reading of mountinfo."""
    run = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else ""


async def send_a_part_of_two_rows(url: str, **options: Any) -> None:
    """Step 0 of ``url``: one part, two rows of 4 and 3 ``token_ids``, sealed."""
    async with rlwire.open_sender(url, validate=False, **options) as sender:
        async with sender.open_step() as writer:
            await writer.put([{"token_ids": np.arange(4)}, {"token_ids": np.arange(3)}], key="g")


async def append_at_once(url: str, names: tuple[str, ...], **options: Any) -> None:
    """One ``add_fields`` call a name, all at once, each from a sender of its own, to
    rank 0 of :func:`send_a_part_of_two_rows`'s step: a float column of its rows."""
    ragged = rlwire.Ragged(np.arange(7, dtype=np.float32), np.array([0, 4, 7]))

    async def stage(name: str) -> None:
        appender = rlwire.open_sender(url, **options)  # attaches
        try:
            await appender.add_fields(0, {name: ragged}, rank=0)
        finally:
            await appender.aclose()

    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(stage, name)


def plain_sample(n: int, experts: tuple[int, int] | None = None) -> rlwire.TrainingSample:
    """A TrainingSample of ``n`` tokens whose values are plain (a range, ones, zeros),
    with routed experts of ``experts`` (layers, top-k) per token when given."""
    return rlwire.TrainingSample(
        token_ids=np.arange(n),
        mask=np.ones(n, bool),
        logprobs=np.zeros(n, np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.zeros(n, np.float32),
        env_name="gsm8k",
        routed_experts=None if experts is None else np.ones((n, *experts), np.uint8),
    )


@asynccontextmanager
async def loop_gaps(every: float = 0.005) -> AsyncIterator[list[float]]:
    """The gaps between the ticks of a task that sleeps ``every`` seconds on the running
    event loop, for the time of the ``async with`` block: a stalled loop makes one long."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(every)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(tick)
        yield gaps
        tasks.cancel_scope.cancel()
