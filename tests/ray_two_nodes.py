"""Two nodes on this machine (``ray.cluster_utils.Cluster``: each its own raylet and
object store): a producer actor on one, trainer actors on the other. Run as a script by
tests/transport/ray/test_ray.py, since a process joins one Ray cluster only and the
tests' own is already joined; prints what it saw as JSON."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray_actors import Producer, Trainer, fingerprint, step_batches

from rlwire.transport.ray import create_board

STORE = 256 << 20
STEPS, RANKS, TOKENS = 3, 2, 1 << 14  # objects of ~1 MB: they live in the object store


def main() -> dict[str, Any]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": STORE, "resources": {"rollout": 1}},
    )
    try:
        cluster.add_node(num_cpus=1, object_store_memory=STORE, resources={"train": 1})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        create_board("two-nodes")  # the driver's, on the head
        url = "ray://two-nodes"
        producer = Producer.options(resources={"rollout": 0.1}).remote()  # type: ignore[attr-defined]
        trainers = [
            Trainer.options(resources={"train": 0.1}).remote()  # type: ignore[attr-defined]
            for _ in range(RANKS)
        ]
        nodes = ray.get([producer.node.remote()] + [t.node.remote() for t in trainers])
        # Boards the driver makes are on its node (the head), not spread over the nodes.
        boards = [create_board(f"placed-{i}") for i in range(4)]
        ray.get([b.steps.remote() for b in boards])  # alive, so placed
        placed = [ray._private.state.actors(b._actor_id.hex())["Address"]["NodeID"] for b in boards]
        sent = ray.get(producer.send.remote(url, STEPS, RANKS, True, TOKENS), timeout=120)
        canary = ray.get(producer.canary.remote())[0]
        ray.kill(producer)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the store dropped what it owned
            try:
                ray.get(canary, timeout=30)
            except (ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError):
                break
            time.sleep(0.05)
        got = ray.get([t.take.remote(url, rank, 0, None) for rank, t in enumerate(trainers)])
        expected = [
            [(step, fingerprint(step_batches(step, RANKS, TOKENS)[rank])) for step in range(STEPS)]
            for rank in range(RANKS)
        ]
        # Ray returns the trainers' tuples as lists.
        exact = [[(step, prints) for step, prints in taken] for taken in got] == expected
        driver = ray.get_runtime_context().get_node_id()
        return {
            "nodes": nodes,
            "board_owned": sent["board_owned"],
            "exact": exact,
            "boards_on_driver_node": all(node == driver for node in placed),
            "placed": [driver, *placed],
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    json.dump(main(), sys.stdout)
