"""Watches: the simulated API server serves them as the apiserver does, and a sweep follows its
check Jobs with them instead of reading each Job again and again.

The protocol is the one on
https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes:
a chunked stream of `{"type": ..., "object": ...}` lines from a resourceVersion, BOOKMARK events
when the client allows them, a 410 Gone (an ERROR event with an Expired Status) for a version
older than the history kept, and the stream ending after timeoutSeconds.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client, watch

from sweeper.actions import ActionContext, load_all
from sweeper.actions.jobwatch import RunWatch
from sweeper.actions.node import SEEN_FRESH
from sweeper.errors import Transient
from sweeper.history import History
from sweeper.kube import Expired
from tests.conftest import TEST_CONFIG, Sim, run_sweep


def raw_events(sim: Sim, path: str, **query: Any) -> tuple[int, list[dict[str, Any]]]:
    """A watch read to its end through the official client's plain HTTP call: the status and
    every event line as sent."""
    resp = sim.api_client.call_api(path, "GET", query_params=[("watch", "true"), *query.items()],
                                   auth_settings=["BearerToken"], _preload_content=False)
    lines = [json.loads(ln) for ln in resp.data.decode().splitlines() if ln.strip()]
    return resp.status, lines


def test_a_watch_sends_changes_from_a_resource_version(sim: Sim) -> None:
    """ADDED, MODIFIED and DELETED in order, each object as stored; an object that starts or stops
    matching the label selector comes as ADDED or DELETED. (Every change here is made before the
    watch starts, so its first batch holds them all, however short its timeoutSeconds.)"""
    rv = sim.core.list_namespaced_config_map("sweeper").metadata.resource_version
    sim.core.create_namespaced_config_map("sweeper", {"metadata": {"name": "c", "labels": {"app": "a"}}})
    sim.core.patch_namespaced_config_map("c", "sweeper", {"metadata": {"labels": {"app": "b"}}})
    sim.core.patch_namespaced_config_map("c", "sweeper", {"metadata": {"labels": {"app": "a", "x": "y"}}})
    sim.core.delete_namespaced_config_map("c", "sweeper")
    status, every = raw_events(sim, "/api/v1/namespaces/sweeper/configmaps", resourceVersion=rv, timeoutSeconds="1")
    assert status == 200
    assert [(e["type"], e["object"]["metadata"]["labels"]) for e in every] == [
        ("ADDED", {"app": "a"}), ("MODIFIED", {"app": "b"}), ("MODIFIED", {"app": "a", "x": "y"}),
        ("DELETED", {"app": "a", "x": "y"})]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in every]
    assert versions == sorted(versions) and versions[0] > int(rv)
    _, selected = raw_events(sim, "/api/v1/namespaces/sweeper/configmaps", resourceVersion=rv, timeoutSeconds="1",
                             labelSelector="app=a")
    assert [e["type"] for e in selected] == ["ADDED", "DELETED", "ADDED", "DELETED"]
    _, elsewhere = raw_events(sim, "/api/v1/configmaps", resourceVersion=rv, timeoutSeconds="1",
                              fieldSelector="metadata.namespace=default")
    assert elsewhere == []


def test_pods_by_node_without_a_version_start_with_what_exists(make_sim) -> None:
    """Without a resourceVersion a watch starts with an ADDED event for each object that exists
    (here: the pods on one node, by field selector)."""
    sim: Sim = make_sim(nodes=2, workloads=[{"node": "gpu-01", "gpus": 8, "duration": None}])
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="the workload")
    _, events = raw_events(sim, "/api/v1/pods", timeoutSeconds="1", fieldSelector="spec.nodeName=gpu-01")
    names = {e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"}
    assert names == {p.metadata.name for p in sim.core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName=gpu-01").items} and names
    _, none = raw_events(sim, "/api/v1/pods", timeoutSeconds="1", fieldSelector="spec.nodeName=gpu-00")
    assert [e for e in none if e["type"] == "ADDED" and e["object"]["metadata"]["namespace"] == "training"] == []


def test_bookmarks_timeout_and_the_official_client(sim: Sim) -> None:
    """With allowWatchBookmarks, a quiet stream carries BOOKMARK events that move the client's
    resourceVersion on; the stream ends after timeoutSeconds (of simulated time here); the
    official client's watch.Watch reads it as it reads a real apiserver."""
    clock = sim.cluster.clock
    clock.freeze()
    rv = sim.core.list_node().metadata.resource_version
    types: list[str] = []

    def later() -> None:
        sim.wait_for(lambda: any(m == "WATCH" for m, _ in sim.cluster.store.requests), what="the watch")
        sim.core.patch_node("gpu-01", {"metadata": {"labels": {"watched": "yes"}}})
        sim.wait_for(lambda: types, what="the first event")
        clock.advance(120)  # a quiet minute and more: a bookmark; then the timeout

    threading.Thread(target=later, daemon=True).start()
    w = watch.Watch()
    for ev in w.stream(sim.core.list_node, resource_version=rv, timeout_seconds=100, allow_watch_bookmarks=True):
        types.append(ev["type"])
        if ev["type"] == "MODIFIED":
            assert ev["object"].metadata.labels["watched"] == "yes"
    assert types[0] == "MODIFIED" and "BOOKMARK" in types[1:], types
    assert int(w.resource_version) >= int(rv)


