"""A unit's life, for a node sweep and a light check: hold the node, play its playbook, read the
verdict, hand the node back or keep it held, then act on the verdict (status marks, Event,
remediation, notification). A pair's life (sweeper.sweep.pair) shares these steps."""

from __future__ import annotations

import time
from typing import Any

from sweeper import profiles
from sweeper.actions import node as node_actions
from sweeper.errors import KubeError, PlaybookError, SweeperError
from sweeper.fleet import NodeView
from sweeper.notify import message
from sweeper.policy import HOLDING
from sweeper.remedy import Remedy
from sweeper.sweep import depth
from sweeper.sweep.claims import judge_node
from sweeper.sweep.evidence import keep_evidence
from sweeper.sweep.faults import count_tool_error
from sweeper.sweep.hold import hand_back, hold_one
from sweeper.sweep.play import PLAY_FAULTS, event, node_vars, play, play_fault
from sweeper.sweep.record import NodeOutcome
from sweeper.sweep.state import Run


def sweep_node(run: Run, view: NodeView) -> NodeOutcome:
    """One node's sweep: hold, play, verdict, hand back, act."""
    t0 = time.monotonic()
    name = view.name
    choice = depth.choose(run.rec, run.cfg, run.sweep.rungs, view, run.clock.now(), run.windows)
    playbook = depth.playbook_of(run.sweep, choice)
    profile = profiles.match(run.sweep.profiles, view.labels)
    if run.tool_stop:
        return NodeOutcome(name, "", [f"not taken: {run.tool_stop}"], "skipped")
    node, lost = hold_one(run, view)
    if node is None:
        assert lost is not None
        return lost
    sweep_id = run.rec.sweep_started(run.id, name, run.clock.now(), playbook.name, profile.name)
    with run.mutex:
        run.checks.pop(name, None)
    event(run, node, "SweepStarted", f"held by run {run.id} for {playbook.name}"
          + (f" at depth {choice.why}" if choice.rung else ""), "Normal")
    if run.sweep.rungs:
        run.log(name, f"depth: {choice.why}")
    verdict, reasons, done_by_play = "error", ["the playbook did not reach a verdict"], ""
    decision: dict[str, Any] | None = None
    try:
        verdict, reasons, done_by_play, decision = play(run, sweep_id, node, profile, playbook,
                                                        choice.rung.dcgm_level if choice.rung else None)
        verdict, reasons = cap_replacements(run, verdict, reasons)
    except PLAY_FAULTS as exc:
        verdict, reasons = play_fault(exc)
    finally:
        action = hand_back(run, name, verdict, reasons, done_by_play)
        record_verdict(run, name, sweep_id, verdict, reasons, decision, action)
        depth.recorded(run, name, choice, verdict)
        judge_node(run, name, sweep_id, verdict)
    keep_if_held(run, node, profile, sweep_id, verdict, action)
    after_verdict(run, node, profile, verdict, reasons, decision, action)
    return NodeOutcome(name, verdict, reasons, action, time.monotonic() - t0)


def keep_if_held(run: Run, node: NodeView, profile: Any, sweep_id: int, verdict: str, action: str) -> None:
    """A node held for reboot, replacement or a person keeps its evidence, before a remedy takes it
    away; a bundle that cannot be kept is said, never in the way of the verdict or its remedy."""
    if verdict in HOLDING and action == "held":
        try:
            keep_evidence(run, node, profile, sweep_id)
        except SweeperError as exc:
            run.log(node.name, f"no evidence kept: {exc}")


def record_verdict(run: Run, name: str, sweep_id: int, verdict: str, reasons: list[str],
                   decision: dict[str, Any] | None, action: str) -> None:
    """Close the node's sweep row with its verdict once the node was handed back (or kept, or left)."""
    with run.mutex:  # a replacement counts once: in this run's tally until recorded, then there
        run.rec.sweep_finished(sweep_id, run.clock.now(), verdict, reasons, decision)
        if verdict == "replace":
            run.replacing -= 1
    run.emit("done", {"node": name, "verdict": verdict, "reasons": reasons, "action": action})
    count_tool_error(run, name, verdict)


