"""`run_pair_job` with the MPIJob template (job-templates/nccl-pair-mpijob.yaml.j2) against the
simulated cluster with the MPI Operator installed (`mpi_operator: true` in the fleet).

What the simulated operator does follows github.com/kubeflow/mpi-operator, v2beta1
(pkg/controller/mpi_job_controller.go, mpi_job_controller_status.go): worker pods
<name>-worker-<i> through the scheduler, the launcher Job <name>-launcher once the workers run
(launcherCreationPolicy: WaitForWorkersReady), conditions Created / Running / Succeeded / Failed,
and deleting the MPIJob deletes what it made. A cluster without the operator's CRD answers 404 on
the resource path ("the server could not find the requested resource"), as the apiserver does for
any path it does not serve (https://kubernetes.io/docs/reference/using-api/api-concepts/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from sweeper.actions import ActionContext, load_all
from sweeper.errors import NotFound, NotServed
from sweeper.history import History
from tests.cluster.test_pair_job import node_vars, run_pair
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

MPI = "nccl-pair-mpijob.yaml.j2"
NS = TEST_CONFIG.check_namespace


def mpi_sim(make_sim: Callable[..., Sim], installed: bool = True, **kw: Any) -> Sim:
    return make_sim(fleet_spec(nodes=kw.pop("nodes", 2), mpi_operator=installed, **kw))


def leftovers(sim: Sim) -> dict[str, list[str]]:
    """Everything an MPIJob run could leave in the namespace (the operator's objects included)."""
    out = {"jobs": [j.metadata.name for j in sim.batch.list_namespaced_job(NS).items],
           "services": [s.metadata.name for s in sim.core.list_namespaced_service(NS).items],
           "configmaps": [c.metadata.name for c in sim.core.list_namespaced_config_map(NS).items],
           "secrets": [s.metadata.name for s in sim.core.list_namespaced_secret(NS).items],
           "pods": [p.metadata.name for p in sim.core.list_namespaced_pod(NS).items]}
    try:
        out["mpijobs"] = [m["metadata"]["name"] for m in sim.kube.list_mpijobs(NS, "")]
    except NotServed:
        out["mpijobs"] = []
    return out


NOTHING = {"jobs": [], "services": [], "configmaps": [], "secrets": [], "pods": [], "mpijobs": []}


def test_a_healthy_pair_passes_through_the_mpijob_form(make_sim: Callable[..., Sim]) -> None:
    sim = mpi_sim(make_sim)
    out, intents = run_pair(sim, template=MPI)
    assert out["status"] == "pass", out
    assert 350 <= out["busbw"] <= 479 * 1.03, "the healthy two-node p5 peak, the pair-allreduce gang's model"
    checks = {(c["name"], c["status"]) for c in out["result"]["checks"]}
    assert ("pair.nccl", "pass") in checks and ("pair.mtu", "skip") in checks, "no MTU probe is passed unread"
    assert [(op, phase) for op, phase, _ in intents] == [
        ("create-mpijob", "before"), ("create-mpijob", "after"), ("delete-mpijob", "before"), ("delete-mpijob", "after")]
    assert leftovers(sim) == NOTHING


def test_the_operator_makes_workers_on_both_nodes_and_reports_its_conditions(make_sim: Callable[..., Sim]) -> None:
    """The simulated operator's own story, read through the API just before the delete, and from the
    store's change history (what a watch of pods would have seen) for the workers, which
    cleanPodPolicy: Running deletes when the launcher finishes."""
    sim = mpi_sim(make_sim)
    seen: dict[str, Any] = {}

    def intent(op: str, phase: str, detail: str) -> None:
        if (op, phase) == ("delete-mpijob", "before"):
            name = detail.split("/")[1]
            seen["name"] = name
            seen["mpijob"] = sim.kube.get_mpijob(NS, name)
            seen["pods"] = sim.kube.namespaced_pods(NS, f"training.kubeflow.org/job-name={name}")
            seen["objects"] = leftovers(sim)
    ctx = ActionContext(config=TEST_CONFIG, clock=sim.cluster.clock, kube=sim.kube, node=node_vars(sim, "gpu-00"),
                        partner=node_vars(sim, "gpu-01"), run_id="sw-mpi-1", intent=intent)
    act = load_all()["run_pair_job"]
    out = act.fn(ctx, act.validate({"template": MPI, "timeout": "30m"}, "test"))
    assert out["status"] == "pass", out
    name = seen["name"]
    conds = {c["type"]: (c["status"], c["reason"]) for c in seen["mpijob"]["status"]["conditions"]}
    assert conds == {"Created": ("True", "MPIJobCreated"), "Running": ("False", "MPIJobRunning"),
                     "Succeeded": ("True", "MPIJobSucceeded")}
    with sim.cluster.store.lock:
        workers = {c.new["metadata"]["name"]: c.new for c in sim.cluster.store.changes
                   if c.plural == "pods" and c.new["metadata"]["name"].startswith(f"{name}-worker-")
                   and c.new["status"].get("phase") == "Running"}
    assert sorted(workers) == [f"{name}-worker-0", f"{name}-worker-1"]
    assert {p["spec"]["nodeName"] for p in workers.values()} == {"gpu-00", "gpu-01"}, "one worker on each node"
    assert all(p["spec"]["subdomain"] == f"{name}-worker" for p in workers.values())
    roles = {p["metadata"]["labels"]["training.kubeflow.org/job-role"] for p in seen["pods"]}
    assert roles == {"launcher"}, "cleanPodPolicy: Running: the workers' sshd went when the launcher finished"
    objects = seen["objects"]
    assert f"{name}-worker" in objects["services"] and f"{name}-config" in objects["configmaps"]
    assert f"{name}-ssh" in objects["secrets"] and f"{name}-launcher" in objects["jobs"]
    assert leftovers(sim) == NOTHING, "deleting the MPIJob deleted what the operator made"


@pytest.mark.parametrize("faults,code", [
    ({"link_degraded": 0.4}, "LOW_BANDWIDTH"),
    ({"fabric_corrupt": True}, "NCCL_WRONG"),
    ({"gpudirect_off": True}, "LOW_BANDWIDTH"),
])
def test_a_fabric_fault_fails_the_mpijob_pair(make_sim: Callable[..., Sim], faults: dict[str, Any],
                                              code: str) -> None:
    sim = mpi_sim(make_sim, faults={"gpu-01": faults})
    out, _ = run_pair(sim, template=MPI)
    assert out["status"] == "fail", out
    assert code in {c.get("code") for c in out["result"]["checks"] if c["status"] == "fail"}, out["result"]
    assert leftovers(sim) == NOTHING


@pytest.mark.parametrize("faults", [{}, {"gpu-01": {"port_flapping": True}}])
def test_both_forms_measure_the_same_fabric(make_sim: Callable[..., Sim], faults: dict[str, Any]) -> None:
    """The launcher's mpirun and the pair-allreduce gang draw from one fabric model: on the same
    fleet (same seed, first run of the pair) both forms read the same bus bandwidth."""
    job, _ = run_pair(mpi_sim(make_sim, faults=faults))
    mpi, _ = run_pair(mpi_sim(make_sim, faults=faults), template=MPI)
    assert job["busbw"] is not None and job["busbw"] == mpi["busbw"], (job, mpi)


def test_without_the_operator_the_pair_is_an_error_of_the_tool(make_sim: Callable[..., Sim]) -> None:
    """The CRD is not installed: the create is a 404 on the resource itself, told apart from an
    MPIJob that is not found. `error` naming the operator; no node is blamed (no check fails)."""
    sim = mpi_sim(make_sim, installed=False)
    with pytest.raises(NotServed):
        sim.kube.list_mpijobs(NS, "")
    out, intents = run_pair(sim, template=MPI)
    assert out["status"] == "error" and out["failed"] is True, out
    (check,) = out["result"]["checks"]
    assert (check["name"], check["code"]) == ("check.tool", "NoMPIOperator")
    assert "MPI Operator is not installed" in check["message"] and out["busbw"] is None
    assert not [c for c in out["result"]["checks"] if c["status"] == "fail"]
    assert [(op, phase) for op, phase, _ in intents] == [
        ("create-mpijob", "before"), ("delete-mpijob", "before"), ("delete-mpijob", "after")]
    assert leftovers(sim) == NOTHING


@pytest.mark.parametrize("installed", [True, False])
def test_discovery_lists_the_group_only_where_the_operator_is(make_sim: Callable[..., Sim], installed: bool) -> None:
    """As `kubectl api-resources` sees it: the CRD adds kubeflow.org/v2beta1 to /apis."""
    sim = mpi_sim(make_sim, installed=installed)
    groups = {g.name for g in client.ApisApi(sim.api_client).get_api_versions().groups}
    assert ("kubeflow.org" in groups) is installed and "batch" in groups


def test_an_mpijob_not_found_is_not_a_missing_operator(make_sim: Callable[..., Sim]) -> None:
    sim = mpi_sim(make_sim)
    with pytest.raises(NotFound) as err:
        sim.kube.get_mpijob(NS, "nobody")
    assert not isinstance(err.value, NotServed)
    assert sim.kube.delete_mpijob(NS, "nobody") is False


def test_workers_that_never_schedule_are_inconclusive_and_deleted(make_sim: Callable[..., Sim]) -> None:
    """Someone else holds the partner's GPUs: the second worker stays Pending, the launcher is never
    created (WaitForWorkersReady); no verdict on either node, and the MPIJob is deleted."""
    sim = mpi_sim(make_sim, workloads=[{"node": "gpu-01", "gpus": 8, "duration": None}])
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="training pod")
    out, intents = run_pair(sim, template=MPI)
    assert out["status"] == "inconclusive", out
    assert "never scheduled" in out["msg"] and out["busbw"] is None
    assert ("delete-mpijob", "after") in [(op, phase) for op, phase, _ in intents]
    assert leftovers(sim) == NOTHING


