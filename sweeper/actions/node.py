"""Actions on the node under test, and the hold/hand-back steps the sweep itself uses.

Every write to a node is a JSON patch that tests the resourceVersion it was computed
from; on a conflict the node is read again and the change recomputed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeper.actions import ActionContext, Arg, action, failed, ok
from sweeper.clock import iso
from sweeper.config import Config
from sweeper.errors import Conflict, NotFound, Transient
from sweeper.fleet import gpu_pods_by_node, is_daemonset_pod, requests_gpu
from sweeper.policy import HOLDING

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MIRROR = "kubernetes.io/config.mirror"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def patch_node(kube: Any, name: str, build: Callable[[dict[str, Any]], list[dict[str, Any]] | None],
               tries: int = 5, known: dict[str, Any] | None = None, fresh: bool = False) -> dict[str, Any] | None:
    """Read, compute a JSON patch, apply it conditional on the version read; again on conflict.
    None when the node is gone or nothing needed changing.

    `known`: the node as last read or written, used for the first attempt instead of a read (the
    resourceVersion test still refuses it if the node changed since). Where it says nothing needs
    changing, the node is read to make sure, unless `fresh` says it was read a moment ago."""
    for _ in range(tries):
        if known is not None:
            current, known, confirmed = known, None, fresh
        else:
            try:
                current = kube.get_node(name)
            except NotFound:
                return None
            confirmed = True
        ops = build(current)
        if not ops:
            if confirmed:
                return None
            continue
        try:
            return kube.patch_node(name, [{"op": "test", "path": "/metadata/resourceVersion",
                                           "value": current["metadata"]["resourceVersion"]}] + ops)  # type: ignore[no-any-return]
        except Conflict:
            continue
        except NotFound:
            return None
    raise Conflict(f"node {name}: gave up after {tries} conflicting updates")


def meta_op(node: dict[str, Any], field: str, values: dict[str, str | None]) -> list[dict[str, Any]] | None:
    current = dict(node["metadata"].get(field) or {})
    new = dict(current)
    for k, v in values.items():
        if v is None:
            new.pop(k, None)
        else:
            new[k] = str(v)
    return None if new == current else [{"op": "add", "path": f"/metadata/{field}", "value": new}]


@dataclass(frozen=True)
class Released:
    """What a hand-back did: `changed` when anything was written; `left_to`, the run whose taint
    was found on the node and left in place (never removed by another run)."""

    changed: bool
    left_to: str = ""
    node: dict[str, Any] | None = None  # the node as the write returned it


@dataclass(frozen=True)
class Marks:
    """What a finished sweep leaves on the node for people and tools: the status labels and the
    last result's summary annotation (mark_status)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    key: tuple[str, tuple[str, ...], tuple[str, ...]]  # verdict, reasons, rules: what they say


def _foreign(node: dict[str, Any], cfg: Config, owner: str) -> str:
    """The run id of a Sweeper taint on the node that is not `owner`'s, or ""."""
    for t in (node.get("spec") or {}).get("taints") or []:
        if t.get("key") == cfg.taint_key and str(t.get("value", "")) != owner:
            return str(t.get("value", "")) or "?"
    return ""


