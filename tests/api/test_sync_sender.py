"""The synchronous sender: SyncSender and open_sync_sender, against real files and sockets."""

from __future__ import annotations

import inspect
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import forked
import numpy as np
import pytest
from helpers import assert_batches_equal, make_batch

import rlwire
from rlwire import SyncSender, open_sync_sender
from rlwire.transport import FileSink

#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 30.0


def receive_step(path: Path, step: int, *, rank: int = 0) -> Any:
    with rlwire.open_receiver(path, rank=rank, start_step=step) as receiver:
        return receiver.receive(timeout=5)


def threads_settle(baseline: set[threading.Thread]) -> set[threading.Thread]:
    """The threads beyond ``baseline`` once they had up to LONG seconds to end (anyio's
    idle worker threads are told to stop when the loop ends, but not joined)."""
    deadline = time.monotonic() + LONG
    while (extra := set(threading.enumerate()) - baseline) and time.monotonic() < deadline:
        time.sleep(0.01)
    return extra


def portal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rlwire-sync-sender"]


# -- round trips -----------------------------------------------------------------------


def test_round_trip_through_files(tmp_path: Path) -> None:
    batches = [make_batch(3, seed=10 * i) for i in range(3)]
    with open_sync_sender(tmp_path, sidecar=("routed_experts",)) as sender:
        assert isinstance(sender, SyncSender)
        assert (sender.next_step, sender.last_step, sender.last_stats) == (0, None, None)
        assert [sender.send(b) for b in batches] == [0, 1, 2]
        assert (sender.next_step, sender.last_step) == (3, 2)
        assert sender.last_stats is not None and sender.last_stats.step == 2
        assert isinstance(sender.sink, FileSink) and sender.sink.root == tmp_path
    with rlwire.open_receiver(tmp_path) as receiver:
        for batch in batches:
            assert_batches_equal(receiver.receive(timeout=5), batch)


def test_send_with_explicit_steps(tmp_path: Path) -> None:
    with open_sync_sender(tmp_path) as sender:
        assert sender.send(make_batch(seed=1), step=7) == 7
        assert sender.send(make_batch(seed=2), step=8) == 8
    assert_batches_equal(receive_step(tmp_path, 8), make_batch(seed=2))


def test_send_ranks(tmp_path: Path) -> None:
    per_rank = [make_batch(2, seed=100 * rank) for rank in range(3)]
    with open_sync_sender(tmp_path) as sender:
        assert sender.send_ranks(per_rank) == 0
        assert sender.last_stats is not None and sender.last_stats.ranks == 3
    for rank, batch in enumerate(per_rank):
        assert_batches_equal(receive_step(tmp_path, 0, rank=rank), batch)


def test_options_reach_the_async_sender(tmp_path: Path) -> None:
    """Options are open_sender's: here start_step, and on_stats (which runs on the
    sender's event-loop thread, not the caller's)."""
    seen: list[tuple[int, str]] = []

    def on_stats(stats: rlwire.SendStats) -> None:
        seen.append((stats.step, threading.current_thread().name))

    with open_sync_sender(tmp_path, start_step=4, on_stats=on_stats) as sender:
        assert sender.next_step == 4
        sender.send(make_batch())
    assert seen == [(4, "rlwire-sync-sender")]


def test_zmq_round_trip() -> None:
    pytest.importorskip("zmq")
    batches = [make_batch(2, seed=s) for s in (5, 6)]
    with open_sync_sender("zmq+tcp://127.0.0.1:0") as sender:
        url = sender.sink.url
        assert url.startswith("zmq+tcp://127.0.0.1:") and not url.endswith(":0")
        with rlwire.open_receiver(url) as receiver:
            for step, batch in enumerate(batches):
                assert sender.send(batch) == step
                assert_batches_equal(receiver.receive(timeout=LONG), batch)


def test_finish_ends_the_stream(tmp_path: Path) -> None:
    with open_sync_sender(tmp_path) as sender:
        sender.send(make_batch())
        sender.finish()
        sender.finish()  # a second call does nothing
        with pytest.raises(rlwire.ClosedError, match="finished its stream"):
            sender.send(make_batch())
    with rlwire.open_receiver(tmp_path) as receiver:
        assert_batches_equal(receiver.receive(timeout=5), make_batch())
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=5)


# -- errors ----------------------------------------------------------------------------


def nan_logprobs() -> rlwire.TrainingBatch:
    batch = make_batch(3)
    batch.samples[2].logprobs[4] = np.nan
    return batch


