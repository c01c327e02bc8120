"""Several tasks using one receiver at once: a take under way holds the receiver's mutex
between its trips to worker threads, and the others wait for it without keeping the
limiter's tokens from it. Each scenario runs in a child process, so that a deadlock is
a timeout here, not a hung test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import forked
import pytest

CHILD = textwrap.dedent(
    """
    import sys
    from typing import Any

    import anyio
    import numpy as np

    import rlwire

    path, backend, limiter = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # Many small rows: decoding the step takes several trips to worker threads.
    rows = [{"token_ids": np.arange(i % 50 + 1), "x": [1, 2, 3]} for i in range(20_000)]
    with rlwire.open_sync_sender(path) as sender:
        sender.send({"samples": rows})
        sender.send({"samples": rows[:10]})

    async def main() -> None:
        receiver = rlwire.open_receiver(path, type=Any, limiter=limiter)
        manifest = receiver.manifest(0)
        got: list[object] = []

        async def take() -> None:
            got.append(len((await receiver.areceive(timeout=10))["samples"]))

        async def rows_of_step_0() -> None:
            await anyio.sleep(0.005)  # the take holds the mutex by now
            got.append(len(await receiver.aread_rows(manifest, "token_ids", 0, 10)))

        async def look() -> None:
            await anyio.sleep(0.005)
            got.append(await receiver.await_next(timeout=10))

        async def close() -> None:
            await anyio.sleep(0.01)
            await receiver.aclose()

        async with anyio.create_task_group() as tg:
            for task in (take, rows_of_step_0, rows_of_step_0, look):
                tg.start_soon(task)
        assert sorted(map(str, got)) == ["10", "10", "20000", "True"], got
        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            tg.start_soon(close)
        assert got[-1] == 10, got
        print("ok")

    anyio.run(main, backend=backend)
    """
)


def _child(script: str, *args: str) -> list[str]:
    """What ``script`` (run in a child process with ``args``) printed; a deadlock is a
    failed test after 60 s, not a hung run."""
    try:
        done = forked.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the tasks sharing the receiver deadlocked")
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("limiter", [1, 2])
def test_tasks_waiting_for_a_take_under_way_do_not_starve_it(
    tmp_path: Path, backend: str, limiter: int
) -> None:
    """Two ``aread_rows`` and an ``await_next`` started while an ``areceive`` decoded a
    large step waited for its mutex in worker threads, holding the receiver's limiter
    tokens (two by default): the take never got one for its next trip, and the process
    hung for good; ``aclose`` beside a take did the same with ``limiter=1``."""
    assert _child(CHILD, str(tmp_path / "run"), backend, str(limiter)) == ["ok"]


SKIP_CHILD = textwrap.dedent(
    """
    import sys

    import anyio
    import numpy as np

    import rlwire

    path, backend = sys.argv[1], sys.argv[2]
    rows = [{"token_ids": np.arange(i % 50 + 1)} for i in range(20_000)]
    with rlwire.open_sync_sender(path) as sender:
        sender.send({"samples": rows})

    async def main() -> None:
        receiver = rlwire.open_receiver(path, type=dict)
        got: list[int] = []

        async def take() -> None:
            got.append(len((await receiver.areceive(timeout=10))["samples"]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            while not receiver._mutex.locked():  # the take is under way
                await anyio.sleep(0)
            try:
                receiver.skip()
            except rlwire.ConfigError as exc:
                assert "under way" in str(exc), exc
                print("refused")
        assert got == [20_000] and receiver.next_step == 1, (got, receiver.next_step)
        assert receiver.skip() == 1  # with nothing under way, it skips at once
        await receiver.aclose()
        print("ok")

    anyio.run(main, backend=backend)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_skip_on_the_loop_beside_a_take_under_way_is_refused_not_a_deadlock(
    tmp_path: Path, backend: str
) -> None:
    """``skip()`` (sync) called in a task while another task's ``areceive`` holds the
    receiver's mutex waited for it on the event loop thread, which the take needs to
    go on: the process hung. It raises ConfigError instead, and the take completes."""
    assert _child(SKIP_CHILD, str(tmp_path / "run"), backend) == ["refused", "ok"]