def test_a_stopped_sweep_deletes_the_mpijob(make_sim: Callable[..., Sim]) -> None:
    sim = mpi_sim(make_sim)
    out, intents = run_pair(sim, template=MPI, cancelled=lambda: True)
    assert out["status"] == "inconclusive" and "stopped" in out["msg"], out
    assert [op for op, phase, _ in intents if phase == "after"][-1] == "delete-mpijob"
    assert leftovers(sim) == NOTHING


def _dead_mpijob(sim: Sim, history: History, name: str = "pair-mpi-dead00") -> None:
    history.run_started("sw-dead", sim.cluster.clock.now() - 7200, "sweep")
    labels = {"app.kubernetes.io/managed-by": "sweeper", "app.kubernetes.io/component": "pair",
              "sweeper.dev/run-id": "sw-dead"}
    body = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name, "labels": labels},
            "spec": {"slotsPerWorker": 1, "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [
                    {"name": "l", "image": "busybox", "command": ["sleep", "inf"]}]}}},
                "Worker": {"replicas": 1, "template": {"spec": {"containers": [
                    {"name": "w", "image": "busybox", "command": ["sleep", "inf"]}]}}}}}}
    sim.kube.create_mpijob(NS, body)
    sim.wait_for(lambda: sim.core.list_namespaced_config_map(NS).items, what="the operator's objects")