def async_error(path: Path, send: Callable[[rlwire.TrainingBatchSender], Any]) -> BaseException:
    """What the async sender raises for the same call, for comparison."""

    async def main() -> BaseException:
        async with rlwire.open_sender(path) as sender:
            try:
                await send(sender)
            except rlwire.RlwireError as exc:
                return exc
        raise AssertionError("the async sender raised nothing")

    return anyio.run(main)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda s: s.send(nan_logprobs()),
            rlwire.SchemaError,
            r"samples\[2\]\.logprobs: 1 non-finite value .* 4",
        ),
        (lambda s: s.send_ranks([]), rlwire.ConfigError, "non-empty sequence"),
        (lambda s: s.send(make_batch(), step=-1), rlwire.StepOrderError, "from 0 to"),
    ],
)
def test_errors_propagate_unchanged(
    tmp_path: Path, call: Callable[[Any], Any], error: type[Exception], match: str
) -> None:
    """Same type and same message as the async sender's; nothing is written."""
    with open_sync_sender(tmp_path / "sync") as sender:
        with pytest.raises(error, match=match) as caught:
            call(sender)
        assert sender.next_step == 0
        assert sender.send(make_batch()) == 0  # the sender is still usable
    expected = async_error(tmp_path / "async", call)
    assert type(caught.value) is type(expected)
    assert str(caught.value) == str(expected)


def test_step_order_error(tmp_path: Path) -> None:
    with open_sync_sender(tmp_path) as sender:
        sender.send(make_batch(), step=5)
        with pytest.raises(rlwire.StepOrderError, match="step 5 repeats step 5"):
            sender.send(make_batch(), step=5)
        with pytest.raises(rlwire.StepOrderError, match="skips ahead of step 6"):
            sender.send(make_batch(), step=8)
        assert sender.send(make_batch()) == 6


def test_step_exists_at_open_leaves_no_thread(tmp_path: Path) -> None:
    with open_sync_sender(tmp_path) as sender:
        sender.send(make_batch())
    baseline = set(threading.enumerate())
    with pytest.raises(rlwire.StepExistsError):
        open_sync_sender(tmp_path)
    assert portal_threads() == []  # joined before the error is raised
    assert threads_settle(baseline) == set()


def test_config_error_starts_no_thread(tmp_path: Path) -> None:
    baseline = set(threading.enumerate())
    with pytest.raises(rlwire.ConfigError, match="unknown"):
        open_sync_sender(tmp_path, codec="no-such-codec")
    # No thread beyond the baseline; one of the baseline may have ended meanwhile (an idle
    # anyio worker thread of an earlier test, told to stop but not joined).
    assert set(threading.enumerate()) - baseline == set()


# -- closing ---------------------------------------------------------------------------


def test_use_after_close_raises_closed_error(tmp_path: Path) -> None:
    sender = open_sync_sender(tmp_path)
    sender.send(make_batch())
    sender.close()
    sender.close()  # idempotent
    for call in (
        lambda: sender.send(make_batch()),
        lambda: sender.send_ranks([make_batch()]),
        sender.finish,
    ):
        with pytest.raises(rlwire.ClosedError, match="is closed"):
            call()
    assert (sender.next_step, sender.last_step) == (1, 0)  # still readable
    with sender:  # entering a closed sender and leaving it again is harmless
        pass


def test_close_stops_the_thread(tmp_path: Path) -> None:
    baseline = set(threading.enumerate())
    sender = open_sync_sender(tmp_path)
    assert len(portal_threads()) == 1 and portal_threads()[0].daemon
    sender.send(make_batch())  # starts worker threads too
    sender.close()
    assert portal_threads() == []
    assert threads_settle(baseline) == set()


def test_leaving_with_on_an_error_closes(tmp_path: Path) -> None:
    with pytest.raises(rlwire.SchemaError):
        with open_sync_sender(tmp_path) as sender:
            sender.send(make_batch())
            sender.send(nan_logprobs())
    assert portal_threads() == []
    with pytest.raises(rlwire.ClosedError):
        sender.send(make_batch())
    assert_batches_equal(receive_step(tmp_path, 0), make_batch())


def test_close_from_another_thread_waits_for_the_send_in_flight(tmp_path: Path) -> None:
    """close() while another thread sends: the send completes, later calls get
    ClosedError, and no call fails with anything else."""
    sender = open_sync_sender(tmp_path)
    errors: list[BaseException] = []
    sent: list[int] = []
    started = threading.Event()

    def keep_sending() -> None:
        try:
            for i in range(1000):
                sent.append(sender.send(make_batch(seed=i)))
                started.set()
        except BaseException as exc:
            errors.append(exc)
        started.set()

    thread = threading.Thread(target=keep_sending)
    thread.start()
    assert started.wait(LONG)
    sender.close()
    thread.join(LONG)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], rlwire.ClosedError), errors
    assert sent == list(range(len(sent)))
    assert_batches_equal(receive_step(tmp_path, sent[-1]), make_batch(seed=sent[-1]))


