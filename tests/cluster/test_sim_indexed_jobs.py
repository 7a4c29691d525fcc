"""The simulated control plane's side of pair sweeps, through the official client: fabric device
plugin resources accounted like GPUs, Indexed Jobs, and required pod anti-affinity."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client

from tests.conftest import Sim, fleet_spec

EFA = "vpc.amazonaws.com/efa"


def _pod(name: str, resources: dict[str, str], node: str | None = None,
         selector: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(restart_policy="Never", node_name=node, node_selector=selector, containers=[
            client.V1Container(name="c", image="busybox", command=["sleep", "inf"],
                               resources=client.V1ResourceRequirements(limits=resources))]))


def test_nodes_advertise_their_fabric_devices(make_sim: Callable[..., Sim]) -> None:
    """EFA devices as AWS's EFA device plugin names them, one per device the node has (a missing
    device is not advertised); InfiniBand HCAs as the RDMA shared device plugin's `rdma/ib`; none on
    GKE's A3 High, whose GPUDirect-TCPX NICs come through multi-networking, not a device plugin."""
    spec = fleet_spec(nodes=2, faults={"gpu-01": {"nics_missing": 2}})
    spec["node_groups"] += [{"name_prefix": "en-", "count": 1, "instance_type": "p5en.48xlarge"},
                            {"name_prefix": "nd-", "count": 1, "instance_type": "Standard_ND96isr_H100_v5"},
                            {"name_prefix": "a3-", "count": 1, "instance_type": "a3-highgpu-8g"},
                            {"name_prefix": "p4-", "count": 1, "instance_type": "p4d.24xlarge"}]
    sim = make_sim(spec)
    cap = {n.metadata.name: n.status.capacity for n in sim.core.list_node().items}
    alloc = {n.metadata.name: n.status.allocatable for n in sim.core.list_node().items}
    assert cap["gpu-00"][EFA] == alloc["gpu-00"][EFA] == "32"
    assert cap["gpu-01"][EFA] == "30"
    assert cap["en-00"][EFA] == "16" and cap["p4-00"][EFA] == "4"
    assert cap["nd-00"]["rdma/ib"] == "8" and EFA not in cap["nd-00"]
    assert not any("/" in r and r != "nvidia.com/gpu" for r in cap["a3-00"])


def test_the_scheduler_and_kubelet_account_fabric_devices_like_gpus(make_sim: Callable[..., Sim]) -> None:
    """Extended resources are integers the scheduler subtracts per node, as it does for GPUs
    (https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources);
    a pod bound past the scheduler that asks for more than is left fails the kubelet's admission
    with UnexpectedAdmissionError."""
    sim = make_sim(nodes=1)
    core = sim.core
    core.create_namespaced_pod("default", _pod("first", {EFA: "32"}))
    sim.wait_for(lambda: core.read_namespaced_pod("first", "default").status.phase == "Running", what="first running")
    # No GPU asked for, so GPUs are not what stops the second pod: the EFA devices are.
    core.create_namespaced_pod("default", _pod("second", {EFA: "1"}))
    cond = sim.wait_for(lambda: (core.read_namespaced_pod("second", "default").status.conditions or [None])[0],
                        what="second considered")
    assert cond.reason == "Unschedulable"
    assert cond.message == f"0/1 nodes are available: 1 Insufficient {EFA}."
    core.create_namespaced_pod("default", _pod("forced", {EFA: "4"}, node="gpu-00"))
    forced = sim.wait_for(lambda: (p := core.read_namespaced_pod("forced", "default")).status.phase == "Failed" and p,
                          what="admission refusal")
    assert forced.status.reason == "UnexpectedAdmissionError"
    assert f"unavailable for {EFA}. Requested: 4, Available: 0" in forced.status.message
    # A node with no such resource at all is as full as one whose devices are all taken.
    core.create_namespaced_pod("default", _pod("ib", {"rdma/ib": "1"}))
    cond = sim.wait_for(lambda: (core.read_namespaced_pod("ib", "default").status.conditions or [None])[0],
                        what="ib considered")
    assert "Insufficient rdma/ib" in cond.message
    # The first pod ends: its devices are free again and the waiting pod runs.
    core.delete_namespaced_pod("first", "default")
    sim.wait_for(lambda: core.read_namespaced_pod("second", "default").status.phase == "Running", what="second runs")
