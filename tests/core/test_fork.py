"""Forked children: the shared executor, Once and a whole send and receive work in a child
forked after the parent used them (fork is what DataLoader workers use, and Linux's
default start method up to Python 3.13).

Each test runs a script in a fresh interpreter that forks with os.fork() or through
multiprocessing's "fork" context; the parent waits for the child with a timeout, so a
child that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fork on Windows")

#: What every script starts with: a child is waited for, at most CHILD_SECONDS.
PRELUDE = textwrap.dedent("""
    import os, sys, threading, time
    CHILD_SECONDS = 30

    def wait_child(pid):
        deadline = time.monotonic() + CHILD_SECONDS
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.exit("the forked child hung")

    def in_child(body):
        pid = os.fork()
        if pid == 0:
            try:
                body()
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        code = wait_child(pid)
        assert code == 0, f"the forked child exited with {code}"
""")

SEND_AND_RECEIVE = textwrap.dedent("""
    import anyio, rlwire
    from rlwire.testing import assert_batches_equal, make_batch

    def round_trip(path, step=0):
        # Big enough that compression and hashing use the shared executor's threads.
        batch = make_batch(4, n=200_000, seed=step)
        with rlwire.open_sync_sender(path, compression="lz4", start_step=step) as sender:
            sender.send(batch)
        with rlwire.open_receiver(path, start_step=step) as receiver:
            assert_batches_equal(receiver.receive(timeout=10), batch)

    async def around_trip(path, step=0):
        batch = make_batch(4, n=200_000, seed=step)
        async with rlwire.open_sender(path, compression="zstd", start_step=step) as sender:
            await sender.send(batch)
        with rlwire.open_receiver(path, start_step=step) as receiver:
            assert_batches_equal(await receiver.areceive(timeout=10), batch)
""")


def run_script(body: str, *args: str) -> str:
    """Run ``body`` after PRELUDE and SEND_AND_RECEIVE in a fresh interpreter; fail with
    its output unless it exits 0. Returns what it printed."""
    code = PRELUDE + SEND_AND_RECEIVE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_forked_child_uses_the_shared_executor_the_parent_used() -> None:
    run_script("""
        from rlwire._core.pools import shared_executor
        assert shared_executor().submit(sum, [1, 2]).result(timeout=5) == 3
        def child():
            assert shared_executor().submit(sum, [3, 4]).result(timeout=5) == 7
        in_child(child)
        assert shared_executor().submit(sum, [5, 6]).result(timeout=5) == 11
    """)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_forked_child_sends_and_receives_after_the_parent_did(
    tmp_path: Path, backend: str
) -> None:
    run_script(
        """
        root, backend = sys.argv[1], sys.argv[2]
        round_trip(root + "/parent")
        anyio.run(around_trip, root + "/parent-async", backend=backend)
        def child():
            round_trip(root + "/child", step=3)
            anyio.run(around_trip, root + "/child-async", 5, backend=backend)
        in_child(child)
        round_trip(root + "/parent-again", step=7)
        """,
        str(tmp_path),
        backend,
    )


def test_a_child_forked_while_a_send_is_in_flight_sends_and_receives(tmp_path: Path) -> None:
    run_script(
        """
        root = sys.argv[1]
        round_trip(root + "/first")
        for attempt in range(5):
            sending = threading.Thread(target=round_trip, args=(f"{root}/busy-{attempt}",))
            sending.start()
            time.sleep(0.01 * attempt)
            in_child(lambda: round_trip(f"{root}/child-{attempt}", step=attempt))
            sending.join(30)
            assert not sending.is_alive()
        """,
        str(tmp_path),
    )


def test_multiprocessing_fork_workers_send_and_receive(tmp_path: Path) -> None:
    run_script(
        """
        import multiprocessing
        root = sys.argv[1]
        if __name__ == "__main__":
            round_trip(root + "/parent")
            context = multiprocessing.get_context("fork")
            workers = [
                context.Process(target=round_trip, args=(f"{root}/worker-{i}", i))
                for i in range(3)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(CHILD_SECONDS)
            hung = [w.pid for w in workers if w.is_alive()]
            for worker in workers:
                worker.kill()
            assert not hung, f"workers {hung} hung"
            assert [w.exitcode for w in workers] == [0, 0, 0]
        """,
        str(tmp_path),
    )


def test_a_child_forked_during_a_once_run_runs_its_own() -> None:
    out = run_script("""
        from rlwire.aio import Once
        started, release = threading.Event(), threading.Event()
        def factory():
            if os.getpid() == parent:
                started.set()
                release.wait(30)
            return os.getpid()
        parent = os.getpid()
        once = Once(factory)
        running = threading.Thread(target=once.get)
        running.start()
        assert started.wait(10)
        def child():
            assert once.get() == os.getpid()
        in_child(child)
        release.set()
        running.join(10)
        assert once.get() == parent
        print("ok")
    """)
    assert out.strip() == "ok"
