"""Two live receivers of one rank, in the ``ranks`` pattern, in processes of their own: a
second trainer started with the same rank, or a restarted one whose old process lives on
(hung, here stopped with SIGSTOP). The newest receiver of a rank gets the rank's steps
from then on; the one it replaced is told (``ConfigError`` naming the rank), never left
waiting, and never gets a step again. Together they get every step of the rank exactly
once, each in order (docs/reliability.md, "ZeroMQ reconnects").

The sender runs in the test process, under asyncio and trio; each receiver runs under the
same backend in a child process, and prints one JSON line per outcome; raw DEALER sockets
play receivers that announce themselves again after a refusal (as rlwire's did before).
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import forked
import pytest
import zmq
from helpers import make_batch

import rlwire
from rlwire.transport.zmq._control import bye_packet, ready_packet
from rlwire.transport.zmq._ranks import taken_over

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).resolve().parents[2]  # helpers.py lives there
#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 15.0

# A receiver of ``rank``: one line per step (checked against its payload) or error, until
# the end of the stream; told it lost its rank (ConfigError), it receives once more, to
# show that the next receive says so again at once, and stops.
RECEIVER = textwrap.dedent("""
    import json, sys, time
    spec = json.loads(sys.argv[1])
    sys.path.insert(0, spec["tests"])
    import anyio, rlwire
    from helpers import assert_batches_equal, make_batch

    def emit(**event):
        print(json.dumps(event), flush=True)

    async def main():
        with rlwire.open_receiver(
            spec["url"], rank=spec["rank"], start_step=spec["start_step"]
        ) as receiver:
            emit(event="opened")
            while True:
                try:
                    batch = await receiver.areceive(timeout=spec["timeout"])
                except rlwire.EndOfStream:
                    emit(event="end")
                    return
                except rlwire.ConfigError as exc:
                    emit(error="ConfigError", message=str(exc), rank=exc.rank)
                    started = time.monotonic()
                    try:
                        await receiver.areceive(timeout=spec["timeout"])
                    except rlwire.RlwireError as again:
                        took = time.monotonic() - started
                        emit(error=type(again).__name__, message=str(again), took=took)
                    return
                except rlwire.RlwireError as exc:
                    emit(error=type(exc).__name__, message=str(exc))
                else:
                    assert_batches_equal(batch, make_batch(2, 16, seed=receiver.last_step))
                    emit(step=receiver.last_step)

    anyio.run(main, backend=spec["backend"])
""")

Event = dict[str, Any]


class Receiver:
    """A receiver in a child process; its lines arrive as :attr:`events`."""

    def __init__(self, url: str, *, backend: str, rank: int = 0, start_step: int = 0) -> None:
        spec = {
            "tests": str(TESTS),
            "url": url,
            "rank": rank,
            "start_step": start_step,
            "timeout": LONG,
            "backend": backend,
        }
        self.proc = forked.Popen(
            [sys.executable, "-c", RECEIVER, json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: list[Event] = []
        self._queue: queue.Queue[Event | None] = queue.Queue()
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, stream: Any, stdout: bool) -> None:
        for line in stream:
            if stdout:
                self._queue.put(json.loads(line))
            else:
                self._stderr.append(line)
        if stdout:
            self._queue.put(None)

    async def until(self, wanted: Any, timeout: float = LONG) -> list[Event]:
        """Every event so far, once one satisfies ``wanted`` (failing the test if none
        comes within ``timeout`` seconds, or the child exits first)."""

        deadline = time.monotonic() + timeout

        def wait() -> list[Event]:
            while not any(wanted(e) for e in self.events):
                try:
                    event = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise AssertionError(f"waited {timeout} s: {self.describe()}") from None
                if event is None:
                    self._queue.put(None)
                    raise AssertionError(f"no more events: {self.describe()}")
                self.events.append(event)
            return list(self.events)

        return await anyio.to_thread.run_sync(wait)

    def describe(self) -> str:
        self.proc.poll()
        return f"events {self.events}, rc={self.proc.returncode}, stderr:\n" + "".join(self._stderr)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(LONG)
        for thread in self._threads:
            thread.join(LONG)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def payload(step: int) -> rlwire.TrainingBatch:
    """What :data:`RECEIVER` expects for ``step``."""
    return make_batch(2, 16, seed=step)


def steps_of(events: list[Event]) -> list[int]:
    return [e["step"] for e in events if "step" in e]


def is_step(step: int) -> Any:
    return lambda event: event.get("step") == step


def told_twice(event: Event) -> bool:
    """The replaced receiver's second receive after it was told, which ends it."""
    return "took" in event