def test_reconcile_deletes_the_mpijob_a_dead_run_left(make_sim: Callable[..., Sim], history: History) -> None:
    """A run killed between the MPIJob's create and its delete leaves it (and all the operator made
    for it) behind; the next run's reconcile deletes it. Someone else's MPIJob is left alone."""
    sim = mpi_sim(make_sim)
    _dead_mpijob(sim, history)
    sim.kube.create_mpijob(NS, {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                "metadata": {"name": "someone-elses", "labels": {"app": "train"}},
                                "spec": {"slotsPerWorker": 1, "mpiReplicaSpecs": {}}})
    report = run_sweep(sim, history)
    assert {"mpijob": "pair-mpi-dead00", "action": "deleted", "why": "left by run sw-dead"} in report.reconciled
    assert [m["metadata"]["name"] for m in sim.kube.list_mpijobs(NS, "")] == ["someone-elses"]
    assert not [c for c in sim.core.list_namespaced_config_map(NS).items if c.metadata.name.startswith("pair-mpi-dead00")]


def test_reconcile_skips_mpijobs_quietly_without_the_operator(make_sim: Callable[..., Sim],
                                                               history: History) -> None:
    sim = mpi_sim(make_sim, installed=False)
    history.run_started("sw-dead", sim.cluster.clock.now() - 7200, "sweep")
    report = run_sweep(sim, history)
    assert not [d for d in report.reconciled if "mpijob" in d]
    assert ("GET", f"/apis/kubeflow.org/v2beta1/namespaces/{NS}/mpijobs") in sim.cluster.store.requests
