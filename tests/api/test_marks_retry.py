"""A consumption mark the store could not take for a moment (a full tmpfs) is written
once it can: before every later read, not only when the receiver moves on again. A
real small tmpfs, in a private mount namespace (needs root and unshare)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TRAINER = textwrap.dedent("""
    import os, sys, threading, warnings, rlwire
    from rlwire.errors import MarkSkippedWarning
    from rlwire.testing import make_batch
    from rlwire.transport.layout import consumed_mark
    mount = sys.argv[1]
    root, mark = os.path.join(mount, "run"), os.path.join(mount, "run", "consumed.rank-0000.rlw")
    sender = rlwire.open_sync_sender(root, max_ahead=0, keep_last=1)
    receiver = rlwire.open_receiver(root)
    sender.send(make_batch(1, 100, seed=0))
    receiver.receive(timeout=5)
    assert receiver.poll() is None  # asks for step 1: its mark says so
    sender.send(make_batch(1, 100, seed=1))
    receiver.receive(timeout=5)
    try:  # the tmpfs is full for a moment
        with open(os.path.join(mount, "filler"), "wb") as filler:
            while True:
                filler.write(bytes(1 << 16))
                filler.flush()
    except OSError as exc:
        assert exc.errno == 28, exc
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert receiver.poll() is None  # asks for step 2: its mark cannot be written
        assert receiver.poll() is None  # still full: skipped again, warned once
    assert [w.category for w in caught] == [MarkSkippedWarning], caught
    assert open(mark, "rb").read() == consumed_mark(1)
    os.unlink(os.path.join(mount, "filler"))  # the space is back
    assert receiver.poll() is None  # the next look writes the mark
    assert open(mark, "rb").read() == consumed_mark(2)
    sent = []
    producer = threading.Thread(target=lambda: sent.append(sender.send(make_batch(1, 100, seed=2))))
    producer.start()
    producer.join(10)  # max_ahead=0: it waits for the mark of step 2
    assert sent == [2], "the sender still waits for the rank's mark"
    got, want = receiver.receive(timeout=5), make_batch(1, 100, seed=2)
    assert got.samples[0].token_ids.tobytes() == want.samples[0].token_ids.tobytes()
    print("ok")
""")


def test_a_mark_skipped_on_a_full_tmpfs_is_written_once_there_is_room(tmp_path: Path) -> None:
    """With ``max_ahead=0`` the sender waits for the rank's mark of step 2: skipped
    while the tmpfs was full, and tried again only when the receiver moved on again, it
    was never written, and sender and trainer waited for each other for ever."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private mount namespace")
    d = str(tmp_path)
    trainer = f"exec {sys.executable} -c {shlex.quote(TRAINER)} {d}"
    done = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-ec",
            f"mount -t tmpfs -o size=2m tmpfs {d}; {trainer}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode and "mount:" in done.stderr:
        pytest.skip(f"no tmpfs mount here: {done.stderr!r}")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
