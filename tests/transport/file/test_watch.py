"""Directory receivers woken by inotify: real files, written by senders in other threads
and processes, read by receivers whose poll interval (5 s) is far longer than any wait
these tests allow, so that only a wake-up can pass them."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import forked
import numpy as np
import pytest

import rlwire
from rlwire.transport import FileSource
from rlwire.transport._file.watch import DirectoryWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux")

#: The receivers' poll interval: what a test would wait without a wake-up.
POLL = 5.0
#: The longest a woken receiver may take, on a loaded 2-CPU machine.
WOKEN = 1.5

PRODUCER = textwrap.dedent("""
    import sys, time, anyio, rlwire
    path, parts, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    async def main():
        async with rlwire.open_sender(path) as sender:
            async with sender.open_step() as writer:
                for i in range(parts):
                    await anyio.sleep(pause)
                    await writer.put([{"t": time.monotonic_ns()}], key=i)
                await anyio.sleep(pause)
            await anyio.sleep(pause)  # then the seal; then, after a pause, the end mark
            await sender.finish()
    anyio.run(main)
""")


def inotify_fds() -> int:
    """How many inotify instances this process holds open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir used, closed since
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


@pytest.fixture
def later() -> Iterator[Any]:
    """``later(seconds, fn)`` runs ``fn`` in a thread after ``seconds``; joined after."""
    threads: list[threading.Thread] = []

    def start(seconds: float, fn: Any) -> None:
        thread = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
        thread.start()
        threads.append(thread)

    yield start
    for thread in threads:
        thread.join()


def send_one(path: Path, step: int = 0) -> None:
    with rlwire.open_sync_sender(path, start_step=step, on_existing="resume") as sender:
        sender.send([{"step": step}])


def test_a_waiting_receiver_is_woken_by_a_step_from_another_thread(
    tmp_path: Path, later: Any
) -> None:
    send_one(tmp_path, 0)
    with rlwire.open_receiver(tmp_path, type=Any, poll_interval=POLL) as receiver:
        assert receiver.receive(timeout=10) == [{"step": 0}]
        later(0.3, lambda: send_one(tmp_path, 1))
        started = time.monotonic()
        assert receiver.receive(timeout=10) == [{"step": 1}]
        assert time.monotonic() - started < WOKEN
        assert isinstance(receiver._source, FileSource) and receiver._source.watch.watching


@pytest.mark.anyio
async def test_parts_seal_and_end_wake_an_async_receiver_across_processes(
    tmp_path: Path,
) -> None:
    """A producer process puts a part every 0.3 s; each reaches the waiting receiver
    (``aparts``) well within a poll interval, and so do the seal and the end mark."""
    parts, pause = 4, 0.3
    producer = forked.Popen(
        [sys.executable, "-c", PRODUCER, str(tmp_path), str(parts), str(pause)],
        stderr=subprocess.PIPE,
    )
    try:
        with rlwire.open_receiver(tmp_path, type=Any, poll_interval=POLL) as receiver:
            with anyio.fail_after(30):
                got = []
                async for part in receiver.aparts():
                    got.append(part.key)
                    late = (time.monotonic_ns() - part.value[0]["t"]) / 1e9
                    assert late < WOKEN, f"part {part.key} came {late:.3f} s after its put"
                    last = time.monotonic()
                assert got == list(range(parts))
                assert time.monotonic() - last < pause + WOKEN  # the seal ended the loop
                with pytest.raises(rlwire.EndOfStream):
                    await receiver.areceive()
                assert time.monotonic() - last < 2 * pause + WOKEN
        _, err = producer.communicate(timeout=30)
        assert producer.returncode == 0, err.decode()
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.communicate()


def test_forced_polling_uses_no_inotify_and_still_receives(tmp_path: Path, later: Any) -> None:
    before = inotify_fds()
    with rlwire.open_receiver(
        tmp_path, type=Any, poll_interval=0.05, storage_options={"watch": False}
    ) as receiver:
        later(0.2, lambda: send_one(tmp_path, 0))
        assert receiver.receive(timeout=10) == [{"step": 0}]
        assert isinstance(receiver._source, FileSource)
        assert not receiver._source.watch.watching
        assert inotify_fds() == before


def test_forced_polling_waits_for_the_poll(tmp_path: Path, later: Any) -> None:
    """The fallback is the poll: a receiver that may not watch, with a 1 s poll
    interval, takes most of a second to see a step sent right after it started waiting."""
    source = FileSource(tmp_path, poll_interval=1.0, watch=False)
    later(0.05, lambda: send_one(tmp_path, 0))
    started = time.monotonic()
    while source.read(0) is None:
        source.wait(None)
    assert time.monotonic() - started > 0.5
    source.close()


