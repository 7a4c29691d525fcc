"""Finding the GPU nodes a real cluster has, and the ones whose device plugin holds GPUs back.

What the clouds label (and do not): GKE sets cloud.google.com/gke-accelerator
(https://cloud.google.com/kubernetes-engine/docs/how-to/gpus), AKS kubernetes.azure.com/accelerator
(https://learn.microsoft.com/azure/aks/gpu-cluster), EKS accelerated AMIs with the plain device
plugin set no GPU label; only the GPU Operator's feature discovery sets nvidia.com/gpu.present
(https://github.com/NVIDIA/k8s-device-plugin#labels). Every one of them registers the GPU resource,
so a node's status.capacity is where GPUs show.

NVIDIA's device plugin marks a GPU unhealthy on any XID but the application ones it skips (13, 31,
43, 45, 68, 109) and on a GPU NVML cannot reach; the kubelet then reports allocatable below
capacity, while capacity stays (github.com/NVIDIA/k8s-device-plugin, internal/rm/health.go and the
README's DP_DISABLE_HEALTHCHECKS)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.cli import main
from sweeper.fleet import NodeView
from sweeper.history import History
from sweeper.policy import HOLDING
from sweeper.sweep import Sweep
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

GPU = "nvidia.com/gpu"


def plain_fleet(**kw: Any) -> dict[str, Any]:
    """Three GPU nodes as EKS's accelerated AMIs bring them (no GPU Operator labels), one CPU node."""
    spec = fleet_spec(nodes=3, **kw)
    spec["node_groups"][0]["gpu_operator"] = False
    spec["node_groups"].append({"name_prefix": "cpu-", "count": 1, "instance_type": "m7i.4xlarge", "age": "2d"})
    return spec


def no_gpu_operator_labels(sim: Sim) -> bool:
    return not any("nvidia.com/gpu.present" in (n.metadata.labels or {}) for n in sim.core.list_node().items)


def allocatable(sim: Sim, node: str) -> str:
    return str(sim.core.read_node(node).status.allocatable.get(GPU))


def test_plan_finds_gpu_nodes_by_capacity_without_gpu_operator_labels(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(plain_fleet())
    assert no_gpu_operator_labels(sim)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"max_percent": 100}))
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"), "--config", str(cfg)]
    res = CliRunner().invoke(main, ["plan", *base])
    assert res.exit_code == 0, res.output
    assert "3 GPU nodes found (by capacity of nvidia.com/gpu, amd.com/gpu, nvidia.com/mig-*)" in res.stdout
    res = CliRunner().invoke(main, ["plan", *base, "--json"])
    plan = json.loads(res.stdout)
    assert plan["gpu_nodes"] == 3 and sorted(n["node"] for n in plan["nodes"]) == ["gpu-00", "gpu-01", "gpu-02"]
    assert {n["reason"] for n in plan["nodes"]} == {"idle"}


