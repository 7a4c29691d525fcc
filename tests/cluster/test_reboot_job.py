"""The reboot Job is followed by the loop that follows every Job (sweeper.actions.follow) until its
reboot began: its container ran, or the node went NotReady or booted again (a new boot id). A reboot
Job that cannot start is a fault of the tool, never of the node: it is deleted, so that it cannot
reboot the node later unseen, the node is held for a person, and discovery does not wait for a
reboot that never began (before, it said "rebooting" until remediation_timeout, then blamed the
node: "not back from its reboot")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sweeper.fleet import NodeView
from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

# Pinned, as every image is; a tag the registry does not have.
BAD_REBOOT_IMAGE = "public.ecr.aws/docker/library/busybox:1.36-typo@sha256:" + "d" * 64
XID_79 = {"gpu-00": {"xids": [{"code": 79, "gpu": 2}]}}  # GPU fallen off the bus: a reboot
# Without the gate the node is re-checked with the fleet's playbook (tests/cluster/test_gate.py has
# the soak). The reboot Job is given up on in simulated time (TOOL_FAULT_GRACE, SCHEDULE_TIMEOUT),
# so a loaded machine makes these tests longer, never different.
CFG = replace(TEST_CONFIG, remediate_reboots=True, gate_taint="")
NS = CFG.remediation_namespace


def remedy(report: Any, node: str = "gpu-00") -> dict[str, Any]:
    return next(d for e, d in report.events if e == "remedy" and d["node"] == node)


def annotations(sim: Sim, node: str = "gpu-00") -> dict[str, str]:
    return sim.core.read_node(node).metadata.annotations or {}


def assert_held_for_a_person_not_rebooted(sim: Sim, history: History, report: Any, boot_id: str,
                                          *words: str) -> None:
    """The remedy failed as a fault of the tool; the Job is gone; the node is held, not rebooted,
    and not waited for; discovery says it is held, never "rebooting" or "not back"."""
    assert {o.node: (o.verdict, o.action) for o in report.outcomes} == {"gpu-00": ("reboot", "held")}
    r = remedy(report)
    assert (r["provider"], r["action"]) == ("reboot", "failed"), r
    for w in ("could not start", "(a fault of the tool, not of the node)", "held (tainted) for a person", *words):
        assert w in r["detail"], (w, r["detail"])
    assert sim.batch.list_namespaced_job(NS).items == [], "the Job is deleted: it cannot reboot the node later"
    node = sim.core.read_node("gpu-00")
    assert node.status.node_info.boot_id == boot_id and "gpu-00" not in sim.cluster.rebooting, "not rebooted"
    assert NodeView.from_obj(sim.kube.get_node("gpu-00")).ready
    assert CFG.taint_key in [t.key for t in node.spec.taints or []], "held (tainted): its verdict was reboot"
    ann = annotations(sim)
    assert ann["sweeper.dev/recheck"] == "false" and ann["sweeper.dev/remediation"] == "reboot-failed"
    acts = [a["detail"] for a in history.db.query("select detail from actions where action = 'remediate-reboot'")]
    assert len(acts) == 1 and acts[0].startswith("failed: the reboot Job"), acts
    events = sim.core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-00").items
    assert any(e.reason == "SweepRemediation" and e.type == "Warning" and "could not start" in e.message
               for e in events)
    # Long past remediation_timeout, discovery says the node is held, not that it is late from a reboot.
    sim.cluster.clock.advance(CFG.remediation_timeout + 600)
    later = run_sweep(sim, history, CFG)
    skip = next(d for d in later.plan.skip if d.node.name == "gpu-00")
    assert skip.reason == "held" and "reboot" not in skip.detail, skip.detail
    assert later.outcomes == [], "nor is it taken to be checked again"


def test_the_followed_reboot_job_is_seen_to_start(make_sim, history: History) -> None:
    """The Job's container ran: the reboot began, whatever the Job says after. With backoffLimit 0
    the Job is Failed once its pod fails, as it does when the node goes down under it
    (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-backoff-failure-policy):
    that is no failed reboot."""
    sim: Sim = make_sim(nodes=1, faults=XID_79)
    boot = sim.core.read_node("gpu-00").status.node_info.boot_id
    report = run_sweep(sim, history, CFG)
    r = remedy(report)
    assert (r["provider"], r["action"]) == ("reboot", "reboot-started"), r
    assert "the reboot began (its container ran)" in r["detail"], r["detail"]
    ann = annotations(sim)
    assert (ann["sweeper.dev/recheck"], ann["sweeper.dev/boot-id"]) == ("true", boot)
    sim.wait_for(lambda: sim.core.read_node("gpu-00").status.node_info.boot_id != boot, what="the reboot")
    job = sim.wait_for(lambda: next((j for j in sim.batch.list_namespaced_job(NS).items if j.status.conditions),
                                    None), what="the Job's condition")
    assert job.status.conditions[0].type == "Failed" and job.status.failed == 1, "Failed, and yet rebooted"


def test_an_unpullable_reboot_image_is_a_fault_of_the_tool(make_sim, history: History) -> None:
    """The kubelet sets the pod's startTime before it pulls; an image that cannot be pulled waits
    with ErrImagePull, then ImagePullBackOff, and its container never runs
    (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff)."""
    sim: Sim = make_sim(fleet_spec(nodes=1, faults=XID_79, registry={"missing": [BAD_REBOOT_IMAGE]}))
    boot = sim.core.read_node("gpu-00").status.node_info.boot_id
    report = run_sweep(sim, history, replace(CFG, reboot_image=BAD_REBOOT_IMAGE))
    assert_held_for_a_person_not_rebooted(sim, history, report, boot, f'the reboot Job image "{BAD_REBOOT_IMAGE}" '
                                          "cannot be pulled", "ImagePull")
    assert report.tool_errors == {}, "the checks ran: no tool error of the sweep's own"


def test_a_reboot_pod_that_never_schedules_is_given_up_on(make_sim, history: History) -> None:
    """Another tool taints the node NoSchedule just as the reboot Job is created: its pod, which
    tolerates only Sweeper's taints, never lands, and the scheduler says why."""
    sim: Sim = make_sim(nodes=1, faults=XID_79)
    boot = sim.core.read_node("gpu-00").status.node_info.boot_id
    taint = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}

    def taint_at_the_reboot_job(stage: str, method: str, path: str) -> None:
        if stage == "before" and method == "POST" and path.endswith(f"/namespaces/{NS}/jobs"):
            sim.cluster.store.mutate("nodes", None, "gpu-00",
                                     lambda n: n["spec"].setdefault("taints", []).append(dict(taint)))

    sim.server.hooks.append(taint_at_the_reboot_job)
    report = run_sweep(sim, history, CFG)
    sim.server.hooks.clear()
    assert_held_for_a_person_not_rebooted(sim, history, report, boot, "the reboot Job's pod never scheduled",
                                          "untolerated taint")


