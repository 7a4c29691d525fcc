"""GPUs through Dynamic Resource Allocation, and Kueue's queued demand (issue 25, point 5).

What the platform does, and where it says so:
- DRA is GA in Kubernetes 1.34 as resource.k8s.io/v1. A driver publishes a node's devices in
  ResourceSlices (spec.driver, spec.nodeName, spec.pool, spec.devices[].name/attributes); a pod names
  claims in spec.resourceClaims (a resourceClaimName, or a resourceClaimTemplateName the
  resourceclaim controller makes a claim from) and its containers in resources.claims; the scheduler
  allocates devices into the claim's status.allocation.devices.results[] (driver, pool, device) with
  a nodeSelector, and lists the pod in status.reservedFor. A request with allocationMode All takes
  every matching device of the node and fails while one is allocated elsewhere.
  https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/,
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/,
  https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-claim-v1/
- NVIDIA's DRA driver publishes GPUs under driver gpu.nvidia.com, with a DeviceClass of that name,
  instead of the device plugin's nvidia.com/gpu: https://github.com/NVIDIA/k8s-dra-driver-gpu
- Kueue creates a Workload (kueue.x-k8s.io/v1beta1) for each Job labelled kueue.x-k8s.io/queue-name
  and keeps the Job suspended (spec.suspend: true, so it has no pods) until the Workload is admitted;
  while it waits for quota its QuotaReserved condition is False:
  https://kueue.sigs.k8s.io/docs/concepts/workload/,
  https://kueue.sigs.k8s.io/docs/tasks/troubleshooting/troubleshooting_jobs/

Before, discovery found GPU nodes by nvidia.com/gpu capacity alone: a DRA node was no GPU node, a
pod holding its GPUs through a claim did not make it busy, and a Kueue queue full of GPU jobs
(suspended, podless) never stopped a sweep under yield_to_pending.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sweeper.actions.safety import Rules, problems
from sweeper.fleet import gpu_nodes, plan
from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

CFG = replace(TEST_CONFIG, light_playbook="")


def dra_fleet(dra: int = 2, plain: int = 1, **extra: Any) -> dict[str, Any]:
    spec = fleet_spec(nodes=plain, **extra)
    spec["node_groups"].append({"name_prefix": "dra-", "count": dra, "instance_type": "p5.48xlarge", "age": "2d",
                                "dra": True})
    return spec


def discover(sim: Sim, cfg: Any = CFG) -> Any:
    """A discovery pass as a sweep makes it: the node and pod lists, then the plan."""
    nodes = gpu_nodes(sim.kube.list_nodes(), cfg)
    return plan(nodes, sim.kube.active_pods(), cfg, {}, sim.cluster.clock.now())


def custom(sim: Sim) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(sim.api_client)


def test_the_simulator_serves_resource_k8s_io_v1_and_kueue_only_where_installed(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet(kueue_workloads=[{"name": "big", "gpus": 8}]))
    groups = {g.name: g.preferred_version.version for g in client.ApisApi(sim.api_client).get_api_versions().groups}
    assert groups["resource.k8s.io"] == "v1" and groups["kueue.x-k8s.io"] == "v1beta1"
    slices = custom(sim).list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    assert sorted(s["spec"]["nodeName"] for s in slices) == ["dra-00", "dra-01"]
    one = slices[0]["spec"]
    assert one["driver"] == "gpu.nvidia.com" and one["pool"]["name"] == one["nodeName"]
    assert [d["name"] for d in one["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert custom(sim).get_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", "gpu.nvidia.com")
    # the DRA node advertises no nvidia.com/gpu: its GPUs are in the slice only
    assert "nvidia.com/gpu" not in sim.core.read_node("dra-00").status.capacity
    [job] = sim.batch.list_namespaced_job("training").items
    assert job.spec.suspend and job.metadata.labels["kueue.x-k8s.io/queue-name"] == "user-queue"
    [wl] = custom(sim).list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "training", "workloads")["items"]
    assert {c["type"]: c["status"] for c in wl["status"]["conditions"]} == {"QuotaReserved": "False"}
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == job.metadata.uid


def test_a_cluster_without_dra_or_kueue_answers_404_and_discovery_reads_none(make_sim) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=2))
    with pytest.raises(ApiException) as err:
        custom(sim).list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
    assert err.value.status == 404
    assert "resource.k8s.io" not in {g.name for g in client.ApisApi(sim.api_client).get_api_versions().groups}
    assert sim.kube.list_resource_slices() == [] and sim.kube.list_workloads() == []
    p = discover(sim)
    assert sorted(d.node.name for d in p.take) == ["gpu-00", "gpu-01"]


def test_a_node_whose_gpus_are_dra_resource_slices_is_a_gpu_node(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet())
    p = discover(sim)
    assert p.gpu_nodes == 3
    taken = {d.node.name: d.node for d in p.take}
    assert sorted(taken) == ["dra-00", "dra-01", "gpu-00"]
    assert taken["dra-00"].gpus == 8
    assert taken["dra-00"].gpu_vars()["dra"] == {"driver": "gpu.nvidia.com", "pool": "dra-00", "devices": 8}
    # another driver's slices are not GPUs of this one
    assert discover(sim, replace(CFG, dra_driver="gpu.example.com")).gpu_nodes == 1


def test_a_pod_holding_gpus_through_a_resource_claim_makes_its_node_busy(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet(workloads=[{"node": "dra-01", "gpus": 8, "duration": None}]))
    [pod] = sim.core.list_namespaced_pod("training").items
    assert pod.spec.resource_claims and "nvidia.com/gpu" not in (pod.spec.containers[0].resources.limits or {})
    claims = custom(sim).list_namespaced_custom_object("resource.k8s.io", "v1", "training", "resourceclaims")["items"]
    [claim] = claims
    assert claim["status"]["reservedFor"][0]["name"] == pod.metadata.name
    assert {r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]} == {"dra-01"}
    p = discover(sim)
    skipped = {d.node.name: d for d in p.skip}
    assert skipped["dra-01"].reason == "busy" and pod.metadata.name in skipped["dra-01"].detail
    assert "dra-00" in {d.node.name for d in p.take}


def test_the_scheduler_places_a_claim_only_where_the_devices_are_free(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet(dra=1, plain=0, workloads=[{"node": "dra-00", "gpus": 8, "duration": None}]))
    custom(sim).create_namespaced_custom_object("resource.k8s.io", "v1", "training", "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})
    sim.core.create_namespaced_pod("training", {"metadata": {"name": "waits"}, "spec": {
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}})
    sim.wait_for(lambda: (sim.core.read_namespaced_pod("waits", "training").status.conditions or [None])[0],
                 what="a scheduling attempt")
    pod = sim.core.read_namespaced_pod("waits", "training")
    assert not pod.spec.node_name, "all eight GPUs are held by the workload's claim"
    # the resourceclaim controller made its claim when the pod was created; the scheduler did not allocate it
    [status] = pod.status.resource_claim_statuses
    claim = custom(sim).get_namespaced_custom_object("resource.k8s.io", "v1", "training", "resourceclaims",
                                                     status.resource_claim_name)
    assert "allocation" not in (claim.get("status") or {})
    sim.core.delete_namespaced_pod(sim.core.list_namespaced_pod("training", label_selector="app=training").items[0]
                                   .metadata.name, "training")
    sim.wait_for(lambda: sim.core.read_namespaced_pod("waits", "training").spec.node_name == "dra-00",
                 what="the waiting pod placed once the devices are free")


def test_a_pod_waiting_for_a_gpu_claim_is_pending_demand(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet(dra=1, plain=1))
    custom(sim).create_namespaced_custom_object("resource.k8s.io", "v1", "training", "resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "two-gpus"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}}]}}}})
    sim.core.create_namespaced_pod("training", {"metadata": {"name": "waits"}, "spec": {
        "nodeSelector": {"example.com/pool": "not-yet"},  # no node has it: the pod stays Pending
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}],
        "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}})
    sim.wait_for(lambda: sim.core.read_namespaced_pod("waits", "training").status.resource_claim_statuses,
                 what="the pod's claim")
    p = discover(sim)
    assert not p.take and {d.reason for d in p.skip} == {"demand"}
    assert "training/waits" in p.skip[0].detail


def test_a_workload_kueue_keeps_suspended_for_gpus_is_pending_demand(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet(kueue_workloads=[{"name": "big", "gpus": 8, "count": 2}]))
    assert not sim.core.list_namespaced_pod("training").items, "a suspended Job has no pods"
    p = discover(sim)
    assert not p.take and p.budget == 0
    assert {d.reason for d in p.skip} == {"demand"}
    assert "kueue workload training/job-big-" in p.skip[0].detail
    # without yield_to_pending it is not waited for
    assert len(discover(sim, replace(CFG, yield_to_pending=False)).take) == 3


def test_a_workload_asking_for_gpus_through_a_claim_is_demand_and_an_admitted_one_is_not(make_sim) -> None:
    sim: Sim = make_sim(dra_fleet(kueue_workloads=[{"name": "claims", "gpus": 4, "claim": True}]))
    assert {d.reason for d in discover(sim).skip} == {"demand"}
    [wl] = custom(sim).list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", "training", "workloads")["items"]
    wl["status"]["conditions"] = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                                   "message": "Quota reserved in ClusterQueue cluster-queue",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"},
                                  {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    # Kueue writes the conditions through the status subresource
    custom(sim).replace_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta1", "training", "workloads",
                                                        wl["metadata"]["name"], wl)
    assert len(discover(sim).take) == 3, "an admitted Workload's pods are ordinary pods"


def test_a_check_job_on_a_dra_node_claims_the_gpus_instead_of_requesting_nvidia_com_gpu(
        make_sim, history: History) -> None:
    sim: Sim = make_sim(dra_fleet(dra=1, plain=1))
    gone: dict[str, list[dict[str, Any]]] = {}  # what the run cleaned up: its Jobs, and the claims their pods held
    sim.cluster.store.on_delete.append(lambda plural, obj: gone.setdefault(plural, []).append(obj))
    report = run_sweep(sim, history, CFG)
    assert {o.node: o.verdict for o in report.outcomes} == {"dra-00": "pass", "gpu-00": "pass"}, report.outcomes
    [template] = custom(sim).list_namespaced_custom_object("resource.k8s.io", "v1", "sweeper-checks",
                                                           "resourceclaimtemplates")["items"]
    assert template["metadata"]["name"] == "sweeper-gpus"
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}
    jobs = {j["metadata"]["labels"]["sweeper.dev/node"]: j["spec"]["template"]["spec"]
            for j in [*gone.get("jobs", []), *(j.to_dict() for j in sim.batch.list_namespaced_job("sweeper-checks").items)]
            if "metadata" in j}
    spec = jobs["dra-00"]
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "sweeper-gpus"}]
    resources = spec["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in resources["limits"] and resources["claims"] == [{"name": "gpus"}]
    plain = jobs["gpu-00"]
    assert "resourceClaims" not in plain and plain["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # the claim the check's pod was given held all eight GPUs of the node, and went with the pod; the
    # resourceclaim controller made it, never Sweeper
    [claim] = [c for c in gone.get("resourceclaims", []) if c["metadata"]["namespace"] == "sweeper-checks"]
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 8
    assert not [p for m, p in sim.cluster.store.requests if m == "POST" and p.endswith("/resourceclaims")]


def test_a_check_template_may_claim_nothing_but_sweepers_claim() -> None:
    ours = ({"name": "gpus", "resourceClaimTemplateName": "sweeper-gpus"},)
    rules = Rules(namespace="sweeper-checks", affinities=({},), tolerations=(), taint_key="sweeper.dev/sweep",
                  images=frozenset({"img"}), claims=ours)
    pod = {"affinity": {}, "tolerations": [{"key": "sweeper.dev/sweep", "operator": "Exists", "effect": "NoSchedule"}],
           "automountServiceAccountToken": False, "restartPolicy": "Never",
           "containers": [{"name": "c", "image": "img"}]}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "sweeper-checks"},
           "spec": {"template": {"spec": pod}}}
    base = problems([job], rules)
    pod["resourceClaims"] = list(ours)
    assert problems([job], rules) == base
    pod["resourceClaims"] = [{"name": "other", "resourceClaimName": "someone-elses-gpus"}]
    assert any("resourceClaims are Sweeper's own" in p for p in problems([job], rules))


def test_abort_on_demand_stops_a_check_for_a_workload_kueue_keeps_waiting(make_sim, history: History) -> None:
    sim: Sim = make_sim(dra_fleet(dra=1, plain=0, kueue_workloads=[{"name": "big", "gpus": 8}], check_seconds=600))
    cfg = replace(CFG, yield_to_pending=False, abort_on_demand=True)
    report = run_sweep(sim, history, cfg)
    [outcome] = report.outcomes
    assert "kueue workload training/job-big-" in " ".join(outcome.reasons), outcome


def _pair_vars(sim: Sim, name: str) -> dict[str, Any]:
    from sweeper.profiles import load_profile
    from tests.cluster.test_pair_job import ROOT
    obj = sim.kube.get_node(name)
    return {"name": name, "gpus": 8, "labels": obj["metadata"].get("labels") or {},
            "annotations": obj["metadata"].get("annotations") or {},
            "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()}


def _pair(sim: Sim, a: str, b: str, run_id: str = "sw-dra-pair") -> dict[str, Any]:
    from sweeper.actions import ActionContext, load_all
    ctx = ActionContext(config=CFG, clock=sim.cluster.clock, kube=sim.kube, node=_pair_vars(sim, a),
                        partner=_pair_vars(sim, b), run_id=run_id, cancelled=lambda: False,
                        intent=lambda op, phase, detail: None)
    act = load_all()["run_pair_job"]
    out: dict[str, Any] = act.fn(ctx, act.validate({"timeout": "30m"}, "test"))
    return out


def test_a_pair_of_dra_nodes_claims_each_nodes_gpus_through_sweepers_template(make_sim) -> None:
    """A pair Job's two pods on DRA nodes each claim every GPU of the node they land on (a claim per pod
    from the ResourceClaimTemplate, allocationMode All), and ask nvidia.com/gpu of neither: a DRA node
    advertises no nvidia.com/gpu, so a pod asking for it would never be scheduled.
    https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/#resourceclaims-and-resourceclaimtemplates"""
    sim: Sim = make_sim(dra_fleet(dra=2, plain=0))
    gone: dict[str, list[dict[str, Any]]] = {}
    sim.cluster.store.on_delete.append(lambda plural, obj: gone.setdefault(plural, []).append(obj))
    out = _pair(sim, "dra-00", "dra-01")
    assert out["status"] == "pass", out
    [job] = [j for j in gone["jobs"] if j["metadata"]["name"] == out["job"]]
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "sweeper-gpus"}]
    [container] = pod["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"] and container["resources"]["claims"] == [{"name": "gpus"}]
    claims = [c for c in gone.get("resourceclaims", []) if c["metadata"]["namespace"] == "sweeper-checks"]
    pools = sorted({r["pool"] for c in claims for r in c["status"]["allocation"]["devices"]["results"]})
    assert len(claims) == 2 and pools == ["dra-00", "dra-01"]
    assert all(len(c["status"]["allocation"]["devices"]["results"]) == 8 for c in claims)