def ended(event: Event) -> bool:
    return event.get("event") == "end"


def check_replaced(events: list[Event]) -> list[int]:
    """The steps the replaced receiver got: in order, one after another, then the
    ConfigError naming its rank and what took it, then the same error at once again;
    nothing else. Returns the steps."""
    steps = steps_of(events)
    assert steps == list(range(steps[0], steps[0] + len(steps))) if steps else True, events
    tail = events[len(steps) + 1 :]  # after "opened" and the steps
    assert [e.get("error") for e in tail] == ["ConfigError", "ConfigError"], events
    first, again = tail
    assert first["rank"] == 0, first
    for words in ("rank 0", "another receiver of rank 0", "gets no more"):
        assert words in first["message"], first
    assert again["message"] == first["message"]
    assert again["took"] < 0.5, again  # no wait: it knows
    return steps


def check_newest(events: list[Event], *, first_expected: int) -> list[int]:
    """The steps the newest receiver got: in order, one after another, with one
    StepGapError before the first if it is not ``first_expected`` (the steps before went
    to the receiver it replaced), then the end. Returns the steps."""
    steps = steps_of(events)
    errors = [e for e in events if "error" in e]
    assert steps == list(range(steps[0], steps[0] + len(steps))), events
    if steps[0] == first_expected:
        assert errors == [], events
    else:
        assert [e["error"] for e in errors] == ["StepGapError"], events
        assert events.index(errors[0]) < events.index({"step": steps[0]}), events
    assert ended(events[-1]), events
    return steps


async def send_for(sender: Any, steps: range, seconds: float) -> None:
    """Send ``steps``, spread over ``seconds``: longer than a receiver left without news
    takes to announce itself again (1 s), which once took the rank back."""
    for step in steps:
        with anyio.fail_after(LONG):
            await sender.send(payload(step), step=step)
        await anyio.sleep(seconds / len(steps))


async def test_a_second_live_receiver_of_a_rank_takes_it_over_and_the_first_is_told(
    anyio_backend_name: str,
) -> None:
    """Two trainers of rank 0 at once: the one that announced itself last gets every
    later step; the first one gets the steps sent before, then ConfigError, at once on
    every later receive. Before, each took the rank back when it had heard nothing for a
    second, and each silently got only some of the rank's steps."""
    options = {"linger": 5}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        url = sender.sink.url
        with Receiver(url, backend=anyio_backend_name) as first:
            await sender.send(payload(0), step=0)
            await first.until(is_step(0))
            with Receiver(url, backend=anyio_backend_name) as second:
                await second.until(lambda e: e.get("event") == "opened")
                await send_for(sender, range(1, 31), 2.0)
                await first.until(told_twice)
                await sender.finish()
                await second.until(ended)
                mine = check_replaced(first.events)
                theirs = check_newest(second.events, first_expected=0)
    assert mine + theirs == list(range(31)), (first.events, second.events)


async def test_a_restart_gets_in_while_the_old_process_hangs_and_the_old_one_is_told(
    anyio_backend_name: str,
) -> None:
    """A trainer restarted while its old process hangs (stopped: its connection stays
    up): the restarted receiver gets every later step. Woken, the old process reads what
    was queued for it before the restart, then ConfigError; never a later step."""
    options = {"linger": 5}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        url = sender.sink.url
        with Receiver(url, backend=anyio_backend_name) as old:
            for step in range(3):
                await sender.send(payload(step), step=step)
            await old.until(is_step(2))
            old.proc.send_signal(signal.SIGSTOP)
            await send_for(sender, range(3, 5), 0.1)  # queued at the hung process
            with Receiver(url, backend=anyio_backend_name, start_step=3) as new:
                await new.until(lambda e: e.get("event") == "opened")
                await send_for(sender, range(5, 15), 0.5)
                old.proc.send_signal(signal.SIGCONT)
                await send_for(sender, range(15, 35), 2.0)
                await old.until(told_twice)
                await sender.finish()
                await new.until(ended)
                mine = check_replaced(old.events)
                theirs = check_newest(new.events, first_expected=3)
    assert mine + theirs == list(range(35)), (old.events, new.events)


def arrived(sock: zmq.Socket[bytes], quiet: float = 0.3) -> list[bytes]:
    """The kinds of the packets that reach ``sock`` until none comes for ``quiet``
    seconds: ``b"data"`` for a data packet, else the packet's first part (with the
    body of a ``refuse``)."""
    kinds = []
    while sock.poll(int(quiet * 1000)):
        parts = sock.recv_multipart()
        if parts[0].startswith(b"RLWZ"):
            kinds.append(b"data")
        else:
            kinds.append(b" ".join(parts) if parts[0] == b"refuse" else parts[0])
    return kinds


