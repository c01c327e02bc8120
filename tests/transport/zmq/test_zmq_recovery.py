"""What a ZeroMQ sender and its receivers do when things go wrong while both stay open: a
network blip (a real TCP proxy on loopback, cut and restored), two receivers claiming the
same rank, a cancelled receive, and the handshake refusing what cannot work (patterns
that disagree, an ipc path in use, CURVE keys that do not match).

Sender and receivers run in this process, on real sockets, under asyncio and trio.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq

import rlwire
from chaos.tcpproxy import TcpProxy
from rlwire.testing import assert_batches_equal, make_batch

pytestmark = pytest.mark.anyio

#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 10.0


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def payload(step: int, n: int = 16) -> rlwire.TrainingBatch:
    return make_batch(2, n=n, seed=step)


def port_of(sender: Any) -> int:
    return int(sender.sink.url.rsplit(":", 1)[1])


class Outcomes:
    """What one receiver got, in order: steps (checked against their payload) and errors."""

    def __init__(self) -> None:
        self.events: list[int | str] = []

    def steps(self) -> list[int]:
        return [e for e in self.events if isinstance(e, int)]

    def errors(self) -> list[str]:
        return [e for e in self.events if isinstance(e, str)]

    def check_stream(self) -> None:
        """Steps go up; a step that does not follow on comes right after one StepGapError
        (what was lost); no other error."""
        previous: int | None = None
        gap = False
        for event in self.events:
            if isinstance(event, str):
                assert event.startswith("StepGapError") and not gap, self.events
                gap = True
                continue
            if previous is not None:
                assert event > previous, self.events
                assert event == previous + 1 or gap, self.events
            previous, gap = event, False


@contextlib.asynccontextmanager
async def receiving(
    receiver: Any,
    outcomes: Outcomes,
    *,
    stop_after: int | None = None,
    until_refused: bool = False,
    n: int = 16,
) -> AsyncIterator[anyio.abc.TaskGroup]:
    """Receive in a task until the stream ends (or ``stop_after`` steps came; 0: until
    the first error; ``until_refused``: until a ConfigError, after which every receive
    says so again), checking each step against ``payload(step, n)``. A receive that
    times out ends it too, recorded: nothing here takes ``LONG``, so the stream stalled,
    and receiving on would hang the test."""

    async def run() -> None:
        while not stop_after or len(outcomes.steps()) < stop_after:
            try:
                batch = await receiver.areceive(timeout=LONG)
            except rlwire.EndOfStream:
                return
            except rlwire.RlwireError as exc:
                outcomes.events.append(f"{type(exc).__name__}: {exc}")
                if stop_after == 0 or isinstance(exc, rlwire.ReceiveTimeout):
                    return
                if until_refused and isinstance(exc, rlwire.ConfigError):
                    return
                continue
            assert_batches_equal(batch, payload(receiver.last_step, n=n))
            outcomes.events.append(receiver.last_step)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        yield tg


async def send_retrying(sender: Any, step: int) -> None:
    """Send ``step``, again while its receiver is away (a TransportError, nothing sent)."""
    with anyio.fail_after(LONG):
        while True:
            try:
                await sender.send(payload(step), step=step)
                return
            except rlwire.TransportError:
                await anyio.sleep(0.05)


async def wait_for(condition: Any) -> None:
    with anyio.fail_after(LONG):
        while not condition():
            await anyio.sleep(0.01)


# -- defect 9: a blip keeps the sequence ---------------------------------------------------


@pytest.mark.parametrize("pattern", ["ranks", "shared"])
async def test_a_blip_between_sends_loses_nothing_and_repeats_nothing(pattern: str) -> None:
    """Cut between two sends, the connection comes back and the same sender goes on: the
    receiver gets every step once, with no error (before, the sender restarted its
    sequence at 0 and the receiver discarded 12 fresh steps as StepOrderError)."""
    options = {"pattern": pattern, "linger": 5}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        with TcpProxy(("127.0.0.1", port_of(sender))) as proxy:
            outcomes = Outcomes()
            with rlwire.open_receiver(f"zmq+tcp://{proxy.address}", rank=0) as receiver:
                async with receiving(receiver, outcomes):
                    for step in range(12):
                        await sender.send(payload(step), step=step)
                    await wait_for(lambda: len(outcomes.events) >= 12)
                    proxy.cut()
                    await anyio.sleep(0.3)
                    proxy.restore()
                    for step in range(12, 24):
                        await send_retrying(sender, step)
                    await sender.finish()
    assert outcomes.events == list(range(24))


@pytest.mark.parametrize("pattern", ["ranks", "shared"])
async def test_a_blip_with_messages_in_flight_is_one_gap_then_every_later_step(
    pattern: str,
) -> None:
    """Cut while messages are on their way to a slow receiver: what was lost is one
    StepGapError, then every later step; never an old step as new."""
    options = {"pattern": pattern, "linger": 5, "hwm": 4}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        with TcpProxy(("127.0.0.1", port_of(sender))) as proxy:
            outcomes = Outcomes()
            with rlwire.open_receiver(f"zmq+tcp://{proxy.address}", rank=0) as receiver:
                async with receiving(receiver, outcomes):
                    await sender.send(payload(0), step=0)
                    await wait_for(lambda: outcomes.events)
                    for step in range(1, 40):
                        if step in (10, 25):
                            proxy.cut()
                            await anyio.sleep(0.2)
                            proxy.restore()
                        await send_retrying(sender, step)
                    await wait_for(lambda: 39 in outcomes.steps())
                    await sender.finish()
    outcomes.check_stream()
    assert outcomes.steps()[-1] == 39
    assert not any("StepOrderError" in e for e in outcomes.errors())


async def test_two_receivers_of_one_rank_never_share_its_steps() -> None:
    """Two receivers claim rank 0: the one that announced itself last gets every step
    from then on, in order; the other gets those sent before, then a ConfigError saying
    another receiver took the rank over. Together they get each step once. (Before, each
    took the rank back whenever it had heard nothing for a second, and each silently got
    some of the steps.) Across processes, and a restart whose old process hangs:
    test_zmq_takeover.py.

    Both announce themselves on opening, but the sender reads a ``ready`` only once it
    arrived: one read after the first steps went to the other takes the rank over then,
    and its first receive reports those steps as one StepGapError (they went to the
    other receiver), so each receives on past such an error, until refused."""
    options = {"linger": 5}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        url = sender.sink.url
        first, second = Outcomes(), Outcomes()
        with (
            rlwire.open_receiver(url, rank=0) as a,
            rlwire.open_receiver(url, rank=0) as b,
        ):
            async with (
                receiving(a, first, until_refused=True),
                receiving(b, second, until_refused=True),
            ):
                for step in range(30):
                    await send_retrying(sender, step)
                    await anyio.sleep(0.05)  # 1.5 s: a receiver left out announces itself
                await sender.finish()
    told = first if any(e.startswith("ConfigError") for e in first.errors()) else second
    kept = second if told is first else first
    assert told.errors() == [told.events[-1]] and told.errors()[0].startswith("ConfigError")
    assert "another receiver of rank 0 announced itself after this one" in told.errors()[0]
    kept.check_stream()
    assert told.steps() + kept.steps() == list(range(30)), (first.events, second.events)


# -- defect 10: a cancelled receive keeps its message --------------------------------------


@pytest.mark.parametrize("pattern", ["ranks", "shared"])
async def test_a_cancelled_receive_keeps_the_message_it_took(pattern: str) -> None:
    """A receive cancelled while decoding a message it took off the socket: the next
    receive returns that message (before: lost, silently in the shared pattern, as a
    StepGapError in ranks)."""
    # Tokens: decoding a step takes many slices (15-55 ms here), far more than the 3 ms
    # after which the receive is cancelled; 3,000,000 took 7 s of CPU a test and, beside
    # the rest of the suite, more than LONG to send the steps.
    big = 500_000
    options = {"pattern": pattern, "linger": 5}
    async with rlwire.open_sender(
        "zmq+tcp://127.0.0.1:0", storage_options=options, compression="zstd"
    ) as sender:

        async def send() -> None:
            for step in range(STEPS):
                await sender.send(payload(step, n=big), step=step)
            await sender.finish()

        with rlwire.open_receiver(sender.sink.url, rank=0) as receiver:
            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                await took_one_then_the_rest(receiver)


#: Steps sent: room for receives that finish before their cancel lands (below).
STEPS = 5


async def took_one_then_the_rest(receiver: Any) -> None:
    """Cancel a receive while it decodes a step that has arrived, then receive the rest:
    every step once, in order. A receive whose last stretch of work in its thread ends
    before the event loop has marked it cancelled returns its step (nothing lost: the
    cancel lands on nothing); the next step is then tried, up to the last but one, with
    half the deadline (a quiet machine decodes a step in less than 3 ms)."""
    got: list[int | None] = []
    deadline = 0.003
    while len(got) < STEPS - 1:
        with anyio.fail_after(LONG):
            while not await receiver.await_next(timeout=LONG):
                pass
        with anyio.move_on_after(deadline) as scope:
            await receiver.areceive(timeout=LONG)
        if scope.cancelled_caught:
            break
        got.append(receiver.last_step)
        deadline /= 2
    assert len(got) < STEPS - 1, f"no receive was cancelled: each decoded too fast ({got})"
    assert receiver.last_step == (got[-1] if got else None)
    with anyio.fail_after(LONG):
        while len(got) < STEPS:
            await receiver.areceive(timeout=LONG)
            got.append(receiver.last_step)
    assert got == list(range(STEPS))


# -- defect 11: patterns that disagree are refused at the handshake ------------------------


async def test_a_shared_sender_refuses_a_receiver_that_asks_for_rank_1() -> None:
    """Receivers of ranks 0 and 1 on a shared sender: rank 1's receiver gets a
    ConfigError at the handshake and no step; rank 0's gets every step (before, the
    sender dealt steps 0, 2, 4 to one and 1, 3, 5 to the other, silently)."""
    options = {"pattern": "shared", "consumers": 1, "linger": 5}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        url = sender.sink.url
        with rlwire.open_receiver(url, rank=0) as zero, rlwire.open_receiver(url, rank=1) as one:
            got, refused = Outcomes(), Outcomes()
            async with receiving(zero, got), receiving(one, refused, stop_after=0):
                await anyio.sleep(0.2)  # both have announced themselves
                for step in range(6):
                    await sender.send(payload(step), step=step)
                await sender.finish()
    assert got.events == list(range(6))
    assert refused.events
    for error in refused.errors():
        assert error.startswith("ConfigError"), refused.events
        assert "refused this receiver of rank 1" in error and "pattern='shared'" in error


@pytest.mark.parametrize(
    ("sender_pattern", "receiver_pattern"), [("ranks", "shared"), ("shared", "ranks")]
)
async def test_a_receiver_naming_the_other_pattern_is_refused_at_the_handshake(
    sender_pattern: str, receiver_pattern: str
) -> None:
    """A receiver whose storage option names the other pattern gets a ConfigError from
    its receive, and no step; the sender, waiting for a receiver that fits, says which
    one it refused when ready_timeout runs out."""
    options = {"pattern": sender_pattern, "ready_timeout": 2, "linger": 1}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        with rlwire.open_receiver(
            sender.sink.url, rank=0, storage_options={"pattern": receiver_pattern}
        ) as receiver:
            refused = Outcomes()
            async with receiving(receiver, refused, stop_after=0):
                with pytest.raises(rlwire.TransportError, match="refused: this receiver expects"):
                    await sender.send(payload(0), step=0)
    assert refused.events and not refused.steps()
    assert all(f"expects the '{receiver_pattern}'" in e for e in refused.errors())


# -- defect 12: an ipc path in use ----------------------------------------------------------


async def test_a_second_sender_on_an_ipc_path_in_use_is_refused(tmp_path: Path) -> None:
    """A second sender on the ipc path of an open one gets a TransportError, as on tcp,
    and the first goes on reaching its receiver (before, libzmq unlinked the first one's
    socket file and bound the second silently). A path left by a dead sender may be
    bound again."""
    url = f"zmq+ipc://{tmp_path / 'run.sock'}"
    options = {"linger": 5, "ready_timeout": LONG}  # a receiver not reached fails, no hang
    async with rlwire.open_sender(url, storage_options=options) as first:
        with pytest.raises(rlwire.TransportError, match=r"run\.sock: cannot bind: address in use"):
            async with rlwire.open_sender(url):
                pass
        with rlwire.open_receiver(url, rank=0) as receiver:
            got = Outcomes()
            async with receiving(receiver, got):
                await first.send(payload(0), step=0)
                await first.finish()
        assert got.events == [0]
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))  # a file no one listens on
    stale.close()
    async with rlwire.open_sender(f"zmq+ipc://{tmp_path / 'stale.sock'}"):
        pass


@pytest.mark.parametrize("what", ["file", "directory"])
async def test_a_sender_never_replaces_what_is_not_a_socket_at_its_ipc_path(
    tmp_path: Path, what: str
) -> None:
    """An ipc path that names a regular file (or a directory) is a ConfigError saying
    so, and the file is left as it was: libzmq unlinks whatever is at the path before
    binding, so a typo in the URL deleted the user's file."""
    path = tmp_path / "notes.txt"
    if what == "file":
        path.write_text("keep me")
    else:
        path.mkdir()
    with pytest.raises(rlwire.ConfigError, match=r"notes\.txt: .*not a socket"):
        async with rlwire.open_sender(f"zmq+ipc://{path}"):
            pass
    assert path.read_text() == "keep me" if what == "file" else path.is_dir()


