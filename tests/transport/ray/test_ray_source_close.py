"""RaySource.close() lets go of the board's answer a wait kept for the next read: the
references it holds kept the step's objects in the object store for as long as the
closed receiver lived."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from helpers import make_batch

import rlwire

pytest.importorskip("ray")


def local_references() -> dict[Any, int]:
    """How many references to each object this process holds (Ray's own count, as
    ``ray memory`` shows it: a reference has no weakref)."""
    import ray

    counts = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
    return {object_id: count["local"] for object_id, count in counts.items()}


def test_close_lets_go_of_the_objects_a_wait_kept(ray_url: str) -> None:
    from rlwire.abc import SourceOptions
    from rlwire.transport import parse_url
    from rlwire.transport.ray import RaySource

    with rlwire.open_sync_sender(ray_url) as sender:
        source = RaySource.from_url(parse_url(ray_url), SourceOptions())
        assert source.read(0) is None  # not sent yet: the wait waits for step 0
        sender.send(make_batch(2, seed=1))
        gc.collect()
        before = local_references()
        source.wait(30)  # the board answers with step 0's objects, kept for the read
        kept = {o for o, n in local_references().items() if n > before.get(o, 0)}
        assert kept, "the wait kept no reference"
        source.close()
        gc.collect()
        after = local_references()
        assert {o: after.get(o, 0) for o in kept} == {o: before.get(o, 0) for o in kept}
