"""A ``ray://`` sender and receivers used after ``ray.shutdown()``: a Ray cluster of its
own (the test session's must stay up), started, used, and shut down while a receiver
waits and a prune a failed send asked for is not waited for yet. Run as a script by
tests/transport/ray/test_ray_after_shutdown.py; prints, as JSON, what each call raised
and how long it took (``"hung"`` past :data:`LIMIT`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import ray
from helpers import make_batch

import rlwire

#: Seconds a call may take before it counts as hung (Ray ends a process whose calls
#: wait on a shut-down cluster for 60 s).
LIMIT = 15.0


def outcome(call: Callable[[], object]) -> list[Any]:
    """``[what call raised (its class name, or "returned", or "hung"), seconds, message]``,
    the call run in a thread of its own so that a hang is told, not waited out."""
    seen: list[Any] = ["hung", LIMIT, ""]

    def run() -> None:
        began = time.monotonic()
        try:
            call()
            seen[0], seen[2] = "returned", ""
        except BaseException as exc:  # what it raised is what the test checks
            seen[0], seen[2] = type(exc).__name__, str(exc)
        seen[1] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT)
    print(seen, file=sys.stderr, flush=True)  # told as it goes, should Ray end the process
    return seen


def main(temp: str) -> dict[str, Any]:
    ray.init(
        num_cpus=1,
        object_store_memory=80 << 20,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=temp,
    )
    url = "ray://after-shutdown"
    sender = rlwire.open_sync_sender(url)
    async_sender = rlwire.open_sender(url + "-async")
    anyio.run(async_sender.send, make_batch(1, seed=9))
    sender.send(make_batch(1, seed=0))
    receiver = rlwire.open_receiver(url)
    receiver.receive(timeout=30)
    # A sender whose last send failed after it asked the board to delete the steps its
    # rank moved past (keep_last): that prune is not waited for yet as Ray shuts down.
    kept = rlwire.open_sync_sender(url + "-kept", keep_last=1)
    with rlwire.open_receiver(url + "-kept") as consumer:
        for seed in range(3):
            kept.send(make_batch(1, seed=seed))
            consumer.receive(timeout=30)
    refused = make_batch(1, seed=3)
    refused.samples[0].token_ids = np.array([object()], dtype=object)
    with contextlib.suppress(rlwire.SchemaError):
        kept.send(refused)
    seen_prune = getattr(kept.sink, "_pruning", None) is not None
    waiting = rlwire.open_receiver(url, resume=True)  # at step 1, which never comes
    waiting.poll()
    seen: dict[str, Any] = {"prune pending": seen_prune}
    thread = threading.Thread(
        target=lambda: seen.update(waiting=outcome(lambda: waiting.receive(timeout=60)))
    )
    thread.start()
    time.sleep(1.5)  # the wait is on the board
    ray.shutdown()
    thread.join()
    seen["receive"] = outcome(lambda: receiver.receive(timeout=2))
    seen["poll"] = outcome(receiver.poll)
    seen["send"] = outcome(lambda: sender.send(make_batch(1, seed=1)))
    for backend in ("asyncio", "trio"):
        seen[f"areceive {backend}"] = outcome(
            lambda b=backend: anyio.run(receiver.areceive, backend=b)  # type: ignore[misc]
        )
        seen[f"async send {backend}"] = outcome(
            lambda b=backend: anyio.run(async_sender.send, make_batch(1), backend=b)  # type: ignore[misc]
        )
    seen["sender close"] = outcome(sender.close)
    seen["sender close, a prune pending"] = outcome(kept.close)
    seen["async sender close"] = outcome(lambda: anyio.run(async_sender.aclose))
    seen["receiver close"] = outcome(receiver.close)
    return seen


if __name__ == "__main__":
    # A short path of its own: Ray's sockets live under it, and a socket's path is short.
    temp = tempfile.mkdtemp(prefix="rlw-ray-")
    try:
        print(json.dumps(main(temp)), flush=True)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        sys.stdout.flush()
        os._exit(0)  # not Ray's exit hooks: they may wait on the cluster that is gone
