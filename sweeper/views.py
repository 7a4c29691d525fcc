"""What the fleet's reading commands show, computed from the cluster and the history: `nodes`'
rows, `plan`'s document and the report's page. The CLI prints them; `sweeper serve` serves the
same rows and pages to readers elsewhere (sweeper.remote), so both say the same thing."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeper.config import Config
    from sweeper.fleet import NodeView
    from sweeper.policy import Policy

# Each function imports what it needs when it runs: `nodes --offline` reads the history alone and
# starts without the Kubernetes client, pydantic or Jinja2 (tests/test_cli.py holds it to that).


def policy_for(cfg: Config, name: str | None) -> Policy:
    """The policy named (a file, or a name in the config's policies/, with or without its `.yaml`:
    `default` is policies/default.yaml), else the config's."""
    from pathlib import Path

    from sweeper.policy import load_policy, policy_path

    name = name or cfg.policy
    path = Path(name) if Path(name).exists() else policy_path(cfg.path("policies"), name)
    if not path.exists() and "/" not in name and path.with_name(f"{name}.yaml").is_file():
        path = path.with_name(f"{name}.yaml")
    return load_policy(path)


def fleet_rows(hist: Any, cfg: Config, kube: Any = None, now: float | None = None) -> list[dict[str, Any]]:
    """Each GPU node's last sweep and verdict, when it is due, whether it is a suspect and whether
    Sweeper holds it. With `kube`, the cluster's GPU nodes (a node never swept included, with the
    profile it would get); without, the nodes the history knows."""
    now = time.time() if now is None else now
    latest = {r["node"]: r for r in hist.fleet()}
    # a light check of a busy node shows, but only a full sweep makes a node not due (the planner's rule):
    # each row's `swept` where the history keeps it, else the history is asked again where a latest row is not one
    if all("swept" in r for r in latest.values()):
        full = {n: r["swept"] for n, r in latest.items() if r["swept"] is not None}
    elif any(r.get("kind") != "sweep" or r.get("verdict") == "inconclusive" for r in latest.values()):
        full = hist.last_swept()
    else:
        full = {n: r["started"] for n, r in latest.items()}
    views: list[NodeView] = []
    profile_of: dict[str, str] = {}
    if kube is not None:
        from sweeper import profiles as prof
        from sweeper.fleet import NodeView, gpu_nodes

        views = [NodeView.from_obj(o, cfg.gpu_resources)
                 for o in gpu_nodes(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size), cfg)]
        catalogue = prof.load_profiles(cfg.path("profiles"))  # a node never swept gets the profile it would
        profile_of = {v.name: prof.match(catalogue, v.labels).name for v in views}
    names = [v.name for v in views] if views else sorted(latest)
    by_name = {v.name: v for v in views}
    rows: list[dict[str, Any]] = []
    for name in names:
        last = latest.get(name)
        v = by_name.get(name)
        swept = full.get(name)
        due = (swept + cfg.interval) if swept is not None else now
        taint = v.sweep_taint(cfg.taint_key) if v else None
        rows.append({
            "node": name, "profile": (last["profile"] if last else "") or profile_of.get(name, ""),
            "last_sweep": last["started"] if last else None, "verdict": last["verdict"] if last else "",
            "rules": last.get("rules", []) if last else [], "due": max(due, now) if v or last else None,
            "overdue": swept is not None and now - swept > cfg.interval,
            "suspect": "; ".join(_suspect_signals(v, cfg)) if v else "",
            "held": bool(taint) or (v is not None and f"{cfg.prefix}/cordoned-by" in v.annotations),
            "in_cluster": v is not None})
    return rows


def _suspect_signals(v: NodeView, cfg: Config) -> list[str]:
    from sweeper.fleet import suspect_signals

    return suspect_signals(v, cfg)


@dataclass
class PlanView:
    """`plan`'s document, and what its table says beside it."""

    doc: dict[str, Any]
    listed: int  # nodes listed, GPU or not
    paired: bool  # a pair playbook: rows carry a partner
    selector: str = ""
    notes: list[str] = field(default_factory=list)


