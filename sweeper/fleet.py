"""Which GPU nodes are idle and due, which are not and why, and how many may be taken."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sweeper.clock import parse_iso, read_iso
from sweeper.config import Config
from sweeper.kube.dra import DEVICES
from sweeper.pods import (  # noqa: F401 - the pods' side, re-exported where callers have always found it
    MANAGED_BY,
    gpu_pods_by_node,
    holds_dra_gpus,
    is_daemonset_pod,
    is_gpu_resource,
    is_sweeper_pod,
    pending_gpu_pods,
    requests_gpu,
    sweeper_namespaces,
)

# Taints that mean someone else is handling the node (never take it).
FOREIGN_TAINTS = {
    "karpenter.sh/disrupted": "Karpenter is disrupting the node",
    "karpenter.sh/disruption": "Karpenter is disrupting the node",
    "node.kubernetes.io/unschedulable": "the node is cordoned",
    "node.kubernetes.io/not-ready": "the node is not ready",
    "node.kubernetes.io/unreachable": "the node is unreachable",
}


# Fabric resources a node's device plugins advertise (read by profiles.advertised_nics): AWS's EFA,
# the RDMA shared device plugin's, GKE's multi-network networks.
FABRIC_PREFIXES = ("vpc.amazonaws.com/efa", "rdma/", "networking.gke.io.networks/")


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: tuple[dict[str, Any], ...]
    ready: bool
    unschedulable: bool
    created: float
    gpus: int
    resource_version: str
    provider_id: str = ""
    conditions: tuple[str, ...] = ()  # types of the node's conditions whose status is True, Ready aside
    boot_id: str = ""
    uid: str = ""
    capacity: dict[str, int] = field(default_factory=dict)  # GPU resources in status.capacity
    allocatable: dict[str, int] = field(default_factory=dict)  # the same in status.allocatable
    fabric: dict[str, int] = field(default_factory=dict)  # fabric resources in status.capacity (EFA, rdma/*, GKE)
    # The GPUs a DRA driver publishes in the node's ResourceSlices: {"driver", "pool", "devices": [names]}
    dra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: dict[str, Any], gpu_resources: tuple[str, ...] = ("nvidia.com/gpu",),
                 gpu_prefixes: tuple[str, ...] = ("nvidia.com/mig-",), dra_driver: str = "gpu.nvidia.com") -> NodeView:
        meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
        alloc = status.get("allocatable") or {}
        capacity = gpu_amounts(status.get("capacity") or {}, gpu_resources, gpu_prefixes)
        dra = dra_devices(obj, dra_driver)
        gpus = sum(_quantity(alloc.get(r)) for r in gpu_resources) or len(dra.get("devices") or ())
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        return cls(name=meta["name"], labels=dict(meta.get("labels") or {}),
                   annotations=dict(meta.get("annotations") or {}), taints=tuple(spec.get("taints") or ()),
                   ready=ready, unschedulable=bool(spec.get("unschedulable")),
                   created=parse_iso(meta["creationTimestamp"]) if meta.get("creationTimestamp") else 0.0,
                   gpus=gpus, resource_version=meta.get("resourceVersion", ""),
                   provider_id=spec.get("providerID", ""),
                   conditions=tuple(c.get("type", "") for c in status.get("conditions") or []
                                    if c.get("status") == "True" and c.get("type") != "Ready"),
                   boot_id=(status.get("nodeInfo") or {}).get("bootID", ""), uid=meta.get("uid", ""),
                   capacity=capacity, allocatable={r: _quantity(alloc.get(r)) for r in capacity},
                   fabric={r: _quantity(v) for r, v in (status.get("capacity") or {}).items()
                           if r.startswith(FABRIC_PREFIXES)}, dra=dra)

    @property
    def is_gpu_node(self) -> bool:
        """A GPU resource in capacity, or GPUs published through DRA."""
        return bool(self.capacity or self.dra.get("devices"))

    def sweep_taint(self, key: str) -> dict[str, Any] | None:
        return next((t for t in self.taints if t.get("key") == key), None)

    def short_of_capacity(self) -> list[tuple[str, int, int]]:
        """(resource, allocatable, capacity) for each GPU resource the device plugin holds back:
        GPUs it marked unhealthy leave allocatable, while capacity still counts them."""
        return [(r, self.allocatable.get(r, 0), c) for r, c in sorted(self.capacity.items())
                if self.allocatable.get(r, 0) < c]

    def gpu_vars(self) -> dict[str, Any]:
        """What playbooks see of the node's GPU resources: capacity, allocatable and the shortfall."""
        return {"capacity": dict(self.capacity), "allocatable": dict(self.allocatable),
                "unhealthy": [{"resource": r, "allocatable": a, "capacity": c}
                              for r, a, c in self.short_of_capacity()],
                "dra": {"driver": self.dra["driver"], "pool": self.dra["pool"], "devices": len(self.dra["devices"])}
                if self.dra.get("devices") else {}}