def release(kube: Any, cfg: Config, name: str, owner: str, clear_suspect: bool = False,
            marks: Marks | None = None, known: dict[str, Any] | None = None) -> Released:
    """Take run `owner`'s taint and Sweeper's annotations off and leave everything else as found;
    after a conclusive good verdict, also the suspect label. A taint of any other run is left
    alone, node and all: the JSON patch tests the taint it removes, value included. `marks`: the
    status labels and last-result annotation, written in the same patch. `known`: the node as
    this run last saw it (see patch_node)."""
    prefix = cfg.prefix
    other = [""]

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        other[0] = _foreign(node, cfg, owner)
        if other[0]:
            return None
        taints = (node.get("spec") or {}).get("taints") or []
        keep = [t for t in taints if t.get("key") != cfg.taint_key]
        ops: list[dict[str, Any]] = [{"op": "test", "path": f"/spec/taints/{i}", "value": t}
                                     for i, t in enumerate(taints) if t.get("key") == cfg.taint_key]
        ann = dict(node["metadata"].get("annotations") or {})
        if ann.pop(f"{prefix}/added-do-not-disrupt", None):
            ann.pop(DO_NOT_DISRUPT, None)
        for k in ("held-by", "held-since", "verdict", "reason", "remediation", "remediated-at", "boot-id", "recheck"):
            ann.pop(f"{prefix}/{k}", None)
        if ann.pop(f"{prefix}/cordoned-by", None) and (node.get("spec") or {}).get("unschedulable"):
            ops.append({"op": "add", "path": "/spec/unschedulable", "value": False})
        if len(keep) != len(taints):
            ops.append({"op": "add", "path": "/spec/taints", "value": keep})
        labels = dict(node["metadata"].get("labels") or {})
        if clear_suspect:
            ann.pop(f"{prefix}/suspect-reason", None)
            labels.pop(f"{prefix}/suspect", None)  # checked and handed back
        if marks is not None:
            labels.update(marks.labels)
            ann.update(marks.annotations)
        if labels != (node["metadata"].get("labels") or {}):
            ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
        if ann != (node["metadata"].get("annotations") or {}):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": ann})
        return ops if any(op["op"] != "test" for op in ops) else None

    node = patch_node(kube, name, build, known=known)
    return Released(node is not None, other[0], node)


def keep_held(kube: Any, cfg: Config, name: str, verdict: str, reason: str, owner: str,
              known: dict[str, Any] | None = None) -> bool:
    """Keep run `owner`'s taint, say why on the node, and stop shielding it from Karpenter.
    False, and nothing written, when the node carries another run's taint."""
    return not hold_with_reason(kube, cfg, name, verdict, reason, owner, known=known).left_to


def hold_with_reason(kube: Any, cfg: Config, name: str, verdict: str, reason: str, owner: str,
                     marks: Marks | None = None, known: dict[str, Any] | None = None) -> Released:
    """keep_held, saying what it did: `left_to` names the other run whose taint is on the node
    (nothing written). `marks` and `known` as for release."""
    prefix = cfg.prefix
    other = [""]

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        other[0] = _foreign(node, cfg, owner)
        if other[0]:
            return None
        ann = dict(node["metadata"].get("annotations") or {})
        if ann.pop(f"{prefix}/added-do-not-disrupt", None):
            ann.pop(DO_NOT_DISRUPT, None)
        ann[f"{prefix}/verdict"] = verdict
        ann[f"{prefix}/reason"] = reason[:1000]
        ops = []
        if marks is not None:
            ann.update(marks.annotations)
            labels = {**(node["metadata"].get("labels") or {}), **marks.labels}
            if labels != (node["metadata"].get("labels") or {}):
                ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
        return ops + [{"op": "add", "path": "/metadata/annotations", "value": ann}]

    done = patch_node(kube, name, build, known=known)
    return Released(done is not None, other[0], done)


def hold(kube: Any, cfg: Config, node: dict[str, Any], run_id: str, now: float) -> dict[str, Any]:
    """Taint the node as read (a resourceVersion test, no retry: a conflict means the node changed
    under us and must be looked at again) and shield it from consolidation while held."""
    meta = node["metadata"]
    # A node held already (back from a reboot for its re-check) carries our taint: replace it.
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != cfg.taint_key]
    ann = dict(meta.get("annotations") or {})
    for key in ("recheck", "verdict", "reason"):
        ann.pop(f"{cfg.prefix}/{key}", None)
    ann.update({f"{cfg.prefix}/held-by": run_id, f"{cfg.prefix}/held-since": iso(now)})
    if DO_NOT_DISRUPT not in (meta.get("annotations") or {}):
        ann[DO_NOT_DISRUPT] = "true"
        ann[f"{cfg.prefix}/added-do-not-disrupt"] = "true"
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
           {"op": "add", "path": "/spec/taints", "value": taints + [
               {"key": cfg.taint_key, "value": run_id, "effect": "NoSchedule"}]},
           {"op": "add", "path": "/metadata/annotations", "value": ann}]
    return kube.patch_node(meta["name"], ops)  # type: ignore[no-any-return]