def test_close_releases_the_inotify_descriptor(tmp_path: Path) -> None:
    before = inotify_fds()
    receiver = rlwire.open_receiver(tmp_path, type=Any, poll_interval=POLL)
    assert inotify_fds() == before  # made on the first wait, not at open
    with pytest.raises(rlwire.ReceiveTimeout):
        receiver.receive(timeout=0.1)
    assert inotify_fds() == before + 1
    receiver.close()
    assert inotify_fds() == before


def test_close_from_another_thread_while_a_wait_holds_the_descriptor(tmp_path: Path) -> None:
    """The waiter releases the descriptor as it returns, not later: no other thread
    closes it under a poll() that uses it."""
    watch = DirectoryWatch(tmp_path)
    watch.wait(POLL)  # sets the watch up
    before = inotify_fds()
    waiter = threading.Thread(target=watch.wait, args=(0.5,))
    waiter.start()
    time.sleep(0.1)
    watch.close()
    waiter.join()
    assert inotify_fds() == before - 1
    assert not watch.watching


def test_a_forgotten_source_releases_its_descriptor(tmp_path: Path) -> None:
    before = inotify_fds()
    source = FileSource(tmp_path)
    source.wait(POLL)
    assert inotify_fds() == before + 1
    del source
    assert inotify_fds() == before


def test_receivers_forgotten_on_a_recycling_tmpfs_release_their_descriptors_at_once(
    shm_dir: Path,
) -> None:
    """On tmpfs a source keeps mappings of the files it read, for when they come back
    recycled; those held the source in a reference cycle, so a receiver dropped without
    close() kept its inotify descriptor and its kept files' descriptors until the
    cyclic collector ran: a trainer that opens a receiver for each step and forgets it
    piled up inotify instances (128 a user by default) and deleted files' memory."""
    descriptors = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    with rlwire.open_sync_sender(shm_dir, keep_last=1, storage_options={"recycle": True}) as sender:
        gc.disable()  # what a collection would free hides nothing then
        try:
            for step in range(12):
                if step == 4:  # the sender's own kept files settled
                    before, inotify_before = descriptors(), inotify_fds()
                receiver = rlwire.open_receiver(
                    shm_dir, type=Any, start_step=step, poll_interval=POLL
                )
                sender.send({"x": np.arange(4) + step})
                assert receiver.receive(timeout=WOKEN)["x"][0] == step
                with pytest.raises(rlwire.ReceiveTimeout):
                    receiver.receive(timeout=0.01)  # sets its watch up
                del receiver
            assert inotify_fds() == inotify_before
            assert descriptors() <= before + 1
        finally:
            gc.enable()


@pytest.mark.anyio
async def test_an_async_wait_is_cancelled_at_once_and_leaves_the_watch_usable(
    tmp_path: Path,
) -> None:
    source = FileSource(tmp_path, poll_interval=POLL)
    try:
        await source.await_message(None)  # sets the watch up
        started = time.monotonic()
        with anyio.move_on_after(0.1):
            await source.await_message(None)
        assert time.monotonic() - started < WOKEN
        assert source.watch.watching

        async def send_soon() -> None:
            await anyio.sleep(0.2)
            await anyio.to_thread.run_sync(send_one, tmp_path, 0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_soon)
            started = time.monotonic()
            while source.read(0) is None:
                await source.await_message(None)
            assert time.monotonic() - started < WOKEN
    finally:
        source.close()


def test_two_waiters_one_watch(tmp_path: Path, later: Any) -> None:
    """A second waiter meanwhile sleeps its poll interval rather than share the
    descriptor; the first is woken."""
    watch = DirectoryWatch(tmp_path)
    watch.wait(POLL)
    took: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        watch.wait(2.0)
        took.append(time.monotonic() - started)

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    later(0.2, lambda: (tmp_path / "step-00000000.rank-0000.rlw").write_bytes(b"x"))
    for thread in threads:
        thread.join()
    assert sorted(took)[0] < WOKEN and sorted(took)[1] >= 1.95
    watch.close()


def test_temporary_names_do_not_wake(tmp_path: Path, later: Any) -> None:
    watch = DirectoryWatch(tmp_path)
    watch.wait(POLL)
    later(0.1, lambda: (tmp_path / ".step-00000000.rank-0000.rlw.00ff.tmp").write_bytes(b"x"))
    later(0.6, lambda: os.link(tmp_path / ".step-00000000.rank-0000.rlw.00ff.tmp",
                               tmp_path / "step-00000000.rank-0000.rlw"))  # fmt: skip
    started = time.monotonic()
    watch.wait(POLL)
    assert 0.55 < time.monotonic() - started < 0.6 + WOKEN
    watch.close()


