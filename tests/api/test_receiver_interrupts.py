"""Ctrl-C (a ``KeyboardInterrupt`` raised by a signal handler between two bytecodes)
landing anywhere in a blocking receive never leaves the receiver stuck."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A child process interrupts its own receives at random moments, many thousand times,
# and says "stuck" if one receive (timeout=0: it never waits) has not returned after
# 3 s. Only interrupts inside rlwire's code are raised, as only those can leave its
# state half-changed.
_CHILD = textwrap.dedent(
    """
    import os, random, signal, sys, tempfile, threading, time
    import rlwire

    package = os.path.dirname(rlwire.__file__)

    class Interrupt(KeyboardInterrupt):
        pass

    def handler(signum, frame):
        while frame is not None:
            if frame.f_code.co_filename.startswith(package):
                raise Interrupt()
            frame = frame.f_back

    signal.signal(signal.SIGALRM, handler)
    rng = random.Random(int(sys.argv[1]))
    last = [time.monotonic()]

    def watchdog():
        while True:
            time.sleep(0.2)
            if time.monotonic() - last[0] > 3:
                print("stuck", flush=True)
                os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    interrupted, end = 0, time.monotonic() + float(sys.argv[2])
    with rlwire.open_receiver(tempfile.mkdtemp()) as receiver:
        while time.monotonic() < end:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0, 0.0005))
            try:
                try:
                    receiver.receive(timeout=0)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupt:
                interrupted += 1
            except rlwire.ReceiveTimeout:
                pass
            last[0] = time.monotonic()
    print("interrupted", interrupted, flush=True)
    """
)


@pytest.mark.skipif(os.name != "posix", reason="needs SIGALRM")
def test_interrupts_anywhere_in_a_receive_never_leave_its_lock_held() -> None:
    """The receiver's lock used to be taken before the block that releases it began: an
    interrupt between the two left it held, and every later receive (and close) waited
    for it for ever. Before the fix this child was stuck within a second or two."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "7", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    interrupted = int(done.stdout.split()[-1])
    assert interrupted > 200, done.stdout  # it did interrupt receives, many times
