"""Forged ZeroMQ messages: a fake sender (a raw ROUTER socket) answers a real receiver's
*ready* with a real message, cut into several data packets and a seal, that was damaged
(bit flips, truncated, dropped, extra or swapped parts, dropped or swapped packets, a
replayed or skipped sequence number). The receiver must return the data sent or a typed
error, within its timeout (plus a slack)."""

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
    "packet dropped",
    "packets swapped",
)
#: Small enough to cut the captured message into several data packets.
PACKET_BYTES = 8 << 10

Packets = list[list[bytes]]


def capture(root: str) -> dict[str, Any]:
    """Send one message through a real sender to a raw DEALER; save the packets it got."""
    from helpers import capture_zmq_message

    got = capture_zmq_message(
        root,
        payload(0, 0, N),
        sidecar=("routed_experts",),
        compression="lz4",
        storage_options={"message_bytes": PACKET_BYTES},
    )
    Path(root, "zmq-captured.msgpack").write_bytes(msgspec.msgpack.encode(got))
    whole = len(got) > 2 and got[-1][0] == b"seal"
    return {"outcome": EXACT if whole else TYPED, "detail": f"{len(got)} packets"}


def forge(packets: Packets, kind: str, rng: random.Random) -> tuple[Packets, str]:
    packets = [[bytes(p) for p in packet] for packet in packets]
    m = rng.randrange(len(packets))
    if kind == "packet dropped":
        del packets[m]
        return packets, f"{kind}: {m}"
    if kind == "packets swapped":
        j = (m + rng.randrange(1, len(packets))) % len(packets)  # another packet
        packets[m], packets[j] = packets[j], packets[m]
        return packets, f"{kind}: {m} and {j}"
    if kind in ("sequence number skipped", "another rank"):
        # Every data packet's head, and the seal for the sequence number.
        for packet in packets[:-1]:
            prelude, head = packet[0][:8], msgspec.msgpack.decode(packet[0][8:])
            if kind == "another rank":
                head[3] = 1
            else:  # after the intact step 0 (seq 0), step 1 with seq 2 or more: lost
                head[1], head[2] = 2 + m, 1
            packet[0] = prelude + msgspec.msgpack.encode(head)
        if kind == "another rank":
            return packets, kind
        seal = packets[-1]
        seal[1] = seal[1][:8] + struct.pack("<Q", 2 + m) + seal[1][16:]
        return packets, f"{kind} (to {2 + m})"
    parts = packets[m]
    i = rng.randrange(len(parts))
    where = f"packet {m} part {i}"
    if kind.startswith("bit flips"):
        i = 0 if kind.endswith("head") else i
        data = bytearray(parts[i])
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        parts[i] = bytes(data)
        return packets, f"{kind}: packet {m} part {i}"
    if kind == "part truncated":
        parts[i] = parts[i][: rng.randrange(len(parts[i]))]
    elif kind == "part dropped":
        del parts[i]
    elif kind == "part added":
        parts.insert(i + 1, os.urandom(rng.randint(0, 100)))
    elif kind == "parts swapped" and len(parts) > 1:
        j = (i + rng.randrange(1, len(parts))) % len(parts)  # another part
        parts[i], parts[j] = parts[j], parts[i]
        return packets, f"{kind}: packet {m}, parts {i} and {j}"
    elif kind == "junk appended to a part":
        parts[i] += os.urandom(rng.randint(1, 100))
    return packets, f"{kind}: {where}"


def run_forged(root: str, packets: Packets, after: Packets | None = None) -> dict[str, Any]:
    """Serve ``packets`` (after ``after``, the intact step 0, if given) to a receiver."""
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
                for packet in [*(after or []), *packets]:
                    router.send_multipart([ident, *packet])

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
    packets = msgspec.msgpack.decode(Path(root, "zmq-captured.msgpack").read_bytes())
    yield Job(run_forged, (root, packets), timeout=20, tag=("forged ZeroMQ messages", "intact"))
    for i in range(total - 1):
        kind = KINDS[i % len(KINDS)] if i < 3 * len(KINDS) else rng.choice(KINDS)
        forged, what = forge(packets, kind, rng)
        after = packets if kind == "sequence number skipped" else None
        yield Job(
            run_forged, (root, forged, after), timeout=20, tag=("forged ZeroMQ messages", what)
        )
