"""Actions on the node under test: taint, cordon, drain, label, events, records and the
hand-back a playbook's `always` ends with. How a node is held and given back, and the conditional
patch every write goes through, live in sweeper.actions.holding (re-exported here, their old home).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sweeper.actions import ActionContext, Arg, action, failed, ok
from sweeper.actions.holding import (  # noqa: F401  (re-exported: their old home)
    CONDITION,
    DO_NOT_DISRUPT,
    LAST_RESULT_LIMIT,
    Marks,
    Released,
    gpu_pods_on,
    hold,
    hold_with_reason,
    keep_held,
    mark_status,
    meta_op,
    patch_node,
    release,
    status_marks,
)
from sweeper.clock import iso
from sweeper.errors import NotFound, Transient
from sweeper.fleet import is_daemonset_pod, requests_gpu
from sweeper.policy import HOLDING

MIRROR = "kubernetes.io/config.mirror"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


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
