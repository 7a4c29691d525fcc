"""Discovery and the gates a node passes before a run takes it: the plan (due, idle, within the
budget and the floor), the outside signals that name suspects, the switches people flip (pause,
breaker, dismissals), the breaker that trips on too many failures, the attempt window, and the
busy nodes due a light check."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from sweeper import gating, platforms, profiles, signals
from sweeper.actions import node as node_actions
from sweeper.clock import iso
from sweeper.control import KEYS, dismissal_key
from sweeper.fleet import Gates, NodeView, Plan, gpu_nodes, plan, suspect_signals
from sweeper.policy import HOLDING
from sweeper.sweep import claims as outside_claims
from sweeper.sweep import depth
from sweeper.sweep.record import ATTEMPT_VERDICTS
from sweeper.sweep.state import Run


# -- discovery -------------------------------------------------------------------------
def discover(run: Run, refill: bool = False) -> Plan:
    """`refill`: a look again within a run, which reuses the outside signals the run's first
    discovery read and marked (one query of each source a run)."""
    cfg = run.cfg
    gated, listed = gating.split(run.kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size), cfg)
    nodes = gpu_nodes(listed, cfg)
    pods = run.kube.active_pods(page_size=cfg.page_size)
    settled = None if refill else resolve_platform(run, nodes, pods)
    cfg = run.cfg  # as settled
    if not run.dry_run:
        trip_breaker(run, len(nodes))
    found = gates(run)
    run.cooling = found.cooldown
    if cfg.suspect_sources and refill:
        found = replace(found, suspects=run.suspects)
    elif cfg.suspect_sources:
        named, problems = signals.suspects(run.sweep.sources)
        run.suspects = named
        for problem in problems:
            run.log("-", f"suspect source unavailable: {problem}")
        found = replace(found, suspects=named)
        if not run.dry_run:
            nodes = mark_suspects(run, nodes, named)
    run.claimed = outside_claims.pending(run, nodes)
    if run.claimed:  # a node carrying an untested claim goes first, as a suspect does
        found = replace(found, suspects={**run.claimed, **found.suspects})
    p = plan(nodes, pods, cfg, run.rec.last_swept(run.sweep.kind), run.clock.now(), found)
    stop = ("paused", found.paused) if found.paused else ("breaker-open", found.breaker) if found.breaker else ("", "")
    late = gating.joined_long_ago(gated, cfg, run.clock.now())
    seen = run.rec.gate_seen(late, run.clock.now() - cfg.gate_deadline) if late else {}
    p.gate, p.gate_budget = gating.gate_plan(gated, pods, cfg, run.clock.now(), stop, found.attempts, seen)
    if not run.dry_run and run.id:  # a run's look (not `plan`'s): when nodes were idle, for the idle window
        depth.observe(run.rec, cfg, p, run.clock.now())
    for d in p.skip:
        if d.warning:  # the node's own data is broken: that node is skipped, the run goes on
            run.log(d.node.name, f"warning: {d.warning}")
    # Every GPU node this pass saw, with its profile: the report's coverage counts the never swept.
    p.profiles = {d.node.name: profiles.match(run.sweep.profiles, d.node.labels).name
                  for d in p.take + p.skip + p.gate}
    if settled is not None:
        p.notes = [*settled.why, *p.notes]
    return p


def resolve_platform(run: Run, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> platforms.Found | None:
    """Settle `platform: auto` (and the runtime class and DCGM host engine) from the GPU nodes this
    discovery read; the run's checks and remedies use what was found."""
    sweep = run.sweep
    cfg, found = platforms.resolve(sweep.auto_cfg, nodes, pods, run.kube.runtime_class_names)
    if found is not None:
        sweep.cfg = sweep.remediator.cfg = cfg
        run.log("-", "found " + "; ".join(found.why))
    return found


def mark_suspects(run: Run, nodes: list[dict[str, Any]], found: dict[str, str]) -> list[dict[str, Any]]:
    """Label and event each node an outside signal names, once; the nodes as they are after."""
    label, note = f"{run.cfg.prefix}/suspect", f"{run.cfg.prefix}/suspect-reason"
    out = []
    for obj in nodes:
        name = obj["metadata"]["name"]
        if name not in found or (obj["metadata"].get("labels") or {}).get(label) == "true":
            out.append(obj)
            continue
        def mark(n: dict[str, Any], why: str = found[name]) -> list[dict[str, Any]] | None:
            ops = (node_actions.meta_op(n, "labels", {label: "true"}) or []) + \
                (node_actions.meta_op(n, "annotations", {note: why[:500]}) or [])
            return ops or None

        out.append(node_actions.patch_node(run.kube, name, mark) or obj)
        node_actions.node_event(run.kube, name, obj["metadata"].get("uid", name), "SweeperSuspect",
                                f"named by an outside signal: {found[name]}", "Warning", "sweeper", run.clock.now())
        run.rec.action("signals", name, run.clock.now(), "suspect", found[name])
    return out


def suspect(run: Run, view: NodeView) -> bool:
    """A node with signs of its own trouble (a condition, a signal, GPUs the device plugin holds
    back): never the probe after a stop, whose failing would say nothing about the check."""
    return bool(suspect_signals(view, run.cfg, {**run.claimed, **run.suspects}))


def light_candidates(run: Run, p: Plan) -> list[NodeView]:
    """Busy nodes due a read-only check (oldest first), when a light playbook is configured."""
    if run.sweep.light_playbook is None or run.sweep.stop.is_set():
        return []
    last = run.rec.last_light()
    now = run.clock.now()
    due = [d.node for d in p.skip if d.reason == "busy" and now - last.get(d.node.name, 0.0) >= run.cfg.light_interval]
    due.sort(key=lambda v: (last.get(v.name, 0.0), v.name))
    return due[: run.cfg.light_max]


