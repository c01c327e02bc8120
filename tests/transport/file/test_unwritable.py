"""A receiver on a directory it cannot write (a read-only mount, a full disk): the
stored steps stay readable; the consumption mark is skipped with one
MarkSkippedWarning. Real mounts, in a private mount namespace (needs root and unshare)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import make_batch

import rlwire

pytestmark = pytest.mark.anyio

RECEIVE = textwrap.dedent("""
    import sys, warnings, rlwire
    from rlwire.testing import make_batch
    from rlwire.errors import MarkSkippedWarning
    path, steps = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:  # fill the disk first
        try:
            with open(f"{path}/filler", "wb") as filler:
                while True:
                    filler.write(bytes(4096))
                    filler.flush()
        except OSError as exc:
            assert exc.errno == 28, exc
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rlwire.open_receiver(path) as receiver:
            for step in range(steps):
                got = receiver.receive(timeout=5)
                want = make_batch(1, seed=step)
                assert got.samples[0].token_ids.tobytes() == want.samples[0].token_ids.tobytes()
    skipped = [w for w in caught if issubclass(w.category, MarkSkippedWarning)]
    assert len(skipped) == 1 and len(caught) == 1, [str(w.message) for w in caught]
    print(skipped[0].message)
""")


def namespaced(shell: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -m fails here: {probe.stderr!r}")
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-ec", shell],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def send_steps(path: Path, steps: int) -> None:
    async with rlwire.open_sender(path) as sender:
        for step in range(steps):
            await sender.send(make_batch(1, seed=step))


async def test_a_receiver_reads_a_read_only_directory(tmp_path: Path) -> None:
    await send_steps(tmp_path, 3)
    d = str(tmp_path)
    done = namespaced(
        f"mount --bind {d} {d}; mount -o remount,ro,bind {d}; "
        f"exec {sys.executable} -c '{RECEIVE}' {d} 3"
    )
    assert done.returncode == 0, done.stderr
    assert "Read-only file system" in done.stdout
    assert not (tmp_path / "consumed.rank-0000.rlw").exists()


def test_a_receiver_reads_a_full_disk(tmp_path: Path) -> None:
    d = str(tmp_path)
    sender = (
        "import anyio, rlwire, sys\n"
        "from rlwire.testing import make_batch\n"
        "async def main():\n"
        "    async with rlwire.open_sender(sys.argv[1]) as s:\n"
        "        for step in range(3):\n"
        "            await s.send(make_batch(1, seed=step))\n"
        "anyio.run(main)\n"
    )
    done = namespaced(
        f"mount -t tmpfs -o size=1m tmpfs {d}; "
        f"{sys.executable} -c '{sender}' {d}; "
        f"exec {sys.executable} -c '{RECEIVE}' {d} 3 fill"
    )
    assert done.returncode == 0, done.stderr
    assert "No space left on device" in done.stdout
