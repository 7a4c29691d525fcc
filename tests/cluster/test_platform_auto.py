"""`platform: auto` on EKS-, AKS- and GKE-like simulated fleets, with the shipped config over several
sweep cycles; and a check that cannot start anywhere, which stops the run (exit 5) with the
apiserver's words.

The shapes (sweeper/sim/fleet.py, `platform`): EKS's accelerated AMIs make NVIDIA's runtime
containerd's default and no RuntimeClass exists without the GPU Operator
(https://docs.aws.amazon.com/eks/latest/userguide/ml-eks-optimized-ami.html); AKS's GPU node images
likewise (https://learn.microsoft.com/azure/aks/gpu-cluster); GKE runs runc and its device plugin
mounts the driver, installed under /home/kubernetes/bin/nvidia, at /usr/local/nvidia
(https://cloud.google.com/kubernetes-engine/docs/how-to/gpus#cuda). The RuntimeClass admission
plugin refuses a pod that names a RuntimeClass that does not exist: `pod rejected: RuntimeClass
"nvidia" not found` (kubernetes plugin/pkg/admission/runtimeclass/admission.go,
https://kubernetes.io/docs/concepts/containers/runtime-class/)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sweeper.cli import main
from sweeper.config import Config
from sweeper.history import History
from tests.conftest import Sim, fleet_spec, run_sweep

# The shipped defaults (platform, runtime_class and dcgm_hostengine all `auto`), made quick for a test.
SHIPPED = Config(max_nodes=8, max_percent=100, min_node_age=600, poll_interval=5, check_timeout=1800,
                 run_deadline=0)
FOUND = {"eks": "label eks.amazonaws.com/nodegroup", "aks": "label kubernetes.azure.com/cluster",
         "gke": "label cloud.google.com/gke-nodepool"}


@pytest.mark.parametrize("platform", ["eks", "aks", "gke"])
def test_the_shipped_config_sweeps_a_managed_fleet_over_several_cycles(make_sim, history: History,
                                                                       platform: str) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=3, platform=platform))
    pods = check_pods(sim)
    node = sim.core.read_node("gpu-00")
    assert "nvidia.com/gpu.present" not in (node.metadata.labels or {}), "no GPU Operator on a managed shape"
    assert client.NodeV1Api(sim.api_client).list_runtime_class().items == []
    for cycle in range(3):
        report = run_sweep(sim, history, SHIPPED)
        assert sorted((o.node, o.verdict) for o in report.outcomes) == [
            ("gpu-00", "pass"), ("gpu-01", "pass"), ("gpu-02", "pass")], (cycle, report.outcomes)
        assert not report.tool_stop and not report.tool_errors
        assert any(f"platform {platform}" in n and FOUND[platform] in n for n in report.plan.notes), report.plan.notes
        assert any("no RuntimeClass nvidia" in n for n in report.plan.notes)
        sim.cluster.clock.advance(SHIPPED.interval + 60)
    assert pods and all(not p["spec"].get("runtimeClassName") for p in pods), "none named where none exists"
    checks = {c["name"] for c in history.db.query("select name from checks where status = 'pass'")}
    assert "gpu.count" in checks or any(n.startswith("gpu.") for n in checks), checks


def check_pods(sim: Sim) -> list[dict]:
    """Every check pod the run made, as it was when its Job was cleaned up."""
    pods: list[dict] = []
    sim.cluster.store.on_delete.append(
        lambda plural, obj: pods.append(obj) if plural == "pods" and obj["metadata"].get("namespace") == "sweeper-checks"
        else None)
    return pods


def test_a_gpu_operator_fleet_names_its_runtime_class(make_sim, history: History) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=2))
    pods = check_pods(sim)
    report = run_sweep(sim, history, SHIPPED)
    assert {o.verdict for o in report.outcomes} == {"pass"}
    assert any("RuntimeClass nvidia exists (the GPU Operator's)" in n for n in report.plan.notes), report.plan.notes
    assert pods and {p["spec"].get("runtimeClassName") for p in pods} == {"nvidia"}


def test_gke_without_its_driver_mount_is_not_a_pass(make_sim, history: History) -> None:
    """The simulated kubelet as GKE's node: under runc, a check pod sees the driver only through the
    device plugin's /usr/local/nvidia on its library path. A config that names the wrong platform
    gets no NVML there: an `error`, never a pass and never a node fault."""
    sim: Sim = make_sim(fleet_spec(nodes=2, platform="gke"))
    report = run_sweep(sim, history, replace(SHIPPED, platform="eks"))
    assert {o.verdict for o in report.outcomes} == {"error"}, report.outcomes
    again = run_sweep(sim, history, replace(SHIPPED, interval=1))
    assert {o.verdict for o in again.outcomes} == {"pass"}, again.outcomes


def test_the_simulated_apiserver_refuses_a_pod_naming_a_missing_runtime_class(make_sim) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=1, platform="eks"))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"runtimeClassName": "nvidia", "containers": [{"name": "c", "image": "busybox:1.36"}]}}
    with pytest.raises(ApiException) as exc:
        sim.core.create_namespaced_pod("default", pod)
    assert exc.value.status == 403
    body = json.loads(exc.value.body)
    assert (body["reason"], body["message"]) == (
        "Forbidden", 'pods "p" is forbidden: pod rejected: RuntimeClass "nvidia" not found')


def cli_sweep(sim: Sim, tmp_path: Path, **cfg: object) -> object:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"max_nodes": 8, "max_percent": 100, "poll_interval": 0.02,
                                    "check_timeout": 1800, "light_playbook": "", **cfg}))
    return CliRunner().invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--state",
                                     str(tmp_path / "h.db"), "--config", str(path), "--json"])


def test_a_check_that_cannot_start_anywhere_stops_the_run_with_exit_5(make_sim, tmp_path: Path) -> None:
    """Two nodes, fewer than tool_error_limit (3): every check pod refused at admission for one cause
    is still a stopped run, exit 5 with the apiserver's words, never exit 0 with nothing checked."""
    sim: Sim = make_sim(fleet_spec(nodes=2, platform="eks"))
    res = cli_sweep(sim, tmp_path, platform="generic")
    assert res.exit_code == 5, res.output  # type: ignore[attr-defined]
    assert 'pod rejected: RuntimeClass "nvidia" not found' in res.stderr  # type: ignore[attr-defined]
    report = json.loads(res.stdout)  # type: ignore[attr-defined]
    assert [n["verdict"] for n in report["nodes"]] == ["error", "error"]
    res = cli_sweep(sim, tmp_path, interval="1s")  # the shipped `platform: auto`
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert {n["verdict"] for n in json.loads(res.stdout)["nodes"]} == {"pass"}, res.output  # type: ignore[attr-defined]


def test_plan_says_what_it_found_and_why_the_budget_is_one(make_sim, tmp_path: Path) -> None:
    """A fleet under ten GPU nodes at the default max_percent (10%) gets one node at a time, not
    none; `plan` says so, and what it found of the platform."""
    sim: Sim = make_sim(fleet_spec(nodes=4, platform="gke"))
    path = tmp_path / "config.yaml"
    path.write_text("min_node_age: 10m\n")
    res = CliRunner().invoke(main, ["plan", "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"),
                                    "--config", str(path), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["budget"] == 1
    assert doc["platform"] == {"platform": "gke", "runtime_class": "", "dcgm_hostengine": ""}
    assert any("rounds down to none" in n for n in doc["notes"]), doc["notes"]
    assert any("/usr/local/nvidia" in n for n in doc["notes"]), doc["notes"]
    path.write_text("min_node_age: 10m\nmax_nodes: 0\n")
    res = CliRunner().invoke(main, ["plan", "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"),
                                    "--config", str(path), "--json"])
    assert json.loads(res.stdout)["budget"] == 0
