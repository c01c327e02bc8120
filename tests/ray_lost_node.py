"""Three nodes on this machine (``ray.cluster_utils.Cluster``): the driver and the board
on the head, a producer actor on a second node, trainer actors on a third. The
producer's node is removed after the trainers read the first step: the later steps'
objects were stored on that node alone. Run as a script by
tests/transport/ray/test_ray.py (a process joins one Ray cluster only); prints what the
trainers saw as JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray_actors import Producer, Trainer, fingerprint, step_batches

from rlwire.transport.ray import create_board

STORE = 256 << 20
STEPS, RANKS, TOKENS = 3, 2, 1 << 14  # objects of ~1 MB: they live in the object store


def main() -> dict[str, Any]:
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE}
    )
    try:
        rollout = cluster.add_node(num_cpus=1, object_store_memory=STORE, resources={"rollout": 1})
        cluster.add_node(num_cpus=1, object_store_memory=STORE, resources={"train": 1})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        create_board("lost-node")
        url = "ray://lost-node"
        producer = Producer.options(resources={"rollout": 0.1}).remote()  # type: ignore[attr-defined]
        trainers = [
            Trainer.options(resources={"train": 0.1}).remote()  # type: ignore[attr-defined]
            for _ in range(RANKS)
        ]
        sent = ray.get(producer.send.remote(url, STEPS, RANKS, True, TOKENS), timeout=120)
        first = ray.get([t.take.remote(url, rank, 0, 1) for rank, t in enumerate(trainers)])
        cluster.remove_node(rollout)
        rest = ray.get(
            [t.take_each.remote(url, rank, STEPS + 2) for rank, t in enumerate(trainers)],
            timeout=120,
        )
        expected = [
            [fingerprint(step_batches(step, RANKS, TOKENS)[rank]) for step in range(STEPS)]
            for rank in range(RANKS)
        ]
        return {
            "board_owned": sent["board_owned"],
            "first_exact": [
                [[step, prints] for step, prints in taken] == [[0, expected[rank][0]]]
                for rank, taken in enumerate(first)
            ],
            "rest": [
                [
                    ["exact" if seen[2] == expected[rank][seen[1]] else "wrong", seen[1]]
                    if seen[0] == "step"
                    else seen
                    for seen in taken
                ]
                for rank, taken in enumerate(rest)
            ],
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    json.dump(main(), sys.stdout)