def cap_replacements(run: Run, verdict: str, reasons: list[str]) -> tuple[str, list[str]]:
    """Beyond max_replacements_per_hour, a node that should be replaced is held for a person."""
    if verdict != "replace":
        return verdict, reasons
    cap = run.cfg.max_replacements_per_hour
    with run.mutex:
        recent = sum(run.rec.failures_since(run.clock.now() - 3600, ("replace",)).values())
        if recent + run.replacing < cap:
            run.replacing += 1
            return verdict, reasons
    return "quarantine", reasons + [f"replacement cap reached ({cap} per hour): held for a person instead"]


def after_verdict(run: Run, node: NodeView, profile: profiles.Profile, verdict: str, reasons: list[str],
                  decision: dict[str, Any] | None, action: str) -> None:
    """What people and neighbours see of a verdict: the node's status labels, annotation and
    condition, an Event, the remediation, a notification. A failure here is logged; the
    verdict and the hold stand."""
    name, sweep, now = node.name, run.sweep, run.clock.now
    rules = list((decision or {}).get("rules") or [])
    seen = run.seen.pop(name, {})
    marked = seen.get("node") if seen.get("marked") == (verdict, tuple(reasons), tuple(map(str, rules))) else None
    try:
        node_actions.mark_status(run.kube, run.cfg, name, verdict, reasons, rules, now(),
                                 condition=run.cfg.node_condition, marked=marked)
    except KubeError as exc:
        run.log(name, f"could not mark the node's status: {exc}")
    holding = verdict in HOLDING
    event(run, node, f"Sweep{verdict.capitalize()}", f"verdict {verdict} ({action}): "
          + ("; ".join(reasons) if verdict != "pass" else "all checks passed"),
          "Warning" if holding or verdict == "error" else "Normal")
    if not holding or action != "held":
        return
    run.fence()  # a remedy may reach past the Kubernetes API (a cloud provider)
    try:
        remedy = sweep.remediator.remediate(run.id, node, profile.name, verdict, decision, node_vars(node, profile))
    except (KubeError, PlaybookError) as exc:
        remedy = Remedy("error", "failed", f"remediation failed: {exc}; the node stays held", ok=False)
    if remedy is None:
        return
    with run.mutex:
        sweep.remedies.append(remedy)
    run.rec.action(run.id, name, now(), f"remediate-{remedy.provider}", f"{remedy.action}: {remedy.detail}"[:1000],
                   dry_run=remedy.dry_run)
    if remedy.action == "nodeclaim-deleted" and "terminated" in remedy.detail:
        run.rec.action(run.id, name, now(), "replaced", f"{remedy.provider}: {remedy.detail}")
    run.emit("remedy", {"node": name, "provider": remedy.provider, "action": remedy.action, "detail": remedy.detail})
    event(run, node, "SweepRemediation", f"{remedy.provider}: {remedy.action}: {remedy.detail}",
          "Normal" if remedy.ok else "Warning")
    if sweep.webhook and (verdict == "replace" or remedy.provider not in ("reboot", "gpu-reset") or not remedy.ok):
        _, what = sweep.webhook.send(message(name, verdict, reasons, f"{remedy.provider}: {remedy.action}"))
        run.rec.action(run.id, name, now(), "notify", what)


def light_check(run: Run, view: NodeView) -> NodeOutcome:
    """Run the light playbook on a busy node: no taint, no GPU requested; a failure makes the
    node a suspect (labelled and evented by the playbook), swept first when it goes idle."""
    t0 = time.monotonic()
    light = run.sweep.light_playbook
    assert light is not None
    profile = profiles.match(run.sweep.profiles, view.labels)
    sweep_id = run.rec.sweep_started(run.id, view.name, run.clock.now(), light.name, profile.name, kind="light")
    verdict, reasons = "error", ["the light playbook did not reach a verdict"]
    decision: dict[str, Any] | None = None
    try:
        verdict, reasons, _, decision = play(run, sweep_id, view, profile, light)
    except (PlaybookError, KubeError) as exc:
        verdict, reasons = "error", [f"light check failed to run: {exc}"]
    finally:
        run.rec.sweep_finished(sweep_id, run.clock.now(), verdict, reasons, decision)
        run.emit("light", {"node": view.name, "verdict": verdict, "reasons": reasons})
    return NodeOutcome(view.name, verdict, reasons, "light", time.monotonic() - t0)
