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


# -- closer to a real apiserver: dry run, selectors, names, health, OpenAPI, apply, reviews -------------
def _rv(sim: Sim, plural: str, ns: str | None, name: str) -> str:
    return sim.cluster.store.get(plural, ns, name)["metadata"]["resourceVersion"]


def test_dry_run_all_validates_and_persists_nothing(make_sim) -> None:
    """dryRun=All on create, patch, update, delete and eviction answers as the write would, and the
    store is left as it was (https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run)."""
    sim: Sim = make_sim(nodes=2, workloads=[{"node": "gpu-01", "gpus": 8, "duration": None}])
    core = sim.core
    # the workload settles first (bound, then Running): from then on nothing writes but this test
    pod = sim.wait_for(lambda: [p for p in core.list_namespaced_pod("training").items if p.status.phase == "Running"],
                       what="the workload to run")[0]
    before = sim.cluster.store.resource_version
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dry", namespace="default"), data={"a": "b"})
    made = core.create_namespaced_config_map("default", cm, dry_run="All")
    assert made.metadata.uid and made.data == {"a": "b"} and not made.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("dry", "default")
    assert exc.value.status == 404
    node_rv = _rv(sim, "nodes", None, "gpu-00")
    patched = core.patch_node("gpu-00", {"spec": {"unschedulable": True}}, dry_run="All")
    assert patched.spec.unschedulable is True
    node = core.read_node("gpu-00")
    assert not node.spec.unschedulable and node.metadata.resource_version == node_rv
    node.metadata.labels["dry"] = "run"
    assert core.replace_node("gpu-00", node, dry_run="All").metadata.labels["dry"] == "run"
    assert "dry" not in core.read_node("gpu-00").metadata.labels
    core.delete_namespaced_pod(pod.metadata.name, "training", dry_run="All")
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace="training"),
                                 delete_options=client.V1DeleteOptions(dry_run=["All"]))
    core.create_namespaced_pod_eviction(pod.metadata.name, "training", eviction)
    assert core.read_namespaced_pod(pod.metadata.name, "training").status.phase == "Running"
    with pytest.raises(ApiException) as exc:  # a dry run still validates: a conflict is a conflict
        stale = client.V1Node(metadata=client.V1ObjectMeta(name="gpu-00", resource_version="1"))
        core.replace_node("gpu-00", stale, dry_run="All")
    assert exc.value.status == 409
    with pytest.raises(ApiException) as exc:
        core.patch_node("gpu-00", {"spec": {"unschedulable": True}}, dry_run="Some")
    assert exc.value.status == 400
    assert sim.cluster.store.resource_version == before, "no resourceVersion was spent"


def test_field_selectors_read_zero_values_and_escapes(make_sim) -> None:
    """An absent spec.unschedulable is "false", as the node field set prints a bool; a value may
    escape `,` `=` and `\\` with a backslash (fields.ParseSelector,
    https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/)."""
    sim: Sim = make_sim(nodes=3)
    core = sim.core
    assert names(core.list_node(field_selector="spec.unschedulable=false").items) == ["gpu-00", "gpu-01", "gpu-02"]
    core.patch_node("gpu-01", {"spec": {"unschedulable": True}})
    assert names(core.list_node(field_selector="spec.unschedulable=false").items) == ["gpu-00", "gpu-02"]
    assert names(core.list_node(field_selector="spec.unschedulable==true").items) == ["gpu-01"]
    core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="odd.1"), involved_object=client.V1ObjectReference(kind="Node", name="gpu-00"),
        reason="Odd", message="m", type="Normal"))
    assert [e.metadata.name for e in core.list_namespaced_event(
        "default", field_selector="reason=Odd,metadata.name=odd.1").items] == ["odd.1"]
    assert core.list_namespaced_event("default", field_selector=r"reason=Odd\,x").items == []
    for bad in ("reason=a=b", r"reason=a\b", "reason"):
        with pytest.raises(ApiException) as exc:
            core.list_namespaced_event("default", field_selector=bad)
        assert exc.value.status == 400, bad