def dra_devices(obj: dict[str, Any], driver: str) -> dict[str, Any]:
    """The node's devices of `driver` in its ResourceSlices, as the kube layer folds them in
    (sweeper.kube.dra): {"driver", "pool", "devices": [names]}, or {} for none."""
    found = (obj.get(DEVICES) or {}).get(driver) if driver else None
    return {"driver": driver, "pool": found.get("pool", ""), "devices": list(found.get("devices") or [])} \
        if found and found.get("devices") else {}


def _quantity(value: Any) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0


def gpu_amounts(resources: dict[str, Any], gpu_resources: tuple[str, ...],
                gpu_prefixes: tuple[str, ...]) -> dict[str, int]:
    """The GPU resources of a capacity or allocatable map that are above zero."""
    prefixes = tuple(gpu_prefixes)
    out = {r: _quantity(v) for r, v in resources.items() if r in gpu_resources or r.startswith(prefixes)}
    return {r: v for r, v in out.items() if v > 0}


def gpu_nodes(nodes: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """The nodes with a configured GPU resource in status.capacity. The device plugin (NVIDIA's,
    AMD's) registers it on every cloud and install, where labels differ: GKE sets
    cloud.google.com/gke-accelerator, AKS kubernetes.azure.com/accelerator, EKS accelerated AMIs
    none by default, and only the GPU Operator's feature discovery sets nvidia.com/gpu.present."""
    return [n for n in nodes
            if gpu_amounts((n.get("status") or {}).get("capacity") or {}, cfg.gpu_resources,
                           cfg.gpu_resource_prefixes) or dra_devices(n, cfg.dra_driver)]


def looked_for(cfg: Config) -> str:
    """How discovery finds GPU nodes, in words: "by capacity of nvidia.com/gpu, ..., selector X"."""
    names = list(cfg.gpu_resources) + [f"{p}*" for p in cfg.gpu_resource_prefixes]
    selector = f", selector {cfg.gpu_node_selector}" if cfg.gpu_node_selector else ""
    return f"by capacity of {', '.join(names)}{selector}"


@dataclass(frozen=True)
class Decision:
    node: NodeView
    take: bool
    reason: str
    detail: str = ""
    warning: str = ""  # something of the node that could not be read (said in the run's log)


@dataclass
class Plan:
    take: list[Decision] = field(default_factory=list)
    skip: list[Decision] = field(default_factory=list)
    gpu_nodes: int = 0
    held: int = 0
    budget: int = 0
    profiles: dict[str, str] = field(default_factory=dict)  # every GPU node seen -> its profile's name
    notes: list[str] = field(default_factory=list)  # what `plan` says beside the table: the platform found, the budget
    gate: list[Decision] = field(default_factory=list)  # the nodes carrying gate_taint (sweeper.gating), apart
    gate_budget: int = 0


def budget(cfg: Config, gpu_nodes: int, held: int) -> int:
    """Nodes that may still be taken: the smaller of max_nodes and max_percent, less those already held.
    A share that rounds down to none still allows one node (a fleet under ten nodes at the default
    10% would never be swept); `max_nodes: 0` or `max_percent: 0` is none."""
    return max(0, min(cfg.max_nodes, _by_percent(cfg, gpu_nodes)) - held)


def _by_percent(cfg: Config, gpu_nodes: int) -> int:
    share = math.floor(gpu_nodes * cfg.max_percent / 100.0)
    return 1 if share == 0 and gpu_nodes > 0 and cfg.max_percent > 0 else share


def budget_note(cfg: Config, gpu_nodes: int) -> str:
    """Why the budget is one where max_percent of the fleet rounds down to none ('' otherwise)."""
    if gpu_nodes > 0 and cfg.max_nodes > 0 and cfg.max_percent > 0 and \
            math.floor(gpu_nodes * cfg.max_percent / 100.0) == 0:
        return (f"budget: {cfg.max_percent:g}% of {gpu_nodes} GPU nodes rounds down to none; a fleet this small "
                "is swept one node at a time (max_nodes: 0 to sweep none)")
    return ""


@dataclass(frozen=True)
class Gates:
    """What stops or slows a whole sweep: a pause, an open breaker, a cooldown after one."""

    paused: str = ""  # the reason, when paused
    breaker: str = ""  # the reason, when the breaker is open
    cooldown: bool = False
    attempts: dict[str, int] = field(default_factory=dict)  # failures per node within the attempt window
    suspects: dict[str, str] = field(default_factory=dict)  # node to why an outside signal names it


def suspect_signals(v: NodeView, cfg: Config, outside: dict[str, str] | None = None) -> list[str]:
    """Why a node is suspect: a condition another tool set, a signal from Prometheus or Loki,
    Sweeper's own suspect label (a light check or an outside signal put it there), or GPUs the
    device plugin holds back from allocatable."""
    out = [f"condition {c}" for c in v.conditions if c in cfg.suspect_conditions]
    if outside and v.name in outside:
        out.append(outside[v.name])
    elif v.labels.get(f"{cfg.prefix}/suspect") == "true":
        out.append(v.annotations.get(f"{cfg.prefix}/suspect-reason") or "a light check failed")
    out += [f"allocatable {a} of {c} {r}" for r, a, c in v.short_of_capacity()]  # the device plugin's word
    return out


def healthy_schedulable(v: NodeView, cfg: Config) -> bool:
    if not v.ready or v.unschedulable or v.sweep_taint(cfg.taint_key):
        return False
    return not any(t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in cfg.allowed_taint_keys
                   for t in v.taints)


def plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], cfg: Config, last_swept: dict[str, float],
         now: float, gates: Gates | None = None) -> Plan:
    """Classify every GPU node (by capacity; see gpu_nodes): take (idle and due, within budget) or
    skip with a reason."""
    gates = gates or Gates()
    views = [v for v in (NodeView.from_obj(n, cfg.gpu_resources, cfg.gpu_resource_prefixes, cfg.dra_driver)
                         for n in nodes)
             if v.is_gpu_node]  # GPU nodes by capacity or DRA devices, as gpu_nodes() finds them
    busy = gpu_pods_by_node(pods, cfg)
    out = Plan(gpu_nodes=len(views))
    eligible: list[NodeView] = []
    for v in views:
        try:
            decision = _classify(v, busy.get(v.name, []), cfg, last_swept, now, gates, out)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            # what the node's own kubelet may write (its annotations, labels, status) ends this node only
            why = f"skipped: its object cannot be read ({type(exc).__name__}: {str(exc)[:160]})"
            decision = Decision(v, False, "unreadable", why, warning=why)
        if decision is None:
            eligible.append(v)
        elif decision.take:
            out.take.append(decision)
        else:
            out.skip.append(decision)
    out.budget = budget(cfg, out.gpu_nodes, out.held)
    out.notes = [n for n in (budget_note(cfg, out.gpu_nodes),) if n]
    healthy = sum(1 for v in views if healthy_schedulable(v, cfg))
    floor = max(cfg.min_healthy_nodes, math.ceil(out.gpu_nodes * cfg.min_healthy_percent / 100.0))
    out.budget = max(0, min(out.budget, healthy - floor))
    if gates.cooldown:
        out.budget = min(out.budget, 1)
    waiting = pending_gpu_pods(pods, cfg) if cfg.yield_to_pending else []
    stop = ("paused", gates.paused) if gates.paused else ("breaker-open", gates.breaker) if gates.breaker else \
        ("demand", f"{len(waiting)} GPU workload(s) waiting for capacity: {', '.join(waiting[:3])}") if waiting else None
    if stop:
        out.budget = 0
        out.skip += [Decision(d.node, False, stop[0], stop[1]) for d in out.take]
        out.take = []
        out.skip += [Decision(v, False, stop[0], stop[1]) for v in eligible]
        eligible = []
    suspects = {v.name: suspect_signals(v, cfg, gates.suspects) for v in eligible}
    # GPUs the device plugin marked unhealthy come first: the sickest nodes are checked before any other.
    eligible.sort(key=lambda v: (not v.short_of_capacity(), v.name in last_swept, not suspects[v.name],
                                 last_swept.get(v.name, 0.0), v.name))
    for i, v in enumerate(eligible):
        if i < out.budget:
            last = last_swept.get(v.name)
            why = "never swept" if last is None else f"last swept {(now - last) / 3600:.1f}h ago"
            if suspects[v.name]:
                why += f"; suspect: {', '.join(suspects[v.name])}"
            out.take.append(Decision(v, True, "idle", why))
        else:
            # a run is a rolling queue: a node over the budget now is taken when a slot frees
            # the budget's free slots went to the nodes ahead of it: none is free for this one now
            ahead = f" ({out.budget} went to the nodes taken)" if out.budget else ""
            out.skip.append(Decision(v, False, "over-budget",
                                     f"queued: no slot free now{ahead}; taken as one frees, within run_deadline"))
    return out