# -- the gates: pause, breaker, cooldown, attempts -----------------------------------------
def gates(run: Run) -> Gates:
    now = run.clock.now()
    controls, rec, cfg = run.sweep.controls, run.rec, run.cfg
    # A switch an older version kept in the history file counts until a run carries it over.
    pause = controls.get("pause") or rec.get_control("pause")
    breaker = controls.get("breaker") or rec.get_control("breaker") or {}
    is_open = breaker.get("state") == "open"
    cooling = breaker.get("state") == "closed" and now - float(breaker.get("closed_at", 0)) < cfg.breaker_cooldown
    return Gates(paused=(f"paused by {pause.get('by', '?')}: {pause.get('reason', '')}" if pause else ""),
                 breaker=(f"breaker open since {iso(breaker['opened_at'])}: {breaker.get('reason', '')}; "
                          "close it with `sweeper breaker reset`" if is_open else ""),
                 cooldown=cooling, attempts=attempts(run, now))


def attempts(run: Run, now: float) -> dict[str, int]:
    """Failed sweeps per node within the attempt window; a check that could not run at all is a
    fault of the tool and does not count against the node."""
    failed = run.rec.failures_since(now - run.cfg.attempt_window, ATTEMPT_VERDICTS)
    tool = run.rec.tool_errors_since(now - run.cfg.attempt_window)
    return {n: k - tool.get(n, 0) for n, k in failed.items() if k > tool.get(n, 0)}


def trip_breaker(run: Run, gpu_nodes: int) -> bool:
    """Open the breaker when too many nodes failed within the window: a systemic fault (a bad
    driver, a broken check image, a network outage) is not a node fault. It stays open until a
    person resets it."""
    now, cfg = run.clock.now(), run.cfg
    current = run.sweep.controls.get("breaker") or {}
    if current.get("state") == "open":
        return True
    since = max(now - cfg.breaker_window, float(current.get("closed_at", 0.0)))
    failed = run.rec.failures_since(since, HOLDING)
    threshold = max(cfg.breaker_failures, math.ceil(gpu_nodes * cfg.breaker_percent / 100.0))
    # Nodes, not verdicts: one node failing again within the window (re-swept after a person released
    # it) is the same known fault, not a second sign of a systemic one.
    total = len(failed)
    if total < threshold:
        return False
    reason = (f"{sum(failed.values())} failing verdicts on {total} node(s) within {cfg.breaker_window / 60:g} min "
              f"(threshold {threshold} nodes)")
    switch(run, "breaker", {"state": "open", "opened_at": now, "reason": reason, "nodes": sorted(failed)}, now)
    run.emit("breaker", {"reason": reason})
    return True


# -- the switches people flip (sweeper.control) --------------------------------------------
def see_controls(run: Run) -> None:
    """Record in the history each switch that changed since this history last saw it, so that
    `sweeper history` and a backtest know when a pause or a breaker was in force; and carry
    over a pause or breaker that an older version kept in the history file."""
    now, controls, rec = run.clock.now(), run.sweep.controls, run.rec
    for key in KEYS:
        old = rec.get_control(key)
        if old is None:
            continue
        ts = float(old.pop("ts", now))
        if controls.get(key) is None:
            controls.set(key, {**old, "carried_from": "history"}, ts)
            what = f"{key} carried from the history file to configmap {run.cfg.namespace}/{run.cfg.control_name}"
        else:
            what = f"{key} in the history file ignored: configmap {run.cfg.control_name} has its own"
        rec.set_control(key, None, now)
        rec.action(run.id, "*", now, "control-migrated", f"{what}: {json.dumps(old, sort_keys=True)}"[:1000])
        run.log("-", what)
    switches = controls.all()
    for key in sorted(set(KEYS) | set(switches)):
        current = switches.get(key)
        if (rec.get_control(f"seen.{key}") or {}).get("value") == current:
            continue
        node = key.removeprefix("dismissed.") if key.startswith("dismissed.") else "*"
        rec.action(run.id, node, now, "control-seen",
                   f"{key}: {json.dumps(current, sort_keys=True) if current is not None else 'cleared'}"[:1000])
        rec.set_control(f"seen.{key}", {"value": current} if current is not None else None, now)


def switch(run: Run, key: str, value: dict[str, Any] | None, now: float) -> None:
    """Flip a switch in the cluster; this history saw it (no control-seen row next run)."""
    controls = run.sweep.controls
    controls.set(key, value, now)
    current = controls.get(key)
    run.rec.set_control(f"seen.{key}", {"value": current} if current is not None else None, now)


def dismissal(run: Run, node: str) -> dict[str, Any] | None:
    """The findings a person dismissed on this node; one kept in the history file by an older
    version is carried over to the cluster the first time it is needed."""
    found = run.sweep.controls.get(dismissal_key(node))
    if found is not None:
        return found
    old = run.rec.get_control(f"dismissed/{node}")
    if old is None or run.dry_run:
        return old
    now = run.clock.now()
    ts = float(old.pop("ts", now))
    switch(run, dismissal_key(node), old, ts)
    run.rec.set_control(f"dismissed/{node}", None, now)
    run.rec.action(run.id, node, now, "control-migrated",
                   f"dismissal carried from the history file to configmap {run.cfg.control_name}")
    return old
