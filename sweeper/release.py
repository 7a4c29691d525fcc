"""`sweeper release`: the panic button. Hands back every node Sweeper holds (or the ones
named), deletes its Jobs, and works from the cluster alone when the history is lost.

A release is not a judgement of the verdict: a node released after a failing verdict is a
suspect, which the next sweep checks first, and the findings that held it hold it again. Each
released node carries the release's mark (sweeper.actions.holding.RELEASED: when, why, by whom,
whether as a false positive), written in the same patch as the untaint, so that the next run's
reconcile knows a person let it go on purpose even where `release` ran beside another history
(a laptop) or none. A node untainted with no such mark and no record (by kubectl) reads as a
person's "false positive", and so does a release with `false_positive`: the findings that held
the node are dismissed (they warn, never hold it again) in the control ConfigMap."""

from __future__ import annotations

from typing import Any

from sweeper.actions import node as node_actions
from sweeper.actions.holding import release_mark
from sweeper.clock import Clock
from sweeper.config import Config
from sweeper.errors import ConfigError, KubeError
from sweeper.fleet import NodeView


def held_nodes(kube: Any, cfg: Config) -> list[NodeView]:
    """Every node carrying Sweeper's taint or a cordon Sweeper made (all nodes, not only GPU ones)."""
    return _scan(kube, cfg)[0]


def _scan(kube: Any, cfg: Config) -> tuple[list[NodeView], set[str]]:
    """The held nodes, and the name of every node of the cluster (one LIST)."""
    out, names = [], set()
    for obj in kube.list_nodes("", page_size=cfg.page_size):
        v = NodeView.from_obj(obj, cfg.gpu_resources)
        names.add(v.name)
        if v.sweep_taint(cfg.taint_key) or f"{cfg.prefix}/cordoned-by" in v.annotations:
            out.append(v)
    return out, names


def _event(kube: Any, cfg: Config, v: NodeView, message: str, clock: Clock) -> str:
    """A `SweepReleased` Event on the node, as a sweep leaves one for each hold and verdict
    (`kubectl describe node` shows who let it go and why); '' or why it could not be written."""
    try:
        node_actions.node_event(kube, v.name, v.uid or v.name, "SweepReleased", message, "Normal", cfg.lock_name,
                                clock.now())
    except KubeError as exc:  # the node is released; a lost Event is said, not fatal
        return f"; could not record an Event: {exc}"
    return ""


def release(kube: Any, cfg: Config, names: list[str], everything: bool, reason: str, clock: Clock,
            recorder: Any = None, dry_run: bool = False, false_positive: bool = False,
            by: str = "") -> list[dict[str, str]]:
    """Hand back the named nodes (or every held one): untaint, undo Sweeper's cordon, delete its
    Jobs. Each carries the release's mark. Without `false_positive` the history (where there is
    one) records the release, and a node released after a holding verdict is a suspect, so the
    next sweep checks it first and judges it afresh; with it, the next run's reconcile dismisses
    the findings that held it, with the mark's reason."""
    if not names and not everything:
        raise ConfigError("name the nodes to release, or pass --all")
    views, known = _scan(kube, cfg)
    unknown = [n for n in names if n not in known]
    if unknown:  # a typo is bad input, not "not held": nothing is done
        raise ConfigError(f"no node named {', '.join(unknown)} in the cluster")
    held = {v.name: v for v in views}
    targets = sorted(held) if everything else names
    rows: list[dict[str, str]] = []
    for name in targets:
        v = held.get(name)
        if v is None:
            rows.append({"node": name, "action": "not held", "detail": "no Sweeper taint or cordon on it"})
            continue
        taint = v.sweep_taint(cfg.taint_key) or {}
        detail = f"held by run {taint.get('value', '?')}" + (
            f", verdict {v.annotations[f'{cfg.prefix}/verdict']}" if f"{cfg.prefix}/verdict" in v.annotations else "")
        if not dry_run:
            # Only the taint as read goes: a run that held the node again since keeps it.
            marks = release_mark(cfg, clock.now(), reason, by, v.annotations.get(f"{cfg.prefix}/verdict", ""),
                                 false_positive)
            done = node_actions.release(kube, cfg, name, str(taint.get("value", "")), marks=marks)
            if done.left_to:
                rows.append({"node": name, "action": "left alone",
                             "detail": f"held again since, by run {done.left_to}"})
                continue
            if false_positive:
                detail += "; its findings are dismissed by the next run"
            if recorder is not None:  # a release-false-positive is no hand-back that spares the findings
                recorder.action("manual", name, clock.now(), "release-false-positive" if false_positive else "release",
                                f"sweeper release: {reason} ({detail})")
            detail += _event(kube, cfg, v, f"released by hand: {reason} ({detail})", clock)
        rows.append({"node": name, "action": "would release" if dry_run else "released", "detail": detail})
    wanted = set(targets)
    for ns in dict.fromkeys((cfg.check_namespace, cfg.remediation_namespace)):
        for job in kube.list_jobs(ns, "app.kubernetes.io/managed-by=sweeper"):
            node = (job["metadata"].get("labels") or {}).get(f"{cfg.prefix}/node", "")
            if everything or node in wanted:
                if not dry_run:
                    kube.delete_job(ns, job["metadata"]["name"])
                rows.append({"node": node, "action": "would delete job" if dry_run else "deleted job",
                             "detail": job["metadata"]["name"]})
    return rows