def test_path_segments_are_percent_decoded(sim: Sim) -> None:
    """The client percent-encodes each path parameter (a ClusterRole's ':' is sent as %3A); the server
    decodes each segment after splitting the path, so the names round-trip."""
    rbac = client.RbacAuthorizationV1Api(sim.api_client)
    role = client.V1ClusterRole(metadata=client.V1ObjectMeta(name="sweeper:reader.v1"),
                                rules=[client.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get"])])
    rbac.create_cluster_role(role)
    assert ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/sweeper%3Areader.v1") not in \
        sim.cluster.store.requests
    assert rbac.read_cluster_role("sweeper:reader.v1").metadata.name == "sweeper:reader.v1"
    assert ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/sweeper%3Areader.v1") in \
        sim.cluster.store.requests, "the name went out percent-encoded"
    rbac.patch_cluster_role("sweeper:reader.v1", {"metadata": {"labels": {"team": "a.b_c-d"}}})
    listed = rbac.list_cluster_role(label_selector="team in (a.b_c-d)").items
    assert [r.metadata.name for r in listed] == ["sweeper:reader.v1"]
    assert [r.metadata.name for r in rbac.list_cluster_role(field_selector="metadata.name=sweeper:reader.v1").items] \
        == ["sweeper:reader.v1"]
    rbac.delete_cluster_role("sweeper:reader.v1")
    assert rbac.list_cluster_role().items == []


def test_health_endpoints_answer_ok(sim: Sim) -> None:
    """/healthz, /livez and /readyz answer `ok`, and list their checks with ?verbose
    (https://kubernetes.io/docs/reference/using-api/health-checks/)."""
    import urllib.request

    for path in ("/healthz", "/livez", "/readyz", "/livez/ping"):
        with urllib.request.urlopen(sim.server.url + path) as r:
            assert (r.status, r.read()) == (200, b"ok"), path
    with urllib.request.urlopen(sim.server.url + "/readyz?verbose") as r:
        text = r.read().decode()
    assert "[+]ping ok" in text and text.endswith("readyz check passed\n")


def _get_json(sim: Sim, path: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(sim.server.url + path) as r:
        return json.loads(r.read())


def test_openapi_v3_documents_every_served_kind(sim: Sim) -> None:
    """/openapi/v3 names one document a group-version with a hash; each document has a PATCH per
    kind carrying its group-version-kind and the fieldValidation and dryRun parameters (what kubectl
    looks for before it leaves validation to the server) and the kind's schema in components."""
    index = _get_json(sim, "/openapi/v3")["paths"]
    assert {"api/v1", "apis/batch/v1", "apis/rbac.authorization.k8s.io/v1", "apis/apps/v1"} <= set(index)
    kinds = set()
    for gv, ref in index.items():
        assert ref["serverRelativeURL"].startswith(f"/openapi/v3/{gv}?hash=")
        doc = _get_json(sim, ref["serverRelativeURL"])
        assert doc["openapi"].startswith("3.")
        for path, item in doc["paths"].items():
            if "patch" in item:
                params = {p["name"] for p in item["patch"]["parameters"]}
                assert {"fieldValidation", "dryRun", "fieldManager"} <= params, path
                kinds.add(item["patch"]["x-kubernetes-group-version-kind"]["kind"])
        schemas = doc["components"]["schemas"]
        refs = {r for r in _all_refs(doc) if r.startswith("#/components/schemas/")}
        assert {r.rsplit("/", 1)[1] for r in refs} <= set(schemas), f"{gv} refers to schemas it lacks"
    assert {"CronJob", "ServiceAccount", "ClusterRole", "RoleBinding", "PersistentVolumeClaim", "ConfigMap",
            "Node", "Pod", "Job"} <= kinds
    cron = _get_json(sim, index["apis/batch/v1"]["serverRelativeURL"])["components"]["schemas"][
        "io.k8s.api.batch.v1.CronJob"]
    assert cron["x-kubernetes-group-version-kind"] == [{"group": "batch", "kind": "CronJob", "version": "v1"}]
    assert cron["properties"]["spec"]["allOf"] == [{"$ref": "#/components/schemas/io.k8s.api.batch.v1.CronJobSpec"}]


def _all_refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _all_refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _all_refs(v)]
    return []


def test_strict_field_validation_names_unknown_fields(sim: Sim) -> None:
    """fieldValidation=Strict refuses an object with a field its kind does not have, naming it."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "typo", "labelz": {"a": "b"}},
          "data": {"a": "b"}}
    with pytest.raises(ApiException) as exc:
        sim.core.create_namespaced_config_map("default", cm, field_validation="Strict")
    assert exc.value.status == 400 and 'unknown field "metadata.labelz"' in json.loads(exc.value.body)["message"]
    sim.core.create_namespaced_config_map("default", cm, field_validation="Ignore")  # stored as sent
    with pytest.raises(ApiException) as exc:
        sim.core.patch_namespaced_config_map("typo", "default", {"spec": {"x": 1}}, field_validation="Strict")
    assert exc.value.status == 400 and 'unknown field "spec"' in json.loads(exc.value.body)["message"]


def test_the_kinds_of_the_deploy_manifest_are_stored(sim: Sim) -> None:
    """ServiceAccount, ClusterRole(Binding), Role(Binding), PersistentVolumeClaim, ConfigMap and CronJob:
    create, read, list, patch and delete through the official client, in their discovery documents."""
    from pathlib import Path

    import yaml

    docs = [d for d in yaml.safe_load_all((Path(__file__).resolve().parents[2] / "deploy" / "cronjob.yaml")
                                          .read_text()) if d]
    rbac = client.RbacAuthorizationV1Api(sim.api_client)
    batch = sim.batch
    for d in docs:
        kind, meta = d["kind"], d["metadata"]
        ns = meta.get("namespace")
        if kind == "Namespace":
            continue
        create = {"ServiceAccount": sim.core.create_namespaced_service_account,
                  "PersistentVolumeClaim": sim.core.create_namespaced_persistent_volume_claim,
                  "ConfigMap": sim.core.create_namespaced_config_map,
                  "Role": rbac.create_namespaced_role, "RoleBinding": rbac.create_namespaced_role_binding,
                  "CronJob": batch.create_namespaced_cron_job}.get(kind)
        if create is not None:
            create(ns, d)
        elif kind == "ClusterRole":
            rbac.create_cluster_role(d)
        elif kind == "ClusterRoleBinding":
            rbac.create_cluster_role_binding(d)
    cron = batch.read_namespaced_cron_job("sweeper", "sweeper")
    assert cron.spec.schedule == "*/30 * * * *" and cron.spec.job_template.spec.backoff_limit == 0
    assert [r.metadata.name for r in rbac.list_namespaced_role("default").items] == ["sweeper-node-events"]
    assert rbac.read_cluster_role_binding("sweeper").role_ref.name == "sweeper"
    assert sim.core.read_namespaced_persistent_volume_claim("sweeper-state", "sweeper").spec.access_modes == \
        ["ReadWriteOnce"]
    batch.patch_namespaced_cron_job("sweeper", "sweeper", {"spec": {"suspend": True}})
    assert batch.read_namespaced_cron_job("sweeper", "sweeper").spec.suspend is True
    assert len(sim.core.list_config_map_for_all_namespaces(label_selector="app.kubernetes.io/name=sweeper").items) \
        == 4
    sim.core.delete_namespaced_service_account("sweeper", "sweeper")
    assert sim.core.list_namespaced_service_account("sweeper").items == []
    found = {r["name"] for gv in ("/api/v1", "/apis/batch/v1", "/apis/rbac.authorization.k8s.io/v1")
             for r in _get_json(sim, gv)["resources"]}
    assert {"serviceaccounts", "persistentvolumeclaims", "configmaps", "cronjobs", "clusterroles",
            "clusterrolebindings", "roles", "rolebindings"} <= found


def test_server_side_apply_creates_then_merges(sim: Sim) -> None:
    """PATCH with application/apply-patch+yaml creates an absent object and merges into a present
    one; a fieldManager is required (https://kubernetes.io/docs/reference/using-api/server-side-apply/)."""
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied", "namespace": "default"},
            "data": {"a": "1"}}
    made = sim.core.patch_namespaced_config_map("applied", "default", body, field_manager="test",
                                                _content_type="application/apply-patch+yaml")
    assert made.data == {"a": "1"} and made.metadata.uid
    body["data"] = {"b": "2"}
    merged = sim.core.patch_namespaced_config_map("applied", "default", body, field_manager="test",
                                                  _content_type="application/apply-patch+yaml")
    assert merged.data == {"a": "1", "b": "2"} and merged.metadata.uid == made.metadata.uid
    with pytest.raises(ApiException) as exc:
        sim.core.patch_namespaced_config_map("applied", "default", body,
                                             _content_type="application/apply-patch+yaml")
    assert exc.value.status == 422 and "fieldManager" in exc.value.body


def test_self_subject_reviews_answer_from_the_simulated_rbac(sim: Sim) -> None:
    """SelfSubjectRulesReview (kubectl auth can-i --list) and SelfSubjectAccessReview answer from the
    rules of the request's service account; a request without one is the cluster's admin."""
    authz = client.AuthorizationV1Api(sim.api_client)
    review = client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace="sweeper"))
    status = authz.create_self_subject_rules_review(review).status
    assert [(r.api_groups, r.resources, r.verbs) for r in status.resource_rules] == [(["*"], ["*"], ["*"])]
    # the kubeconfig's token now stands for a service account with these rules
    sim.server.service_accounts["sim-token"] = ("system:serviceaccount:sweeper:sweeper", [
        (None, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}),
        ("sweeper", {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]})])
    status = authz.create_self_subject_rules_review(review).status
    rules = [(r.api_groups, r.resources, r.verbs) for r in status.resource_rules]
    assert ([""], ["nodes"], ["get", "list"]) in rules and (["batch"], ["jobs"], ["create"]) in rules
    other = authz.create_self_subject_rules_review(
        client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace="default"))).status
    assert (["batch"], ["jobs"], ["create"]) not in [(r.api_groups, r.resources, r.verbs) for r in other.resource_rules]

    def can(verb: str, resource: str, group: str = "", ns: str | None = None) -> bool:
        spec = client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, namespace=ns))
        return bool(authz.create_self_subject_access_review(client.V1SelfSubjectAccessReview(spec=spec)).status.allowed)

    assert can("create", "jobs", "batch", "sweeper") and not can("create", "jobs", "batch", "default")
    assert can("list", "nodes") and not can("delete", "nodes")


