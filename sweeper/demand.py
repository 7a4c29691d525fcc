"""Which running checks to abort for pending GPU work: only as many as the pending pods need.

A pending pod (or a Kueue Workload's podSet, all its pods or none) needs G GPUs on each of P nodes
whose labels its nodeSelector and required node affinity accept. For each, largest first, the
checks whose nodes could host it are taken in order of least progress (the share of their deadline
spent): a node already freed for another pod is used first where it still has room. A pod that no
running check's node could host aborts nothing: stopping a check would not let it run. One arbiter
serves a run; a pod served once is not served again while it waits for the node it was given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sweeper.config import Config
from sweeper.fleet import pending_gpu_pods, requests_gpu

PODS = "x-sweeper-pods"  # a Workload podSet's pod count (sweeper.kube.dra), its GPUs are the total


@dataclass(frozen=True)
class Want:
    """Pending work: `pods` pods of `gpus` GPUs each (0: a count not known, as through a DRA claim: a
    whole node each), on nodes `fits` accepts."""

    name: str
    pods: int
    gpus: int
    fits: Callable[[Mapping[str, str]], bool]


@dataclass
class Check:
    """A running abortable check: its node's labels and GPUs, when it began and its deadline."""

    node: str
    labels: Mapping[str, str]
    gpus: int
    started: float
    timeout: float

    def progress(self, now: float) -> float:
        return (now - self.started) / self.timeout if self.timeout > 0 else 0.0


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _match(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), [str(v) for v in expr.get("values") or ()]
    have = labels.get(key)
    return {"In": have in values, "NotIn": have not in values, "Exists": have is not None,
            "DoesNotExist": have is None}.get(op, False)  # Gt/Lt and unknown operators: not a match


def selector(pod: Mapping[str, Any]) -> Callable[[Mapping[str, str]], bool]:
    """What nodes a pending pod accepts: its nodeSelector, and its required node affinity (terms ORed,
    expressions ANDed). Preferred affinity and taints are not read: a node that passes may still
    not be the pod's, and then the pod waits as it did."""
    spec = pod.get("spec") or {}
    wanted = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [t.get("matchExpressions") or [] for t in required.get("nodeSelectorTerms") or []]

    def fits(labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in wanted.items()):
            return False
        return not terms or any(all(_match(e, labels) for e in term) for term in terms)
    return fits


def holds_gpus(job: Mapping[str, Any], cfg: Config) -> bool:
    """Whether a check Job's pods take GPUs (a resource or a claim): only stopping such a check frees
    a node for pending work; a light check beside a workload frees nothing."""
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return bool(spec.get("resourceClaims")) or requests_gpu({"metadata": {}, "spec": spec}, cfg)


def wants(pods: list[dict[str, Any]], cfg: Config) -> list[Want]:
    """The pending GPU work among `pods` (as pending_gpu_pods counts it), each with its shape."""
    names = set(pending_gpu_pods(pods, cfg))
    out = []
    for p in pods:
        name = p.get("x-sweeper-demand") or f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}"
        if name not in names:
            continue
        total = 0
        for c in (p.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            part = res.get("limits") or res.get("requests") or {}
            total += sum(_count(v) for k, v in part.items()
                         if k in cfg.gpu_resources or any(k.startswith(x) for x in cfg.gpu_resource_prefixes))
        count = max(1, _count(p.get(PODS) or 1))
        out.append(Want(name, count, total // count, selector(p)))  # 0: GPUs through claims, a whole node
    return out


def plan_aborts(want: list[Want], checks: list[Check], now: float) -> dict[str, list[str]]:
    """Node -> the pending work it is freed for: as few nodes as the work needs, least progress first."""
    free: dict[str, int] = {}  # nodes chosen so far -> GPUs not yet given
    out: dict[str, list[str]] = {}
    order = sorted(checks, key=lambda c: (c.progress(now), c.node))
    for w in sorted(want, key=lambda w: (-w.gpus, w.name)):
        given: dict[str, int] = {}
        for _ in range(w.pods):
            spot = next((c for c in order if w.gpus and c.node in free | given
                         and free.get(c.node, c.gpus) - given.get(c.node, 0) >= w.gpus and w.fits(c.labels)), None) or \
                next((c for c in order if c.node not in free and c.node not in given
                      and (c.gpus >= w.gpus or not c.gpus) and w.fits(c.labels)), None)
            if spot is None:
                given = {}  # all its pods or none: a gang that cannot all land runs nowhere
                break
            # A node whose GPU count is not known (published through DRA) is given whole to one pod.
            given[spot.node] = given.get(spot.node, 0) + (w.gpus if w.gpus and spot.gpus else spot.gpus or 1 << 30)
        for node, gpus in given.items():
            free[node] = free.get(node, next(c.gpus or 1 << 30 for c in checks if c.node == node)) - gpus
            out.setdefault(node, []).append(w.name)
    return out


def words(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


@dataclass
class Arbiter:
    """One run's decisions: the checks that may be aborted, and those chosen to be."""

    checks: dict[str, Check] = field(default_factory=dict)
    aborted: dict[str, str] = field(default_factory=dict)  # node -> the work it was freed for
    served: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def running(self, nodes: list[Mapping[str, Any]], now: float, timeout: float) -> Iterator[None]:
        """While the block runs, the checks on `nodes` (their `node` variables) may be aborted."""
        with self.lock:
            for v in nodes:
                self.checks[v["name"]] = Check(v["name"], v.get("labels") or {}, int(v.get("gpus") or 0), now, timeout)
        try:
            yield
        finally:
            with self.lock:
                for v in nodes:
                    self.checks.pop(v["name"], None)

    def abort(self, node: str, pods: list[dict[str, Any]], cfg: Config, now: float) -> str:
        """The pending work `node`'s check is aborted for ("" to go on), deciding for every check
        of the run at once."""
        with self.lock:
            if node not in self.aborted:
                new = [w for w in wants(pods, cfg) if w.name not in self.served]
                left = [c for n, c in self.checks.items() if n not in self.aborted]
                chosen = plan_aborts(new, left, now)
                self.aborted.update({n: words(names) for n, names in chosen.items()})
                self.served.update(name for names in chosen.values() for name in names)
            return self.aborted.get(node, "")