async def test_a_sender_and_a_receiver_left_by_a_cancellation_are_closed(
    tmp_path: Path,
) -> None:
    """``async with`` blocks of a sender and a receiver left by a cancellation close
    them: the ipc path is free for the next sender, the receiver says it is closed.
    Before, the sender's lock and the receiver's worker thread refused the cancelled
    scope, so both stayed open: the path stayed in use, and the garbage collector later
    hung whatever thread it ran in, terminating a context whose socket was still open."""
    url = f"zmq+ipc://{tmp_path / 'run.sock'}"
    sender = rlwire.open_sender(url, storage_options={"linger": 1})
    receiver = rlwire.open_receiver(url, rank=0)
    with anyio.CancelScope() as scope:
        async with sender, receiver:
            scope.cancel()
            await anyio.sleep(LONG)
    assert scope.cancelled_caught
    with pytest.raises(rlwire.ClosedError):
        await sender.send(payload(0), step=0)
    with pytest.raises(rlwire.ClosedError):
        await receiver.areceive(timeout=0.1)
    with anyio.fail_after(LONG):
        async with rlwire.open_sender(url, storage_options={"linger": 1}):
            pass


# -- the end reaches a receiver whose queue was full, while the sender stays open ----------


#: Tokens in each sample of the steps below: a step or two fill an ipc connection.
BIG = 4096