@pytest.mark.realtime("`sweeper sim serve` processes started and stopped by signal")
def test_sim_serve_honours_the_fleet_files_speed(tmp_path) -> None:
    """A fleet file that sets `speed` is served at that speed, as the embedded simulator runs it; one
    that does not, and the demo's fleet, at 1x; `--speed` outranks both."""
    import socket
    import subprocess
    import sys
    import time

    def served_speed(fleet_text: str | None, *extra: str) -> str:
        kc = tmp_path / "kc"
        kc.unlink(missing_ok=True)
        args = [sys.executable, "-m", "sweeper.cli", "sim", "serve", "--kubeconfig-out", str(kc), *extra]
        if fleet_text is not None:
            (tmp_path / "f.yaml").write_text(fleet_text)
            args += ["--fleet", str(tmp_path / "f.yaml")]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args += ["--port", str(s.getsockname()[1])]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            while not kc.exists():
                assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
                time.sleep(0.05)
        finally:
            proc.terminate()
            out = proc.communicate(timeout=30)[0].decode()
        return out.split("real time")[0].split()[-1]

    group = "node_groups: [{name_prefix: g-, count: 1, instance_type: p5.48xlarge}]\n"
    assert served_speed("speed: 120\n" + group) == "120x"
    assert served_speed(group) == "1x"
    assert served_speed(None) == "1x"
    assert served_speed("speed: 120\n" + group, "--speed", "2") == "2x"


