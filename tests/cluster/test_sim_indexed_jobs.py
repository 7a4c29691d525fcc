"""The simulated control plane's side of pair sweeps, through the official client: fabric device
plugin resources accounted like GPUs, Indexed Jobs, and required pod anti-affinity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


INDEX = "batch.kubernetes.io/job-completion-index"


def _indexed_job(name: str, command: list[str], completions: int = 2, parallelism: int = 2,
                 anti_affinity: bool = False, **spec: Any) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "subdomain": name, "containers": [
        {"name": "main", "image": "busybox", "command": command, "env": [{"name": "FIRST", "value": "1"}]}]}
    if anti_affinity:
        pod_spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"pair": name}}, "topologyKey": "kubernetes.io/hostname"}]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"completionMode": "Indexed", "completions": completions, "parallelism": parallelism,
                     "backoffLimit": 0, **spec,
                     "template": {"metadata": {"labels": {"pair": name}}, "spec": pod_spec}}}


def _job_pods(sim: Sim, name: str) -> list[Any]:
    pods = sim.core.list_namespaced_pod("default", label_selector=f"batch.kubernetes.io/job-name={name}").items
    return sorted(pods, key=lambda p: int(p.metadata.annotations[INDEX]))


def _condition(sim: Sim, name: str) -> Any:
    job = sim.batch.read_namespaced_job(name, "default")
    return next((c for c in job.status.conditions or [] if c.status == "True"), None) and job


def test_an_indexed_job_runs_one_pod_per_index_and_completes_when_every_index_succeeded(
        make_sim: Callable[..., Sim]) -> None:
    """completionMode Indexed (https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode):
    each pod carries its index as the annotation and label batch.kubernetes.io/job-completion-index,
    in JOB_COMPLETION_INDEX (the downward API on that annotation) and in its hostname
    `<job>-<index>`; with the template's subdomain a headless Service gives each pod a DNS name.
    The Job is Complete when each index has succeeded, and lists them in completedIndexes."""
    sim = make_sim(nodes=2)
    sim.batch.create_namespaced_job("default", _indexed_job("ix", ["sleep", "60"], completions=3, parallelism=2))
    job = sim.wait_for(lambda: _condition(sim, "ix"), what="the Job to finish")
    assert [c.type for c in job.status.conditions if c.status == "True"] == ["Complete"]
    assert job.status.succeeded == 3 and job.status.completed_indexes == "0-2"
    pods = _job_pods(sim, "ix")
    assert [p.metadata.annotations[INDEX] for p in pods] == ["0", "1", "2"]
    for i, p in enumerate(pods):
        assert p.metadata.labels[INDEX] == str(i)
        assert p.metadata.name.startswith(f"ix-{i}-")
        assert p.spec.hostname == f"ix-{i}" and p.spec.subdomain == "ix"
        env = p.spec.containers[0].env
        assert env[0].name == "FIRST", "the template's own variables come first"
        assert env[-1].name == "JOB_COMPLETION_INDEX"
        assert env[-1].value_from.field_ref.field_path == f"metadata.annotations['{INDEX}']"
    # The template itself is untouched: no index leaked into it.
    tmpl = sim.batch.read_namespaced_job("ix", "default").spec.template
    assert tmpl.spec.hostname is None and len(tmpl.spec.containers[0].env) == 1


def test_an_indexed_job_keeps_to_its_parallelism(make_sim: Callable[..., Sim]) -> None:
    """At most `parallelism` pods at once, one per pending index, lowest indexes first."""
    sim = make_sim(nodes=2)
    sim.batch.create_namespaced_job("default", _indexed_job("par", ["sleep", "inf"], completions=3, parallelism=2))
    sim.wait_for(lambda: sim.batch.read_namespaced_job("par", "default").status.active == 2, what="two active")
    assert [p.metadata.annotations[INDEX] for p in _job_pods(sim, "par")] == ["0", "1"]


def test_an_indexed_job_fails_on_its_backoff_limit_or_deadline_and_its_pods_go(make_sim: Callable[..., Sim]) -> None:
    """backoffLimit counts failed pods of every index; past activeDeadlineSeconds the Job fails with
    DeadlineExceeded and its running pods are deleted."""
    sim = make_sim(nodes=2)
    sim.batch.create_namespaced_job("default", _indexed_job("bad", ["false"]))
    job = sim.wait_for(lambda: _condition(sim, "bad"), what="the failing Job to finish")
    failed = next(c for c in job.status.conditions if c.status == "True")
    assert (failed.type, failed.reason) == ("Failed", "BackoffLimitExceeded")
    assert job.status.completed_indexes is None and not job.status.succeeded
    sim.batch.create_namespaced_job("default", _indexed_job("slow", ["sleep", "inf"], activeDeadlineSeconds=120))
    job = sim.wait_for(lambda: _condition(sim, "slow"), what="the deadline")
    failed = next(c for c in job.status.conditions if c.status == "True")
    assert (failed.type, failed.reason) == ("Failed", "DeadlineExceeded")
    assert job.status.active == 0 and job.status.failed == 2
    assert _job_pods(sim, "slow") == []


def test_required_anti_affinity_on_the_hostname_spreads_a_pair(make_sim: Callable[..., Sim]) -> None:
    """Required podAntiAffinity with topologyKey kubernetes.io/hostname: no two pods of the pair
    on one node; a third has nowhere to go, in the scheduler's words for that filter
    (https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity)."""
    sim = make_sim(nodes=2)
    sim.batch.create_namespaced_job("default", _indexed_job("pr", ["sleep", "inf"], completions=3, parallelism=3,
                                                            anti_affinity=True))
    sim.wait_for(lambda: sum(1 for p in _job_pods(sim, "pr") if p.spec.node_name) == 2, what="two bound")
    pods = sim.wait_for(lambda: len(ps := _job_pods(sim, "pr")) > 2 and (ps[2].status.conditions or [None])[0] and ps,
                        what="the third considered")
    assert {p.spec.node_name for p in pods[:2]} == {"gpu-00", "gpu-01"}
    assert pods[2].spec.node_name is None
    assert pods[2].status.conditions[0].message == \
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    # The other way round: a pod the pair's terms select is kept off both nodes as well.
    intruder = _pod("intruder", {})
    intruder.metadata.labels = {"pair": "pr"}
    sim.core.create_namespaced_pod("default", intruder)
    cond = sim.wait_for(lambda: (sim.core.read_namespaced_pod("intruder", "default").status.conditions or [None])[0],
                        what="the intruder considered")
    assert cond.message == "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."
