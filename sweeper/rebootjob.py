"""The reboot Job, followed by the loop that follows every Job (sweeper.actions.follow) until its
reboot began: its container ran, the node's boot id changed, the node is gone, or it went NotReady
with the Job's pod accepted by its kubelet. A Job that cannot start (an image that cannot be pulled,
a pod refused by admission or never scheduled) is a fault of the tool, never of the node."""

from __future__ import annotations

from typing import Any

from sweeper.actions import ActionContext
from sweeper.actions.follow import PollSource, Shape, follow
from sweeper.actions.podstate import TOOL_WAITING, container_ran, job_condition, node_gone, waiting_states
from sweeper.errors import NotFound
from sweeper.fleet import NodeView
from sweeper.result import CheckResult, Result, tool_result

JOB_TIMEOUT = 600.0  # a reboot or GPU reset Job's activeDeadlineSeconds, and how long it is followed (and a grace)


def _waiting(pods: list[dict[str, Any]]) -> list[str]:
    """Why the pods' containers wait, in the kubelet's words (ContainerCreating, ErrImagePull: ...)."""
    return [f"{w['reason']}: {w.get('message', '')}".rstrip(": ") for w in waiting_states(pods) if w.get("reason")]


def _accepted(pods: list[dict[str, Any]]) -> bool:
    """A reboot pod the kubelet took (status.startTime) and whose container was on its way to start, not
    waiting on a fault of the tool: a node that goes NotReady then is taken to reboot by its hand (its
    reboot may come before the kubelet posts the container running)."""
    return any((p.get("status") or {}).get("startTime") for p in pods) and \
        not any(w.get("reason") in TOOL_WAITING for w in waiting_states(pods))


class RebootShape(Shape):
    """A reboot Job: its outcome is decided once its container ran. The node may go down before the
    kubelet ever posts the pod Running; after the reboot the pod is Failed or Unknown, and a Job with
    backoffLimit 0 may say Failed: that is a reboot begun, not a failed one."""

    need = 0  # nothing is read from a finished pod
    decided_by_run = True
    what = "the reboot Job"
    part = "reboot Job"

    def never_scheduled(self, ctx: ActionContext, why: str) -> str:
        return f"the reboot Job's pod never scheduled ({why})" + node_gone(ctx, self.node)

    def never_started(self, ctx: ActionContext) -> str:
        return "the reboot Job's pod never started before its deadline" + node_gone(ctx, self.node)


def follow_reboot(ctx: ActionContext, ns: str, name: str, view: NodeView) -> tuple[bool, str, bool]:
    """Follow the reboot Job until its reboot began: (True, how it shows), or until it is given
    up on: (False, why, whether that is a fault of the tool rather than of the node or a stop)."""
    kube, node = ctx.kube, view.name

    def down() -> dict[str, Any] | None:
        """The node as a sign that the reboot began: NotReady, or booted since (a new boot id)."""
        try:
            now = NodeView.from_obj(kube.get_node(node))
        except NotFound:
            return {"type": "Rebooting", "message": "the node is gone (deleted)"}
        if now.boot_id and now.boot_id != view.boot_id:
            return {"type": "Rebooting", "message": f"its boot id changed from {view.boot_id or '(none)'}"}
        return None if now.ready else {"type": "Rebooting", "reason": "NotReady", "message": "the node went NotReady"}

    def ended(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        at = ctx.clock.now()
        ran = any(container_ran(p) for p in pods)
        if not ran and cond.get("reason") == "NotReady" and not _accepted(pods):
            # NotReady with the reboot pod never accepted by the kubelet, or stuck before its start (an
            # image that cannot be pulled): the node went down for another reason, not by this Job.
            return tool_result(node, at, "NotStarted", "the node went NotReady before the reboot Job's pod "
                               "started", "; ".join(_waiting(pods)) or "no pod of the Job was started")
        if ran or cond.get("type") == "Rebooting":
            how = "its container ran" if ran else cond.get("message", "")
            return Result(node=node, source="reboot", started=at, finished=at,
                          checks=(CheckResult("node.reboot", "pass", str(how)),))
        # Failed with no container run (backoffLimit 0): the pod's own words say why, where it has them
        # (the kubelet's UnexpectedAdmissionError, an eviction).
        said = [f"{st['reason']}: {st.get('message', '')}" for p in pods if (st := p.get("status") or {}).get("reason")]
        return tool_result(node, at, str(cond.get("reason") or "Failed"), "the reboot Job failed before its "
                           "container ran", "; ".join([str(cond.get("message") or ""), *said]).strip("; "))

    def gone(at: str, now: float) -> Result:
        cond = down()
        return ended(cond, []) if cond else tool_result(at, now, "Lost", f"Job {ns}/{name} was deleted")

    source = PollSource(ctx, lambda: kube.get_job(ns, name), lambda: kube.namespaced_pods(ns, f"job-name={name}"),
                        lambda job: down() or job_condition(job), gone,
                        lambda fault, now: fault.see_events(ctx, ns, name, now))  # admission refused its pod
    outcome = follow(ctx, source, RebootShape(node), JOB_TIMEOUT, False, ended)
    if outcome.result is None:  # never scheduled, never started, or the sweep was stopped
        return False, outcome.inconclusive, not ctx.cancelled()
    if outcome.result.status == "pass":
        return True, outcome.result.checks[0].message, False
    bad = outcome.result.failed_checks[0]
    # A tool fault is `error`; the node's GPU stack refusing the container is a finding (`fail`).
    return False, bad.message, bad.status == "error" and bad.code not in ("Lost", "NotStarted")
