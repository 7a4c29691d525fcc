"""What the fleet report shows, read from the history: the GPU nodes and where that list came from,
each node's state, coverage per profile, the trends behind decisions, and the pages' contents."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sweeper import profiles as prof
from sweeper.claims import load_catalog
from sweeper.config import Config
from sweeper.fleet import gpu_nodes as find_gpu_nodes
from sweeper.policy import HOLDING, Policy, slope_per_day

BANDWIDTH = "nccl.busbw_largest"
MAX_NODE_PAGES = 100
MAX_TREND_CARDS = 12


@dataclass
class ReportData:
    generated: float
    since: float
    interval: float
    fleet: list[dict[str, Any]]  # latest sweep per node (history)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # every sweep in the window, oldest first
    gpu_nodes: dict[str, str] | None = None  # the cluster's GPU nodes -> profile; None: not known
    node_source: str = ""  # where gpu_nodes came from, in words
    replaced: dict[str, float] = field(default_factory=dict)  # node -> when its replacement went through
    trends: list[dict[str, Any]] = field(default_factory=list)  # {node, metric, rule, limit, slope, gpu, fired, points}
    bandwidth: list[dict[str, Any]] = field(default_factory=list)  # {node, profile, value}
    floors: dict[str, float] = field(default_factory=dict)  # profile -> NCCL floor
    pages: list[dict[str, Any]] = field(default_factory=list)  # one per node given a page
    more_pages: int = 0  # nodes left without a page (see `sweeper report --node`)
    pairs: dict[str, Any] = field(default_factory=dict)  # history.pair_overview: counts, failures, culprits
    suspects: dict[str, str] = field(default_factory=dict)  # node -> the partner of its failed pair, waiting
    claims: list[dict[str, Any]] = field(default_factory=list)  # other tools' claims judged, per source and code
    claim_docs: dict[str, str] = field(default_factory=dict)  # source -> its documentation
    cohorts: list[dict[str, Any]] = field(default_factory=list)  # sweeper.cohorts.cohort_report, one a fact
    _states: dict[str, dict[str, Any]] | None = None


# -- where the GPU node list comes from ---------------------------------------------------------
def cluster_gpu_nodes(kube: Any, cfg: Config) -> dict[str, str]:
    """The cluster's GPU nodes (by capacity, as discovery finds them), each with its profile's name."""
    profiles = prof.load_profiles(cfg.path("profiles"))
    nodes = find_gpu_nodes(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size), cfg)
    return {n["metadata"]["name"]: prof.match(profiles, n["metadata"].get("labels") or {}).name for n in nodes}


def last_run_gpu_nodes(history: Any) -> tuple[dict[str, str] | None, str]:
    """The GPU nodes the latest finished run saw, from its recorded plan; (None, "") before any."""
    last = history.last_run()
    nodes = (last or {}).get("summary", {}).get("gpu_node_profiles")
    if last is None or not isinstance(nodes, dict):
        return None, ""
    return {str(k): str(v) for k, v in nodes.items()}, f"the plan of run {last['id']}"


# -- gathering ------------------------------------------------------------------------------------
def gather(history: Any, policy: Policy, since: float, now: float, interval: float,
           floors: dict[str, float] | None = None, *, gpu_nodes: dict[str, str] | None = None,
           node_source: str = "", node: str | None = None, max_pages: int = MAX_NODE_PAGES) -> ReportData:
    """Read what the report shows. `gpu_nodes`: the cluster's GPU nodes and their profiles when it
    was reachable; else the latest run's plan is used. `node`: gather that one node's page only."""
    fleet = history.fleet()
    # A history whose clock ran ahead of this one (a simulation) is reported as of its latest sweep.
    now = max([now] + [r["started"] for r in fleet])
    if gpu_nodes is None:
        gpu_nodes, node_source = last_run_gpu_nodes(history)
    data = ReportData(generated=now, since=since, interval=interval, fleet=fleet,
                      timeline=history.sweep_timeline(since), gpu_nodes=gpu_nodes,
                      node_source=node_source if gpu_nodes is not None else "", replaced=history.replaced(),
                      floors=floors or {})
    fired: dict[str, set[str]] = {}
    for s in data.timeline:
        fired.setdefault(s["node"], set()).update(s["rules"])
    for tr in policy.trends:
        # The whole window's slope (in SQLite) picks the candidates: the nodes whose rule fired and
        # the steepest others; each is then judged as its rule sees it, over the rule's window
        # ending at the node's latest reading.
        rough: dict[str, float] = {}
        for name, _gpu, _n, slope in history.metric_slopes(tr.metric, since, now):
            rough[name] = max(slope, rough.get(name, slope))
        steep = sorted((n for n, sl in rough.items() if sl > 0), key=lambda n: -rough[n])[:MAX_TREND_CARDS * 2]
        for name in dict.fromkeys([n for n in rough if tr.name in fired.get(n, set())] + steep):
            by_gpu: dict[int | None, list[tuple[float, float]]] = {}
            for ts, gpu, value in history.series(name, tr.metric, since, now):
                if _number(value):
                    by_gpu.setdefault(gpu, []).append((ts, value))
            if not by_gpu:
                continue
            end = max(pts[-1][0] for pts in by_gpu.values())
            steepest: tuple[float, int | None, list[tuple[float, float]]] | None = None
            for gpu, all_pts in by_gpu.items():
                pts = [p for p in all_pts if p[0] >= end - tr.window]
                if len(pts) >= 2:
                    slope = slope_per_day(pts)
                    if steepest is None or slope > steepest[0]:
                        steepest = (slope, gpu, pts)
            if steepest is None or steepest[0] <= 0:
                continue
            data.trends.append({"node": name, "metric": tr.metric, "rule": tr.name, "limit": tr.slope_per_day,
                                "then": tr.then, "slope": steepest[0], "gpu": steepest[1],
                                "fired": tr.name in fired.get(name, set()), "points": steepest[2]})
    data.trends.sort(key=lambda t: (not t["fired"], -t["slope"] / (t["limit"] or 1.0), t["node"]))
    data.bandwidth = [b for b in history.metric_latest(BANDWIDTH, since) if _number(b["value"])]
    data.pairs = history.pair_overview(since)
    data.suspects = history.pair_suspects(since)
    data.claims = history.claim_precision(since)
    data.claim_docs = {s.name: s.doc for s in load_catalog().sources.values()}
    if node is None:
        from sweeper.report.cohorts import gather_cohorts

        data.cohorts = gather_cohorts(history, since)
    states = node_states(data)
    if node is not None:
        chosen = [node]
    else:
        # Pages for the nodes a reader is most likely to open: held, replaced, failing, then the rest.
        order = {"held": 0, "replaced": 1, "gone": 2, "in service": 3, "never swept": 4}
        swept = [n for n, st in states.items() if st["last"] is not None]
        swept.sort(key=lambda n: (order.get(states[n]["state"], 5), states[n]["last"]["verdict"] == "pass", n))
        chosen, data.more_pages = swept[:max_pages], max(0, len(swept) - max_pages)
    metrics = [t.metric for t in policy.trends] + [p.metric for p in policy.peers]
    rules = {t.name: f"{t.metric} rising faster than {t.slope_per_day:g}/day over {_days(t.window)}: {t.then}"
             for t in policy.trends}
    rules |= {p.name: f"{p.metric} {p.below_median_by:.0%} below its profile's median on {p.consecutive} sweeps: "
              f"{p.then}" for p in policy.peers}
    rules |= {r.name: f"failed pairs with {r.partners} or more different partners within {_days(r.window)}: {r.then}"
              for r in policy.pair_failures}
    rules |= {r.name: f"more than {r.allowed} {'/'.join(r.verdicts)} verdict(s) for the same cause within "
              f"{_days(r.window)}: {r.then}" for r in policy.ladders}
    rules |= {r.name: f"held for a cause, handed back, and failing for it again within {_days(r.window)}: {r.then}"
              for r in policy.relapses}
    rules |= {r.name: f"{r.k} of the last {r.n} conclusive sweeps held the node: {r.then}" for r in policy.failure_rates}
    for name in chosen:
        page = _page(history, name, states.get(name), since, now, metrics, rules)
        page["floor"] = data.floors.get(page["profile"])
        data.pages.append(page)
    return data


def _page(history: Any, name: str, state: dict[str, Any] | None, since: float, now: float, metrics: list[str],
          rules: dict[str, str]) -> dict[str, Any]:
    h = history.node_history(name, since)
    series = []
    for metric in dict.fromkeys(metrics):
        by_gpu: dict[int | None, list[tuple[float, float]]] = {}
        for ts, gpu, value in history.series(name, metric, since, now):
            if _number(value):  # a history written before results were type-checked may hold text
                by_gpu.setdefault(gpu, []).append((ts, value))
        if by_gpu:
            series.append({"metric": metric, "by_gpu": by_gpu})
    last = (state or {}).get("last")
    # the rules of the sweeps in the window, and of the latest verdict (the one the held table names) even
    # where that sweep is older than the window
    used = {r for s in [*h["sweeps"], last or {}] for r in s.get("rules") or []}
    return {"node": name, "state": (state or {}).get("state", "unknown"), "profile": (state or {}).get("profile", ""),
            "last": last, "history": h, "series": series,
            "rules": {r: rules.get(r) or "a rule of another policy" for r in sorted(used)}}


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds / 3600:g}h"


def coverage_window(data: ReportData) -> float:
    """The sweep interval, or a day where sweeping is continuous (interval 0)."""
    return data.interval if data.interval > 0 else 86400.0


def node_states(data: ReportData) -> dict[str, dict[str, Any]]:
    """Every node the report knows (the cluster's GPU nodes and the history's): its state (in
    service, held, never swept, replaced, gone), profile, latest sweep and latest full sweep."""
    if data._states is None:
        data._states = _node_states(data)
    return data._states


def _node_states(data: ReportData) -> dict[str, dict[str, Any]]:
    latest = {r["node"]: r for r in data.fleet}
    full: dict[str, float] = {}
    light: dict[str, float] = {}
    for s in data.timeline:
        if s["kind"] == "light":
            light[s["node"]] = s["started"]
        # a pair sweep checks the node too, unless it ended waiting for a re-pair
        if s["kind"] == "sweep" or (s["kind"] == "pair" and s["verdict"] != "inconclusive"):
            full[s["node"]] = s["started"]
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(latest) | set(data.gpu_nodes or {})):
        last = latest.get(name)
        in_cluster = None if data.gpu_nodes is None else name in data.gpu_nodes
        replaced_at = data.replaced.get(name)
        if replaced_at and (last is None or replaced_at >= last["started"]):
            state = "replaced"  # even where a plan made before the replacement still lists it
        elif in_cluster is False:
            state = "replaced" if last and last["verdict"] == "replace" else "gone"
        elif last is None:
            state = "never swept"
        elif last["verdict"] in HOLDING:
            state = "held"
        else:
            state = "in service"
        profile = (data.gpu_nodes or {}).get(name) or (last or {}).get("profile") or "?"
        out[name] = {"state": state, "profile": profile, "last": last, "full": full.get(name),
                     "light": light.get(name), "replaced": replaced_at}
    return out


def coverage(data: ReportData) -> tuple[int, int]:
    """(GPU nodes given a full sweep within their interval, GPU nodes in the cluster)."""
    rows = coverage_by_profile(data)
    return sum(r["fresh"] for r in rows), sum(r["nodes"] for r in rows)


def coverage_by_profile(data: ReportData) -> list[dict[str, Any]]:
    """Per profile: GPU nodes in the cluster, and where each went: swept within the interval, held,
    busy (no full sweep within the interval, but a light check: GPU pods kept it), overdue (neither),
    never swept. A held node swept within the interval counts in both of those columns."""
    cut = data.generated - coverage_window(data)
    by: dict[str, dict[str, Any]] = {}
    for st in node_states(data).values():
        if st["state"] in ("replaced", "gone"):
            continue
        row = by.setdefault(st["profile"], {"profile": st["profile"], "nodes": 0, "fresh": 0, "never": 0, "held": 0,
                                            "busy": 0, "overdue": 0})
        fresh = st["full"] is not None and st["full"] >= cut
        row["nodes"] += 1
        row["fresh"] += int(fresh)
        row["never"] += int(st["state"] == "never swept")
        row["held"] += int(st["state"] == "held")
        if not fresh and st["state"] == "in service":
            busy = st["light"] is not None and st["light"] >= cut
            row["busy" if busy else "overdue"] += 1
    return [by[k] for k in sorted(by)]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
