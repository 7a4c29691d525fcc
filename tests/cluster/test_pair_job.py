"""`run_pair_job` against the simulated cluster: a headless Service and an Indexed Job of two pods,
one on each node through the scheduler, both logs read, both objects always deleted.

The pattern is Kubernetes' own for pods of one Job that talk to each other
(https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/); the simulated kubelet
runs the pair as a gang and prints what pair-allreduce prints (iputils' ping, an nccl-tests-shaped
table), from each node's fabric faults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sweeper.actions import ActionContext, load_all
from sweeper.config import Config
from sweeper.errors import PlaybookError
from sweeper.history import History
from sweeper.profiles import load_profile
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

ROOT = Path(__file__).resolve().parent.parent.parent
P5 = load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()


ND = load_profile(ROOT / "profiles" / "azure-nd-h100-v5.yaml").as_vars()


def node_vars(sim: Sim, name: str) -> dict[str, Any]:
    obj = sim.kube.get_node(name)
    return {"name": name, "gpus": 8, "labels": obj["metadata"].get("labels") or {},
            "annotations": obj["metadata"].get("annotations") or {}, "profile": ND if name.startswith("nd-") else P5}


def run_pair(sim: Sim, a: str = "gpu-00", b: str = "gpu-01", cfg: Config = TEST_CONFIG,
             cancelled: Callable[[], bool] = lambda: False,
             **args: Any) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    intents: list[tuple[str, str, str]] = []
    ctx = ActionContext(config=cfg, clock=sim.cluster.clock, kube=sim.kube, node=node_vars(sim, a),
                        partner=node_vars(sim, b), run_id="sw-pair-1", cancelled=cancelled,
                        intent=lambda op, phase, detail: intents.append((op, phase, detail)))
    act = load_all()["run_pair_job"]
    out = act.fn(ctx, act.validate({"timeout": "30m", **args}, "test"))
    return out, intents


def leftovers(sim: Sim) -> tuple[list[str], list[str]]:
    jobs = [j.metadata.name for j in sim.batch.list_namespaced_job(TEST_CONFIG.check_namespace).items]
    services = [s.metadata.name for s in sim.core.list_namespaced_service(TEST_CONFIG.check_namespace).items]
    return jobs, services


def test_a_healthy_pair_passes_and_leaves_nothing_behind(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(nodes=2)
    out, intents = run_pair(sim)
    assert out["status"] == "pass", out
    assert out["failed"] is False and out["changed"] is True
    assert 350 <= out["busbw"] <= 479 * 1.03, "the healthy two-node p5 peak, above the profile's floor"
    result = out["result"]
    assert result["node"] == "gpu-00"
    mtu = [c["message"].split(":")[0] for c in result["checks"] if c["name"] == "pair.mtu"]
    assert mtu == ["eth0 gpu-00 -> gpu-01", "eth0 gpu-01 -> gpu-00"]
    name = out["job"]
    assert name.startswith("sweep-pair-gpu-00-")
    assert [(op, phase) for op, phase, _ in intents] == [
        ("create-service", "before"), ("create-service", "after"), ("create-job", "before"), ("create-job", "after"),
        ("delete-job", "before"), ("delete-job", "after"), ("delete-service", "before"), ("delete-service", "after")]
    assert leftovers(sim) == ([], [])


@pytest.mark.parametrize("faults,code", [
    ({"link_degraded": 0.4}, "LOW_BANDWIDTH"),
    ({"path_mtu": {"eth0": 1500}}, "PATH_MTU"),
    ({"fabric_corrupt": True}, "NCCL_WRONG"),
])
def test_a_fabric_fault_on_either_node_fails_the_pair(make_sim: Callable[..., Sim], faults: dict[str, Any],
                                                      code: str) -> None:
    sim = make_sim(nodes=2, faults={"gpu-01": faults})
    out, _ = run_pair(sim)
    assert out["status"] == "fail", out
    assert code in {c.get("code") for c in out["result"]["checks"] if c["status"] == "fail"}, out["result"]
    assert leftovers(sim) == ([], [])


def test_a_pair_whose_partner_is_taken_is_inconclusive(make_sim: Callable[..., Sim]) -> None:
    """Someone else holds the partner's GPUs: the second pod cannot land, which is no verdict on
    either node; the Job and the Service are deleted all the same."""
    sim = make_sim(nodes=2, workloads=[{"node": "gpu-01", "gpus": 8, "duration": None}])
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="training pod")
    out, intents = run_pair(sim)
    assert out["status"] == "inconclusive", out
    assert "never scheduled" in out["msg"] and out["busbw"] is None
    assert ("delete-service", "after") in [(op, phase) for op, phase, _ in intents]
    assert leftovers(sim) == ([], [])


def test_a_pair_without_a_partner_is_refused(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(nodes=1)
    ctx = ActionContext(config=TEST_CONFIG, clock=sim.cluster.clock, kube=sim.kube, node=node_vars(sim, "gpu-00"))
    act = load_all()["run_pair_job"]
    with pytest.raises(PlaybookError, match="partner"):
        act.fn(ctx, act.validate({}, "test"))
    assert leftovers(sim) == ([], [])


def test_reconcile_deletes_the_service_a_dead_run_left(make_sim: Callable[..., Sim], history: History) -> None:
    """A run killed between its pair Service's create and delete leaves it behind; the next run's
    reconcile deletes it, as it deletes the dead run's Jobs. A Service that is not a pair sweep's
    (no component=pair label) is none of its business."""
    sim = make_sim(nodes=2)
    history.run_started("sw-dead", sim.cluster.clock.now() - 7200, "sweep")
    labels = {"app.kubernetes.io/managed-by": "sweeper", "app.kubernetes.io/component": "pair",
              "sweeper.dev/run-id": "sw-dead"}
    for name, extra in (("sweep-pair-gpu-00-dead00", labels), ("someone-elses", {"app": "web"})):
        sim.core.create_namespaced_service(TEST_CONFIG.check_namespace, {
            "metadata": {"name": name, "labels": extra}, "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}})
    report = run_sweep(sim, history)
    assert leftovers(sim)[1] == ["someone-elses"]
    assert {"service": "sweep-pair-gpu-00-dead00", "action": "deleted", "why": "left by run sw-dead"} in report.reconciled


def test_an_unpullable_pair_image_is_a_fault_of_the_tool(make_sim: Callable[..., Sim]) -> None:
    """Both pods wait with ErrImagePull, then ImagePullBackOff
    (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff): `error`, never
    `fail`, and a fault no pair result may hold against either node."""
    bad = "ghcr.io/sweeper-dev/nccl-pair:typo@sha256:" + "b" * 64  # the config's image (never a playbook var)
    sim = make_sim(fleet_spec(nodes=2, registry={"missing": [bad]}))
    out, _ = run_pair(sim, cfg=replace(TEST_CONFIG, pair_image=bad))
    assert out["status"] == "error" and out["failed"] is True, out
    (check,) = out["result"]["checks"]
    assert (check["name"], check["code"]) == ("check.tool", "ErrImagePull")
    assert bad in check["message"] and out["busbw"] is None
    assert leftovers(sim) == ([], [])


def test_a_stopped_sweep_leaves_the_pair_inconclusive(make_sim: Callable[..., Sim]) -> None:
    """SIGTERM mid-pair: no verdict on either node, and nothing left behind."""
    sim = make_sim(nodes=2)
    out, intents = run_pair(sim, cancelled=lambda: True)
    assert out["status"] == "inconclusive" and "stopped" in out["msg"], out
    assert [op for op, phase, _ in intents if phase == "after"][-2:] == ["delete-job", "delete-service"]
    assert leftovers(sim) == ([], [])


def test_an_infiniband_pair_takes_its_hcas_and_has_no_floor_to_meet(make_sim: Callable[..., Sim]) -> None:
    """Azure ND H100 v5: each pod takes the node's 8 `rdma/ib` devices (AKS's Network Operator
    names them so: https://azure.github.io/aks-rdma-infiniband/configurations/network-operator);
    the profile sets no two-node floor, so the bandwidth check is `skip` and the pair passes."""
    spec = fleet_spec(nodes=0)
    spec["node_groups"] = [{"name_prefix": "nd-", "count": 2, "instance_type": "Standard_ND96isr_H100_v5", "age": "2d"}]
    sim = make_sim(spec)
    out, _ = run_pair(sim, "nd-00", "nd-01")
    assert out["status"] == "pass", out
    skipped = [c for c in out["result"]["checks"] if c["status"] == "skip"]
    assert [c["name"] for c in skipped] == ["pair.nccl"] and out["busbw"] > 0
    assert leftovers(sim) == ([], [])