@pytest.mark.realtime("a served simulator and a sweeper in processes of their own share one clock")
def test_one_clock_for_the_served_simulator_and_an_outside_sweeper(tmp_path) -> None:
    """`sweeper sim serve` runs on the wall clock by default, the only clock kubectl and a Sweeper in
    another process can read. So what the simulator stamps (an Event's creationTimestamp, the check's
    result document from its kubelet) and what Sweeper stamps (the Event's first and last timestamps,
    its history) tell one time: each falls inside the sweep that wrote it. At the fleet's 600x the
    kubelet's metric would sit hours after its sweep, and an Event's creation hours after its own
    lastTimestamp."""
    import socket
    import subprocess
    import sys
    import time

    import yaml
    from kubernetes import config as kubeconfig_loader

    from sweeper.clock import parse_iso
    from sweeper.history import History

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"name": "clock", "seed": 3, "check_seconds": 1,
                                     "node_groups": [{"name_prefix": "gpu-", "count": 2,
                                                      "instance_type": "p5.48xlarge", "age": "2d"}]}))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("max_nodes: 2\nmax_percent: 100\nmin_node_age: 10m\npoll_interval: 0.2\ncheck_timeout: 5m\n"
                   "light_playbook: ''\n")
    kc, db = tmp_path / "kubeconfig", tmp_path / "history.db"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "sim", "serve", "--fleet", str(fleet), "--port",
                               str(port), "--kubeconfig-out", str(kc)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        while not kc.exists():  # the kubeconfig is written once the server listens
            assert server.poll() is None, server.stdout.read().decode()  # type: ignore[union-attr]
            time.sleep(0.05)
        run = subprocess.run([sys.executable, "-m", "sweeper.cli", "sweep", "--config", str(cfg), "--kubeconfig",
                              str(kc), "--state", str(db), "--json"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        cc = client.Configuration()
        kubeconfig_loader.load_kube_config(config_file=str(kc), client_configuration=cc)
        with client.ApiClient(cc) as api:
            events = [e for e in client.CoreV1Api(api).list_namespaced_event("default").items
                      if e.source and e.source.component == "sweeper"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    h = History(db)
    try:
        (r,) = list(h.db.query("select started, finished from runs"))
        sweeps = {s["id"]: s for s in h.db.query("select id, node, started, finished from node_sweeps")}
        metrics = list(h.db.query("select sweep_id, ts from metrics"))
    finally:
        h.close()
    lo, hi = int(r["started"]), r["finished"] + 1  # Kubernetes times are whole seconds
    assert len(sweeps) == 2 and metrics and events
    for m in metrics:
        s = sweeps[m["sweep_id"]]
        assert int(s["started"]) <= m["ts"] <= s["finished"], "the kubelet's result is timed inside its sweep"
    for e in events:
        written = [e.first_timestamp.timestamp(), e.last_timestamp.timestamp()]
        created = e.metadata.creation_timestamp.timestamp()
        assert all(lo <= t <= hi for t in [*written, created]), (e.reason, r, written, created)
        assert abs(created - parse_iso(e.last_timestamp.isoformat())) <= 1


def test_a_pod_log_is_read_no_further_than_its_limit_whatever_the_server_sends(sim: Sim) -> None:
    """limitBytes is applied by the kubelet, and the API server passes the kubelet's answer on
    (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#read-log-of-the-specified-pod);
    a node taken over sends what it likes. The simulated API server ignores limitBytes, as such a
    kubelet would: Sweeper's adapter still holds no more than the limit, and its connections stay usable."""
    sim.batch.create_namespaced_job("default", _job("loud", ["echo", "x" * (1 << 20)]))
    _finished(sim, "loud")
    pod = sim.core.list_namespaced_pod("default", label_selector="job-name=loud").items[0].metadata.name
    raw = sim.core.read_namespaced_pod_log(pod, "default", limit_bytes=4096, _preload_content=False)
    assert len(raw.data) > 4096, "the server sends it all"
    assert sim.kube.pod_log("default", pod, limit_bytes=4096) == "x" * 4096
    assert sim.kube.pod_log("default", pod) == "x" * (1 << 20) + "\n", "the next request on the pool reads whole"
