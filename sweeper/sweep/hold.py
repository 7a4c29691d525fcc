"""Holding a node and handing it back: the taint (conditional on the version read), the look at
its pods after it, and the hand-back or keep-held that a verdict asks for, each step written to
the intent log before and after it happens."""

from __future__ import annotations

from typing import Any

from sweeper.actions import node as node_actions
from sweeper.errors import Conflict, NotFound, Transient
from sweeper.fleet import NodeView
from sweeper.policy import HOLDING
from sweeper.sweep.record import NodeOutcome
from sweeper.sweep.state import Run


def hold(run: Run, view: NodeView) -> NodeView | None:
    """Taint the node (conditional on the version we read), then look at its pods again.
    None if a GPU pod got there first, in which case the taint is already gone."""
    name = view.name
    run.rec.intent(run.id, name, run.clock.now(), "taint", "before", view.resource_version)
    updated = node_actions.hold(run.kube, run.cfg, _raw(view), run.id, run.clock.now())
    run.rec.intent(run.id, name, run.clock.now(), "taint", "after", updated["metadata"]["resourceVersion"])
    return _after_hold(run, name, updated)


def hold_one(run: Run, view: NodeView) -> tuple[NodeView | None, NodeOutcome | None]:
    """Hold a node for a unit of the queue; (None, why not) when it could not be held or was raced."""
    try:
        node = hold(run, view)
    except (Conflict, NotFound, Transient) as exc:
        if not _holds(run, view.name):
            run.emit("skip", {"node": view.name, "why": str(exc)})
            return None, NodeOutcome(view.name, "", [f"could not hold: {exc}"], "skipped")
        node = _after_hold(run, view.name)  # our taint did land: the reply was lost
    if node is None:
        return None, NodeOutcome(view.name, "", ["a GPU pod landed before the taint; released untouched"], "raced")
    return node, None


def _holds(run: Run, name: str) -> bool:
    try:
        current = NodeView.from_obj(run.kube.get_node(name), run.cfg.gpu_resources)
    except NotFound:
        return False
    taint = current.sweep_taint(run.cfg.taint_key)
    return bool(taint and taint.get("value") == run.id)


def _after_hold(run: Run, name: str, updated: dict[str, Any] | None = None) -> NodeView | None:
    """The node carries our taint: record it, then look at its pods again."""
    run.rec.action(run.id, name, run.clock.now(), "hold", f"taint {run.cfg.taint_key}={run.id}:NoSchedule")
    run.emit("hold", {"node": name})
    landed = node_actions.gpu_pods_on(run.kube, run.cfg, name)
    if landed:
        run.emit("raced", {"node": name, "pods": landed})
        release(run, name, f"GPU pod(s) landed before the taint: {', '.join(landed)}", owner=run.id)
        return None
    node = updated or run.kube.get_node(name)
    # The playbook's first steps (taint, verify_idle) reuse what was just read and written.
    run.seen[name] = {"node": node, "at": run.clock.now(), "idle_at": run.clock.now()}
    return NodeView.from_obj(node, run.cfg.gpu_resources)


def _raw(view: NodeView) -> dict[str, Any]:
    return {"metadata": {"name": view.name, "resourceVersion": view.resource_version,
                         "annotations": view.annotations}, "spec": {"taints": list(view.taints)}}


def hand_back(run: Run, name: str, verdict: str, reasons: list[str], done_by_play: str = "") -> str:
    """Record what the playbook's `always` did; do it here if the playbook did not."""
    reason = "; ".join(reasons)
    holding = verdict in HOLDING
    left = done_by_play == "left"
    rec, now = run.rec, run.clock.now
    if not left and (done_by_play not in ("released", "held") or (done_by_play == "held") != holding):
        if holding:
            rec.intent(run.id, name, now(), "keep-held", "before", verdict)
            left = not node_actions.keep_held(run.kube, run.cfg, name, verdict, reason, run.id,
                                              known=run.seen.get(name, {}).get("node"))
            rec.intent(run.id, name, now(), "keep-held", "left" if left else "after", verdict)
        else:
            rec.intent(run.id, name, now(), "untaint", "before", f"verdict {verdict}")
            done = node_actions.release(run.kube, run.cfg, name, run.id, clear_suspect=verdict in ("pass", "warn"),
                                        known=run.seen.get(name, {}).get("node"))
            left = bool(done.left_to)
            rec.intent(run.id, name, now(), "untaint", "left" if left else "after",
                       f"taint of run {done.left_to}" if left else f"verdict {verdict}")
    if left:
        rec.action(run.id, name, now(), "left", f"{verdict}: another run's taint is on the node; left in place")
        return "left"
    if holding:
        rec.action(run.id, name, now(), "keep-held", f"{verdict}: {reason[:1000]}")
        return "held"
    rec.action(run.id, name, now(), "release", f"verdict {verdict}")
    return "released"


def release(run: Run, name: str, why: str, owner: str) -> bool:
    """Take run `owner`'s taint off (this run's, or a dead run's being reconciled); False when
    another run's taint is there instead, which stays."""
    rec, now = run.rec, run.clock.now
    rec.intent(run.id, name, now(), "untaint", "before", why)
    done = node_actions.release(run.kube, run.cfg, name, owner)
    if done.left_to:
        rec.intent(run.id, name, now(), "untaint", "left", f"taint of run {done.left_to}")
        rec.action(run.id, name, now(), "left", f"{why}; but the node carries the taint of run "
                   f"{done.left_to} now: left in place")
        return False
    rec.intent(run.id, name, now(), "untaint", "after", why)
    rec.action(run.id, name, now(), "release", why)
    return True
