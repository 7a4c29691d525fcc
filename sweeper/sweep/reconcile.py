"""Crash recovery: finish the story of earlier runs that died (their lock lease expired with
their work half done). Their open sweep rows are closed with what their intent log proves, their
Jobs, Services and MPIJobs deleted, and the nodes they held handed back, or kept held where a
failing verdict was already recorded; a node a person released after a failing verdict marks
that verdict's findings as dismissed, unless `sweeper release` let it go (its mark: a release is
no judgement of the verdict)."""

from __future__ import annotations

import json
from typing import Any

from sweeper.actions import node as node_actions
from sweeper.actions.holding import RELEASED, read_release_mark
from sweeper.clock import iso, read_iso
from sweeper.control import dismissal_key
from sweeper.errors import NotFound
from sweeper.fleet import NodeView
from sweeper.policy import HOLDING, finding_key
from sweeper.sweep.gates import switch
from sweeper.sweep.hold import release
from sweeper.sweep.state import Run


def reconcile(run: Run) -> list[dict[str, str]]:
    """Finish the story of earlier runs that died: their Jobs are deleted, the nodes they held
    are handed back, or kept held where a failing verdict was already recorded."""
    done: list[dict[str, str]] = []
    now = run.clock.now()
    dead = [old for old in run.rec.unfinished_runs() if old != run.id]
    for old in dead:
        run.rec.run_finished(old, now, "crashed", 0, {"reconciled_by": run.id})
    cut = {(r["run_id"], r["node"]) for r in close_open_sweeps(run, now) if not r["proven"]}
    # Check Jobs, and the reboot / GPU reset Jobs in their own namespace.
    for ns in dict.fromkeys((run.cfg.check_namespace, run.cfg.remediation_namespace)):
        for job in run.kube.list_jobs(ns, "app.kubernetes.io/managed-by=sweeper"):
            owner = (job["metadata"].get("labels") or {}).get(f"{run.cfg.prefix}/run-id", "")
            if owner != run.id:
                run.kube.delete_job(ns, job["metadata"]["name"])
                done.append({"job": job["metadata"]["name"], "action": "deleted", "why": f"left by run {owner}"})
    # A pair sweep's headless Service outlives a run killed between its create and its delete.
    for svc in run.kube.list_services(run.cfg.check_namespace,
                                       "app.kubernetes.io/managed-by=sweeper,app.kubernetes.io/component=pair"):
        owner = (svc["metadata"].get("labels") or {}).get(f"{run.cfg.prefix}/run-id", "")
        if owner != run.id:
            run.kube.delete_service(run.cfg.check_namespace, svc["metadata"]["name"])
            done.append({"service": svc["metadata"]["name"], "action": "deleted", "why": f"left by run {owner}"})
    # And the MPIJob form's MPIJob (deleting it deletes what the MPI Operator made for it); a
    # cluster without the operator does not serve mpijobs at all (kube.NotServed, a NotFound):
    # nothing of the kind to find.
    try:
        mpijobs = run.kube.list_mpijobs(run.cfg.check_namespace, "app.kubernetes.io/managed-by=sweeper")
    except NotFound:
        mpijobs = []
    for mj in mpijobs:
        owner = (mj["metadata"].get("labels") or {}).get(f"{run.cfg.prefix}/run-id", "")
        if owner != run.id:
            run.kube.delete_mpijob(run.cfg.check_namespace, mj["metadata"]["name"])
            done.append({"mpijob": mj["metadata"]["name"], "action": "deleted", "why": f"left by run {owner}"})
    untainted = []
    said: dict[str, str] = {}  # node -> the reason `sweeper release --false-positive` gave
    for obj in run.kube.list_nodes(run.cfg.gpu_node_selector, page_size=run.cfg.page_size):
        view = NodeView.from_obj(obj, run.cfg.gpu_resources)
        taint = view.sweep_taint(run.cfg.taint_key)
        if not taint:
            untainted.append(view.name)
            why = released_by_hand(run, view)
            if why:
                said[view.name] = why
        if not taint or taint.get("value") == run.id:
            continue
        old = str(taint.get("value", ""))
        if old not in dead and f"{run.cfg.prefix}/verdict" in view.annotations:
            continue  # held on purpose by a run that finished: nothing to reconcile
        done.append(_reconcile_node(run, view, old, now, (old, view.name) in cut))
    for s in run.rec.released_by_people(untainted, HOLDING):
        keys = sorted({finding_key(f) for f in s["findings"]})
        switch(run, dismissal_key(s["node"]), {"keys": keys, "verdict": s["verdict"], "sweep": s["id"], "at": now},
                     now)
        by = f" with sweeper release --false-positive: {said[s['node']]}" if s["node"] in said else ""
        run.rec.action(run.id, s["node"], now, "false-positive",
                        f"a person released the node Sweeper held ({s['verdict']}){by}; the same findings will "
                        f"not hold it again: {', '.join(keys)}")
        done.append({"node": s["node"], "action": "marked a false positive",
                     "why": f"released by a person after verdict {s['verdict']}"})
    for d in done:
        if "node" in d:
            run.emit("reconcile", d)
    return done