def _classify(v: NodeView, gpu_pods: list[str], cfg: Config, last_swept: dict[str, float], now: float,
              gates: Gates, out: Plan) -> Decision | None:
    """One node's decision before the budget: taken to recheck, skipped with a reason, or None (eligible)."""
    reason, detail = _skip_reason(v, gpu_pods, cfg, last_swept, now, gates.suspects)
    if not reason and gates.attempts.get(v.name, 0) >= cfg.max_attempts:
        reason, detail = "attempts-exhausted", (f"failed {gates.attempts[v.name]} time(s) within "
                                                f"{cfg.attempt_window / 86400:g}d; a person should look")
    if reason == "held":
        out.held += 1
        back, why = remediated_and_back(v, cfg, now)
        if back and not gpu_pods:
            return Decision(v, True, "recheck", why)
        if why:
            detail = f"{detail}; {why}"
    if not reason:
        return None
    bad = [f"{k}={str(v.annotations[k])[:40]!r}" for k in (f"{cfg.prefix}/remediated-at", f"{cfg.prefix}/held-since")
           if k in v.annotations and read_iso(v.annotations[k]) is None]
    return Decision(v, False, reason, detail, warning=f"annotations that are not times: {', '.join(bad)}" if bad else "")


def remediated_and_back(v: NodeView, cfg: Config, now: float) -> tuple[bool, str]:
    """A held node whose reboot or GPU reset is done and that is Ready again: check it again."""
    ann = v.annotations
    how = ann.get(f"{cfg.prefix}/remediation", "")
    if ann.get(f"{cfg.prefix}/recheck") != "true" or how not in ("reboot", "gpu-reset"):
        return False, ""
    if how == "reboot" and (not v.boot_id or v.boot_id == ann.get(f"{cfg.prefix}/boot-id")):
        raw = ann.get(f"{cfg.prefix}/remediated-at")
        since = read_iso(raw)
        if raw and since is None:
            return False, (f"rebooting; its {cfg.prefix}/remediated-at annotation {str(raw)[:40]!r} is not a time: "
                           "a person should look")
        late = since is not None and now - since > cfg.remediation_timeout
        return False, ("not back from its reboot within the remediation timeout: a person should look" if late
                       else "rebooting")
    if not v.ready:
        return False, f"not Ready after its {how}"
    return True, f"back from its {how}: checking it again"