def gpu_pods_on(kube: Any, cfg: Config, name: str) -> list[str]:
    return gpu_pods_by_node(kube.active_pods(node=name), cfg).get(name, [])


# What the sweep read of the node when it held it (ActionContext.seen) stays good this long for
# the playbook's first steps. The hold listed the node's pods after its NoSchedule taint landed, so
# the scheduler can place nothing there since; only a pod bound by nodeName could land, and a list
# made later would not close that gap either (such a pod can come right after it): what keeps the
# GPUs free is the check Job requesting all of them (a pod holding one leaves the check Pending, an
# inconclusive sweep). The playbook's first steps come within moments of the hold, even on a slow
# API server; a playbook that does other work first (a drain, a wait) takes longer than this, and
# then looks again.
SEEN_FRESH = 120.0


def seen_node(ctx: ActionContext) -> tuple[dict[str, Any] | None, bool]:
    """The node as last read or written in this sweep, and whether that was within SEEN_FRESH."""
    node = ctx.seen.get("node")
    if node is None or ctx.node is None or node["metadata"]["name"] != ctx.node.get("name"):
        return None, False
    return node, ctx.clock.now() - float(ctx.seen.get("at", 0.0)) <= SEEN_FRESH


def _patch_seen(ctx: ActionContext, build: Callable[[dict[str, Any]], list[dict[str, Any]] | None]) \
        -> dict[str, Any] | None:
    """patch_node from what this sweep last saw of the node, remembering what the write returned."""
    known, fresh = seen_node(ctx)
    done = patch_node(ctx.cluster(), ctx.node_name, build, known=known, fresh=fresh)
    if done is not None and known is not None:
        ctx.seen.update(node=done, at=ctx.clock.now())
    return done


# -- actions ------------------------------------------------------------------------------
@action("taint", Arg("key", str, required=True), Arg("value", str, default=""),
        Arg("effect", str, default="NoSchedule", choices=EFFECTS),
        help="Add a taint to the node (no change if the same key and effect are there).", needs_node=True)