def test_plan_says_what_it_looked_for_when_it_finds_no_gpu_node(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(plain_fleet())
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"gpu_node_selector": "nvidia.com/gpu.present=true"}))
    res = CliRunner().invoke(main, ["plan", "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"),
                                    "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert ("0 GPU nodes found (by capacity of nvidia.com/gpu, amd.com/gpu, nvidia.com/mig-*, "
            "selector nvidia.com/gpu.present=true)") in res.stdout
    assert "device plugin" in res.stdout and "gpu_node_selector" in res.stdout


def test_a_sweep_without_gpu_operator_labels_sweeps_the_gpu_nodes_only(make_sim, history: History) -> None:
    sim: Sim = make_sim(plain_fleet())
    assert no_gpu_operator_labels(sim)
    report = run_sweep(sim, history)
    assert report.plan.gpu_nodes == 3
    assert sorted((o.node, o.verdict) for o in report.outcomes) == [("gpu-00", "pass"), ("gpu-01", "pass"),
                                                                     ("gpu-02", "pass")]


def test_the_device_plugin_holds_back_gpus_on_critical_xids_and_a_reboot_restores_them(make_sim) -> None:
    sim: Sim = make_sim(nodes=5, faults={
        "gpu-00": {"xids": [{"code": 79, "gpu": 3}]},  # fallen off the bus: critical
        "gpu-01": {"xids": [{"code": 13, "gpu": 1}, {"code": 31, "gpu": 2}]},  # application errors: skipped
        "gpu-02": {"gpu_lost": [4, 6]},
        "gpu-03": {"xids": [{"code": 48, "gpu": 5, "at": "2h"}]},  # a double-bit ECC error, later
    })
    sim.cluster.clock.freeze()
    assert [allocatable(sim, f"gpu-0{i}") for i in range(5)] == ["7", "8", "6", "8", "8"]
    assert {str(n.status.capacity[GPU]) for n in sim.core.list_node().items} == {"8"}
    sim.cluster.clock.advance(3 * 3600)
    sim.wait_for(lambda: allocatable(sim, "gpu-03") == "7", what="the XID 48 to mark GPU 5 unhealthy")
    with sim.cluster.store.lock:
        sim.cluster.reboot("gpu-00", sim.cluster.clock.now())
        sim.cluster.reboot("gpu-02", sim.cluster.clock.now())
    sim.cluster.clock.advance(60)
    sim.wait_for(lambda: allocatable(sim, "gpu-00") == "8" and allocatable(sim, "gpu-02") == "8",
                 what="the reboots to clear the unhealthy GPUs")
    assert allocatable(sim, "gpu-03") == "7"


def test_a_node_with_7_of_8_gpus_allocatable_is_swept_first_and_held(make_sim, history: History) -> None:
    """Four idle nodes never swept and room for one: the node whose device plugin lost a GPU goes
    first, its check Job requests the 7 GPUs that are allocatable, and the missing one is a finding."""
    sim: Sim = make_sim(nodes=4, faults={"gpu-03": {"gpu_lost": [5]}})
    cfg = TEST_CONFIG.with_overrides(max_nodes=1)
    plan = Sweep(sim.kube, cfg, history, clock=sim.cluster.clock, dry_run=True).discover()
    assert [(d.node.name, d.detail) for d in plan.take] == [
        ("gpu-03", "never swept; suspect: allocatable 7 of 8 nvidia.com/gpu")]
    report = run_sweep(sim, history, cfg)
    [outcome] = report.outcomes
    assert outcome.node == "gpu-03" and outcome.verdict in HOLDING and outcome.action == "held"
    # The cause is what Sweeper reads itself (NVML lost GPU 5); the plugin's mark is its symptom (issue 21).
    assert outcome.reasons[0].startswith("gpu.lost (GPU 5)"), outcome.reasons
    recorded = list(history.db.query("select node, source, status, message from checks "
                                     "where name = 'gpu.allocatable'"))
    assert [(r["node"], r["source"], r["status"]) for r in recorded] == [("gpu-03", "device-plugin", "warn")]
    assert recorded[0]["message"].startswith("1 nvidia.com/gpu unhealthy per the device plugin: allocatable 7 of 8: "
                                             "a symptom of Sweeper's own findings (gpu.lost GPU_LOST on GPU 5)")


def test_the_device_plugin_alone_holds_a_node_whose_checks_pass(make_sim, history: History) -> None:
    """The node's own checks see nothing wrong; the kubelet reports a GPU short of capacity (as it
    does after the plugin marks one unhealthy), and no device plugin pod is there to restart. The
    node must not pass: it is held for a person with why, not rebooted (issue 21)."""
    sim: Sim = make_sim(nodes=2)
    sim.kube.patch_node_status("gpu-01", {"status": {"allocatable": {GPU: "7"}}})
    assert allocatable(sim, "gpu-01") == "7"
    report = run_sweep(sim, history)
    verdicts = {o.node: (o.verdict, o.reasons) for o in report.outcomes}
    assert verdicts["gpu-00"][0] == "pass"
    verdict, reasons = verdicts["gpu-01"]
    assert verdict == "quarantine", reasons
    assert reasons == ["gpu.allocatable: 1 nvidia.com/gpu unhealthy per the device plugin: allocatable 7 of 8; "
                       "Sweeper's own readings are clean (no XID in the kernel log): no device plugin pod on the "
                       "node matches device_plugin_pods (gpu-operator/app=nvidia-device-plugin-daemonset, "
                       "kube-system/app.kubernetes.io/name=nvidia-device-plugin, "
                       "nvidia-device-plugin/app.kubernetes.io/name=nvidia-device-plugin)"]


def test_the_check_job_requests_what_is_allocatable(make_sim) -> None:
    sim: Sim = make_sim(nodes=1, faults={"gpu-00": {"gpu_lost": [1, 2]}})
    view = NodeView.from_obj(sim.kube.get_node("gpu-00"), TEST_CONFIG.gpu_resources)
    assert (view.gpus, view.capacity, view.allocatable) == (6, {GPU: 8}, {GPU: 6})
    ctx = ActionContext(config=TEST_CONFIG, node={"name": "gpu-00", "labels": view.labels, "gpus": view.gpus,
                                                  "profile": {"check_args": []}})
    job = render_job(ctx, "sweeper-check.yaml.j2", 60, {})
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"][GPU] == resources["limits"][GPU] == "6"
