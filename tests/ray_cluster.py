"""A real local Ray cluster for the tests, started once per test process.

``ray_cluster`` (session scope) starts Ray on this machine with a small object store
and no dashboard, the first time a test asks for it, and shuts it down at the end of
the session. Under pytest-xdist each worker process that runs a Ray test starts its own
cluster (Ray runs several on one machine, each on its own ports); the others start none.
``ray_url`` gives an empty ``ray://`` destination per test and empties it after the test
(as ``on_existing="overwrite"`` does), so that no test's steps stay in the object store.
Destinations are reused from test to test: a board is an actor, a new process that takes
half a second to start here, while emptying one takes a millisecond; when a test drops
its board, the board of a later test starts at once, under a new name. For the same reason
``ray_trainers`` and ``ray_producer`` are actors started once a session, for the tests
that do not kill them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "OBJECT_STORE_BYTES",
    "ray_cluster",
    "ray_producer",
    "ray_trainers",
    "ray_url",
    "spare",
]

#: The object store of the test cluster: room for the largest test step many times over.
OBJECT_STORE_BYTES = 512 << 20

_SRC = str(Path(__file__).resolve().parents[1] / "src")
_IDLE_WORKERS = 6
_PRELOADED = ["rlwire.transport.ray._board", "ray_actors", "ray_fence_actors"]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    # Ray's workers are new processes: they must import this checkout's rlwire (and the
    # tests' helper modules), whatever is installed.
    path = [_SRC, str(Path(__file__).resolve().parent)]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(path + ([old] if old else []))
    ray.init(
        num_cpus=4,
        object_store_memory=OBJECT_STORE_BYTES,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        # Idle workers kept started, so that a new actor (a board a test makes again under
        # its name) takes one: on this 2-core machine with three busy processes beside it,
        # a board took 27-30 s to start without them, 0.5-1.2 s with them.
        # Each worker imports the board's module and the tests' actors as it starts, not
        # when an actor is placed on it: the import (rlwire, numpy, ...) was most of an
        # actor's start, which a test that makes a board again waits for (with it: 0.3-0.5
        # s, 0.9-1.7 s without, on an idle worker).
        _system_config={
            "enable_worker_prestart": True,
            "num_workers_soft_limit": _IDLE_WORKERS,
            "preload_python_modules": _PRELOADED,
        },
    )
    _start_early(_SESSION, _SESSION_KINDS)
    _PENDING[:] = [kind for kind, n in _SPARE_KINDS.items() for _ in range(n)]
    try:
        yield
    finally:
        _SESSION.clear()
        _SPARES.clear()
        _PENDING.clear()
        ray.shutdown()
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


#: Actors of tests/ray_actors.py started before a test asks for them, not waited for, so
#: that they come up while other tests run: an actor is a new process, which took 1-2 s
#: to start here (3-9 s while the rest of the suite ran). The session's start with the
#: cluster; the spares (:func:`spare`: an actor a test kills or has alone) one after
#: each test, the first once the first test is done: not all at once, since Ray starts
#: two processes at a time, and a board a test starts waited behind them (a test that
#: makes a board again took 15 s, not 3, beside six spares starting).
_SESSION_KINDS = {"Trainer": 2, "Producer": 1}
_SPARE_KINDS = {"Trainer": 1, "Producer": 1, "OneCallAsyncProducer": 1, "HeldProducer": 3}
_SESSION: dict[str, list[Any]] = {}
_SPARES: dict[str, list[Any]] = {}
_PENDING: list[str] = []  # the kind of each spare not started yet, in the order they start


def _start_early(started: dict[str, list[Any]], kinds: dict[str, int]) -> None:
    if not started:
        started.update((kind, [_start(kind) for _ in range(n)]) for kind, n in kinds.items())


def _start_next_spare() -> None:
    """Start the next spare of :data:`_PENDING`, if any is left."""
    if _PENDING:
        kind = _PENDING.pop(0)
        _SPARES.setdefault(kind, []).append(_start(kind))


def _start(kind: str) -> Any:
    import ray_actors
    import ray_fence_actors

    module = ray_actors if hasattr(ray_actors, kind) else ray_fence_actors
    return getattr(module, kind).remote()


def _up(actors: list[Any]) -> list[Any]:
    import ray

    ray.get([actor.__ray_ready__.remote() for actor in actors], timeout=120)
    return actors


@pytest.fixture(scope="session")
def ray_trainers(ray_cluster: None) -> list[Any]:
    """Two trainer actors (tests/ray_actors.py's ``Trainer``), up, shared by the tests
    that only receive with them; a test that kills one takes a :func:`spare`."""
    return _up(_SESSION["Trainer"])


@pytest.fixture(scope="session")
def ray_producer(ray_cluster: None) -> Any:
    """A producer actor (tests/ray_actors.py's ``Producer``), up, shared as
    :func:`ray_trainers` are by the tests that do not kill it."""
    return _up(_SESSION["Producer"])[0]


def spare(kind: str) -> Any:
    """An actor of class ``kind`` (tests/ray_actors.py's, or ray_fence_actors.py's) for
    one test, which may kill it: the one started early while it lasts, else a new one;
    up either way."""
    left = _SPARES.get(kind)
    if left:
        return _up([left.pop()])[0]
    if kind in _PENDING:  # asked for before its turn: started now, not again later
        _PENDING.remove(kind)
    return _up([_start(kind)])[0]


_FREE: list[str] = []  # names of emptied destinations, this process's


@pytest.fixture
def ray_url(ray_cluster: None) -> Iterator[str]:
    from rlwire.abc import SinkOptions
    from rlwire.transport import parse_url
    from rlwire.transport.ray import RaySink, create_board

    name = _FREE.pop() if _FREE else f"test-{uuid.uuid4().hex[:12]}"
    url = f"ray://{name}"
    yield url
    import ray

    _start_next_spare()
    if not any(actor.endswith(f":{name}") for actor in ray.util.list_named_actors()):
        # The test dropped its board: a board for a later test starts now, under a new
        # name, while the tests between run (an actor start takes a second or more).
        spare = f"test-{uuid.uuid4().hex[:12]}"
        create_board(spare)
        _FREE.append(spare)
        return
    sink = RaySink.from_url(parse_url(url), SinkOptions())
    try:  # emptied, and kept for the next test
        sink.open("overwrite")
    except Exception:  # a board the test broke is not reused
        return
    finally:
        sink.close()
    _FREE.append(name)
