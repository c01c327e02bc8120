"""writev_all (rlwire.transport._file.writev) over a real socket that takes a little at a
time: short writes resume where they stopped, whatever view they ended in."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from rlwire.transport._file.writev import batches, writev_all


def test_short_writes_resume_inside_and_between_views(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    views = [memoryview(rng.integers(0, 256, n, dtype=np.uint8)) for n in [1, 3, 63] * 300]
    views += [memoryview(rng.integers(0, 256, 300_001, dtype=np.uint8))]
    expected = b"".join(bytes(v) for v in views)
    returned: list[int] = []
    real = os.writev

    def counting(fd: int, buffers: list[memoryview]) -> int:
        while True:
            try:
                n = real(fd, buffers)
                break
            except BlockingIOError:  # timed out before moving a byte (a starved drain)
                continue
        returned.append(n)
        return n

    monkeypatch.setattr(os, "writev", counting)
    writer, reader = socket.socketpair()
    got = bytearray()
    with writer, reader:
        writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        # A send that times out after moving some bytes returns how many: a short write.
        writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 2000))

        def drain() -> None:
            while len(got) < len(expected):
                got.extend(reader.recv(3000))
                time.sleep(0.003)

        thread = threading.Thread(target=drain)
        thread.start()
        total = writev_all(writer.fileno(), list(views))
        thread.join(timeout=30)
    assert total == len(expected)
    assert bytes(got) == expected
    assert len(returned) > 1  # it did resume after short writes


def test_small_flat_views_are_batched_as_they_are() -> None:
    runs = [memoryview(bytes([i % 256]) * (i % 7 + 1)) for i in range(2000)]
    out = list(batches(runs, [1] * len(runs)))
    flat = [item for batch in out for item in batch]
    assert [view for view, _ in flat] == runs
    assert all(len(batch) <= 1024 for batch in out)
    assert all(view is run for (view, _), run in zip(flat, runs, strict=True))
