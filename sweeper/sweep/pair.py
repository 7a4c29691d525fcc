"""A pair's life: hold both nodes (or the partner of a suspect already held), play the pair
playbook once for the two, record one sweep row per node and one pair result, then hand both
back, keep a suspect held for its re-pair, or keep a culprit held with its verdict."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, cast

from sweeper import pairing, profiles
from sweeper.actions import ActionContext
from sweeper.actions.decide import policy_for
from sweeper.errors import KubeError
from sweeper.fleet import NodeView
from sweeper.playbook.executor import Executor
from sweeper.playbook.model import Playbook
from sweeper.policy import HOLDING, pair_rule
from sweeper.result import Result
from sweeper.sweep.claims import judge_fabric
from sweeper.sweep.hold import hand_back, hold_one, release
from sweeper.sweep.play import (
    PLAY_FAULTS,
    context,
    event,
    extra_vars,
    node_vars,
    on_task,
    play_fault,
    play_vars,
    result,
    verdict_of,
)
from sweeper.sweep.record import NodeOutcome, PairRun
from sweeper.sweep.state import Run
from sweeper.sweep.unit import after_verdict, cap_replacements, keep_if_held, record_verdict


def sweep_pair(run: Run, a: NodeView, b: NodeView, mode: str, held: bool | None = None,
               playbook: Playbook | None = None, repairs: bool = True) -> PairRun:
    """Hold both nodes (in mode "repair", `a` is the suspect, already held by this run unless
    `held` is False: a suspect an earlier run let go), run the pair playbook (the run's, or
    `playbook`) once for the two, record one sweep row per node and one pair result, and hand both
    back, or keep a suspect held for its re-pair, or a culprit with its verdict. `repairs`: the
    caller re-pairs the suspects this pair names (a claim's pair re-pairs no one)."""
    t0 = time.monotonic()
    held = mode == "repair" if held is None else held
    back = a if held else None  # a re-pair abandoned before it ran: the suspect waits again
    if run.tool_stop:
        return PairRun([NodeOutcome(v.name, "", [f"not taken: {run.tool_stop}"], "skipped")
                        for v in ((b,) if held else (a, b))], back=back)
    nodes: list[NodeView] = [a] if held else []
    for v in ([b] if held else [a, b]):
        got, lost = hold_one(run, v)
        if got is not None:
            nodes.append(got)
            continue
        # The pair is abandoned cleanly: what this pair held goes back untouched.
        outs = [cast(NodeOutcome, lost)]
        for other in (a, b):
            if other.name == v.name or (held and other.name == a.name):
                continue
            why = f"partner {v.name} could not be held ({lost.action if lost else 'lost'}): not swept"
            if any(n.name == other.name for n in nodes):
                release(run, other.name, why, owner=run.id)
            outs.append(NodeOutcome(other.name, "", [why], "skipped"))
        return PairRun(outs, back=back)
    first, second = nodes
    playbook = playbook or run.sweep.playbook
    run.emit("pair", {"nodes": [first.name, second.name], "mode": mode})
    profs = [profiles.match(run.sweep.profiles, n.labels) for n in nodes]
    ids = tuple(run.rec.sweep_started(run.id, n.name, run.clock.now(), playbook.name, pr.name, kind="pair")
                for n, pr in zip(nodes, profs, strict=True))
    for n, other in ((first, second), (second, first)):
        event(run, n, "SweepStarted", f"held by run {run.id} for {playbook.name} with {other.name} ({mode})", "Normal")
    verdict, reasons = "error", ["the pair playbook did not reach a verdict"]
    busbw: float | None = None
    decision: dict[str, Any] | None = None
    hosts: set[str] = set()  # whose own logs, probes or pods gave the findings that are not a pass
    out = PairRun([])
    try:
        verdict, reasons, busbw, decision = _play_pair(run, (ids[0], ids[1]), first, second, profs, mode, playbook,
                                                       hosts)
    except PLAY_FAULTS as exc:
        verdict, reasons = play_fault(exc)
    finally:
        status = pairing.pair_status(verdict)
        disputed = pairing.partner_only(mode, second.name, verdict, hosts)
        # A re-pair that failed on its partner's own log alone blames no one, as a pair of mode sweep
        # does, and is recorded as one: both its nodes are the history's suspects, neither known-good.
        detail = (f"failed on {second.name}'s own log alone: " if disputed else "") + "; ".join(reasons)
        run.rec.pair_result(run.id, run.clock.now(), first.name, second.name, status,
                            "sweep" if disputed else mode, busbw, detail[:1000], (ids[0], ids[1]))
        out.disputed = second.name if disputed else ""
        calls = tuple(_pair_rule(run, c) for c in pairing.node_verdicts(mode, first.name, second.name, verdict,
                                                                         reasons, hosts, repairs))
        out.suspects = tuple((n, o.name) for c, n, o in zip(calls, nodes, nodes[::-1], strict=True) if c.suspect)
        out.why = f"{status}: {'; '.join(reasons)}"[:500]
        out.status = status
        if status in ("pass", "warn"):
            out.passed = (first.name, second.name)
        for call, view, prof, sweep_id in zip(calls, nodes, profs, ids, strict=True):
            out.outcomes.append(_pair_node(run, call, view, prof, sweep_id,
                                           _pair_decision(run, call, verdict, decision), t0))
    return out


def _pair_rule(run: Run, call: pairing.NodeCall) -> pairing.NodeCall:
    """A suspect that the policy's pair rules already condemn (failed pairs with too many
    different partners) gets that verdict now, without a re-pair."""
    if not call.suspect:
        return call
    found = pair_rule(policy_for(ActionContext(config=run.cfg)), run.rec, call.node, run.clock.now())
    if found is None or found.verdict not in HOLDING:
        return call
    return pairing.NodeCall(call.node, found.verdict, found.reasons, rules=found.rules)


def _pair_decision(run: Run, call: pairing.NodeCall, verdict: str,
                   decision: dict[str, Any] | None) -> dict[str, Any] | None:
    """The decision recorded on a node's row: the play's where the node got the play's verdict;
    the pair rule's where that rule held the node (so its history names the rule)."""
    if call.rules:
        return {"verdict": call.verdict, "causes": [], "rules": list(call.rules), "decided": run.clock.now(),
                "policy": policy_for(ActionContext(config=run.cfg)).name, "gpus": []}
    return decision if call.verdict == verdict else None


def _pair_node(run: Run, call: pairing.NodeCall, view: NodeView, prof: profiles.Profile,
               sweep_id: int, decision: dict[str, Any] | None, t0: float) -> NodeOutcome:
    """One node's part of a pair run: its sweep row closed, and the node handed back, kept held
    with its verdict, or (a suspect) kept held for its re-pair."""
    name, verdict, reasons = view.name, call.verdict, list(call.reasons)
    if call.suspect:
        run.rec.sweep_finished(sweep_id, run.clock.now(), verdict, reasons, decision)
        run.emit("done", {"node": name, "verdict": verdict, "reasons": reasons, "action": "suspect"})
        return NodeOutcome(name, verdict, reasons, "suspect", time.monotonic() - t0)
    verdict, reasons = cap_replacements(run, verdict, reasons)
    action = "left"
    try:
        action = hand_back(run, name, verdict, reasons)
    finally:
        record_verdict(run, name, sweep_id, verdict, reasons, decision, action)
    keep_if_held(run, view, prof, sweep_id, verdict, action)
    after_verdict(run, view, prof, verdict, reasons, decision, action)
    return NodeOutcome(name, verdict, reasons, action, time.monotonic() - t0)


def _play_pair(run: Run, ids: tuple[int, int], a: NodeView, b: NodeView, profs: list[profiles.Profile],
               mode: str, playbook: Playbook,
               hosts: set[str]) -> tuple[str, list[str], float | None, dict[str, Any] | None]:
    """Run the pair playbook once: `node` is A, `partner` B, `pair_mode` the mode. Each result
    is recorded on both nodes' sweep rows; `hosts` gains the node each finding that is not a pass
    came from (its check's `host`, else the result's node: A, whose play it is)."""
    vars_ = play_vars(run, a, profs[0])
    partner_vars = node_vars(b, profs[1])

    def on_result(r: Result) -> None:
        hosts.update(c.host or r.node for c in r.checks if c.status in ("fail", "warn", "error"))
        result(run, ids[0], a.name, r)
        run.rec.result(ids[1], replace(r, node=b.name))

    ctx = context(run, ids[0], a.name, vars_, partner=partner_vars)
    ctx.on_result = on_result
    extra = {"node": vars_, "partner": partner_vars, "pair_mode": mode, **extra_vars(run, vars_)}
    done = Executor(run.sweep.actions, ctx, on_task(run, a.name)).run(playbook, extra)
    found = [v["busbw"] for v in done.vars.values() if isinstance(v, dict) and v.get("busbw") is not None]
    verdict, reasons, decision = verdict_of(done, "the sweep was stopped before the pair's checks finished")
    return verdict, reasons, float(found[0]) if found else None, decision


def claim_pair(run: Run, node: NodeView, partner: NodeView) -> PairRun:
    """An NVLink or fabric claim's pair: the claimed node (its own sweep passed and it went back)
    with an idle known-good partner, through the claims' pair playbook in mode "repair" (a failure is
    the node's, and goes through the policy as a finding of Sweeper's own); then the claim is settled
    from the node's own checks and this pair (sweeper.claims.judge_pair)."""
    got = PairRun([])
    try:
        got = sweep_pair(run, node, partner, "repair", held=False, playbook=run.sweep.claims_pair_playbook,
                         repairs=False)
    finally:
        why = got.why or "; ".join(r for o in got.outcomes for r in o.reasons)[:500] or "the pair did not run"
        status = "inconclusive" if got.disputed else got.status  # the partner's own log is no word on the node
        judge_fabric(run, node.name, status, why.split(": ", 1)[-1] if got.status else why, partner.name)
    return got


def let_suspect_go(run: Run, book: pairing.Repairs, name: str, why: str, verdict: str = "inconclusive") -> NodeOutcome:
    """A suspect with no re-pair goes back `inconclusive` (a failed pair is no verdict on either
    node), or `error` when every pair of the run failed (a fault of the check)."""
    s = book.waiting.pop(name)
    reason = f"pair with {s.first_partner} failed ({s.why}); {why}: handed back {verdict}"
    try:
        release(run, name, reason, owner=run.id)
    except KubeError as exc:
        run.log(name, f"could not hand the node back: {exc}; the next run's reconcile will")
    run.emit("done", {"node": name, "verdict": verdict, "reasons": [reason], "action": "released"})
    return NodeOutcome(name, verdict, [reason], "released")
