"""A label is no identity: a pod anyone creates in a namespace of their own may carry
`app.kubernetes.io/managed-by=sweeper` (labels are free-form metadata that the creator sets,
https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/). Only a pod so
labelled in one of Sweeper's own namespaces is Sweeper's; an impostor elsewhere is a workload, which
a sweep never disturbs and whose wait for GPUs stops a sweep. Against the simulated cluster over HTTP."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sweeper.history import History
from tests.cluster.test_gate import CFG, GATE, gated_fleet, taints
from tests.conftest import TEST_CONFIG, Sim, run_sweep

GPU = "nvidia.com/gpu"


def impostor(name: str, node: str | None = None, gpus: int = 8, namespace: str = "default") -> dict[str, Any]:
    """A user's GPU pod labelled as Sweeper's, tolerating Sweeper's taints (and the gate's)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "tolerations": [{"key": k, "operator": "Exists", "effect": "NoSchedule"}
                        for k in (GPU, GATE, TEST_CONFIG.taint_key)],
        "containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                        "command": ["torchrun", "train.py"],
                        "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "sweeper",
                                    "app.kubernetes.io/component": "check"}}}


def test_a_pod_labelled_as_sweepers_outside_its_namespaces_occupies_a_gated_node(make_sim, history: History) -> None:
    sim: Sim = make_sim(gated_fleet())
    sim.core.create_namespaced_pod("default", impostor("not-a-check", node="new-00"))
    report = run_sweep(sim, history, CFG)
    assert report.outcomes == [], "the gate takes no node with work on it"
    [d] = report.plan.gate
    assert d.reason == "gate-occupied" and "default/not-a-check" in d.detail, d
    assert [t["key"] for t in taints(sim, "new-00")] == [GATE]
    assert not sim.writes_to("new-00"), "not one write to the node"


def test_a_pod_labelled_as_sweepers_outside_its_namespaces_keeps_a_fleet_node_busy(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2)
    sim.core.create_namespaced_pod("default", impostor("not-a-check", node="gpu-01"))
    report = run_sweep(sim, history, replace(TEST_CONFIG, yield_to_pending=False))
    [d] = [d for d in report.plan.skip if d.node.name == "gpu-01"]
    assert d.reason == "busy" and "default/not-a-check" in d.detail, d
    # a busy node gets at most the light check beside its work (no GPU taken, never tainted)
    assert {o.node: o.action for o in report.outcomes}.get("gpu-01", "light") == "light", report.outcomes
    assert not [t for t in sim.kube.get_node("gpu-01")["spec"].get("taints") or []
                if t["key"] == TEST_CONFIG.taint_key]
    assert sim.core.read_namespaced_pod("not-a-check", "default").status.phase == "Running"


def test_a_pending_pod_labelled_as_sweepers_outside_its_namespaces_is_demand(make_sim, history: History) -> None:
    """16 GPUs fit on no 8-GPU node: the pod waits, and a sweep that yields to pending work takes nothing."""
    sim: Sim = make_sim(nodes=2)
    sim.core.create_namespaced_pod("default", impostor("waiting", gpus=16))
    report = run_sweep(sim, history, TEST_CONFIG)
    assert report.outcomes == []
    assert {d.reason for d in report.plan.skip} == {"demand"}
    assert all("default/waiting" in d.detail for d in report.plan.skip)


def test_a_pending_pod_of_sweepers_own_namespace_is_no_demand(make_sim, history: History) -> None:
    """The same pod in the check namespace is Sweeper's own (a check waiting for its node), not demand."""
    sim: Sim = make_sim(nodes=2)
    ns = TEST_CONFIG.check_namespace
    sim.core.create_namespaced_pod(ns, impostor("waiting", gpus=16, namespace=ns))
    report = run_sweep(sim, history, TEST_CONFIG)
    assert "demand" not in {d.reason for d in report.plan.skip}
    assert {o.node for o in report.outcomes} == {"gpu-00", "gpu-01"}
