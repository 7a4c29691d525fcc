"""A gated node's life (sweeper.gating says which nodes are gated): hold it, play the gate's deep
playbook (a new node) or the soak playbook (a node back from Sweeper's reboot or GPU reset), hand it
back, record the verdict, and only then, on a passing verdict, take the gate's taint off. A new
node that fails is replaced, not rebooted; one that never came up within gate_deadline fails
without a play. Every step is in the intent log, so a run that dies leaves a node the next run
gates again (its taint stays until a pass is recorded)."""

from __future__ import annotations

import time
from typing import Any

from sweeper import gating, profiles
from sweeper.actions import holding
from sweeper.errors import KubeError
from sweeper.fleet import Decision
from sweeper.sweep.hold import hand_back, hold_one, release
from sweeper.sweep.play import PLAY_FAULTS, event, play, play_fault
from sweeper.sweep.record import NodeOutcome
from sweeper.sweep.state import Run
from sweeper.sweep.unit import after_verdict, cap_replacements, keep_if_held, record_verdict

PASSING = ("pass", "warn")  # the verdicts that hand a node back to work
NEW_NODE_FAILS = ("reboot", "quarantine")  # on a new node, these are a replacement


def gate_node(run: Run, d: Decision) -> NodeOutcome:
    """One gated node: `d.reason` is gate (a new node), soak (back from a reboot or reset) or
    gate-late (never Ready, or no GPU advertised, within gate_deadline)."""
    t0 = time.monotonic()
    view, name = d.node, d.node.name
    if run.tool_stop:
        return NodeOutcome(name, "", [f"not taken: {run.tool_stop}"], "skipped")
    soak, late = d.reason == "soak", d.reason == "gate-late"
    playbook = run.sweep.soak_playbook if soak else run.sweep.gate_playbook
    assert playbook is not None
    profile = profiles.match(run.sweep.profiles, view.labels)
    node, lost = hold_one(run, view)
    if node is None:
        assert lost is not None
        return lost
    occupied = gating.occupants(run.kube.active_pods(node=name), run.cfg).get(name)
    if occupied:
        why = f"pods tolerate the gate and run here, not disturbed: {', '.join(occupied[:3])}"
        release(run, name, why, owner=run.id)
        return NodeOutcome(name, "", [why], "raced")
    sweep_id = run.rec.sweep_started(run.id, name, run.clock.now(), "gate" if late else playbook.name, profile.name)
    what = "failing it: " + d.detail if late else f"{playbook.name} ({'soak' if soak else 'new node'})"
    event(run, node, "GateStarted", f"gated by run {run.id}: {what}", "Normal")
    verdict, reasons, done_by_play = "error", ["the gate's playbook did not reach a verdict"], ""
    decision: dict[str, Any] | None = None
    try:
        if late:
            verdict, reasons = "replace", [f"gate: {d.detail}"]
        else:
            verdict, reasons, done_by_play, decision = play(run, sweep_id, node, profile, playbook)
        if not soak and verdict in NEW_NODE_FAILS:
            verdict, reasons, done_by_play = "replace", reasons + [
                f"a new node that fails its gate ({verdict}) is replaced, not rebooted"], ""
        capped = cap_replacements(run, verdict, reasons)
        if capped[0] != verdict:
            (verdict, reasons), done_by_play = capped, ""
    except PLAY_FAULTS as exc:
        verdict, reasons = play_fault(exc)
    finally:
        action = hand_back(run, name, verdict, reasons, done_by_play)
        record_verdict(run, name, sweep_id, verdict, reasons, decision, action)
    if verdict in PASSING and action == "released":
        ungate(run, name, verdict)
    elif verdict not in PASSING:
        run.log(name, f"gate: {verdict}; the gate's taint stays ({'; '.join(reasons)[:300]})")
    keep_if_held(run, node, profile, sweep_id, verdict, action)
    after_verdict(run, node, profile, verdict, reasons, decision, action)
    return NodeOutcome(name, verdict, reasons, action, time.monotonic() - t0)


def ungate(run: Run, name: str, verdict: str) -> bool:
    """Take the gate's taint off, now that the pass is in the history (record_verdict ran first)."""
    rec, now = run.rec, run.clock.now
    rec.intent(run.id, name, now(), "ungate", "before", f"verdict {verdict}")
    try:
        done = holding.ungate(run.kube, run.cfg, name)
    except KubeError as exc:
        rec.intent(run.id, name, now(), "ungate", "left", str(exc)[:300])
        run.log(name, f"gate: could not take {run.cfg.gate_taint} off ({exc}); the next run gates the node again")
        return False
    rec.intent(run.id, name, now(), "ungate", "after", f"verdict {verdict}")
    if done:
        rec.action(run.id, name, now(), "ungate", f"{run.cfg.gate_taint} removed after verdict {verdict}")
        run.emit("ungate", {"node": name, "verdict": verdict})
    return done
