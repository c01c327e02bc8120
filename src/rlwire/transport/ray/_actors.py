"""Finding, creating and calling a destination's board, with Ray's errors turned into
rlwire's."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import ray
from ray import ObjectRef
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlwire._core.errors import ConfigError, RlwireError, TransportError
from rlwire.transport.ray._board import Board, BoardActor, board_name

#: A board's actor handle (its methods are :class:`~._board.Board`'s).
BoardHandle = ActorHandle[Any]

# Ray destroys a board that is not detached once no handle to it is left, even a named
# one: the process that created it keeps one, so that its steps outlive the sender that
# sent them (they live as long as this process, or until drop_board).
_KEPT: dict[tuple[str, str | None], BoardHandle] = {}

#: Seconds a board has to answer a call, beyond what the call itself waits for (a
#: receiver's step, the pull of a producer's objects): a board whose process stopped
#: (its node cut off, not yet declared dead) is a TransportError then, not a hang.
BOARD_ANSWER_SECONDS = 10.0
#: Seconds a board just made has to answer its first call: Ray starts a process for it,
#: which on a loaded machine takes tens of seconds.
BOARD_START_SECONDS = 300.0

__all__ = [
    "BOARD_ANSWER_SECONDS",
    "BOARD_START_SECONDS",
    "BoardHandle",
    "answer_of",
    "board_id",
    "call",
    "create_board",
    "drop_board",
    "ensure_ray",
    "fetch",
    "find_board",
    "ray_errors",
    "submit",
    "unanswered",
]


def ensure_ray(where: str | None) -> None:
    """Raise ConfigError unless this process is connected to a Ray cluster (never was,
    or no longer is: ``ray.shutdown()``)."""
    if not ray.is_initialized():
        raise ConfigError(
            "this process is not connected to a Ray cluster: call ray.init() first "
            "(inside a Ray actor or task it is), and use no sender or receiver after "
            "ray.shutdown()",
            where=where,
        )


@contextlib.contextmanager
def ray_errors(where: str, action: str) -> Iterator[None]:
    """Turn Ray's errors (a dead board, a lost object, a timeout) into a
    :class:`~rlwire.errors.TransportError` saying that ``action`` failed at ``where``.

    Raises ConfigError at once when Ray is shut down (``ray.shutdown()``): a call then
    raises Ray's bare Exception (the actor is not found), and a wait may hang until Ray
    ends the process."""
    ensure_ray(where)
    try:
        yield
    except RlwireError as exc:
        exc.add_context(where=where)
        raise
    except (ray.exceptions.GetTimeoutError, TimeoutError) as exc:
        raise TransportError(f"cannot {action}: timed out", where=where) from exc
    except ray.exceptions.ObjectLostError as exc:
        if isinstance(exc, ray.exceptions.ObjectFetchTimedOutError):
            raise _failed(exc, where, action) from exc  # a slow transfer: may pass next time
        # No retry brings the bytes back: say so, or a trainer's loop retries forever.
        raise TransportError(
            f"cannot {action}: {type(exc).__name__}: no copy of them is left in the "
            "cluster (the process that owned them died, or the node that stored them); "
            "every read of this step fails the same way: skip() it",
            where=where,
        ) from exc
    except ray.exceptions.RayError as exc:
        raise _failed(exc, where, action) from exc


def _failed(exc: ray.exceptions.RayError, where: str, action: str) -> TransportError:
    """The TransportError of a Ray call that raised ``exc``: its kind and first line,
    and what the call raised, for a RayTaskError."""
    kind = type(exc).__name__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else kind
    cause = getattr(exc, "cause", None)  # a RayTaskError's: what the call raised
    if isinstance(cause, Exception):
        first += f" raised {type(cause).__name__}: {cause}"
    return TransportError(f"cannot {action}: {kind}: {first}", where=where)


def fetch(refs: list[ObjectRef[Any]], timeout: float | None = None) -> list[Any]:
    """The values of ``refs``, waited for in this thread (a worker thread: it blocks).

    Through each reference's future rather than ``ray.get``, which in an async actor
    warns that it blocks the event loop, though it runs in a worker thread here.
    Errors are Ray's (and TimeoutError), and ConfigError once Ray is shut down: use it
    under :func:`ray_errors`.
    """
    if timeout is not None and timeout >= threading.TIMEOUT_MAX:
        timeout = None  # a thread cannot wait that long (OverflowError): no limit, as asked
    futures = [ref.future() for ref in refs]
    return [_result(future, timeout) for future in futures]


#: How often a wait on Ray asks whether Ray is still there, in seconds: after
#: ``ray.shutdown()`` no answer comes, and the wait held its caller its whole timeout.
SHUTDOWN_POLL_SECONDS = 0.5


def _result(future: concurrent.futures.Future[Any], timeout: float | None) -> Any:
    """``future.result(timeout)``, raising ConfigError within
    :data:`SHUTDOWN_POLL_SECONDS` once Ray is shut down."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return future.result(
                SHUTDOWN_POLL_SECONDS if left is None else min(left, SHUTDOWN_POLL_SECONDS)
            )
        except TimeoutError:
            if left is not None and left <= SHUTDOWN_POLL_SECONDS:
                raise
            ensure_ray(None)


def call(method: Any, *args: Any, where: str, action: str, timeout: float | None = None) -> Any:
    """``method.remote(*args)`` on a board, waited for (blocking: call it from a worker
    thread) up to ``timeout`` seconds (default :data:`BOARD_ANSWER_SECONDS`); its answer.

    Raises:
        TransportError: the board is gone, or does not answer in time.
    """
    return answer_of(submit(method, *args, where=where, action=action), where, action, timeout)