def test_a_reboot_pod_refused_by_admission_is_a_fault_of_the_tool(make_sim, history: History) -> None:
    """A namespace labelled pod-security.kubernetes.io/enforce=baseline refuses the privileged
    reboot pod at creation: no pod exists, only the Job controller's FailedCreate Event with the
    apiserver's words. https://kubernetes.io/docs/concepts/security/pod-security-admission/"""
    sim: Sim = make_sim(nodes=1, faults=XID_79)
    sim.core.patch_namespace(NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    boot = sim.core.read_node("gpu-00").status.node_info.boot_id
    report = run_sweep(sim, history, CFG)
    assert_held_for_a_person_not_rebooted(sim, history, report, boot, "the reboot Job pod was refused at creation",
                                          'violates PodSecurity "baseline:latest"')


def test_a_node_that_reboots_before_its_pod_is_seen_running_began_its_reboot(make_sim, history: History) -> None:
    """A real node may go down before the kubelet posts the reboot pod Running: its new boot id is
    the sign. Here the pod cannot even start, and the node boots again all the same."""
    sim: Sim = make_sim(fleet_spec(nodes=1, faults=XID_79, registry={"missing": [BAD_REBOOT_IMAGE]}))
    boot = sim.core.read_node("gpu-00").status.node_info.boot_id

    def reboot_at_the_reboot_job(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "POST" and path.endswith(f"/namespaces/{NS}/jobs"):
            sim.cluster._reboot_node("gpu-00", sim.cluster.clock.now())

    sim.server.hooks.append(reboot_at_the_reboot_job)
    report = run_sweep(sim, history, replace(CFG, reboot_image=BAD_REBOOT_IMAGE))
    sim.server.hooks.clear()
    r = remedy(report)
    assert (r["action"], r["provider"]) == ("reboot-started", "reboot"), r
    assert f"its boot id changed from {boot}" in r["detail"], r["detail"]
    assert annotations(sim)["sweeper.dev/recheck"] == "true"


def test_a_dry_run_reboot_writes_nothing(make_sim) -> None:
    from sweeper.remedy import Remediator
    from sweeper.runner import node_vars

    sim: Sim = make_sim(nodes=1)
    view = NodeView.from_obj(sim.kube.get_node("gpu-00"))
    before = len(sim.cluster.store.requests)
    out = Remediator(sim.kube, CFG, sim.cluster.clock, dry_run=True).reboot("run-1", view, node_vars(view, CFG))
    assert (out.action, out.dry_run) == ("would-reboot", True) and out.detail.startswith("would run ")
    assert [r for r in sim.cluster.store.requests[before:] if r[0] != "GET"] == []


def test_with_the_gate_a_node_whose_reboot_never_began_is_held_not_waited_for(make_sim, history: History) -> None:
    """The gate's taint goes on before the reboot (tests/cluster/test_gate.py) and stays: the node is
    gate-held for a person, not gate-waiting for a reboot that never began."""
    sim: Sim = make_sim(fleet_spec(nodes=1, faults=XID_79, registry={"missing": [BAD_REBOOT_IMAGE]}))
    cfg = replace(TEST_CONFIG, remediate_reboots=True, reboot_image=BAD_REBOOT_IMAGE)
    assert remedy(run_sweep(sim, history, cfg))["action"] == "failed"
    sim.cluster.clock.advance(cfg.remediation_timeout + 600)
    gate = next(d for d in run_sweep(sim, history, cfg).plan.gate if d.node.name == "gpu-00")
    assert (gate.reason, gate.take) == ("gate-held", False), gate


def test_a_node_notready_for_another_reason_is_no_reboot_begun(make_sim, history: History) -> None:
    """A node that goes NotReady while the reboot pod cannot start (here: an image that cannot be
    pulled) went down for another reason: the reboot did not begin by this Job. Read as begun, the
    Job stayed to reboot the node later unseen, and discovery blamed the node ("not back from its
    reboot")."""
    sim: Sim = make_sim(fleet_spec(nodes=1, faults=XID_79, registry={"missing": [BAD_REBOOT_IMAGE]}))
    boot = sim.core.read_node("gpu-00").status.node_info.boot_id

    def not_ready_at_the_reboot_job(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "POST" and path.endswith(f"/namespaces/{NS}/jobs"):
            def not_ready(n: dict[str, Any]) -> None:
                for c in n["status"]["conditions"]:
                    if c["type"] == "Ready":
                        c["status"] = "False"
            sim.cluster.store.mutate("nodes", None, "gpu-00", not_ready)

    sim.server.hooks.append(not_ready_at_the_reboot_job)
    report = run_sweep(sim, history, replace(CFG, reboot_image=BAD_REBOOT_IMAGE))
    sim.server.hooks.clear()
    r = remedy(report)
    assert (r["provider"], r["action"]) == ("reboot", "failed"), r
    assert "did not start" in r["detail"] and "went NotReady before the reboot Job's pod started" in r["detail"], r
    assert sim.batch.list_namespaced_job(NS).items == [], "the Job is deleted: it cannot reboot the node later"
    assert sim.core.read_node("gpu-00").status.node_info.boot_id == boot
    assert annotations(sim)["sweeper.dev/remediation"] == "reboot-failed"


def test_a_sweep_stopped_while_its_reboot_job_starts_leaves_the_reboot_to_it(make_sim, history: History) -> None:
    """SIGTERM while the reboot Job is followed: the run stops, and the node's reboot is left to its
    Job, as before the Job was followed; the node waits for its reboot (recheck), not for a person."""
    from sweeper.sweep import Sweep

    sim: Sim = make_sim(nodes=1, faults=XID_79)
    events: list[tuple[str, dict[str, Any]]] = []
    sw = Sweep(sim.kube, CFG, history, clock=sim.cluster.clock, emit=lambda e, d: events.append((e, d)))

    def stop_at_the_reboot_job(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "POST" and path.endswith(f"/namespaces/{NS}/jobs"):
            sw.stop.set()

    sim.server.hooks.append(stop_at_the_reboot_job)
    sw.run()
    sim.server.hooks.clear()
    r = next(d for e, d in events if e == "remedy")
    assert (r["provider"], r["action"]) == ("reboot", "reboot-requested"), r
    ann = annotations(sim)
    assert ann["sweeper.dev/remediation"] == "reboot" and ann["sweeper.dev/recheck"] == "true", ann