def test_a_version_older_than_the_history_is_410_gone(sim: Sim) -> None:
    """After a compaction the apiserver answers a watch from an older version with 200 and a
    single ERROR event whose Status is 410 Expired; the client must list again."""
    rv = sim.core.list_node().metadata.resource_version
    sim.core.patch_node("gpu-00", {"metadata": {"labels": {"a": "b"}}})
    sim.cluster.store.compact()
    status, events = raw_events(sim, "/api/v1/nodes", resourceVersion=rv, timeoutSeconds="60")
    assert status == 200 and len(events) == 1
    assert events[0]["type"] == "ERROR"
    assert {k: events[0]["object"][k] for k in ("kind", "status", "reason", "code")} == {
        "kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}
    stream = sim.kube.watch("pods", "sweeper", "", rv, 60)
    with pytest.raises(Expired):
        list(stream)


def test_watches_of_jobs_and_events(sim: Sim) -> None:
    """Jobs and Events are watched like nodes and pods; a field selector filters Events."""
    jobs_rv = sim.batch.list_namespaced_job("sweeper").metadata.resource_version
    ev_rv = sim.core.list_namespaced_event("default").metadata.resource_version
    sim.batch.create_namespaced_job("sweeper", {"metadata": {"name": "j"}, "spec": {"template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})
    for reason in ("A", "B"):
        sim.core.create_namespaced_event("default", {"metadata": {"generateName": "e."}, "reason": reason,
                                                     "involvedObject": {"kind": "Node", "name": "gpu-00"}})
    _, jobs = raw_events(sim, "/apis/batch/v1/namespaces/sweeper/jobs", resourceVersion=jobs_rv, timeoutSeconds="1")
    assert jobs[0]["type"] == "ADDED" and jobs[0]["object"]["metadata"]["name"] == "j"
    _, events = raw_events(sim, "/api/v1/namespaces/default/events", resourceVersion=ev_rv, timeoutSeconds="1",
                           fieldSelector="reason=B")
    assert [(e["type"], e["object"]["reason"]) for e in events] == [("ADDED", "B")]


def test_a_run_watch_lists_again_after_a_dropped_stream_and_a_410(sim: Sim) -> None:
    """The run's watch of its Jobs, cut by the server and its history compacted meanwhile, lists
    again and carries on: a change made after the drop is seen."""
    labels = {"sweeper.dev/run-id": "sw-w"}
    job = {"metadata": {"name": "j", "labels": labels}, "spec": {"template": {"metadata": {"labels": labels}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}
    rw = RunWatch(sim.kube, "sweeper", "sweeper.dev/run-id=sw-w", sim.cluster.clock, 5.0)
    try:
        changed = rw.changed("j")
        sim.wait_for(lambda: sum(m == "WATCH" for m, _ in sim.cluster.store.requests) == 2, what="both watches")
        sim.batch.create_namespaced_job("sweeper", job)
        sim.wait_for(lambda: rw.state("j")[0] is not None, what="the Job, through the watch")
        watches = sum(m == "WATCH" for m, _ in sim.cluster.store.requests)
        with sim.cluster.store.lock:
            # Writes elsewhere in the cluster move the resourceVersion past the last one the watch saw
            # (an event of its own or a BOOKMARK, however fresh), and the history is compacted there: its
            # resume is then certainly too old. Compacting at the version the watch had already reached
            # would be no loss to it, and on a fast loopback it often had (1 run in 6).
            sim.cluster.store.next_rv()
            sim.cluster.store.compact()
        sim.server.drop_watches()
        sim.batch.patch_namespaced_job("j", "sweeper", {"metadata": {"labels": {"after": "drop"}}})
        sim.wait_for(lambda: (rw.state("j")[0] or {}).get("metadata", {}).get("labels", {}).get("after"),
                     what="the change made after the drop")
        assert changed.is_set()
        assert rw.relists >= 1, "a dropped stream is listed again"
        sim.wait_for(lambda: sum(m == "WATCH" for m, _ in sim.cluster.store.requests) >= watches + 2,
                     what="both watches started again")
    finally:
        rw.close()


def test_a_sweep_follows_its_jobs_with_one_watch_and_no_job_reads(make_sim, history: History) -> None:
    """However many nodes a run sweeps, it lists its Jobs and their pods once and then follows
    them with a watch on each (started again from its last version each time one ends, after
    timeoutSeconds: a count that grows with time, not with nodes): no GET of a single Job, and
    no list of one Job's pods, per node. (At 60x, so that a busy machine cannot make the pod
    watch look a simulated minute behind the Job watch, which would list a Job's pods.)"""
    sim: Sim = make_sim(nodes=6, speed=60)
    report = run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=6))
    assert [o.action for o in report.outcomes] == ["released"] * 6
    requests = sim.cluster.store.requests
    assert [p for m, p in requests if m == "GET" and "/jobs/" in p] == []
    watches = [p for m, p in requests if m == "WATCH"]
    assert set(watches) == {"/api/v1/namespaces/sweeper-checks/pods", "/apis/batch/v1/namespaces/sweeper-checks/jobs"}
    assert sum(1 for m, p in requests if m == "GET" and p == "/api/v1/namespaces/sweeper-checks/pods") == 1
    jobs = [p for m, p in requests if m == "GET" and p == "/apis/batch/v1/namespaces/sweeper-checks/jobs"]
    assert len(jobs) == 2, "one list by reconcile, one by the run's watch"
    sim.wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("run-watch-") and t.is_alive()],
                 what="the run's watch threads to end with the run")


def test_a_swept_node_is_written_twice(make_sim, history: History) -> None:
    """A passing node costs one patch that taints it and one that hands it back with its status
    labels and last result; the playbook's taint and verify_idle reuse what the hold read."""
    sim: Sim = make_sim(nodes=3)
    report = run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=3))
    assert {o.verdict for o in report.outcomes} == {"pass"}
    for n in ("gpu-00", "gpu-01", "gpu-02"):
        assert [m for m, _ in sim.writes_to(n)] == ["PATCH", "PATCH"], n
        labels = sim.core.read_node(n).metadata.labels
        assert labels["sweeper.dev/status"] == "pass" and "sweeper.dev/last-sweep" in labels
        assert json.loads(sim.core.read_node(n).metadata.annotations["sweeper.dev/last-result"])["verdict"] == "pass"
        assert not sim.core.read_node(n).spec.taints


