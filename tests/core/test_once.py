"""Once: single-flight lazy initialisation, with real threads and real cancellation."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest

from rlwire.aio import Once


class Factory:
    """Counts its runs; each run blocks until released, then returns or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail = fail

    def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        assert self.release.wait(10)
        if self.fail:
            raise OSError(f"run {self.calls} failed")
        return f"value {self.calls}"


def test_concurrent_callers_share_one_run() -> None:
    factory = Factory()
    once = Once(factory)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(once.get) for _ in range(8)]
        assert factory.started.wait(5)
        time.sleep(0.05)  # let the other seven reach the wait
        assert not once.done
        factory.release.set()
        assert [f.result(5) for f in futures] == ["value 1"] * 8
    assert factory.calls == 1
    assert once.done
    assert once.get() == "value 1"
    assert factory.calls == 1


def test_failure_reaches_every_waiting_caller_and_a_later_call_retries() -> None:
    factory = Factory(fail=True)
    once = Once(factory)
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(once.get) for _ in range(5)]
        assert factory.started.wait(5)
        time.sleep(0.05)
        factory.release.set()
        errors = [f.exception(5) for f in futures]
    assert factory.calls == 1
    assert all(isinstance(e, OSError) and str(e) == "run 1 failed" for e in errors)
    assert not once.done
    factory.fail = False
    assert once.get() == "value 2"  # the failure was not cached
    assert factory.calls == 2


def test_a_factory_may_return_none() -> None:
    calls: list[int] = []
    once: Once[None] = Once(lambda: calls.append(1))
    assert once.get() is None
    assert once.get() is None
    assert calls == [1] and once.done


@pytest.mark.anyio
async def test_cancelled_async_caller_leaves_the_run_to_the_others() -> None:
    factory = Factory()
    once = Once(factory)
    results: list[str] = []
    scopes: list[anyio.CancelScope] = []

    async def wait_for_it() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            results.append(await once.aget())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_it)  # this caller starts the run...
        await anyio.to_thread.run_sync(factory.started.wait, 5)
        for _ in range(3):
            tg.start_soon(wait_for_it)
        await anyio.sleep(0.05)
        scopes[0].cancel()  # ...and is cancelled while it runs
        await anyio.sleep(0.05)
        assert scopes[0].cancelled_caught
        factory.release.set()
    assert factory.calls == 1
    assert results == ["value 1"] * 3


@pytest.mark.anyio
async def test_cancelled_first_caller_does_not_cancel_the_run() -> None:
    factory = Factory()
    once = Once(factory)

    with anyio.move_on_after(0.05) as scope:
        await once.aget()  # starts the run, then gives up waiting
    assert scope.cancelled_caught
    assert factory.started.is_set() and not once.done
    factory.release.set()
    # A later caller joins the same run (still one call) and gets its result.
    assert await once.aget() == "value 1"
    assert factory.calls == 1


@pytest.mark.anyio
async def test_async_callers_all_see_the_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    factory = Factory(fail=True)
    once = Once(factory)
    errors: list[BaseException] = []
    # Each caller's thread is seen entering get(): a fixed pause alone let a caller that
    # a loaded machine scheduled late arrive after the failed run, and start another.
    entered = threading.Semaphore(0)
    get = Once.get

    def counted(self: Once[str]) -> str:
        entered.release()
        return get(self)

    monkeypatch.setattr(Once, "get", counted)

    async def wait_for_it() -> None:
        try:
            await once.aget()
        except OSError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(wait_for_it)
        for _ in range(4):
            assert await anyio.to_thread.run_sync(entered.acquire, True, 5)
        await anyio.to_thread.run_sync(factory.started.wait, 5)
        await anyio.sleep(0.05)  # from get() to the wait for the run: a few bytecodes
        factory.release.set()
    assert factory.calls == 1
    assert len(errors) == 4 and {str(e) for e in errors} == {"run 1 failed"}
