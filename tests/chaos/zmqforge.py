"""Forged ZeroMQ messages: a fake sender (a raw ROUTER socket) answers a real receiver's
*ready* with a real batch that was damaged (bit flips, truncated, dropped, extra or
swapped parts, a replayed or skipped sequence number). The receiver must return the
data sent or a typed error, within its timeout (plus a slack)."""

from __future__ import annotations

import os
import random
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec

import rlwire

from ._model import EXACT, HANG, TYPED, payload, receive_one
from ._proc import Job

N = 2_000
TIMEOUT = 2.0
SLACK = 3.0
KINDS = (
    "bit flips",
    "bit flips in the head",
    "part truncated",
    "part dropped",
    "part added",
    "parts swapped",
    "sequence number skipped",
    "another rank",
    "junk appended to a part",
)


def capture(root: str) -> dict[str, Any]:
    """Send one batch through a real sender to a raw DEALER; save the parts it got."""
    import zmq

    endpoint = f"ipc://{root}/capture.sock"
    got: list[bytes] = []

    def dealer() -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        sock.send_multipart([b"ready", msgspec.msgpack.encode([1, 0])])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if sock.poll(100):
                parts = sock.recv_multipart()
                if parts[0][:4] == b"RLWZ":
                    got.extend(parts)
                    head = msgspec.msgpack.decode(parts[0][8:])
                    sock.send_multipart([b"ack", head[0] + struct.pack("<Q", head[1])])
                    sock.send_multipart([b"bye", b""])
                    break
        sock.close(linger=1000)
        ctx.term()

    thread = threading.Thread(target=dealer)
    thread.start()

    async def send() -> None:
        async with rlwire.open_sender(
            f"zmq+{endpoint}", sidecar=("routed_experts",), compression="lz4"
        ) as sender:
            await sender.send(payload(0, 0, N))

    anyio.run(send)
    thread.join()
    Path(root, "zmq-captured.msgpack").write_bytes(msgspec.msgpack.encode(got))
    return {"outcome": EXACT if got else TYPED, "detail": f"{len(got)} parts"}


def forge(parts: list[bytes], kind: str, rng: random.Random) -> tuple[list[bytes], str]:
    parts = [bytes(p) for p in parts]
    i = rng.randrange(len(parts))
    if kind.startswith("bit flips"):
        i = 0 if kind.endswith("head") else i
        data = bytearray(parts[i])
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        parts[i] = bytes(data)
        return parts, f"{kind}: part {i}"
    if kind == "part truncated":
        parts[i] = parts[i][: rng.randrange(len(parts[i]))]
    elif kind == "part dropped":
        del parts[i]
    elif kind == "part added":
        parts.insert(i + 1, os.urandom(rng.randint(0, 100)))
    elif kind == "parts swapped":
        j = (i + rng.randrange(1, len(parts))) % len(parts)  # another part
        parts[i], parts[j] = parts[j], parts[i]
        return parts, f"{kind}: {i} and {j}"
    elif kind == "junk appended to a part":
        parts[i] += os.urandom(rng.randint(1, 100))
    elif kind in ("sequence number skipped", "another rank"):
        prelude, head = parts[0][:8], msgspec.msgpack.decode(parts[0][8:])
        if kind == "another rank":
            head[3] = 1
            parts[0] = prelude + msgspec.msgpack.encode(head)
            return parts, kind
        # After the intact step 0 (seq 0), step 1 arrives with seq 2 or more: a lost message.
        head[1], head[2] = rng.randint(2, 1 << 40), 1
        parts[0] = prelude + msgspec.msgpack.encode(head)
        return parts, f"{kind} (to {head[1]})"
    return parts, f"{kind}: part {i}"


def run_forged(root: str, parts: list[bytes], after: list[bytes] | None = None) -> dict[str, Any]:
    """Serve ``parts`` (after ``after``, the intact step 0, if given) to a receiver."""
    import zmq

    directory = tempfile.mkdtemp(dir=root)
    endpoint = f"ipc://{directory}/s.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    result: dict[str, Any] = {}

    def fake_sender() -> None:
        if router.poll(int(TIMEOUT * 1000)):
            ident, kind, *_ = router.recv_multipart()
            if kind == b"ready":
                if after is not None:
                    router.send_multipart([ident, *after])
                router.send_multipart([ident, *parts])

    thread = threading.Thread(target=fake_sender, daemon=True)
    thread.start()
    start = time.monotonic()
    url = f"zmq+{endpoint}"
    if after is None:
        result = receive_one(url, 0, 0, payload(0, 0, N), timeout=TIMEOUT)
    else:
        result = _receive_two(url)
    took = time.monotonic() - start
    thread.join(1)
    router.close(linger=0)
    ctx.term()
    if took > TIMEOUT + SLACK:
        return {"outcome": HANG, "detail": f"receive(timeout={TIMEOUT}) took {took:.1f} s"}
    return result


def _receive_two(url: str) -> dict[str, Any]:
    """Step 0 must arrive intact; step 1 (forged) must be a typed error."""
    from ._model import UNTYPED, WRONG, describe, same

    try:
        with rlwire.open_receiver(url, rank=0) as receiver:
            if not same(receiver.receive(timeout=TIMEOUT), payload(0, 0, N)):
                return {"outcome": WRONG, "detail": "the intact step 0 came out different"}
            receiver.receive(timeout=TIMEOUT)
    except rlwire.RlwireError as exc:
        return {"outcome": TYPED, "detail": describe(exc)}
    except Exception as exc:
        return {"outcome": UNTYPED, "detail": describe(exc)}
    return {"outcome": WRONG, "detail": "a message after a lost one was accepted"}


def jobs(root: str, total: int, seed: int) -> Iterator[Job]:
    rng = random.Random(seed)
    parts = msgspec.msgpack.decode(Path(root, "zmq-captured.msgpack").read_bytes())
    yield Job(run_forged, (root, parts), timeout=20, tag=("forged ZeroMQ messages", "intact"))
    for i in range(total - 1):
        kind = KINDS[i % len(KINDS)] if i < 3 * len(KINDS) else rng.choice(KINDS)
        forged, what = forge(parts, kind, rng)
        after = parts if kind == "sequence number skipped" else None
        yield Job(
            run_forged, (root, forged, after), timeout=20, tag=("forged ZeroMQ messages", what)
        )