def test_forgotten_close_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """The thread is a daemon; the process exits without close(), both with the sender
    still referenced at exit and with the sender garbage collected before it."""
    script = textwrap.dedent(f"""
        import gc, sys
        from rlwire._api.sync_sender import open_sync_sender
        from rlwire.testing import make_batch
        kept = open_sync_sender({str(tmp_path / "kept")!r})
        kept.send(make_batch())
        dropped = open_sync_sender({str(tmp_path / "dropped")!r})
        dropped.send(make_batch())
        del dropped
        gc.collect()
        print("done", flush=True)
    """)
    done = forked.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=LONG)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert_batches_equal(receive_step(tmp_path / "kept", 0), make_batch())


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread() or os.name != "posix",
    reason="needs SIGINT delivered to the main thread",
)
def test_ctrl_c_cancels_the_send_it_interrupts() -> None:
    """A ZeroMQ send with no receiver waits (ready_timeout=None: for ever); Ctrl-C in
    the waiting thread cancels it, and nothing was sent."""
    pytest.importorskip("zmq")
    # Python's own handler, whatever an earlier test in this worker left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.get_ident()
    stop = threading.Event()

    def press() -> None:
        # Again every 0.3 s until the send ended: a signal that lands while the main
        # thread runs a finalizer is dropped by Python (a user presses Ctrl-C again).
        while not stop.wait(0.3):
            signal.pthread_kill(main, signal.SIGINT)

    presser = threading.Thread(target=press)
    try:
        with open_sync_sender("zmq+tcp://127.0.0.1:0") as sender:
            presser.start()
            t0 = time.monotonic()
            try:
                with pytest.raises(KeyboardInterrupt):
                    sender.send(make_batch())
            finally:
                _stop_pressing(stop, presser)
            assert time.monotonic() - t0 < LONG / 2
            assert (sender.next_step, sender.last_step) == (0, None)
        assert portal_threads() == []
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread() or os.name != "posix",
    reason="needs SIGINT delivered to the main thread",
)
def test_ctrl_c_returns_once_the_send_it_cancelled_has_settled(tmp_path: Path) -> None:
    """Ctrl-C at seeded moments of file sends: when KeyboardInterrupt reaches the
    caller, the cancelled send has settled: ``next_step`` says whether its step is
    visible, and no temporary file of it is left (it used to return at once, while
    the send went on committing or cleaning up on the sender's thread)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main, rng = threading.get_ident(), np.random.default_rng(11)
    big = make_batch(4, 60_000, layers=8, topk=8)
    try:
        with open_sync_sender(tmp_path) as sender:
            t0 = time.perf_counter()
            sender.send(big)
            took = time.perf_counter() - t0
            for _ in range(8):
                step, seen = sender.next_step, None
                timer = threading.Timer(rng.uniform(0, took), signal.pthread_kill, (main, 2))
                try:
                    timer.start()  # in the try: an early signal may land before the send
                    try:
                        sender.send(big)
                    except KeyboardInterrupt:
                        seen = sender.next_step, os.listdir(tmp_path)  # at once
                    timer.join()
                    time.sleep(0.05)  # a signal sent after the send lands here
                except KeyboardInterrupt:
                    pass
                next_step, names = seen or (sender.next_step, os.listdir(tmp_path))
                assert [n for n in names if n.endswith(".tmp")] == []
                visible = f"step-{step:08d}.rank-0000.rlw" in names
                assert next_step == step + visible, (step, sorted(names))
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_pressing(stop: threading.Event, presser: threading.Thread) -> None:
    """Stop ``presser`` and take any Ctrl-C it sent meanwhile, so none reaches pytest."""
    stop.set()
    while True:
        try:
            presser.join()
            time.sleep(0.05)  # a signal sent just before the join is handled here
            return
        except KeyboardInterrupt:
            continue


def test_ctrl_c_while_a_send_is_handed_over_cancels_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt lands after the portal has started the send but before the caller
    holds its future: the send is cancelled all the same, and close() does not wait for
    it (it used to wait for ever for a receiver that never came)."""
    pytest.importorskip("zmq")
    with open_sync_sender("zmq+tcp://127.0.0.1:0") as sender:
        portal = sender._portal
        handed_over = portal.start_task_soon

        def interrupted(*args: object, **kwargs: object) -> object:
            handed_over(*args, **kwargs)  # type: ignore[arg-type]
            raise KeyboardInterrupt

        monkeypatch.setattr(portal, "start_task_soon", interrupted)
        with pytest.raises(KeyboardInterrupt):
            sender.send(make_batch())
        monkeypatch.undo()
        t0 = time.monotonic()
    assert time.monotonic() - t0 < LONG / 2
    assert (sender.next_step, sender.last_step) == (0, None)
    assert portal_threads() == []