async def send_until_stalled(sender: Any) -> int:
    """Send steps 0, 1, ... to a receiver that reads nothing, until one waits a second
    for room in its queue (cancelled, nothing of it sent); how many steps were sent."""
    step = 0
    while True:
        with anyio.move_on_after(1.0) as scope:
            await sender.send(payload(step, n=BIG), step=step)
        if scope.cancelled_caught:
            return -1 if sender.last_step is None else sender.last_step + 1
        step += 1


async def test_a_receiver_whose_queue_was_full_hears_the_end_while_the_sender_stays_open(
    tmp_path: Path,
) -> None:
    """``finish`` finds the receiver's queue full; once the receiver reads, the end
    reaches it from ``finish`` itself, while the sender stays open. Before, only closing
    the sender told it, so a receiver waiting for the end of an open sender waited
    forever (the queue is full for a moment after any send, until ZeroMQ's I/O thread
    moves it on: it hung test_a_second_sender_on_an_ipc_path_in_use_is_refused one full
    run in five)."""
    options = {"hwm": 1, "linger": 5}
    url = f"zmq+ipc://{tmp_path / 'end.sock'}"
    async with rlwire.open_sender(url, storage_options=options) as sender:
        with rlwire.open_receiver(url, rank=0, storage_options={"hwm": 1}) as receiver:
            sent = await send_until_stalled(sender)
            got = Outcomes()
            with anyio.fail_after(2 * LONG):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(sender.finish)
                    await anyio.sleep(0.5)  # the end has found the queue full
                    async with receiving(receiver, got, n=BIG):
                        pass
    assert sent > 0
    assert got.events == list(range(sent))


