"""A real local Ray cluster for the tests, started once per test process.

``ray_cluster`` (session scope) starts Ray on this machine with a small object store
and no dashboard, the first time a test asks for it, and shuts it down at the end of
the session. Under pytest-xdist each worker process that runs a Ray test starts its own
cluster (Ray runs several on one machine, each on its own ports); the others start none.
``ray_url`` gives an empty ``ray://`` destination per test and empties it after the test
(as ``on_existing="overwrite"`` does), so that no test's steps stay in the object store.
Destinations are reused from test to test: a board is an actor, a new process that takes
half a second to start here, while emptying one takes a millisecond. For the same reason
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

__all__ = ["OBJECT_STORE_BYTES", "ray_cluster", "ray_producer", "ray_trainers", "ray_url"]

#: The object store of the test cluster: room for the largest test step many times over.
OBJECT_STORE_BYTES = 512 << 20

_SRC = str(Path(__file__).resolve().parents[1] / "src")


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
    )
    try:
        yield
    finally:
        ray.shutdown()
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="session")
def ray_trainers(ray_cluster: None) -> list[Any]:
    """Two trainer actors (tests/ray_actors.py's ``Trainer``), up, shared by the tests
    that only receive with them; a test that kills one starts its own. An actor is a
    new process, which took 3-9 s to start while the rest of the suite ran."""
    return _started("Trainer", 2)


@pytest.fixture(scope="session")
def ray_producer(ray_cluster: None) -> Any:
    """A producer actor (tests/ray_actors.py's ``Producer``), up, shared as
    :func:`ray_trainers` are by the tests that do not kill it."""
    return _started("Producer", 1)[0]


def _started(name: str, count: int) -> list[Any]:
    import ray
    import ray_actors

    actors = [getattr(ray_actors, name).remote() for _ in range(count)]
    ray.get([actor.node.remote() for actor in actors], timeout=120)
    return actors


_FREE: list[str] = []  # names of emptied destinations, this process's


@pytest.fixture
def ray_url(ray_cluster: None) -> Iterator[str]:
    from rlwire.abc import SinkOptions
    from rlwire.transport import parse_url
    from rlwire.transport.ray import RaySink

    name = _FREE.pop() if _FREE else f"test-{uuid.uuid4().hex[:12]}"
    url = f"ray://{name}"
    yield url
    import ray

    # A board the test dropped is not made again (an actor start): the next test makes
    # its own if it needs one.
    if not any(actor.endswith(f":{name}") for actor in ray.util.list_named_actors()):
        return
    sink = RaySink.from_url(parse_url(url), SinkOptions())
    try:  # emptied, and kept for the next test
        sink.open("overwrite")
    except Exception:  # a board the test broke is not reused
        return
    finally:
        sink.close()
    _FREE.append(name)
