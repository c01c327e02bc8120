"""S3 without a shared filesystem: a producer process and trainer processes meet in a bucket.

Nothing is shared but the bucket: the producer uploads each step (its sidecars first,
then each rank's message, completed at commit, so no rank's message is ever half there;
a kill between two ranks' messages can leave the step visible to some ranks only, which
a resumed sender refuses, naming the repair: docs/reliability.md) and each trainer
polls for its rank's next step. By default the example starts
moto's S3 server on loopback (``rlwire[dev]`` has it); set ``S3_ENDPOINT`` (and the usual
``AWS_*`` credentials) to use a real S3-compatible store instead.

Run it: ``python examples/s3_without_shared_fs.py`` (needs ``rlwire[s3]``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator

import anyio
import numpy as np

import rlwire

RANKS, STEPS = 2, 3


def payload(step: int, rank: int) -> dict[str, object]:
    rng = np.random.default_rng([step, rank])
    return {
        "step": step,
        "rank": rank,
        "advantages": rng.standard_normal(4096, np.float32),
        "routed_experts": rng.integers(0, 64, (4096, 24, 8), dtype=np.uint8),
    }


def produce(url: str, storage: dict[str, object]) -> None:
    async def run() -> None:
        async with rlwire.open_sender(
            url, storage_options=storage, sidecar=("routed_experts",)
        ) as sender:
            for step in range(STEPS):
                await sender.send_ranks([payload(step, rank) for rank in range(RANKS)])
                print(f"producer: uploaded step {step}", flush=True)
            await sender.finish()

    anyio.run(run)


def train(url: str, storage: dict[str, object], rank: int) -> None:
    with rlwire.open_receiver(url, rank=rank, storage_options=storage, type=dict) as receiver:
        for batch in receiver:  # ends at the producer's finish()
            want = payload(receiver.last_step or 0, rank)
            assert np.array_equal(batch["routed_experts"], want["routed_experts"])
            print(f"trainer {rank}: step {batch['step']}", flush=True)


@contextlib.contextmanager
def s3_endpoint() -> Iterator[str]:
    """An S3 endpoint: $S3_ENDPOINT, or moto's server on loopback for the example's life."""
    if "S3_ENDPOINT" in os.environ:
        yield os.environ["S3_ENDPOINT"]
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield endpoint
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")  # moto's dummies
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with s3_endpoint() as endpoint:
        storage = {"endpoint_url": endpoint}
        bucket = f"rl-runs-{uuid.uuid4().hex[:8]}"
        import s3fs  # rlwire[s3]

        s3fs.S3FileSystem(**storage).mkdir(bucket)
        url = f"s3://{bucket}/run42"
        args = [sys.executable, __file__, url, json.dumps(storage)]
        trainers = [subprocess.Popen([*args, "train", str(r)]) for r in range(RANKS)]
        producer = subprocess.Popen([*args, "produce"])
        codes = [p.wait(timeout=120) for p in (producer, *trainers)]
        assert codes == [0] * (RANKS + 1), codes
        print(f"{RANKS} trainers received {STEPS} steps through {url}, no shared directory")


if __name__ == "__main__":
    if len(sys.argv) > 3:
        url, storage = sys.argv[1], json.loads(sys.argv[2])
        if sys.argv[3] == "produce":
            produce(url, storage)
        else:
            train(url, storage, int(sys.argv[4]))
    else:
        main()