def plan_view(kube: Any, cfg: Config, hist: Any, now: float | None = None) -> PlanView:
    """Which nodes a sweep would take now, and why every other GPU node is skipped. Changes nothing."""
    from sweeper import gating
    from sweeper.fleet import gpu_nodes, looked_for
    from sweeper.fleet import plan as make_plan
    from sweeper.sweep import Sweep

    nodes = kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size)
    pods = kube.active_pods(page_size=cfg.page_size)
    sweep = Sweep(kube, cfg, hist)
    found = sweep.resolve_platform(gpu_nodes(nodes, cfg), pods)
    cfg = sweep.cfg
    gates = sweep.gates()
    now = time.time() if now is None else now
    gated, rest = gating.split(nodes, cfg)
    p = make_plan(rest, pods, cfg, hist.last_swept(sweep.kind), now, gates)
    stop = ("paused", gates.paused) if gates.paused else ("breaker-open", gates.breaker) if gates.breaker else ("", "")
    late = gating.joined_long_ago(gated, cfg, now)
    asked = getattr(hist, "gate_seen", None)  # a history of nodes' labels alone keeps no runs
    seen = (asked(late, now - cfg.gate_deadline) if late else {}) if asked else None
    p.gate, p.gate_budget = gating.gate_plan(gated, pods, cfg, now, stop, gates.attempts, seen)
    p.notes = [*(found.why if found else ()), *p.notes]
    rows: list[dict[str, Any]] = [{"node": d.node.name, "take": d.take, "reason": d.reason, "detail": d.detail}
                                  for d in p.take + p.skip]
    windows: dict[str, Any] = {}
    for r, d in zip(rows, p.take + p.skip, strict=True):  # the depth each node would get, and why
        if d.take or d.reason in ("idle", "over-budget"):
            r.update(sweep.depth(d.node, now, windows).as_dict())
    partners = sweep.partners(p) if sweep.playbook.pair else None
    for r in rows if partners is not None else []:  # a pair playbook takes nodes two at a time
        r["partner"] = partners.get(r["node"], "")  # type: ignore[union-attr]
        if r["partner"] and not r["take"]:  # an odd node of another group left it room
            r.update(take=True, reason="idle", detail=f"paired with {r['partner']}")
        elif r["take"] and not r["partner"]:
            r.update(take=False, reason="no-partner", detail="no other due node of its profile and placement "
                     "(pair_labels) to pair with within the budget; it waits")
    doc = {"gpu_nodes": p.gpu_nodes, "found_by": looked_for(cfg), "held": p.held, "budget": p.budget, "nodes": rows,
           "paused": gates.paused, "breaker": gates.breaker, "notes": p.notes,
           "gate": {"taint": cfg.gate_taint, "budget": p.gate_budget,
                    "nodes": [{"node": d.node.name, "take": d.take, "reason": d.reason, "detail": d.detail}
                              for d in p.gate]},
           "platform": {"platform": cfg.platform, "runtime_class": cfg.runtime_class_name,
                        "dcgm_hostengine": cfg.hostengine}}
    return PlanView(doc, len(nodes), partners is not None, cfg.gpu_node_selector or "", p.notes)


def nccl_floors(cfg: Config) -> dict[str, float]:
    """Each profile's NCCL bus bandwidth floor, where it has one (the report draws it)."""
    from sweeper import profiles as prof

    return {p.name: p.nccl_busbw_min for p in prof.load_profiles(cfg.path("profiles")).values() if p.nccl_busbw_min}


def report_page(hist: Any, cfg: Config, policy: Policy, since: float, *, gpu: dict[str, str] | None = None,
                source: str = "", node: str | None = None, title: str = "Sweeper fleet report",
                refresh: int = 0) -> tuple[str, int]:
    """The report as HTML, and how many node pages it holds. `gpu`: the cluster's GPU nodes and
    their profiles (sweeper.report.cluster_gpu_nodes) when it answered; else the last run's plan."""
    from sweeper.report import gather, render, render_node

    data = gather(hist, policy, since, time.time(), cfg.interval, nccl_floors(cfg), gpu_nodes=gpu,
                  node_source=source, node=node)
    if node is not None:
        return render_node(data), len(data.pages)
    return render(data, title, refresh), len(data.pages)


def fleet_report(hist: Any, cfg: Config, policy: Policy, since: float, stem: str,
                 gpu: tuple[str, dict[str, str] | None, str] | None = None) -> tuple[str, dict[str, str]]:
    """The fleet page over every cluster of the history, and each cluster's report by file name
    (`<stem>-<cluster>.html`, beside it). `gpu`: (cluster, its GPU nodes, where from) for the cluster
    that answered; every other cluster's GPU nodes come from its last run's plan."""
    from sweeper.report import overview, page_name, render_fleet

    now = time.time()
    pages: dict[str, str] = {}
    links: dict[str, str] = {}
    taken: set[str] = set()
    for cluster in hist.clusters():
        nodes, source = (gpu[1], gpu[2]) if gpu is not None and gpu[0] == cluster else (None, "")
        page, _ = report_page(hist.for_cluster(cluster), cfg, policy, since, gpu=nodes, source=source,
                              title=f"Sweeper: cluster {cluster}")
        links[cluster] = page_name(stem, cluster, taken)
        pages[links[cluster]] = page
    rows = overview(hist.for_cluster(None), since, now)
    generated = max([now] + [r["last_run"] or 0.0 for r in rows])
    return render_fleet(rows, links, generated, since), pages