def _skip_reason(v: NodeView, gpu_pods: list[str], cfg: Config, last_swept: dict[str, float],
                 now: float, outside: dict[str, str] | None = None) -> tuple[str, str]:
    if v.sweep_taint(cfg.taint_key):
        return "held", f"carries {cfg.taint_key}={v.sweep_taint(cfg.taint_key).get('value', '')}"  # type: ignore[union-attr]
    if v.labels.get(cfg.opt_out_label, "").lower() in ("true", "1", "yes"):
        return "opted-out", f"label {cfg.opt_out_label}"
    if not v.ready:
        return "not-ready", "node is not Ready"
    if v.unschedulable:
        return "cordoned", "spec.unschedulable is set (a person or another tool cordoned it)"
    handled = [c for c in v.conditions if c in cfg.handled_conditions]
    if handled:
        return "handled-elsewhere", f"condition {', '.join(handled)} is set: another remediator owns the node"
    for t in v.taints:
        key = t.get("key", "")
        if key in FOREIGN_TAINTS:
            return "handled-elsewhere", f"{key}: {FOREIGN_TAINTS[key]}"
        if t.get("effect") in ("NoSchedule", "NoExecute") and key not in cfg.allowed_taint_keys:
            return "foreign-taint", f"{key}:{t.get('effect')}"
    if gpu_pods:
        return "busy", f"{len(gpu_pods)} GPU pod(s): {', '.join(gpu_pods[:3])}"
    if not any(v.capacity.get(r) for r in cfg.gpu_resources) and not v.dra.get("devices"):
        return "no-gpus", f"no whole GPUs ({', '.join(cfg.gpu_resources)}) in capacity"
    if now - v.created < cfg.min_node_age:
        return "too-young", f"joined {int(now - v.created)}s ago (minimum {int(cfg.min_node_age)}s)"
    last = last_swept.get(v.name)
    if last is not None and now - last < cfg.interval and not suspect_signals(v, cfg, outside):
        return "not-due", f"swept {(now - last) / 3600:.1f}h ago; due every {cfg.interval / 3600:.1f}h"
    return "", ""
