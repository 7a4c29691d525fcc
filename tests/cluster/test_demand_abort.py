"""abort_on_demand stops only as many running checks as the pending GPU work needs (issue 25,
point 4): one pending 8-GPU pod frees one 8-GPU node, the check with the least done; a pod pinned
by its nodeSelector frees its own node; work that no node under test could host stops nothing.

Kubernetes schedules a pending pod onto a node whose labels its nodeSelector and required node
affinity accept and whose allocatable GPUs cover its request
(https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/); a Kueue Workload is
admitted with all its podSets or not at all (https://kueue.sigs.k8s.io/docs/concepts/workload/)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from typing import Any

from sweeper.config import Config
from sweeper.demand import Check, Want, holds_gpus, plan_aborts, selector, wants
from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, run_sweep

CFG = replace(TEST_CONFIG, yield_to_pending=False, abort_on_demand=True, check_timeout=6000)


def pending_pod(sim: Sim, name: str, gpus: int, node_selector: dict[str, str] | None = None) -> None:
    from kubernetes import client

    pod = client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace="training"),
                       spec=client.V1PodSpec(node_selector=node_selector, containers=[client.V1Container(
                           name="c", image="i",
                           resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}))]))
    sim.core.create_namespaced_pod("training", pod)


def when_checks_run(sim: Sim, count: int, then: Any) -> None:
    """Call `then` (on its own thread) once `count` check Jobs were created: all under test."""
    created = itertools.count(1)

    def hook(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "POST" and path.endswith("/jobs") and next(created) == count:
            threading.Thread(target=then).start()
    sim.server.hooks.append(hook)


def aborted(report: Any) -> list[Any]:
    return [o for o in report.outcomes if o.verdict == "inconclusive" and "aborted to make room" in " ".join(o.reasons)]


def test_one_pending_8_gpu_pod_aborts_one_of_four_checks(make_sim: Any, history: History) -> None:
    """Before: every running check was aborted for a single pending pod that one node serves."""
    sim = make_sim(nodes=4, check_seconds=1200)
    when_checks_run(sim, 4, lambda: pending_pod(sim, "big", 8))
    report = run_sweep(sim, history, CFG)
    stopped = aborted(report)
    assert len(stopped) == 1, [(o.node, o.verdict, o.reasons) for o in report.outcomes]
    assert "training/big" in stopped[0].reasons[0]
    assert sorted(o.verdict for o in report.outcomes if o not in stopped) == ["pass"] * 3


def test_a_pinned_pod_frees_the_node_it_asks_for(make_sim: Any, history: History) -> None:
    sim = make_sim(nodes=4, check_seconds=1200)
    when_checks_run(sim, 4, lambda: pending_pod(sim, "pinned", 8, {"kubernetes.io/hostname": "gpu-02"}))
    report = run_sweep(sim, history, CFG)
    assert [o.node for o in aborted(report)] == ["gpu-02"], [(o.node, o.verdict) for o in report.outcomes]


def test_work_no_node_under_test_could_host_aborts_nothing(make_sim: Any, history: History) -> None:
    """A 16-GPU pod fits no 8-GPU node: stopping a check would not let it run."""
    sim = make_sim(nodes=2, check_seconds=600)
    when_checks_run(sim, 2, lambda: pending_pod(sim, "huge", 16))
    report = run_sweep(sim, history, CFG)
    assert aborted(report) == [] and {o.verdict for o in report.outcomes} == {"pass"}


def test_least_progress_first_and_gangs_all_or_none() -> None:
    """Plan alone: the checks that began last go first; a two-pod gang frees two nodes, or none
    when only one could host it."""
    checks = [Check(f"n{i}", {"pool": "a" if i < 3 else "b"}, 8, started=100.0 * i, timeout=1000) for i in range(4)]
    anyone = selector({})
    assert plan_aborts([Want("w/one", 1, 8, anyone)], checks, now=400) == {"n3": ["w/one"]}
    gang = Want("w/gang", 2, 8, selector({"spec": {"nodeSelector": {"pool": "a"}}}))
    assert plan_aborts([gang], checks, now=400) == {"n2": ["w/gang"], "n1": ["w/gang"]}
    assert plan_aborts([gang], checks[2:], now=400) == {}
    small = [Want("w/s1", 1, 4, anyone), Want("w/s2", 1, 4, anyone)]
    assert plan_aborts(small, checks, now=400) == {"n3": ["w/s1", "w/s2"]}  # two halves share one node


def test_required_node_affinity_is_read() -> None:
    pod = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
                              {"matchExpressions": [{"key": "spare", "operator": "Exists"}]}]}}}}}
    fits = selector(pod)
    assert fits({"zone": "z1"}) and fits({"spare": ""}) and not fits({"zone": "z2"})


def test_a_kueue_podset_counts_its_pods() -> None:
    entry = {"kind": "Workload", "metadata": {"name": "w", "namespace": "ml", "labels": {}},
             "spec": {"nodeName": None, "containers": [{"resources": {"requests": {"nvidia.com/gpu": "16"}}}]},
             "status": {"phase": "Pending"}, "x-sweeper-demand": "kueue workload ml/w", "x-sweeper-pods": 2}
    [w] = wants([entry], Config())
    assert (w.name, w.pods, w.gpus) == ("kueue workload ml/w", 2, 8)


def test_only_a_check_that_holds_gpus_is_abortable() -> None:
    """A light check beside a workload takes no GPU: stopping it frees nothing for pending work."""
    def job(**spec: Any) -> dict[str, Any]:
        return {"spec": {"template": {"spec": spec}}}
    cfg = Config()
    assert holds_gpus(job(containers=[{"resources": {"limits": {"nvidia.com/gpu": "8"}}}]), cfg)
    assert holds_gpus(job(containers=[{}], resourceClaims=[{"name": "gpus"}]), cfg)
    assert not holds_gpus(job(containers=[{"resources": {"limits": {"cpu": "1"}}}]), cfg)
