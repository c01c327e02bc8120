"""A sidecar file longer than its main file's envelope says (a sparse 4 GiB one) is
refused by its size before it is mapped: a ``CorruptFrameError`` naming the sidecar
and both sizes. It was mapped whole first: under a limit on address space a
``TransportError`` ("cannot map"), without one 4 GiB mapped for a few hundred bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import forked
import numpy as np

import rlwire
from rlwire.transport.layout import sidecar_name

HUGE = 4 << 30

#: A receiver under a 3 GiB limit on address space: prints what receiving step 0 gives.
READER = """
import resource, sys, rlwire
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
try:
    with rlwire.open_receiver(sys.argv[1], type=dict) as receiver:
        receiver.receive(timeout=5)
    print("read")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_a_sparse_sidecar_of_gigabytes_is_refused_unmapped(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path, sidecar="x") as sender:
        sender.send({"x": np.arange(100)})
    path = tmp_path / sidecar_name(0, 0)
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(HUGE)
    done = forked.run(
        [sys.executable, "-c", READER, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("CorruptFrameError"), done.stdout
    assert f"{path}: sidecar extended: expected {size} bytes, found {HUGE}; not read" in done.stdout
