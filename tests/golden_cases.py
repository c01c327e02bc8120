"""The messages in tests/golden/: what each holds and how it was written.

The files were written once by rlwire 0.1.0 (wire format 1.0), the chunked case once by
the first rlwire that chunks heavy containers (format 1.0 with extension types 4 and 5),
and the ZeroMQ messages once by the first rlwire that speaks ZeroMQ version 2.0, with
``python tests/golden_cases.py [NAME]``; never rewrite them to make a test pass. A
reader must keep decoding them into exactly the objects below.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import rlwire
from rlwire._frame.compression import Compressor

GOLDEN = Path(__file__).parent / "golden"


def _sample(i: int) -> rlwire.TrainingSample:
    n = 300 + 100 * i
    return rlwire.TrainingSample(
        token_ids=np.arange(n, dtype=np.int64) * 7 % 50_000,
        mask=np.arange(n) % 3 != 0,
        logprobs=-np.linspace(0, 4, n, dtype=np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=np.full(n, 0.5 - i, np.float32),
        env_name=f"env-{i}",
        routed_experts=(np.arange(n * 4 * 2, dtype=np.uint8) % 5).reshape(n, 4, 2),
    )


def batch() -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[_sample(i) for i in range(3)])


def mixed() -> dict[str, Any]:
    return {
        "fortran": np.asfortranarray(np.arange(600, dtype=">f8").reshape(20, 30)),
        "small": np.array([1.5, 2.5], dtype=np.float32),
        "blob": bytes(range(256)) * 20,
        "nested": [{"step": 1, "ok": True, "name": "x"}, None, 2.5],
    }


def metrics() -> dict[str, Any]:
    return {"step": 3, "loss": 0.25, "rewards": [1.0, 0.0, 0.5], "env": "gsm8k"}


def chunked() -> dict[str, Any]:
    """Containers heavy enough that the msgpack codec writes them as chunks (ext 4, 5)."""
    return {
        "input_ids": [i * 7 % 50_000 for i in range(70_000)],
        "logprobs": [-(i % 97) / 16 for i in range(40_000)],
        "rows": [[i, i + 1, i + 2] for i in range(12_000)],
        "by_name": {f"k{i}": i for i in range(40_000)},
        "routed_experts": bytes(range(256)) * 40,
    }


SMALL = 1024  # compress segments from 1 KiB so the golden files stay small

#: name -> (the object, open_sender options, the type to receive as)
CASES: dict[str, tuple[Callable[[], Any], dict[str, Any], Any]] = {
    "msgpack-plain": (batch, {}, rlwire.TrainingBatch),
    "msgpack-sidecar-zstd": (
        batch,
        {"sidecar": ("routed_experts",), "compression": Compressor("zstd", 3, SMALL)},
        rlwire.TrainingBatch,
    ),
    "msgpack-lz4": (mixed, {"compression": Compressor("lz4", 0, SMALL)}, Any),
    "msgpack-no-checksum": (mixed, {"checksum": False, "sidecar": "fortran"}, Any),
    "json": (metrics, {"codec": "json"}, Any),
    "msgpack-chunked": (
        chunked,
        {"sidecar": ("routed_experts",), "compression": Compressor("zstd", 3, SMALL)},
        Any,
    ),
}


#: ZeroMQ packets are never stored: this file holds what a sender sent a receiver for
#: one message (``batch()``, routed experts as sidecar, lz4, cut into data packets of
#: 2 KiB), as a msgpack list of packets, each a list of ZeroMQ frames; the ZeroMQ version is
#: in its name.
ZMQ_GOLDEN = GOLDEN / "zmq-2.0.msgpack"
ZMQ_OPTIONS: dict[str, Any] = {
    "sidecar": ("routed_experts",),
    "compression": Compressor("lz4", 0, SMALL),
    "storage_options": {"message_bytes": 2 << 10},
}


def _write_zmq() -> None:
    """Send ``batch()`` to a raw DEALER socket and keep the messages it gets."""
    import tempfile

    import msgspec
    from helpers import capture_zmq_message

    got = capture_zmq_message(tempfile.mkdtemp(), batch(), **ZMQ_OPTIONS)
    ZMQ_GOLDEN.write_bytes(msgspec.msgpack.encode(got))


async def _write(name: str) -> None:
    make, options, _ = CASES[name]
    path = GOLDEN / name
    shutil.rmtree(path, ignore_errors=True)
    async with rlwire.open_sender(path, **options) as sender:
        await sender.send(make())


if __name__ == "__main__":
    for case in sys.argv[1:] or [*CASES, ZMQ_GOLDEN.name]:
        if case == ZMQ_GOLDEN.name:
            _write_zmq()
        else:
            anyio.run(_write, case)
        print("wrote", GOLDEN / case)