async def read_by(sender: Any, condition: Any) -> None:
    """Wait until ``sender`` has read what its receivers sent it, as its next send would,
    and ``condition()`` holds. A packet a raw socket sends reaches the sender's socket
    through two ZeroMQ I/O threads: a fixed pause before the next send (0.3 s) was a bet
    that a loaded machine could lose, the packet then read only after the step went."""
    peers = sender.sink._peers
    with anyio.fail_after(LONG):
        while True:
            peers.drain()
            if condition():
                return
            await anyio.sleep(0.005)


async def test_a_replaced_receiver_announcing_itself_again_is_refused_for_good(
    tmp_path: Path,
) -> None:
    """A replaced receiver that announces itself again, as rlwire's did a second after
    a refusal, is refused each time: it never takes its rank back, not even once the
    receiver that replaced it left; the sender, waiting for rank 0 then, says that no
    receiver of it announced itself."""
    url = f"zmq+ipc://{tmp_path}/sock"
    refused = b"refuse " + taken_over(0).encode()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    old, new = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    try:
        options = {"ready_timeout": 1.0, "linger": 1}
        async with rlwire.open_sender(url, storage_options=options) as sender:
            for sock in (old, new):
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(url.removeprefix("zmq+"))
            old.send_multipart(ready_packet(0))
            await sender.send(payload(0), step=0)
            assert arrived(old) == [b"data", b"seal"]
            new.send_multipart(ready_packet(0))
            # Read, it takes the rank: the sender tells the old receiver at once.
            await read_by(sender, lambda: old.poll(0))
            await sender.send(payload(1), step=1)
            assert arrived(new) == [b"data", b"seal"]
            assert arrived(old) == [refused]
            old.send_multipart(ready_packet(0))
            await read_by(sender, lambda: old.poll(0))  # read, and answered
            await sender.send(payload(2), step=2)
            assert arrived(new) == [b"data", b"seal"]
            assert arrived(old) == [refused]
            new.send_multipart(bye_packet())
            old.send_multipart(ready_packet(0))
            peers = sender.sink._peers
            await read_by(sender, lambda: old.poll(0) and peers._owners.owner(0) is None)
            words = r"no receiver of rank 0 announced itself within ready_timeout=1.0 s$"
            with pytest.raises(rlwire.TransportError, match=words):
                await sender.send(payload(3), step=3)
            assert arrived(old) == [refused]
    finally:
        old.close()
        new.close()
        context.term()


async def test_a_takeover_midway_through_a_message_gives_it_up_and_says_so(
    tmp_path: Path,
) -> None:
    """A receiver whose queue is full holds up a message of many data packets; a newer
    receiver of its rank announces itself meanwhile. The send gives the message up (the
    old receiver never gets it whole) and says that the rank was taken over; the step
    sent again goes to the newer receiver, whole."""
    url = f"zmq+ipc://{tmp_path}/sock"
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    old, new = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    big = make_batch(2, 400_000, seed=0)  # some tens of MB: more than the socket buffers
    try:
        options = {"hwm": 1, "message_bytes": 1 << 20, "linger": 1}
        async with rlwire.open_sender(url, storage_options=options) as sender:
            for sock in (old, new):
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, 1)
                sock.connect(url.removeprefix("zmq+"))
            old.send_multipart(ready_packet(0))
            failed: list[rlwire.TransportError] = []

            async def send() -> None:
                try:
                    await sender.send(big)
                except rlwire.TransportError as exc:
                    failed.append(exc)

            with anyio.fail_after(LONG):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send)
                    await anyio.sleep(0.5)  # the sender waits for room at the old one
                    new.send_multipart(ready_packet(0))
            words = "another receiver of rank 0 took the rank over midway through the message"
            assert len(failed) == 1 and words in str(failed[0]), failed
            assert sender.next_step == 0

            async def send_again() -> None:
                # The step may start towards `new` before the receiver's announcement is
                # read (a loaded machine): that send is given up as above, and the step
                # sent again goes to the receiver, as the error says.
                for _ in range(3):
                    try:
                        await sender.send(big)
                        return
                    except rlwire.TransportError as exc:
                        if words not in str(exc):
                            raise

            with rlwire.open_receiver(url) as receiver:  # announces itself last: it wins
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_again)
                    got = await receiver.areceive(timeout=LONG)
            assert receiver.last_step == 0 and got.samples[0].env_name == big.samples[0].env_name
            kinds = arrived(old)
            assert b"seal" not in kinds and kinds.count(b"data") > 1, kinds
    finally:
        old.close()
        new.close()
        context.term()
