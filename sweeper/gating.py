"""The gate for new nodes: the nodes that carry Sweeper's startup taint (`gate_taint`), and for each
whether a run takes it now, and why not.

A node joins with the taint (a Karpenter NodePool's `startupTaints`, which Karpenter applies and
expects another controller to remove, https://karpenter.sh/docs/concepts/nodepools/; or an EKS
node group's `taints`, https://docs.aws.amazon.com/eks/latest/userguide/node-taints-managed-node-groups.html),
or gets it from Sweeper before its reboot or GPU reset. Gated nodes have a budget of their own
(`gate_max_nodes`): they serve no work yet, so they never spend the fleet's `max_nodes` nor count
against its floor. A node that is not Ready, or advertises no GPU yet (its device plugin is not
up), waits until `gate_deadline`; past it, the gate fails it. A node someone let work onto (a pod
tolerating the taint, not a DaemonSet's) is not disturbed."""

from __future__ import annotations

from typing import Any

from sweeper.clock import read_iso
from sweeper.config import Config
from sweeper.fleet import Decision, NodeView, is_daemonset_pod, is_sweeper_pod, remediated_and_back

TAKE = ("gate", "soak", "gate-late")  # a new node's sweep, the soak after a reboot, failing a node that never came up


def gate_taint(obj_or_view: dict[str, Any] | NodeView, cfg: Config) -> dict[str, Any] | None:
    """The gate's taint on the node (as read), or None; never any other taint."""
    if not cfg.gate_taint:
        return None
    taints = obj_or_view.taints if isinstance(obj_or_view, NodeView) else \
        (obj_or_view.get("spec") or {}).get("taints") or ()
    return next((t for t in taints if t.get("key") == cfg.gate_taint), None)


def split(nodes: list[dict[str, Any]], cfg: Config) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(gated, the rest): a gated node is the gate's, whether or not it advertises GPUs yet."""
    gated = [n for n in nodes if gate_taint(n, cfg)]
    ids = {id(n) for n in gated}
    return gated, [n for n in nodes if id(n) not in ids]


def occupants(pods: list[dict[str, Any]], cfg: Config) -> dict[str, list[str]]:
    """Node name to the pods on it that are neither a DaemonSet's nor Sweeper's own (its label in its
    own namespaces, fleet.is_sweeper_pod): work someone let onto a gated node, which the gate does not disturb."""
    out: dict[str, list[str]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if is_daemonset_pod(p) or is_sweeper_pod(p, cfg):
            continue
        out.setdefault(node, []).append(f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}")
    return out


def joined_long_ago(nodes: list[dict[str, Any]], cfg: Config, now: float) -> list[str]:
    """The gated nodes, not held by Sweeper, created gate_deadline or longer ago: those whose wait
    may not count from their creation (their taint may have come later, from someone else), for
    which gate_plan wants to know when runs first saw them at the gate."""
    out = []
    for n in nodes:
        v = NodeView.from_obj(n, cfg.gpu_resources, cfg.gpu_resource_prefixes, cfg.dra_driver)
        if not v.sweep_taint(cfg.taint_key) and now - v.created >= cfg.gate_deadline:
            out.append(v.name)
    return out


def gate_plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], cfg: Config, now: float,
              stop: tuple[str, str] = ("", ""), attempts: dict[str, int] | None = None,
              seen: dict[str, float] | None = None) -> tuple[list[Decision], int]:
    """Every gated node's decision, oldest first, and the gate's budget left. `stop`: why no node is
    taken at all (a pause, an open breaker), as (reason, detail), said on every node that would have been.
    `attempts`: failed sweeps per node within attempt_window; a node back from its remediation that
    failed max_attempts times waits for a person instead of another soak (and another reboot).
    `seen`: for the nodes of joined_long_ago, when runs first saw them at the gate (the history's
    gate_seen; a node absent is seen now): a node's wait counts from the later of its creation and
    that, so a node tainted long after it joined is not failed `gate-late` at first sight. None: from
    its creation (no history to ask)."""
    views = sorted((NodeView.from_obj(n, cfg.gpu_resources, cfg.gpu_resource_prefixes, cfg.dra_driver)
                    for n in nodes), key=lambda v: (v.created, v.name))
    busy = occupants(pods, cfg)
    out: list[Decision] = []
    due: list[Decision] = []
    testing = 0
    for v in views:
        first = None if seen is None or now - v.created < cfg.gate_deadline else seen.get(v.name, now)
        d = _classify(v, busy.get(v.name, []), cfg, now, first)
        failed = (attempts or {}).get(v.name, 0)
        if d.reason == "soak" and failed >= cfg.max_attempts:
            d = Decision(v, False, "attempts-exhausted", f"failed {failed} time(s) within "
                         f"{cfg.attempt_window / 86400:g}d; a person should look")
        if d.reason == "gate-testing":
            testing += 1
        (due if d.take else out).append(d)
    budget = max(0, cfg.gate_max_nodes - testing)
    left = 0 if stop[0] else budget
    for d in due:
        if stop[0]:
            out.append(Decision(d.node, False, *stop))
        elif left > 0:
            out.append(d)
            left -= 1
        else:
            out.append(Decision(d.node, False, "gate-queued", f"{d.detail}; queued: gate_max_nodes "
                                f"({cfg.gate_max_nodes}) under test"))
    return out, 0 if stop[0] else budget


def _classify(v: NodeView, occupied: list[str], cfg: Config, now: float, first: float | None = None) -> Decision:
    p = cfg.prefix
    held = v.sweep_taint(cfg.taint_key)
    since, joined = v.created, "after it joined"
    if first is not None and first > v.created and not held:
        since, joined = first, "since runs first saw its gate taint"
    if held:
        if v.annotations.get(f"{p}/recheck") == "true":
            back, why = remediated_and_back(v, cfg, now)
            if not back:
                return Decision(v, False, "gate-waiting", why or "held for its reboot or GPU reset")
            since = read_iso(v.annotations.get(f"{p}/remediated-at")) or since
        elif f"{p}/verdict" in v.annotations:
            return Decision(v, False, "gate-held", f"failed the gate ({v.annotations[f'{p}/verdict']}): "
                            f"{v.annotations.get(f'{p}/reason', '')[:300]}")
        else:
            return Decision(v, False, "gate-testing", f"under test by run {held.get('value', '?')}")
    waiting = "not Ready" if not v.ready else "no GPU advertised yet (device plugin not up)" if not v.gpus else ""
    if waiting:
        age = now - since
        if age >= cfg.gate_deadline:
            return Decision(v, True, "gate-late", f"{waiting} {int(age)}s {joined} (gate_deadline "
                            f"{int(cfg.gate_deadline)}s)")
        return Decision(v, False, "gate-waiting", f"{waiting}; {int(age)}s of gate_deadline {int(cfg.gate_deadline)}s")
    if occupied:
        return Decision(v, False, "gate-occupied", f"{len(occupied)} pod(s) tolerate the gate and run here, not "
                        f"disturbed: {', '.join(occupied[:3])}")
    if held:
        return Decision(v, True, "soak", f"back from its {v.annotations.get(f'{p}/remediation', 'remediation')}: "
                        f"{cfg.soak_playbook} before hand-back")
    return Decision(v, True, "gate", f"new node, {int(now - v.created)}s old: {cfg.gate_playbook}")
