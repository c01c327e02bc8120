"""SyncSender: a TrainingBatchSender for synchronous code, on a private event-loop thread.

A sender's blocking face is a separate object with the same method names (``send``,
``send_ranks``, ``finish``, ``close``), as httpx's ``Client`` beside ``AsyncClient``; a
receiver offers both faces itself. The rule is written out in :mod:`rlwire._api.receiver`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Literal, NamedTuple, ParamSpec, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.sender import open_sender
from rlwire._api.stats import SendStats
from rlwire._api.sync_step_writer import SyncStepWriter
from rlwire._core.columns import Column
from rlwire._core.errors import ClosedError, ConfigError
from rlwire._core.offload import runs_event_loop
from rlwire.transport._base import Sink

__all__ = ["SyncSender", "open_sync_sender"]

P = ParamSpec("P")
T = TypeVar("T")

#: The name of every SyncSender's event-loop thread (as threading.current_thread() has it).
_THREAD_NAME = "rlwire-sync-sender"


def _same_parameters(
    like: Callable[P, object],
) -> Callable[[Callable[..., SyncSender]], Callable[P, SyncSender]]:
    """Give the decorated function the parameters of ``like``, for type checkers (through
    ``P``) and for :func:`inspect.signature` (so ``help()`` and autodoc list them)."""

    def adopt(func: Callable[..., SyncSender]) -> Callable[P, SyncSender]:
        signature = inspect.signature(like).replace(return_annotation="SyncSender")
        func.__dict__["__signature__"] = signature
        return func

    return adopt


@_same_parameters(open_sender)
def open_sync_sender(url: str | os.PathLike[str], **options: Any) -> SyncSender:
    """Open a sender for synchronous code: :func:`~rlwire.open_sender`'s parameters, the
    same behaviour, but plain blocking methods instead of coroutines.

    The sender runs on its own event-loop thread (asyncio), which this call starts; it
    then opens the destination at once (unlike the async sender, which opens on
    ``async with`` or the first send), so that a destination that cannot be used is
    reported here, and ``sender.sink.url`` is already the bound address of a
    ``zmq+tcp://host:0`` sender. If opening fails, what the sink acquired is released
    and the thread is stopped before the error is raised. ``on_stats`` is called on
    that thread, not on the thread that sends, so the sender's methods called from it
    raise ``ConfigError``.

    Raises:
        ConfigError: as :func:`~rlwire.open_sender` (before any thread is started).
        StepExistsError: the destination holds steps and ``on_existing="error"``.
        TransportError: the destination cannot be written.

    Returns:
        An open :class:`SyncSender`; use it as ``with``, or call
        :meth:`~SyncSender.close`.

    Example:
        >>> import rlwire, tempfile
        >>> from rlwire import open_sync_sender
        >>> path = tempfile.mkdtemp()
        >>> with open_sync_sender(path) as sender:
        ...     sender.send(rlwire.TrainingBatch(samples=[]))
        ...     sender.send(rlwire.TrainingBatch(samples=[]))
        0
        1
        >>> with rlwire.open_receiver(path, start_step=1) as receiver:
        ...     receiver.receive(timeout=5).samples
        []
    """
    return SyncSender(_made_off_the_loop(lambda: open_sender(url, **options)))


class SyncSender:
    """A :class:`~rlwire.TrainingBatchSender` driven from synchronous code.

    The async sender runs on a private event-loop thread (an anyio blocking portal,
    asyncio); each method hands its call to that thread and blocks until it is done, so
    a send still encodes and writes in worker threads, in slices, exactly as the async
    one does. Usually made by :func:`open_sync_sender`; constructing one from a
    :class:`~rlwire.TrainingBatchSender` that was never opened takes it over, starts the
    thread and opens the destination, as :func:`open_sync_sender` describes.

    Methods may be called from any number of threads: sends are serialized, so
    concurrent callers get consecutive steps in the order they acquire the sender.
    Errors are those of the async sender, raised unchanged (same type, same message).
    An exception that interrupts a waiting caller (``KeyboardInterrupt``) cancels the
    send it waits for, and is raised once that send has settled: the step was committed
    whole (``next_step`` is past it) or left nothing visible. Each call costs one
    round trip to the event-loop thread (a fraction of a millisecond), on top of the
    async send.

    :meth:`close` (or leaving ``with``) closes the sender, then stops the thread. The
    thread is a daemon thread, so a forgotten close does not keep the process from
    exiting; but until then it keeps the thread, the event loop and the sink's files or
    sockets, and what a ZeroMQ sink still queues at exit is lost. Use ``with``.

    A process forked from the one that opened the sender (``os.fork``, multiprocessing's
    ``"fork"`` start method, DataLoader workers) has no event-loop thread for it: there
    its methods raise :class:`~rlwire.ClosedError` at once, and :meth:`close` only marks
    it closed, leaving the files and sockets to the parent. Open a sender in the child.
    """

    def __init__(self, sender: TrainingBatchSender) -> None:
        self._sender = sender
        self._pid = os.getpid()  # the process whose thread runs the event loop
        self._closed = False
        self._close_lock = threading.Lock()
        sender.sink.caller_blocks_loop = runs_event_loop()
        self._portal, self._thread = _start_portal()
        try:
            _wait(self._portal.start_task_soon(sender.aopen))
        except BaseException:
            self._closed = True
            try:
                # Release what a failed open may hold (a socket bound, a connection
                # made); the open's own error is the one to report.
                with contextlib.suppress(Exception):
                    self._portal.call(sender.aclose)
            finally:
                self._stop_portal()
            raise

    def __repr__(self) -> str:
        return f"SyncSender({self._sender!r})"

    @property
    def next_step(self) -> int:
        """The step ``send(obj)`` without ``step=`` will use."""
        return self._sender.next_step

    @property
    def last_step(self) -> int | None:
        """The last step sent by this sender, or ``None``."""
        return self._sender.last_step

    @property
    def last_stats(self) -> SendStats | None:
        """The figures of the last step sent, or ``None`` before the first."""
        return self._sender.last_stats

    @property
    def sink(self) -> Sink:
        """The sink this sender writes to; ``sender.sink.url`` is, for example, the
        address a ``zmq+tcp://host:0`` sender actually bound."""
        return self._sender.sink

    def __enter__(self) -> SyncSender:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def send(self, obj: Any, *, step: int | None = None) -> int:
        """Send ``obj`` as ``step`` (default: the next step) for rank 0, and return the
        step number used once it is visible to readers.

        Raises:
            ClosedError: the sender is closed.
            RlwireError: the others of :meth:`rlwire.TrainingBatchSender.send`
                (``SchemaError``, ``ConfigError``, ``EncodeError``, ``StepOrderError``,
                ``StepExistsError``, ``TransportError``), for the same reasons.
        """
        return self._call(self._sender.send, obj, step=step)

    def send_ranks(self, objs: Sequence[Any], *, step: int | None = None) -> int:
        """Send ``objs[r]`` to data-parallel rank ``r``, all as one step, and return the
        step number used; see :meth:`rlwire.TrainingBatchSender.send_ranks`.

        Raises:
            ClosedError: the sender is closed.
            ConfigError: ``objs`` is not a non-empty sequence; otherwise the errors of
                :meth:`send`, naming the rank.
        """
        return self._call(self._sender.send_ranks, objs, step=step)

    def add_fields(
        self,
        step: int,
        fields: Mapping[str, Column],
        *,
        rows: int | None = None,
        rank: int = 0,
        of: bytes | None = None,
    ) -> None:
        """Store ``fields`` beside the samples of the committed ``step``; see
        :meth:`rlwire.TrainingBatchSender.add_fields` (same errors)."""
        self._call(self._sender.add_fields, step, fields, rows=rows, rank=rank, of=of)

    def open_step(
        self,
        step: int | None = None,
        *,
        ranks: int = 1,
        cost: Callable[[Any], float] | None = None,
        balance: Literal["cost", "count"] = "cost",
    ) -> SyncStepWriter:
        """Fill ``step`` part by part, ``with`` it: ``with sender.open_step(ranks=2) as
        writer: writer.put(samples, key=k)``; as
        :meth:`rlwire.TrainingBatchSender.open_step`, with blocking methods.

        Raises:
            ClosedError: the sender is closed.
            ConfigError: as :meth:`rlwire.TrainingBatchSender.open_step`.
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        writer = self._sender.open_step(step, ranks=ranks, cost=cost, balance=balance)
        return SyncStepWriter(writer, self._call)

    def finish(self) -> None:
        """Mark the end of the stream after the last step sent: receivers then get
        :class:`~rlwire.EndOfStream` instead of waiting for the next step. A second call
        does nothing; a send after it raises :class:`~rlwire.ClosedError`. See
        :meth:`rlwire.TrainingBatchSender.finish`.

        Raises:
            ClosedError: the sender is closed.
            TransportError, ConfigError: as :meth:`rlwire.TrainingBatchSender.finish`.
        """
        self._call(self._sender.finish)

    def close(self) -> None:
        """Wait for sends in flight, close the sender (flushing what the sink accepted and
        releasing its files and sockets), then stop the event-loop thread. Idempotent;
        later calls of the other methods raise :class:`~rlwire.ClosedError`. In a forked
        child, only marks this sender closed (the thread and the sink are the parent's)."""
        if self._forked():
            self._closed = True  # not under _close_lock: a parent's thread may hold it
            return
        self._check_not_own_thread("close")
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._portal.call(self._sender.aclose)
            finally:
                self._stop_portal()

    def _stop_portal(self) -> None:
        """Stop the event loop, letting calls already queued finish, and join its thread."""
        try:
            self._portal.call(self._portal.stop)
        except RuntimeError:
            pass  # the loop has already ended
        finally:
            self._thread.join()

    def _check_not_own_thread(self, what: str) -> None:
        """Refuse a call from the event-loop thread, which would wait for itself (an
        ``on_stats`` callback runs there)."""
        if threading.current_thread() is self._thread:
            raise ConfigError(
                f"{what}() of {self!r} was called on the sender's own event-loop thread "
                "(from its on_stats callback?), where it would wait for itself: call "
                "it after the send returns"
            )

    def _forked(self) -> bool:
        """Whether this is a process forked from the one that opened the sender."""
        return os.getpid() != self._pid

    def _call(self, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``func(*args, **kwargs)`` on the event-loop thread and wait for it."""
        if self._forked():
            raise ClosedError(
                f"{self!r} was opened in process {self._pid}, which forked this one "
                f"({os.getpid()}); its event-loop thread is not here: open a sender in "
                "this process"
            )
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        self._check_not_own_thread(getattr(func, "__name__", "a method"))

        # An interrupt (Ctrl-C) can land while the call is being handed over, before
        # there is a future to cancel; the call then cancels itself, or is cancelled
        # here, whichever of the two sees the other's mark first (so close() never
        # waits for a send nobody is waiting for).
        interrupted, ended = threading.Event(), threading.Event()
        scopes: list[anyio.CancelScope] = []

        async def run() -> T | _Escaped:
            try:
                with anyio.CancelScope() as scope:
                    scopes.append(scope)
                    if interrupted.is_set():
                        scope.cancel()
                    return await func(*args, **kwargs)
                raise anyio.get_cancelled_exc_class()  # cancelled before it began
            except (Exception, BaseExceptionGroup, anyio.get_cancelled_exc_class()):
                raise
            except BaseException as exc:  # KeyboardInterrupt from a Checks(check=)...
                return _Escaped(exc)  # ...would end the loop: raised in the caller's thread
            finally:
                ended.set()

        try:
            future = self._portal.start_task_soon(run)
        except RuntimeError:
            if self._closed:  # closed by another thread since the check above
                raise ClosedError(f"{self!r} is closed") from None
            raise
        except BaseException:
            interrupted.set()
            if scopes:  # begun: settled as in _wait (not begun: it will not begin)
                self._portal.call(scopes[0].cancel)
                ended.wait()
            raise
        result = _wait(future, ended)
        if isinstance(result, _Escaped):
            raise result.error
        return result


class _Escaped(NamedTuple):
    """What a call raised that is not an Exception nor a cancellation (KeyboardInterrupt,
    SystemExit: from the caller's code the call runs), handed to the caller's thread."""

    error: BaseException


def _made_off_the_loop(make: Callable[[], T]) -> T:
    """``make()``, in a thread of its own when this thread runs an event loop: anyio's
    locks and limiters take the kind of the loop they are made on (a trio lock cannot be
    used on the sender's asyncio loop)."""
    if not runs_event_loop():
        return make()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(make).result()


def _start_portal() -> tuple[BlockingPortal, threading.Thread]:
    """Start an event loop (asyncio) on a new daemon thread, running a blocking portal.

    Not :func:`anyio.from_thread.start_blocking_portal`: its context manager is a
    generator, and a generator left open is closed when it is garbage collected, which
    calls into the portal; at interpreter exit, with daemon threads already frozen, that
    call would wait forever for a sender someone forgot to close.
    """
    ready: Future[BlockingPortal] = Future()

    async def serve() -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                raise

    thread = threading.Thread(target=run, name=_THREAD_NAME, daemon=True)
    thread.start()
    return ready.result(), thread


def _wait(future: Future[T], ended: threading.Event | None = None) -> T:
    """The result of a call made through the portal. If the wait itself is interrupted
    (``KeyboardInterrupt`` in the calling thread), the call is cancelled, and the
    interrupt raised once the call has settled (``ended`` is set; a cancellation waits
    for one slice, or for a commit under way): the sender's ``next_step`` then says
    whether the step was committed, and nothing of a step left out is still being
    cleaned up. A second interrupt stops that wait."""
    try:
        return future.result()
    except BaseException:
        if future.cancel() and ended is not None:  # cancel() is False once it is done
            ended.wait()
        raise
