"""A sender or receiver awaited from one event loop, then from another (successive
``anyio.run`` calls, under asyncio and trio each way): the thread limiter and lock rlwire
makes serve each loop; a limiter the user gave, bound to another backend, is refused
with a ConfigError rather than anyio's RuntimeError."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from helpers import assert_batches_equal, make_batch

import rlwire

BACKENDS = [("asyncio", "trio"), ("trio", "asyncio"), ("asyncio", "asyncio"), ("trio", "trio")]


@pytest.mark.parametrize(("first", "second"), BACKENDS)
def test_sender_and_receiver_move_to_another_loop(tmp_path: Path, first: str, second: str) -> None:
    batches = [make_batch(2, seed=s) for s in range(4)]
    sender = rlwire.open_sender(tmp_path / "run")
    receiver = rlwire.open_receiver(tmp_path / "run")
    got = []

    async def one(step: int) -> None:
        await sender.send(batches[step])
        got.append(await receiver.areceive(timeout=10))

    anyio.run(one, 0, backend=first)
    anyio.run(one, 1, backend=second)
    anyio.run(one, 2, backend=first)

    async def last() -> None:
        await sender.send(batches[3])
        await sender.finish()
        got.append(await receiver.areceive(timeout=10))
        await sender.aclose()

    anyio.run(last, backend=second)
    receiver.close()
    for batch, want in zip(got, batches, strict=True):
        assert_batches_equal(batch, want)


@pytest.mark.parametrize(("first", "second"), BACKENDS)
def test_sync_receive_between_loops(tmp_path: Path, first: str, second: str) -> None:
    with rlwire.open_sync_sender(tmp_path / "run") as sender:
        for s in range(3):
            sender.send(make_batch(1, seed=s))
    with rlwire.open_receiver(tmp_path / "run", limiter=3) as receiver:
        anyio.run(receiver.areceive, backend=first)
        assert receiver.receive(timeout=5) is not None
        anyio.run(receiver.areceive, backend=second)
        assert receiver.last_step == 2


@pytest.mark.parametrize(("first", "second"), [("asyncio", "trio"), ("trio", "asyncio")])
def test_given_limiter_of_another_backend_is_refused(
    tmp_path: Path, first: str, second: str
) -> None:
    limiter = anyio.CapacityLimiter(2)
    with rlwire.open_sync_sender(tmp_path / "run") as sender:
        for s in range(2):
            sender.send(make_batch(1, seed=s))
    receiver = rlwire.open_receiver(tmp_path / "run", limiter=limiter)
    anyio.run(receiver.areceive, backend=first)
    with pytest.raises(rlwire.ConfigError, match=r"limiter .* another event loop") as caught:
        anyio.run(receiver.areceive, backend=second)
    assert isinstance(caught.value.__cause__, RuntimeError)
    anyio.run(receiver.areceive, backend=first)  # still works on its own backend
    assert receiver.last_step == 1
    receiver.close()

    sender_limiter = anyio.CapacityLimiter(2)
    sender = rlwire.open_sender(tmp_path / "other", limiter=sender_limiter)
    anyio.run(sender.send, make_batch(1), backend=first)
    with pytest.raises(rlwire.ConfigError, match=r"limiter .* another event loop"):
        anyio.run(sender.send, make_batch(1), backend=second)
    anyio.run(sender.aclose, backend=first)
