"""What the simulated fleet tells `sweeper cohorts`: the topology labels each platform puts on a
node (a rack of 16 nodes, a block of 4 racks) and a driver rollout to part of the fleet that fails
more often than the rest, so that a test or the demo can watch a bad rollout stand apart."""

from __future__ import annotations

import hashlib
import random
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

RACK = 16  # nodes a rack (the closest switch), by the number in the node's name
BLOCK = 4  # racks a block


class Rollout(BaseModel):
    """A fleet file's `rollouts` entry: `share` of the fleet's nodes (picked with its seed) run
    `driver`, and each fails its check on a simulated day with probability `fail_rate`."""

    model_config = ConfigDict(extra="forbid")
    driver: Annotated[str, Strict(), Field(pattern=r"^\d{3,4}\.\d+(\.\d+)?$")]
    share: Annotated[float, Strict(), Field(gt=0, le=1)] = 0.25
    fail_rate: Annotated[float, Strict(), Field(ge=0, le=1)] = 0.05


def topology_labels(platform: str, name: str) -> dict[str, str]:
    """The network topology labels of a node on this platform: EKS's network node layers
    (https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html), GKE's block,
    sub-block and host of a reservation's physical topology, and elsewhere NVIDIA Topograph's
    leaf and spine (https://docs.nvidia.com/topograph/reference/node-labels-and-annotations)."""
    m = re.search(r"(\d+)$", name)
    i = int(m.group(1)) if m else int(hashlib.sha1(name.encode()).hexdigest()[:6], 16)
    rack, block = i // RACK, i // (RACK * BLOCK)
    if platform == "eks":
        return {"topology.k8s.aws/network-node-layer-1": "nn-0a1b2c3d4e5f60001",
                "topology.k8s.aws/network-node-layer-2": f"nn-0b{block:015x}",
                "topology.k8s.aws/network-node-layer-3": f"nn-0c{rack:015x}"}
    if platform == "gke":
        return {"cloud.google.com/gce-topology-block": f"block-{block:04x}",
                "cloud.google.com/gce-topology-subblock": f"subblock-{rack:04x}",
                "cloud.google.com/gce-topology-host": hashlib.sha1(name.encode()).hexdigest()[:16]}
    return {"network.topology.nvidia.com/leaf": f"leaf-{rack:02d}", "network.topology.nvidia.com/spine":
            f"spine-{block:02d}"}


def apply_rollouts(nodes: list[Any], rollouts: list[Rollout], seed: int, fail_rate: float) -> None:
    """Every node fails a day with `fail_rate` (the fleet's baseline); each rollout moves its share of
    the nodes not yet moved to its driver, with its own rate."""
    rng = random.Random(f"{seed}/rollouts")
    for n in nodes:
        n.fail_rate = fail_rate
    free = [n for n in nodes]
    for r in rollouts:
        for n in rng.sample(free, min(len(free), round(r.share * len(nodes)))):
            n.driver, n.fail_rate = r.driver, r.fail_rate
            free.remove(n)


def fails_on(seed: int, node: str, day: int, rate: float) -> bool:
    """Whether the node fails on this simulated day: the same answer for every check that day."""
    if rate <= 0:
        return False
    h = hashlib.sha256(f"{seed}/{node}/{day}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < rate