def test_a_pair_of_a_dra_node_and_a_device_plugin_node_is_refused(make_sim) -> None:
    from sweeper.errors import PlaybookError
    sim: Sim = make_sim(dra_fleet(dra=1, plain=1))
    with pytest.raises(PlaybookError, match="one pod template cannot claim both"):
        _pair(sim, "dra-00", "gpu-00")


def test_a_held_nodes_slices_are_asked_for_by_node_and_the_template_once_a_run(make_sim, history: History) -> None:
    """When a node's variables lack its DRA devices, its ResourceSlices are asked for by field selector
    on spec.nodeName and spec.driver, which the API serves for ResourceSlices ("A field selector can be
    used to list only ResourceSlice objects belonging to a certain node"), not as a cluster-wide list per
    Job; and the ResourceClaimTemplate is created once a run, not once a Job.
    https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/"""
    sim: Sim = make_sim(dra_fleet(dra=3, plain=0))
    only = sim.kube.list_resource_slices(node="dra-01", driver="gpu.nvidia.com")
    assert [s["spec"]["nodeName"] for s in only] == ["dra-01"]
    assert sim.kube.list_resource_slices(node="dra-01", driver="gpu.example.com") == []
    from sweeper.actions import ActionContext
    from sweeper.actions.jobs import dra_of
    ctx = ActionContext(config=CFG, clock=sim.cluster.clock, kube=sim.kube, node={"name": "dra-02", "gpus": 0},
                        run_id="sw-x", cancelled=lambda: False, intent=lambda *a: None)
    before = len(sim.cluster.store.field_selectors)
    assert dra_of(ctx) == {"driver": "gpu.nvidia.com", "pool": "dra-02", "devices": 8}
    assert sim.cluster.store.field_selectors[before:] == [
        ("/apis/resource.k8s.io/v1/resourceslices", "spec.nodeName=dra-02,spec.driver=gpu.nvidia.com")]
    report = run_sweep(sim, history, CFG)
    assert {o.verdict for o in report.outcomes} == {"pass"} and len(report.outcomes) == 3
    posts = [p for m, p in sim.cluster.store.requests if m == "POST" and p.endswith("/resourceclaimtemplates")]
    assert len(posts) == 1, posts