def test_another_ranks_consumption_marks_do_not_wake_a_source(tmp_path: Path, later: Any) -> None:
    """A rank's receiver moving its marks (one per part) wakes no other rank's receiver;
    the step that appears after them does."""
    source = FileSource(tmp_path, poll_interval=POLL)
    source.wait(POLL)  # sets the watch up
    later(0.1, lambda: (tmp_path / "consumed.rank-0001.rlw").write_bytes(b"x"))
    later(0.2, lambda: (tmp_path / "consumed.rank-0001.part.rlw").write_bytes(b"x"))
    later(0.6, lambda: send_one(tmp_path, 0))
    started = time.monotonic()
    source.wait(POLL)
    assert 0.55 < time.monotonic() - started < 0.6 + WOKEN
    source.close()


def test_a_directory_made_later_is_polled_then_watched(tmp_path: Path, later: Any) -> None:
    """No directory yet: the receiver polls; once the sender made it, a wait sets the
    watch up (at most a second after the last attempt)."""
    path = tmp_path / "run"
    with rlwire.open_receiver(path, type=Any, poll_interval=0.05) as receiver:
        later(0.2, lambda: send_one(path, 0))
        assert receiver.receive(timeout=10) == [{"step": 0}]
        source = receiver._source
        assert isinstance(source, FileSource)
        deadline = time.monotonic() + 5
        while not source.watch.watching and time.monotonic() < deadline:
            source.wait(None)
        assert source.watch.watching


def test_a_removed_directory_wakes_and_is_watched_again(tmp_path: Path, later: Any) -> None:
    path = tmp_path / "run"
    path.mkdir()
    watch = DirectoryWatch(path)
    watch.wait(POLL)
    later(0.1, lambda: shutil.rmtree(path))
    started = time.monotonic()
    watch.wait(POLL)
    assert time.monotonic() - started < WOKEN
    assert not watch.watching
    path.mkdir()
    time.sleep(1.0)  # the retry delay after the last attempt
    watch.wait(POLL)  # sets the watch up again: returns at once
    assert watch.watching
    later(0.1, lambda: (path / "end.rlw").write_bytes(b"x"))
    started = time.monotonic()
    watch.wait(POLL)
    assert time.monotonic() - started < WOKEN
    watch.close()


def test_the_storage_option_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(rlwire.ConfigError, match="'watch' must be True or False"):
        rlwire.open_receiver(tmp_path, storage_options={"watch": "no"})


FORKED = textwrap.dedent("""
    import os, sys, threading, time
    from pathlib import Path
    from rlwire.transport._file.watch import DirectoryWatch

    def inotify_fds():
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
            except OSError:
                pass
        return count

    root = Path(sys.argv[1])
    watch = DirectoryWatch(root)
    watch.wait(5)
    assert watch.watching and inotify_fds() == 1
    pid = os.fork()
    if pid == 0:
        try:
            assert not watch.watching  # the parent's, not the child's
            watch.wait(5)  # drops the inherited descriptor, sets up its own
            assert watch.watching and inotify_fds() == 1
            (root / "child-ready").write_bytes(b"")
            watch.wait(5)  # woken by its own file
            started = time.monotonic()
            watch.wait(5)
            assert time.monotonic() - started < 1.5, "the child was not woken"
            watch.close()
            assert inotify_fds() == 0
        except BaseException:
            import traceback; traceback.print_exc(); os._exit(1)
        os._exit(0)
    # The parent's queue holds the child's "child-ready": the child does not read it.
    deadline = time.monotonic() + 30
    while not (root / "child-ready").exists():
        done, status = os.waitpid(pid, os.WNOHANG)
        assert not done and time.monotonic() < deadline, "the child failed or hung"
        time.sleep(0.01)
    started = time.monotonic()
    watch.wait(5)
    assert time.monotonic() - started < 1.5, "the child took the parent's event"
    time.sleep(0.2)
    (root / "step-00000000.rank-0000.rlw").write_bytes(b"x")  # wakes both
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        assert time.monotonic() < deadline, "the child hung"
        time.sleep(0.01)
    status = done[1]
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
    watch.close()
    assert inotify_fds() == 0
""")


def test_a_forked_child_sets_up_its_own_watch(tmp_path: Path) -> None:
    done = forked.run(
        [sys.executable, "-c", FORKED, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
