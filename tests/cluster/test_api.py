"""The simulated API server, driven by the official kubernetes client."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.conftest import Sim, fleet_spec


def names(items: list) -> list[str]:
    return sorted(i.metadata.name for i in items)


def test_label_selectors(make_sim) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=2, node_groups=[
        {"name_prefix": "gpu-", "count": 2, "instance_type": "p5.48xlarge", "labels": {"pool": "a"}},
        {"name_prefix": "gpub-", "count": 1, "instance_type": "p4d.24xlarge", "labels": {"pool": "b"}},
        {"name_prefix": "cpu-", "count": 1, "instance_type": "m7i.4xlarge"}]))
    core = sim.core
    assert names(core.list_node(label_selector="pool=a").items) == ["gpu-00", "gpu-01"]
    assert names(core.list_node(label_selector="pool!=a").items) == ["cpu-00", "gpub-00"]
    assert names(core.list_node(label_selector="pool in (b, c)").items) == ["gpub-00"]
    assert names(core.list_node(label_selector="pool notin (a)").items) == ["cpu-00", "gpub-00"]
    assert names(core.list_node(label_selector="nvidia.com/gpu.present").items) == ["gpu-00", "gpu-01", "gpub-00"]
    assert names(core.list_node(label_selector="!nvidia.com/gpu.present").items) == ["cpu-00"]
    assert names(core.list_node(label_selector="pool=a,node.kubernetes.io/instance-type=p5.48xlarge").items) \
        == ["gpu-00", "gpu-01"]
    with pytest.raises(ApiException) as exc:
        core.list_node(label_selector="pool in a")
    assert exc.value.status == 400


def test_field_selectors(make_sim) -> None:
    sim: Sim = make_sim(nodes=3, workloads=[{"node": "gpu-01", "gpus": 8, "duration": "1h"},
                                            {"node": "gpu-02", "gpus": 8, "duration": None}])
    core = sim.core
    sim.wait_for(lambda: len(core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items) == 2,
                 what="training pods running")
    on1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-01").items
    assert [p.spec.node_name for p in on1] == ["gpu-01"]
    active = core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed")
    assert len(active.items) == 2
    sim.wait_for(lambda: len(core.list_pod_for_all_namespaces(field_selector="status.phase=Succeeded").items) == 1,
                 what="the 1h pod to finish")
    assert names(core.list_node(field_selector="metadata.name=gpu-02").items) == ["gpu-02"]
    core.patch_node("gpu-00", {"spec": {"unschedulable": True}})
    assert names(core.list_node(field_selector="spec.unschedulable=true").items) == ["gpu-00"]
    assert names(core.list_node(field_selector="spec.unschedulable!=true").items) == ["gpu-01", "gpu-02"]
    with pytest.raises(ApiException) as exc:
        core.list_node(field_selector="status.capacity=8")
    assert exc.value.status == 400 and "field label not supported" in exc.value.body


def test_paging_returns_every_item_once(make_sim) -> None:
    sim: Sim = make_sim(nodes=23)
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = sim.core.list_node(limit=5, _continue=token)
        pages += 1
        seen += [n.metadata.name for n in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 23 - len(seen)
    assert pages == 5 and len(seen) == 23 and len(set(seen)) == 23
    with pytest.raises(ApiException) as exc:
        sim.core.list_node(limit=5, _continue="not-a-token")
    assert exc.value.status == 400


def test_resource_version_conflicts_and_status_bodies(sim: Sim) -> None:
    node = sim.core.read_node("gpu-00")
    rv = node.metadata.resource_version
    sim.core.patch_node("gpu-00", {"metadata": {"labels": {"a": "1"}}})
    node.metadata.labels["b"] = "2"
    with pytest.raises(ApiException) as exc:
        sim.core.replace_node("gpu-00", node)  # carries the stale resourceVersion
    assert exc.value.status == 409
    body = json.loads(exc.value.body)
    assert body["kind"] == "Status" and body["reason"] == "Conflict" and body["code"] == 409
    with pytest.raises(ApiException) as exc:
        sim.core.patch_node("gpu-00", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                                       {"op": "add", "path": "/metadata/labels/c", "value": "3"}],
                            _content_type="application/json-patch+json")
    assert exc.value.status == 422 and "Testing value" in json.loads(exc.value.body)["message"]
    assert "c" not in sim.core.read_node("gpu-00").metadata.labels
    with pytest.raises(ApiException) as exc:
        sim.core.read_node("nope")
    body = json.loads(exc.value.body)
    assert exc.value.status == 404 and body["reason"] == "NotFound" and body["details"]["name"] == "nope"
    ns = client.V1Namespace(metadata=client.V1ObjectMeta(name="sweeper"))
    with pytest.raises(ApiException) as exc:
        sim.core.create_namespace(ns)
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"


def test_every_object_has_a_growing_resource_version(sim: Sim) -> None:
    lst = sim.core.list_node()
    assert int(lst.metadata.resource_version) > 0
    before = int(sim.core.read_node("gpu-01").metadata.resource_version)
    after = int(sim.core.patch_node("gpu-01", {"metadata": {"labels": {"x": "y"}}}).metadata.resource_version)
    assert after > before


def test_patch_types(sim: Sim) -> None:
    core = sim.core
    # JSON merge patch: null deletes, maps merge.
    core.patch_node("gpu-00", {"metadata": {"labels": {"a": "1", "b": "2"}}},
                    _content_type="application/merge-patch+json")
    n = core.patch_node("gpu-00", {"metadata": {"labels": {"a": None}}}, _content_type="application/merge-patch+json")
    assert "a" not in n.metadata.labels and n.metadata.labels["b"] == "2"
    # Strategic merge patch: taints are atomic (replaced whole), as in core/v1.
    core.patch_node("gpu-00", {"spec": {"taints": [{"key": "k1", "effect": "NoSchedule"}]}},
                    _content_type="application/strategic-merge-patch+json")
    n = core.patch_node("gpu-00", {"spec": {"taints": [{"key": "k2", "effect": "NoSchedule"}]},
                                   "$setElementOrder/taints": []},
                        _content_type="application/strategic-merge-patch+json")
    assert [t.key for t in n.spec.taints] == ["k2"]
    # JSON patch: add, replace, remove, test.
    n = core.patch_node("gpu-00", [{"op": "add", "path": "/spec/taints/-", "value": {"key": "k3", "effect": "NoExecute"}},
                                   {"op": "replace", "path": "/metadata/labels/b", "value": "3"},
                                   {"op": "test", "path": "/metadata/labels/b", "value": "3"},
                                   {"op": "remove", "path": "/spec/taints/0"}],
                        _content_type="application/json-patch+json")
    assert [t.key for t in n.spec.taints] == ["k3"] and n.metadata.labels["b"] == "3"
    # The main resource ignores status in a patch; the status subresource takes it.
    core.patch_node("gpu-00", {"status": {"capacity": {"nvidia.com/gpu": "1"}}})
    assert core.read_node("gpu-00").status.capacity["nvidia.com/gpu"] == "8"


def test_strategic_merge_of_containers_by_name(sim: Sim) -> None:
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="p", namespace="default"),
                       spec=client.V1PodSpec(node_name="gpu-03", containers=[
                           client.V1Container(name="a", image="img:1"), client.V1Container(name="b", image="img:1")]))
    sim.core.create_namespaced_pod("default", pod)
    p = sim.core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "b", "image": "img:2"}]}},
                                      _content_type="application/strategic-merge-patch+json")
    assert [(c.name, c.image) for c in p.spec.containers] == [("a", "img:1"), ("b", "img:2")]


def _pod(name: str, gpus: int, tolerate: str | None = None, selector: dict | None = None) -> client.V1Pod:
    tol = [client.V1Toleration(key=tolerate, operator="Exists", effect="NoSchedule")] if tolerate else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(restart_policy="Never", tolerations=tol, node_selector=selector, containers=[
            client.V1Container(name="c", image="busybox", resources=client.V1ResourceRequirements(
                limits={"nvidia.com/gpu": str(gpus)}))]))


def test_scheduler_honours_taints_selectors_and_gpu_capacity(make_sim) -> None:
    sim: Sim = make_sim(nodes=2)
    core = sim.core
    for n in ("gpu-00", "gpu-01"):
        core.patch_node(n, {"spec": {"taints": [{"key": "maint", "effect": "NoSchedule"}]}})
    core.create_namespaced_pod("default", _pod("blocked", 8))
    core.create_namespaced_pod("default", _pod("tolerant", 8, tolerate="maint", selector={
        "kubernetes.io/hostname": "gpu-01"}))
    sim.wait_for(lambda: core.read_namespaced_pod("tolerant", "default").spec.node_name == "gpu-01", what="binding")
    blocked = sim.wait_for(lambda: (p := core.read_namespaced_pod("blocked", "default")).status.conditions and p,
                           what="an Unschedulable condition")
    assert blocked.spec.node_name is None
    assert blocked.status.conditions[0].reason == "Unschedulable"
    assert "untolerated taint" in blocked.status.conditions[0].message
    # gpu-01 is full now: a second tolerant pod cannot fit there.
    core.create_namespaced_pod("default", _pod("overflow", 1, tolerate="maint", selector={
        "kubernetes.io/hostname": "gpu-01"}))
    sim.wait_for(lambda: (core.read_namespaced_pod("overflow", "default").status.conditions or [None])[0],
                 what="overflow to be considered")
    over = core.read_namespaced_pod("overflow", "default")
    assert over.spec.node_name is None and "Insufficient nvidia.com/gpu" in over.status.conditions[0].message
    # Cordon: spec.unschedulable keeps new pods off unless they tolerate it.
    core.patch_node("gpu-00", {"spec": {"taints": None, "unschedulable": True}})
    core.delete_namespaced_pod("blocked", "default")
    core.create_namespaced_pod("default", _pod("cordoned", 1))
    sim.wait_for(lambda: (core.read_namespaced_pod("cordoned", "default").status.conditions or [None])[0],
                 what="cordoned pod to be considered")
    assert core.read_namespaced_pod("cordoned", "default").spec.node_name is None


def test_node_affinity_on_hostname(make_sim) -> None:
    sim: Sim = make_sim(nodes=3)
    aff = client.V1Affinity(node_affinity=client.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=client.V1NodeSelector(node_selector_terms=[
            client.V1NodeSelectorTerm(match_expressions=[client.V1NodeSelectorRequirement(
                key="kubernetes.io/hostname", operator="In", values=["gpu-02"])])])))
    pod = _pod("pinned", 8)
    pod.spec.affinity = aff
    sim.core.create_namespaced_pod("default", pod)
    p = sim.wait_for(lambda: (x := sim.core.read_namespaced_pod("pinned", "default")).spec.node_name and x,
                     what="binding")
    assert p.spec.node_name == "gpu-02"


def _job(name: str, command: list[str], deadline: int | None = None, backoff: int = 0) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1JobSpec(backoff_limit=backoff, active_deadline_seconds=deadline, template=client.V1PodTemplateSpec(
            spec=client.V1PodSpec(restart_policy="Never", containers=[
                client.V1Container(name="c", image="busybox", command=command)]))))


def _finished(sim: Sim, name: str) -> client.V1Job:
    return sim.wait_for(lambda: (j := sim.batch.read_namespaced_job(name, "default")).status.conditions and j,
                        what=f"job {name} to finish")


def test_job_controller_complete_and_logs(sim: Sim) -> None:
    sim.batch.create_namespaced_job("default", _job("ok", ["echo", "hello", "gpu"]))
    job = _finished(sim, "ok")
    assert job.status.conditions[-1].type == "Complete" and job.status.succeeded == 1
    assert job.status.completion_time is not None
    pods = sim.core.list_namespaced_pod("default", label_selector="job-name=ok").items
    assert pods[0].metadata.owner_references[0].uid == job.metadata.uid
    assert pods[0].metadata.labels["batch.kubernetes.io/controller-uid"] == job.metadata.uid
    assert pods[0].status.phase == "Succeeded"
    assert pods[0].status.container_statuses[0].state.terminated.exit_code == 0
    # The client's own deserialiser mangles text bodies (it str()s the bytes), with a real apiserver
    # too; read the raw response as Sweeper's adapter does.
    raw = sim.core.read_namespaced_pod_log(pods[0].metadata.name, "default", _preload_content=False)
    assert raw.data.decode() == "hello gpu\n"


def test_job_backoff_limit(sim: Sim) -> None:
    sim.batch.create_namespaced_job("default", _job("bad", ["false"], backoff=1))
    job = _finished(sim, "bad")
    cond = job.status.conditions[-1]
    assert (cond.type, cond.reason) == ("Failed", "BackoffLimitExceeded")
    pods = sim.core.list_namespaced_pod("default", label_selector="job-name=bad").items
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Failed"}


def test_job_deadline_deletion_and_propagation(sim: Sim) -> None:
    sim.batch.create_namespaced_job("default", _job("hangs", ["sleep", "inf"], deadline=60))
    job = sim.wait_for(lambda: (j := sim.batch.read_namespaced_job("hangs", "default")).status.conditions and j,
                       what="the deadline")
    cond = job.status.conditions[-1]
    assert (cond.type, cond.reason) == ("Failed", "DeadlineExceeded")
    assert sim.core.list_namespaced_pod("default", label_selector="job-name=hangs").items == []
    # Deleting a Job through the API orphans its pods by default; Background deletes them.
    sim.batch.create_namespaced_job("default", _job("orphan", ["sleep", "inf"]))
    sim.wait_for(lambda: sim.core.list_namespaced_pod("default", label_selector="job-name=orphan").items, what="pod")
    sim.batch.delete_namespaced_job("orphan", "default")
    left = sim.core.list_namespaced_pod("default", label_selector="job-name=orphan").items
    assert len(left) == 1 and not left[0].metadata.owner_references
    sim.batch.create_namespaced_job("default", _job("bg", ["sleep", "inf"]))
    sim.wait_for(lambda: sim.core.list_namespaced_pod("default", label_selector="job-name=bg").items, what="pod")
    sim.batch.delete_namespaced_job("bg", "default", propagation_policy="Background")
    assert sim.core.list_namespaced_pod("default", label_selector="job-name=bg").items == []


def test_events_leases_and_namespaces(sim: Sim) -> None:
    ev = client.CoreV1Event(metadata=client.V1ObjectMeta(generate_name="gpu-00.", namespace="default"),
                            involved_object=client.V1ObjectReference(kind="Node", name="gpu-00"),
                            reason="SweepPassed", message="all checks passed", type="Normal")
    sim.core.create_namespaced_event("default", ev)
    found = sim.core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-00").items
    assert [e.reason for e in found] == ["SweepPassed"]
    coord = client.CoordinationV1Api(sim.api_client)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="sweeper-lock", namespace="sweeper"),
                           spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=60))
    coord.create_namespaced_lease("sweeper", lease)
    assert coord.read_namespaced_lease("sweeper-lock", "sweeper").spec.holder_identity == "a"
    with pytest.raises(ApiException) as exc:
        pod = _pod("x", 0)
        pod.metadata.namespace = "no-such-ns"
        sim.core.create_namespaced_pod("no-such-ns", pod)
    assert exc.value.status == 404
    assert "sweeper" in names(sim.core.list_namespace().items)


def test_api_faults_are_kubernetes_status_errors(make_sim) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=2, api_faults={"rate": 1.0}))
    with pytest.raises(ApiException) as exc:
        sim.core.list_node()
    assert exc.value.status in (429, 500, 503)
    assert json.loads(exc.value.body)["kind"] == "Status"
    # Discovery is never faulted, so clients can still start.
    assert client.VersionApi(sim.api_client).get_code().git_version.startswith("v1.31")
