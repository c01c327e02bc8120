"""Test data shared by the test modules (the same helpers plugin authors get), and a
capture of what a ZeroMQ sender sends, for the wire tests."""

from __future__ import annotations

from typing import Any

from rlwire.testing import assert_batches_equal, make_batch, make_sample

__all__ = ["assert_batches_equal", "capture_zmq_message", "make_batch", "make_sample"]


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