def submit(method: Any, *args: Any, where: str, action: str) -> ObjectRef[Any]:
    """``method.remote(*args)`` on a board, not waited for: the reference of its answer
    (:func:`answer_of` waits for it).

    Raises:
        ConfigError: Ray is shut down.
        TransportError: Ray cannot submit the call.
    """
    with ray_errors(where, action):
        ref: ObjectRef[Any] = method.remote(*args)
    return ref


def answer_of(ref: ObjectRef[Any], where: str, action: str, timeout: float | None = None) -> Any:
    """The board's answer to a call :func:`submit` made, waited for in this thread up
    to ``timeout`` seconds (default :data:`BOARD_ANSWER_SECONDS`).

    Raises:
        TransportError: the board is gone, or does not answer in time.
    """
    limit = BOARD_ANSWER_SECONDS if timeout is None else timeout
    try:
        with ray_errors(where, action):
            return fetch([ref], limit)[0]
    except TransportError as exc:
        if isinstance(exc.__cause__, ray.exceptions.GetTimeoutError | TimeoutError):
            raise TransportError(
                f"cannot {action}: the board did not answer within {limit:g} s (its process "
                "stopped, or its node cut off?)",
                where=where,
            ) from exc.__cause__
        raise


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the board did not answer in time (:func:`answer_of`): a
    cleanup's call to it after that would wait as long again, for nothing."""
    return isinstance(exc, TransportError) and isinstance(
        exc.__cause__, ray.exceptions.GetTimeoutError | TimeoutError
    )


def create_board(name: str, *, namespace: str | None = None, detached: bool = False) -> BoardHandle:
    """The board of ``ray://name``, created if there is none (at once, as one actor
    however many callers race).

    A board that is not ``detached`` dies with the process that created it (Ray's fate
    sharing), and every step with it: create it in the driver, or detach it. It is
    placed on this process's node, so that it shares no other node's fate.

    Raises:
        ConfigError: Ray is not initialized in this process.
        TransportError: Ray cannot create the actor.
    """
    where = f"ray://{name}"
    ensure_ray(where)
    options: dict[str, Any] = {
        "name": board_name(name),
        "namespace": namespace,
        "get_if_exists": True,
        # Many receivers may wait on it at once, each a coroutine.
        "max_concurrency": 1000,
        # On this process's node (the driver's, made there), which it shares the fate of
        # already: an actor that needs no CPU goes to any node otherwise (even with a
        # soft affinity, which Ray spilled to the other node of two), and would die with
        # that node, and every step with it.
        "scheduling_strategy": NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        ),
    }
    if detached:
        options["lifetime"] = "detached"
    with ray_errors(where, "create the board"):
        handle: BoardHandle = BoardActor.options(**options).remote(where)  # type: ignore[assignment]
    _check_board(handle, name, namespace)  # get_if_exists: whatever actor holds the name
    kept = _KEPT.get((name, namespace))
    # Keep the first handle to each board: it may be the creator's, the one that counts;
    # replace it only when the board under the name is another (the old one was killed).
    if kept is None or getattr(kept, "_actor_id", None) != getattr(handle, "_actor_id", None):
        _KEPT[(name, namespace)] = handle
    return handle


def board_id(board: BoardHandle) -> str:
    """Which board ``board`` is, as a string: Ray's id of the actor. A board made again
    under a name (the one before died, and every step with it) is another board, with
    another id; Ray never restarts a board under the same id (it has no
    ``max_restarts``), so the same id is the same board, with the steps it held."""
    return str(board._actor_id.hex())


def find_board(name: str, namespace: str | None = None) -> BoardHandle | None:
    """The board of ``ray://name``, or ``None`` if none is there (yet).

    Raises:
        TransportError: another actor holds the board's name.
    """
    try:
        handle: BoardHandle = ray.get_actor(board_name(name), namespace=namespace)
    except ValueError:
        return None
    return _check_board(handle, name, namespace)


def _check_board(handle: BoardHandle, name: str, namespace: str | None) -> BoardHandle:
    """``handle``, the actor under the board's name of ``ray://name``, if it is a board.

    Raises:
        TransportError: it is an actor of another class (not rlwire's board).
    """
    made = getattr(handle, "_ray_actor_creation_function_descriptor", None)
    module, cls = getattr(made, "module_name", None), getattr(made, "class_name", None)
    if (module, cls) != (Board.__module__, Board.__qualname__):
        raise TransportError(
            f"the actor named {board_name(name)!r}"
            + ("" if namespace is None else f" in namespace {namespace!r}")
            + f" is not an rlwire board but a {module}.{cls}: another program took the name",
            where=f"ray://{name}",
        )
    return handle


def drop_board(name: str, *, namespace: str | None = None, timeout: float = 10.0) -> bool:
    """Kill the board of ``ray://name`` (detached or not); every step it holds goes with
    it. Returns once the name is free (a sender may make a new board under it), True if
    there was one.

    Raises:
        ConfigError: Ray is not initialized in this process.
        TransportError: the name is still taken after ``timeout`` seconds.
    """
    where = f"ray://{name}"
    ensure_ray(where)
    board = find_board(name, namespace)  # before letting go of the handle that keeps it
    _KEPT.pop((name, namespace), None)
    if board is None:
        return False
    ray.kill(board)
    deadline = time.monotonic() + timeout
    while find_board(name, namespace) is not None:  # Ray frees the name a moment later
        if time.monotonic() > deadline:
            raise TransportError(
                f"the killed board still holds the name after {timeout} s", where=where
            )
        time.sleep(0.01)
    return True