def fleet_node_rows(hist: Any, cfg: Config, kube: Any = None, now: float | None = None) -> list[dict[str, Any]]:
    """`nodes --cluster all`: every cluster's rows, each led by its cluster; the cluster's own GPU
    nodes (`kube`) only for the cluster this history writes as (the one the kubeconfig reaches)."""
    rows: list[dict[str, Any]] = []
    for cluster in hist.clusters():
        rows += [{"cluster": cluster, **r} for r in fleet_rows(hist.for_cluster(cluster), cfg,
                                                                kube if cluster == hist.cluster else None, now)]
    return rows


def profile_rows(cfg: Config, kube: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The hardware profiles, and with `kube` which one each GPU node of the cluster gets (by
    instance type, then GPU product label, then the conservative default)."""
    from sweeper import profiles as prof
    from sweeper.fleet import gpu_nodes

    catalogue = prof.load_profiles(cfg.path("profiles"))
    rows: list[dict[str, Any]] = [{"profile": p.name, **p.as_vars()} for p in catalogue.values()]
    nodes: list[dict[str, str]] = []
    if kube is not None:
        for obj in gpu_nodes(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size), cfg):
            labels = obj["metadata"].get("labels") or {}
            nodes.append({"node": obj["metadata"]["name"], "profile": prof.match(catalogue, labels).name,
                          "instance_type": labels.get("node.kubernetes.io/instance-type", "")})
    return rows, nodes


@dataclass
class Read:
    """What a reading command shows from the cluster, where it came from, and, when the cluster's
    Sweeper could not be read, why (the rows are then the nodes' own labels and annotations)."""

    value: Any
    source: str
    why: str = ""


def cluster_fleet_rows(kube: Any, cfg: Config, now: float | None = None) -> Read:
    """`nodes` with no local history: the cluster's Sweeper's rows, else the nodes' labels."""
    from sweeper.remote import LabelHistory, RemoteHistory, Unreachable

    reader = RemoteHistory(kube, cfg.namespace)
    try:
        return Read(reader.nodes(), reader.where)
    except Unreachable as exc:
        labels = LabelHistory(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size, devices=False), cfg)
        return Read(fleet_rows(labels, cfg, kube, now), "the nodes' labels and annotations alone", str(exc))


def cluster_node_history(kube: Any, cfg: Config, node: str, since_seconds: float | None, check: str) -> Read:
    """`history NODE` with no local history: the cluster's Sweeper's, else what the node's labels
    say of its last sweep. The value holds `known`: whether it was ever recorded."""
    from sweeper.remote import LabelHistory, RemoteHistory, Unreachable

    reader = RemoteHistory(kube, cfg.namespace)
    try:
        return Read(reader.node_history(node, since_seconds, check), reader.where)
    except Unreachable as exc:
        labels = LabelHistory(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size, devices=False), cfg)
        h = labels.node_history(node, None if since_seconds is None else time.time() - since_seconds)
        return Read({**h, "known": labels.knows(node)}, "the node's labels and annotations alone", str(exc))


def evidence_bundle(hist: Any, cfg: Config, node: str, run_id: str) -> bytes:
    """The bytes of node `node`'s evidence bundle of run `run_id`, from the history or from S3 where it
    went there; checked against the digest recorded when it was kept. A tar.gz the node made: written
    out as one file, never extracted. ConfigError when there is none to give."""
    import hashlib

    from sweeper.errors import ConfigError

    row = hist.evidence_of(node, run_id)
    if row is None:
        runs = [r["run_id"] for r in hist.evidence_runs(node)][:5]
        raise ConfigError(f"no evidence of node {node!r} for run {run_id!r}"
                          + (f" (runs with evidence: {', '.join(runs)})" if runs else " (none kept of this node)"))
    data = row["data"]
    if data is None and str(row["location"]).startswith("s3://"):
        from sweeper.aws import EvidenceBucket

        data = EvidenceBucket(row["location"].split("/")[2], region=cfg.aws_region or None).get(
            row["location"], max(int(row["bytes"] or 0), 1))
    if data is None:
        raise ConfigError(f"the evidence of node {node!r} for run {run_id!r} is no longer kept "
                          f"({row['location']}: the history's size cap, evidence_keep_bytes, took its bytes)")
    if hashlib.sha256(data).hexdigest() != row["sha256"]:
        raise ConfigError(f"the evidence of node {node!r} for run {run_id!r} does not match the digest recorded "
                          "when it was kept")
    return bytes(data)