async def test_finish_gives_up_on_a_receiver_that_reads_nothing_after_linger(
    tmp_path: Path,
) -> None:
    """A receiver that never makes room for the end: ``finish`` raises a TransportError
    naming its rank once ``linger`` has passed, instead of waiting forever."""
    options = {"hwm": 1, "linger": 0.5}
    url = f"zmq+ipc://{tmp_path / 'end.sock'}"
    async with rlwire.open_sender(url, storage_options=options) as sender:
        with rlwire.open_receiver(url, rank=0, storage_options={"hwm": 1}):
            sent = await send_until_stalled(sender)
            start = time.monotonic()
            with pytest.raises(rlwire.TransportError) as caught:
                with anyio.fail_after(LONG):
                    await sender.finish()
            assert time.monotonic() - start >= 0.5
    message = str(caught.value)
    assert f"the end of the stream (step {sent}) could not be sent" in message, message
    assert "the receiver of rank 0" in message and "linger=0.5 s" in message, message
    assert url.removeprefix("zmq+") in message, message


# -- defect 18: a CURVE key mismatch says so -----------------------------------------------


@pytest.mark.parametrize("mismatch", ["wrong server key", "key not allowed"])
async def test_a_curve_key_mismatch_is_an_authentication_error_on_the_receiver(
    mismatch: str,
) -> None:
    """A receiver whose CURVE handshake fails gets a TransportError saying that
    authentication failed, not a ReceiveTimeout with nothing to go on."""
    public, secret = zmq.curve_keypair()
    allowed, _ = zmq.curve_keypair()
    options = {"curve_secret_key": secret, "curve_clients": [allowed], "linger": 1}
    server_key = zmq.curve_keypair()[0] if mismatch == "wrong server key" else public
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        with rlwire.open_receiver(
            sender.sink.url, rank=0, storage_options={"curve_server_key": server_key}
        ) as receiver:
            with pytest.raises(rlwire.TransportError, match="CURVE authentication failed"):
                with anyio.fail_after(LONG):
                    await receiver.areceive(timeout=5)