def test_verify_idle_reuses_the_holds_pod_list_for_a_while(sim: Sim) -> None:
    """Within SEEN_FRESH of the hold's pod list (taken after the taint landed) verify_idle asks
    nothing; past it, it lists the node's pods again."""
    clock = sim.cluster.clock
    clock.freeze()
    node = sim.kube.get_node("gpu-00")
    ctx = ActionContext(config=TEST_CONFIG, clock=clock, kube=sim.kube, node={"name": "gpu-00"},
                        seen={"node": node, "at": clock.now(), "idle_at": clock.now()})
    verify_idle = load_all()["verify_idle"].fn
    before = len(sim.cluster.store.requests)
    clock.advance(SEEN_FRESH - 1)
    assert verify_idle(ctx, {})["failed"] is False
    assert len(sim.cluster.store.requests) == before
    clock.advance(2)
    assert verify_idle(ctx, {})["failed"] is False
    assert sim.cluster.store.requests[before:] == [("GET", "/api/v1/pods")]


def test_a_refused_watch_falls_back_to_listing(make_sim, history: History) -> None:
    """Where the watch is refused (a proxy or an RBAC without `watch` answers 403), the run polls
    its Jobs with a list every poll_interval, still one request per run, not per node."""
    from sweeper.sim.errors import ApiError

    sim: Sim = make_sim(nodes=3)

    def refuse(stage: str, method: str, path: str) -> None:
        if stage == "before" and method == "WATCH":
            raise ApiError(403, "Forbidden", "watch is not allowed here")

    sim.server.hooks.append(refuse)
    report = run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=3))
    assert [o.verdict for o in report.outcomes] == ["pass"] * 3, report.outcomes
    assert any("refused" in d.get("msg", "") for e, d in report.events if e == "log")  # type: ignore[attr-defined]
    assert [p for m, p in sim.cluster.store.requests if m == "GET" and "/jobs/" in p] == []


def test_the_watch_stream_error_is_transient(sim: Sim) -> None:
    """A stream cut by the server is a Transient error (the run lists again), not a crash."""
    rv = sim.core.list_node().metadata.resource_version
    stream = sim.kube.watch("pods", "sweeper", "", rv, 600)
    sim.server.drop_watches()
    with pytest.raises(Transient):
        list(stream)


def test_official_client_sees_410_as_an_api_exception(sim: Sim) -> None:
    rv = sim.core.list_node().metadata.resource_version
    sim.core.patch_node("gpu-00", {"metadata": {"labels": {"a": "c"}}})
    sim.cluster.store.compact()
    with pytest.raises(client.ApiException) as exc:
        list(watch.Watch().stream(sim.core.list_node, resource_version=rv, timeout_seconds=60))
    assert exc.value.status == 410