def released_by_hand(run: Run, view: NodeView) -> str:
    """A node `sweeper release` let go carries its mark, read once and taken off (a hold takes it off
    too, and each run reconciles before it holds anything, so a mark is always of a release since
    the node's last verdict). A plain release goes into this history, so the findings that held
    the node are not dismissed: a release is no judgement of the verdict. Recorded at this run's
    time, not the mark's: the machine that released it may keep another clock. Returns the reason
    of a release as a false positive ("" for any other), for the dismissal's record."""
    key = f"{run.cfg.prefix}/{RELEASED}"
    if key not in view.annotations:
        return ""
    mark = read_release_mark(view.annotations, run.cfg.prefix)
    if mark is not None and not mark[2]:
        run.rec.action(run.id, view.name, run.clock.now(), "release",
                       f"sweeper release at {iso(mark[0])}: {mark[1]}")
    node_actions.patch_node(run.kube, view.name, lambda obj: node_actions.meta_op(obj, "annotations", {key: None}))
    return mark[1] if mark is not None and mark[2] else ""


def close_open_sweeps(run: Run, now: float) -> list[dict[str, Any]]:
    """Close every sweep row, light checks included, that a dead run left open, tainted node or
    not: with the verdict its intent log proves (the hand-back had begun: `untaint` with
    `verdict V`, or `keep-held V`), else `inconclusive` with the reason."""
    closed = []
    for row in run.rec.open_sweeps(run.id):
        old, proven = row["run_id"], row.get("proven")
        if proven:
            verdict, reasons = str(proven["verdict"]), [
                f"recorded by reconcile: run {old} reached {proven['verdict']} and began handing the node "
                "back, then stopped before recording it"]
            at = float(proven["ts"])
        elif row.get("kind") == "light":
            verdict, reasons, at = "inconclusive", [f"run {old} stopped before the light check finished"], now
        else:
            verdict, reasons, at = "inconclusive", [f"run {old} stopped before its checks finished"], now
        run.rec.sweep_finished(row["id"], at, verdict, reasons)
        run.rec.action(run.id, row["node"], now, "reconcile-record", f"{row.get('kind', 'sweep')} of run {old}: "
                        f"{verdict}" + ("" if proven else " (no verdict in its intent log)"))
        closed.append({**row, "verdict": verdict})
    return closed

def _reconcile_node(run: Run, view: NodeView, old: str, now: float, cut: bool) -> dict[str, str]:
    """`cut`: the dead run's sweep of the node was just closed as inconclusive, with no verdict."""
    name = view.name
    story = run.rec.story(old, name) if old else {"sweep": None, "intents": []}
    sweep = story["sweep"]
    if sweep and sweep["finished"] and sweep["verdict"] in HOLDING:
        reasons = json.loads(sweep["reasons"] or "[]")
        if f"{run.cfg.prefix}/verdict" not in view.annotations:
            node_actions.keep_held(run.kube, run.cfg, name, sweep["verdict"], "; ".join(reasons), old)
        run.rec.action(run.id, name, now, "reconcile-keep-held", f"{sweep['verdict']} recorded by run {old}")
        return {"node": name, "action": "kept held", "why": f"verdict {sweep['verdict']} from run {old}"}
    if sweep or story["intents"]:
        why = (f"run {old} reached {sweep['verdict']} but stopped before handing the node back"
               if sweep and sweep["finished"] and not cut else f"run {old} stopped before its checks finished")
        release(run, name, f"reconcile: {why}", owner=old)
        return {"node": name, "action": "released", "why": why}
    since = read_iso(view.annotations.get(f"{run.cfg.prefix}/held-since"))  # unreadable: as if absent
    age = now - since if since is not None else float("inf")
    if age >= run.cfg.orphan_grace:
        why = f"Sweeper's taint from run {old or '?'} with no record in this history, {int(age)}s old"
        release(run, name, f"reconcile: {why}", owner=old)
        return {"node": name, "action": "released", "why": why}
    return {"node": name, "action": "left held",
            "why": f"taint from run {old} has no record here; released after {int(run.cfg.orphan_grace)}s"}