# -- threads ---------------------------------------------------------------------------


def test_concurrent_sends_from_many_threads(tmp_path: Path) -> None:
    """Eight threads sending at once get consecutive distinct steps, each thread's in
    increasing order, and every step holds the batch its sender sent."""
    threads, per_thread = 8, 6
    results: dict[int, list[tuple[int, int]]] = {t: [] for t in range(threads)}  # (step, seed)
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def producer(sender: SyncSender, t: int) -> None:
        try:
            barrier.wait(LONG)
            for i in range(per_thread):
                seed = 1000 * t + i
                results[t].append((sender.send(make_batch(2, seed=seed)), seed))
        except BaseException as exc:
            errors.append(exc)

    with open_sync_sender(tmp_path) as sender:
        workers = [threading.Thread(target=producer, args=(sender, t)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(LONG)
        assert not any(w.is_alive() for w in workers)
        assert errors == []
        assert sender.next_step == threads * per_thread
    seeds = {}
    for sent in results.values():
        steps = [step for step, _ in sent]
        assert steps == sorted(steps)
        seeds.update(sent)
    assert sorted(seeds) == list(range(threads * per_thread))
    with rlwire.open_receiver(tmp_path) as receiver:
        for step in range(threads * per_thread):
            assert_batches_equal(receiver.receive(timeout=5), make_batch(2, seed=seeds[step]))


# -- the signature ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_sink_knows_when_the_caller_blocks_an_event_loop(tmp_path: Path, backend: str) -> None:
    """Opened on an event loop's thread, each call blocks that loop: the sink is told, so
    it never waits for the loop (ray:// would wait for its actor); elsewhere it is not."""

    async def on_the_loop() -> bool:
        with open_sync_sender(tmp_path / "a") as sender:
            return sender.sink.caller_blocks_loop

    assert anyio.run(on_the_loop, backend=backend) is True
    with open_sync_sender(tmp_path / "b") as sender:
        assert sender.sink.caller_blocks_loop is False


def test_open_sync_sender_has_the_parameters_of_open_sender() -> None:
    mine = inspect.signature(open_sync_sender)
    theirs = inspect.signature(rlwire.open_sender)
    assert list(mine.parameters.values()) == list(theirs.parameters.values())
    assert mine.return_annotation == "SyncSender"


# -- fork ------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_gets_closed_error_from_its_parents_sender(tmp_path: Path) -> None:
    """The parent's event-loop thread does not exist in a forked child: the child's calls
    of the parent's sender raise ClosedError at once (instead of waiting forever for that
    thread), its close() returns, and the parent's sender carries on."""
    script = textwrap.dedent(f"""
        import os, sys, time, rlwire
        from rlwire.testing import make_batch
        sender = rlwire.open_sync_sender({str(tmp_path)!r})
        sender.send(make_batch())
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sender.send(make_batch())
            except rlwire.ClosedError as exc:
                print("child:", exc, flush=True)
                sender.close()
                with sender:
                    pass
                code = 0
            os._exit(code)
        deadline = time.monotonic() + {LONG}
        while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        if not done[0]:
            os.kill(pid, 9)
            sys.exit("the forked child hung")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        assert sender.send(make_batch(seed=1)) == 1
        sender.close()
    """)
    done = forked.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=2 * LONG
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "which forked this one" in done.stdout
    assert_batches_equal(receive_step(tmp_path, 1), make_batch(seed=1))


def test_a_call_from_its_own_on_stats_callback_is_a_config_error(tmp_path: Path) -> None:
    # on_stats runs on the sender's event-loop thread, which cannot wait for itself.
    calls: dict[str, Callable[[SyncSender], object]] = {
        "send": lambda s: s.send(make_batch()),
        "finish": lambda s: s.finish(),
        "open_step": lambda s: s.open_step().put([], key="k"),
        "close": lambda s: s.close(),
    }
    for name, call in calls.items():
        holder: list[SyncSender] = []
        sender = open_sync_sender(
            tmp_path / name, on_stats=lambda _, call=call, holder=holder: call(holder[0])
        )
        holder.append(sender)
        with sender:
            with pytest.raises(rlwire.ConfigError, match="on the sender's own event-loop"):
                sender.send(make_batch())
            assert sender.next_step == 1  # the step was sent; the sender goes on
        assert portal_threads() == []
        assert_batches_equal(receive_step(tmp_path / name, 0), make_batch())