def taint(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    new = {"key": args["key"], "value": args["value"], "effect": args["effect"]}

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        taints = (node.get("spec") or {}).get("taints") or []
        if any(t.get("key") == new["key"] and t.get("effect") == new["effect"] for t in taints):
            return None
        return [{"op": "add", "path": "/spec/taints", "value": taints + [new]}]

    ctx.intent("taint", "before", f"{new['key']}={new['value']}:{new['effect']}")
    changed = _patch_seen(ctx, build) is not None
    ctx.intent("taint", "after", f"{new['key']}:{new['effect']}")
    # `added` names exactly what this task put on the node, so `sweeper run` can take it off again.
    if changed:
        return ok(f"tainted {new['key']}={new['value']}:{new['effect']}", True, added=new)
    return ok("already tainted", False)


@action("untaint", Arg("key", str, required=True), Arg("effect", str, default=None, choices=EFFECTS + (None,)),
        help="Remove the node's taints with this key (and effect, if given).", needs_node=True)
def untaint(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        taints = (node.get("spec") or {}).get("taints") or []
        # Sweeper's own taint key: only this run's taint goes, never another run's.
        keep = [t for t in taints if not (t.get("key") == args["key"]
                                          and args["effect"] in (None, t.get("effect"))
                                          and (t.get("key") != ctx.config.taint_key
                                               or str(t.get("value", "")) == ctx.run_id))]
        return None if len(keep) == len(taints) else [{"op": "add", "path": "/spec/taints", "value": keep}]

    ctx.intent("untaint", "before", args["key"])
    changed = _patch_seen(ctx, build) is not None
    ctx.intent("untaint", "after", args["key"])
    return ok(f"removed {args['key']}" if changed else "no such taint", changed)


@action("cordon", help="Mark the node unschedulable, remembering that Sweeper did it.", needs_node=True)
def cordon(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    mark = f"{ctx.config.prefix}/cordoned-by"

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        if (node.get("spec") or {}).get("unschedulable"):
            return None
        ann = dict(node["metadata"].get("annotations") or {})
        ann[mark] = ctx.run_id
        return [{"op": "add", "path": "/spec/unschedulable", "value": True},
                {"op": "add", "path": "/metadata/annotations", "value": ann}]

    changed = _patch_seen(ctx, build) is not None
    if changed:
        return ok("cordoned", True, cordoned_by=ctx.run_id)
    return ok("already unschedulable", False)


@action("uncordon", Arg("only_own", bool, default=True, help="only undo a cordon Sweeper made"),
        help="Make the node schedulable again; by default only if Sweeper cordoned it.", needs_node=True)
def uncordon(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    mark = f"{ctx.config.prefix}/cordoned-by"

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        ann = dict(node["metadata"].get("annotations") or {})
        if not (node.get("spec") or {}).get("unschedulable"):
            return None
        if args["only_own"] and mark not in ann:
            return None
        ann.pop(mark, None)
        return [{"op": "add", "path": "/spec/unschedulable", "value": False},
                {"op": "add", "path": "/metadata/annotations", "value": ann}]

    changed = _patch_seen(ctx, build) is not None
    return ok("uncordoned" if changed else "left as it was (not cordoned by Sweeper)", changed)


@action("verify_idle", help="Fail if any pod other than a DaemonSet's holds a GPU on the node.", needs_node=True)
def verify_idle(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    _, fresh = seen_node(ctx)
    idle_at = ctx.seen.get("idle_at")
    if fresh and idle_at is not None and ctx.clock.now() - float(idle_at) <= SEEN_FRESH:
        return ok(f"no GPU pods on the node (listed after the taint landed, {ctx.clock.now() - float(idle_at):.0f}s "
                  "ago)", pods=[])
    pods = gpu_pods_on(ctx.cluster(), ctx.config, ctx.node_name)
    if pods:
        return failed(f"{len(pods)} GPU pod(s) on the node: {', '.join(pods[:5])}", pods=pods)
    return ok("no GPU pods on the node", pods=[])


@action("drain", Arg("timeout", (int, float, str), default="10m", help="give up after this long"),
        Arg("delay", (int, float, str), default="5s", help="wait between eviction rounds"),
        Arg("gpu_pods_only", bool, default=False, help="evict only pods that hold GPUs"),
        help="Evict the node's pods through the Eviction API, honouring PodDisruptionBudgets (a 429 is "
             "waited on and retried); DaemonSet and mirror pods stay; the deadline ends it.", needs_node=True)
def drain(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    from sweeper.clock import parse_duration

    kube = ctx.cluster()
    deadline = ctx.clock.now() + parse_duration(args["timeout"])
    if ctx.deadline is not None:
        deadline = min(deadline, ctx.deadline)
    delay = parse_duration(args["delay"])
    evicted: list[str] = []
    blocked: list[str] = []
    while True:
        pods = [p for p in kube.active_pods(node=ctx.node_name)
                if not is_daemonset_pod(p) and MIRROR not in (p["metadata"].get("annotations") or {})
                and (not args["gpu_pods_only"] or requests_gpu(p, ctx.config))]
        if not pods:
            return ok(f"drained: {len(evicted)} pod(s) evicted", bool(evicted), evicted=evicted)
        blocked = []
        for p in pods:
            ref = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            try:
                kube.evict_pod(p["metadata"]["namespace"], p["metadata"]["name"])
                if ref not in evicted:
                    evicted.append(ref)
            except NotFound:
                continue
            except Transient as exc:
                if exc.status != 429:
                    raise
                blocked.append(ref)
        if ctx.clock.now() + delay > deadline:
            return failed(f"drain did not finish before its deadline; still there: {', '.join(blocked or [])}"
                          or "pods still terminating", evicted=evicted, blocked=blocked, timed_out=True)
        ctx.clock.sleep(delay)


def _meta_action(field: str) -> Callable[[ActionContext, dict[str, Any]], dict[str, Any]]:
    def run(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
        values = args["set"] or {}
        for k in args["remove"] or []:
            values[k] = None
        changed = _patch_seen(ctx, lambda n: meta_op(n, field, values)) is not None
        return ok(f"{field} updated" if changed else f"{field} already as asked", changed)
    return run


action("label", Arg("set", dict, default=None, help="labels to set"),
       Arg("remove", list, default=None, help="label keys to remove"),
       help="Set or remove node labels.", needs_node=True)(_meta_action("labels"))
action("annotate", Arg("set", dict, default=None, help="annotations to set"),
       Arg("remove", list, default=None, help="annotation keys to remove"),
       help="Set or remove node annotations.", needs_node=True)(_meta_action("annotations"))


def node_event(kube: Any, node: str, uid: str, reason: str, message: str, kind: str, instance: str,
               now: float) -> dict[str, Any]:
    """A core/v1 Event on a node, in the default namespace as the kubelet's own."""
    ts = iso(now)
    body = {"metadata": {"generateName": f"{node}.", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": node, "uid": uid, "apiVersion": "v1"},
            "reason": reason, "message": message[:1024], "type": kind,
            "source": {"component": "sweeper"}, "reportingComponent": "sweeper", "reportingInstance": instance,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1}
    return kube.create_event("default", body)  # type: ignore[no-any-return]


@action("event", Arg("reason", str, required=True, help="CamelCase reason, e.g. SweepFailed"),
        Arg("message", str, required=True), Arg("type", str, default="Normal", choices=("Normal", "Warning")),
        help="Create a Kubernetes Event on the node (kubectl describe node shows it).", needs_node=True)
def event(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    node = ctx.node or {}
    created = node_event(ctx.cluster(), ctx.node_name, node.get("uid", ctx.node_name), args["reason"],
                         args["message"], args["type"], ctx.run_id, ctx.clock.now())
    return ok(f"event {args['reason']}", True, event=created.get("metadata", {}).get("name"))


@action("record", Arg("name", str, required=True, help="metric name, or a note's title"),
        Arg("value", (int, float), default=None, help="a metric value (omit for a note)"),
        Arg("unit", str, default=""), Arg("gpu", int, default=None), Arg("message", str, default=""),
        help="Write a metric or a note into the history of this sweep.")
def record(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    kind = "metric" if args["value"] is not None else "note"
    ctx.on_record(kind, dict(args))
    return ok(f"recorded {kind} {args['name']}", True)


@action("hand_back", Arg("verdict", str, default=None, help="defaults to the `verdict` fact from decide"),
        Arg("reason", str, default=None, help="defaults to the `reasons` fact from decide"),
        help="Release the node (pass, warn, error, inconclusive) or keep it held with its verdict and reason "
             "(reboot, replace, quarantine). Belongs in a playbook's `always`.", needs_node=True)
def hand_back(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    verdict = args["verdict"] or str(ctx.vars.get("verdict") or "error")
    reasons = ctx.vars.get("reasons") or []
    reason = args["reason"] or ("; ".join(str(r) for r in reasons) if reasons else "no verdict was reached")
    kube = ctx.cluster()
    known, _ = seen_node(ctx)
    # In a sweep (which held the node), the status labels and last-result annotation go in the same
    # patch; the sweep writes them again only if its verdict or reasons end up others (a
    # replacement over the cap becomes a quarantine).
    decision = ctx.vars.get("decision")
    rules = [str(r) for r in (decision.get("rules") or [])] if isinstance(decision, dict) else []
    marks = status_marks(ctx.config, verdict, [str(r) for r in reasons], rules, ctx.clock.now()) \
        if known is not None and args["verdict"] is None and args["reason"] is None else None
    if verdict in HOLDING:
        ctx.intent("keep-held", "before", verdict)
        done = hold_with_reason(kube, ctx.config, ctx.node_name, verdict, reason, ctx.run_id, marks=marks,
                                known=known)
        if done.left_to:
            ctx.intent("keep-held", "left", verdict)
            ctx.facts["handed_back"] = "left"
            return ok(f"left alone: the node carries another run's taint (verdict {verdict}: {reason[:200]})",
                      False, action="left", verdict=verdict)
        ctx.intent("keep-held", "after", verdict)
        ctx.facts["handed_back"] = "held"
        _marked(ctx, marks, done.node)
        return ok(f"kept held: {verdict}: {reason[:200]}", True, action="held", verdict=verdict)
    ctx.intent("untaint", "before", f"verdict {verdict}")
    released = release(kube, ctx.config, ctx.node_name, ctx.run_id, clear_suspect=verdict in ("pass", "warn"),
                       marks=marks, known=known)
    if released.left_to:
        ctx.intent("untaint", "left", f"taint of run {released.left_to}")
        ctx.facts["handed_back"] = "left"
        return ok(f"left alone: the node carries the taint of run {released.left_to} (verdict {verdict})", False,
                  action="left", verdict=verdict)
    ctx.intent("untaint", "after", f"verdict {verdict}")
    ctx.facts["handed_back"] = "released"
    _marked(ctx, marks, released.node)
    return ok(f"released (verdict {verdict})", released.changed, action="released", verdict=verdict)


def _marked(ctx: ActionContext, marks: Marks | None, node: dict[str, Any] | None) -> None:
    """Tell the sweep which status marks are on the node now, and the node as written."""
    if node is not None and marks is not None:
        ctx.seen.update(node=node, at=ctx.clock.now(), marked=marks.key)


CONDITION = "GpuSweepHealthy"
LAST_RESULT_LIMIT = 4096


def status_marks(cfg: Config, verdict: str, reasons: list[str], rules: list[str], now: float) -> Marks:
    """The status labels, the last sweep time, and the last result's summary (at most 4 KiB)."""
    p = cfg.prefix
    summary: dict[str, Any] = {"verdict": verdict, "at": iso(now), "rules": rules, "reasons": []}
    for r in reasons[:5]:
        candidate = {**summary, "reasons": summary["reasons"] + [r[:600]]}
        if len(json.dumps(candidate)) > LAST_RESULT_LIMIT:
            break
        summary = candidate
    return Marks({f"{p}/status": verdict, f"{p}/last-sweep": str(int(now))},
                 {f"{p}/last-result": json.dumps(summary, separators=(",", ":"))},
                 (verdict, tuple(reasons), tuple(rules)))


def mark_status(kube: Any, cfg: Config, name: str, verdict: str, reasons: list[str], rules: list[str],
                now: float, condition: bool = False, marked: dict[str, Any] | None = None) -> None:
    """What people and other tools see on the node after a sweep: labels for the status and the
    last sweep time, an annotation with the last result's summary (at most 4 KiB), and, when
    asked, the GpuSweepHealthy condition, whose lastTransitionTime moves only when its status
    does (so that a repairer counting time in a state can act). `marked`: the node as the
    hand-back wrote it with this verdict's labels and annotation, which are then not written again."""
    if marked is None:
        marks = status_marks(cfg, verdict, reasons, rules, now)
        # One merge patch of Sweeper's own keys: nothing else on the node is read or rewritten.
        node = kube.patch_node(name, {"metadata": {"labels": marks.labels, "annotations": marks.annotations}},
                               content_type="application/merge-patch+json")
    else:
        node = marked
    if not condition or node is None or verdict in ("error", "inconclusive"):
        return
    healthy = "False" if verdict in HOLDING else "True"
    current = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)
    since = current["lastTransitionTime"] if current and current.get("status") == healthy else iso(now)
    cond = {"type": CONDITION, "status": healthy, "reason": f"Sweep{verdict.capitalize()}",
            "message": ("; ".join(reasons) if verdict != "pass" else "all checks passed")[:1000],
            "lastHeartbeatTime": iso(now), "lastTransitionTime": since}
    kube.patch_node_status(name, {"status": {"conditions": [cond]}})
