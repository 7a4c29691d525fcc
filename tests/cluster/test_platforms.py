"""GPU pools as the managed platforms taint them, against the simulated cluster (its scheduler honours
taints and tolerations): GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule
(https://cloud.google.com/kubernetes-engine/docs/how-to/gpus), AKS GPU pools are commonly created
with --node-taints sku=gpu:NoSchedule (https://learn.microsoft.com/azure/aks/gpu-cluster). A taint
in `allowed_taint_keys` leaves the node sweepable, and the check Job tolerates it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, run_sweep


def taint_all(sim: Sim, taint: dict[str, str]) -> None:
    for n in sim.core.list_node().items:
        sim.kube.patch_node(n.metadata.name, [{"op": "add", "path": "/spec/taints", "value": [taint]}])


@pytest.mark.parametrize(("taint", "allowed"), [
    ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, ("nvidia.com/gpu", "amd.com/gpu")),
    ({"key": "sku", "value": "gpu", "effect": "NoSchedule"}, ("nvidia.com/gpu", "amd.com/gpu", "sku")),
], ids=["gke", "aks"])
def test_a_tainted_gpu_pool_is_swept(make_sim, history: History, taint: dict[str, str],
                                     allowed: tuple[str, ...]) -> None:
    sim: Sim = make_sim(nodes=2)
    taint_all(sim, taint)
    report = run_sweep(sim, history, replace(TEST_CONFIG, allowed_taint_keys=allowed))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "pass"}


def test_a_pool_taint_not_allowed_means_someone_else_has_the_node(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2)
    taint_all(sim, {"key": "sku", "value": "gpu", "effect": "NoSchedule"})
    report = run_sweep(sim, history, TEST_CONFIG)
    assert report.outcomes == [] and report.plan.take == []