# -- adversarial review: two receivers connect as the stream ends --------------------------


async def test_two_receivers_that_connect_as_the_stream_ends_both_hear_the_end(
    tmp_path: Path,
) -> None:
    """Two receivers connect together as the sender finishes; one announces itself at
    once, the other only later. The closing sender waits for the second too and tells
    it the end: the first one's ``ready`` used to clear the wait for both, so the sender
    closed at once and the second receiver waited forever."""
    from rlwire.transport.zmq._control import parse_end, ready_packet

    url = f"zmq+ipc://{tmp_path / 'late.sock'}"
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    late = {rank: context.socket(zmq.DEALER) for rank in (1, 2)}
    monitors = [sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED) for sock in late.values()]
    try:
        async with rlwire.open_sender(url, storage_options={"linger": LONG}) as sender:
            with rlwire.open_receiver(url, rank=0) as first:
                await sender.send(payload(0))
                assert (await first.areceive(timeout=LONG)).samples[0].env_name == "env0"
            for sock in late.values():
                sock.connect(url.removeprefix("zmq+"))
            for monitor in monitors:
                assert monitor.poll(int(LONG * 1000)), "no handshake with the sender"
                monitor.recv_multipart()
            late[2].send_multipart(ready_packet(2))
            await anyio.sleep(0.2)  # its ready is there, rank 1's is not
            await sender.finish()
            # The sender closes now; rank 1 announces itself while it does.
            announce = threading.Timer(0.3, late[1].send_multipart, [ready_packet(1)])
            announce.start()
        announce.join()
        for rank, sock in late.items():
            ends = []  # (the end may still be on its way through the receiver's socket)
            while 1 not in ends and sock.poll(int(LONG * 1000)):
                ends.append(parse_end(sock.recv_multipart()))
            assert 1 in ends, f"rank {rank}'s receiver was never told the end"
    finally:
        for sock in late.values():
            sock.disable_monitor()
            sock.close(linger=0)
        for monitor in monitors:
            monitor.close(linger=0)
        context.term()


async def test_a_receiver_without_a_key_for_a_curve_sender_is_told_so() -> None:
    """A receiver opened without ``curve_server_key`` on a sender that uses CURVE gets a
    TransportError naming the option it lacks, not a ReceiveTimeout with nothing to go
    on (the handshake fails: the two sides speak different security mechanisms)."""
    _public, secret = zmq.curve_keypair()
    options = {"curve_secret_key": secret, "linger": 1}
    async with rlwire.open_sender("zmq+tcp://127.0.0.1:0", storage_options=options) as sender:
        with rlwire.open_receiver(sender.sink.url, rank=0) as receiver:
            with pytest.raises(rlwire.TransportError) as caught:
                with anyio.fail_after(LONG):
                    await receiver.areceive(timeout=5)
    assert "the sender uses CURVE" in str(caught.value), caught.value
    assert "curve_server_key" in str(caught.value), caught.value
