"""`sweeper report`: the fleet at a glance as one self-contained HTML file (inline CSS and SVG,
no script, nothing fetched): coverage over every GPU node of the cluster, per profile; every
sweep on a time axis; the nodes held and why, and those that left the cluster; the trends
behind decisions; per-profile NCCL bandwidth; pair sweeps (failed pairs, culprits, suspects
waiting for a re-pair); and a page per node (an anchor in the same file) with its sweeps, pair
runs, findings, actions and metric trends per GPU."""

from __future__ import annotations

import html
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from sweeper import profiles as prof
from sweeper.config import Config
from sweeper.fleet import gpu_nodes as find_gpu_nodes
from sweeper.policy import HOLDING, Policy, slope_per_day

COLORS = {"pass": "#2e9d5b", "warn": "#e0b020", "reboot": "#b455c9", "replace": "#d03b3b", "quarantine": "#e8743b",
          "error": "#7d2b2b", "inconclusive": "#5fa8d3", "": "#cccccc"}
STATE_COLORS = {"in service": "#2e9d5b", "held": "#d03b3b", "never swept": "#8a94a6", "replaced": "#555f73",
                "gone": "#555f73"}
GPU_COLORS = ("#3b7dd8", "#d03b3b", "#2e9d5b", "#b455c9", "#e0b020", "#17a2b8", "#e8743b", "#6c757d")
BANDWIDTH = "nccl.busbw_largest"
MAX_TIMELINE_NODES = 400
MAX_NODE_PAGES = 100
MAX_TREND_CARDS = 12
MAX_PAIR_ROWS = 50
# The page has no script and fetches nothing: a browser runs none, whatever a field of the history holds.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


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
    for name in chosen:
        data.pages.append(_page(history, name, states.get(name), since, now, metrics, rules))
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
    used = {r for s in h["sweeps"] for r in s.get("rules") or []}
    return {"node": name, "state": (state or {}).get("state", "unknown"), "profile": (state or {}).get("profile", ""),
            "history": h, "series": series, "rules": {r: rules.get(r, "") for r in sorted(used)}}


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
    for s in data.timeline:
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
                     "replaced": replaced_at}
    return out


def coverage(data: ReportData) -> tuple[int, int]:
    """(GPU nodes given a full sweep within their interval, GPU nodes in the cluster)."""
    rows = coverage_by_profile(data)
    return sum(r["fresh"] for r in rows), sum(r["nodes"] for r in rows)


def coverage_by_profile(data: ReportData) -> list[dict[str, Any]]:
    """Per profile: GPU nodes in the cluster, swept within the interval, never swept, held."""
    cut = data.generated - coverage_window(data)
    by: dict[str, dict[str, Any]] = {}
    for st in node_states(data).values():
        if st["state"] in ("replaced", "gone"):
            continue
        row = by.setdefault(st["profile"], {"profile": st["profile"], "nodes": 0, "fresh": 0, "never": 0, "held": 0})
        row["nodes"] += 1
        row["fresh"] += int(st["full"] is not None and st["full"] >= cut)
        row["never"] += int(st["state"] == "never swept")
        row["held"] += int(st["state"] == "held")
    return [by[k] for k in sorted(by)]


# -- drawing -----------------------------------------------------------------------------------------
def _esc(x: Any) -> str:
    """Any value, whatever its type, as text safe inside an element or a quoted attribute."""
    return html.escape(str(x), quote=True)


def _gpu_order(kv: tuple[Any, Any]) -> tuple[int, float, str]:
    """The node's own line first, then GPUs by index; anything else a history holds after them."""
    gpu = kv[0]
    if gpu is None:
        return (0, 0.0, "")
    if isinstance(gpu, int | float) and not isinstance(gpu, bool):
        return (1, float(gpu), "")
    return (2, 0.0, str(gpu))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _when(ts: float | None) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def anchor(node: str) -> str:
    return "node-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in node)


def _node_link(node: str, pages: set[str] | frozenset[str]) -> str:
    return f'<a href="#{anchor(node)}">{_esc(node)}</a>' if node in pages else _esc(node)


TICKS = (3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400)


def _ticks(t0: float, t1: float, most: int = 8) -> list[float]:
    step = next((s for s in TICKS if (t1 - t0) / s <= most), TICKS[-1])
    first = (int(t0 // step) + 1) * step
    return [float(t) for t in range(int(first), int(t1) + 1, int(step))]


def _tick_label(ts: float, t0: float, t1: float) -> str:
    return time.strftime("%m-%d" if t1 - t0 > 3 * 86400 else "%m-%d %H:%M", time.gmtime(ts))


def _timeline(data: ReportData, pages: set[str], states: dict[str, dict[str, Any]]) -> str:
    """Every sweep at its time, one row per node, coloured by verdict, with the reason as a tooltip."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for s in data.timeline:
        by_node.setdefault(s["node"], []).append(s)
    if not by_node:
        return "<p class=empty>No sweeps in this window.</p>"
    # Nodes with a sweep that did not pass come first, so a large fleet's trouble is never cut off.
    nodes = sorted(by_node, key=lambda n: (all(s["verdict"] == "pass" for s in by_node[n]), n))[:MAX_TIMELINE_NODES]
    t0 = min(s["started"] for s in data.timeline)
    t1 = max(data.generated, t0 + 3600)
    row, label, plot = 16, 170, 760
    width, height = label + plot + 20, len(nodes) * row + 30

    def x(ts: float) -> float:
        return label + (ts - t0) / (t1 - t0) * plot

    parts = [f'<svg class=timeline width="{width}" height="{height}" viewBox="0 0 {width} {height}" role=img '
             'aria-label="every sweep of each node at its time, coloured by verdict">']
    for tick in _ticks(t0, t1):
        parts.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1=0 y2="{height - 22}" class=grid />'
                     f'<text x="{x(tick):.1f}" y="{height - 8}" text-anchor=middle class=tick>'
                     f'{_tick_label(tick, t0, t1)}</text>')
    for i, node in enumerate(nodes):
        y = i * row + row / 2
        st = states.get(node, {}).get("state", "")
        gone = " (replaced)" if st == "replaced" else " (gone)" if st == "gone" else ""
        parts.append(f'<text x="{label - 8}" y="{y + 4}" text-anchor=end class=node>{_node_link(node, pages)}'
                     f'{_esc(gone)}</text><line x1="{label}" x2="{label + plot}" y1="{y}" y2="{y}" class=lane />')
        for s in by_node[node]:
            verdict = s["verdict"] or ""
            why = "; ".join(json.loads(s["reasons"] or "[]")) if verdict != "pass" else "all checks passed"
            rule = f" [{', '.join(s['rules'])}]" if s["rules"] else ""
            light = s["kind"] == "light"
            kind = " (light check)" if light else " (pair sweep)" if s["kind"] == "pair" else ""
            tip = f"{node} {_when(s['started'])} UTC: {verdict}{kind}{rule}: {why}"
            parts.append(f'<circle cx="{x(s["started"]):.1f}" cy="{y}" r="{3 if light else 5}" '
                         f'fill="{COLORS.get(verdict, "#999")}" class="sweep{" light" if light else ""}" '
                         f'data-node="{_esc(node)}" data-ts="{s["started"]:.0f}" data-verdict="{_esc(verdict)}">'
                         f'<title>{_esc(tip[:600])}</title></circle>')
    parts.append("</svg>")
    more = len(by_node) - len(nodes)
    return "".join(parts) + (f"<p class=note>and {more} more nodes (see <code>sweeper nodes</code>)</p>" if more else "")


def _legend() -> str:
    return "<div class=legend>" + "".join(
        f'<span><i style="background:{c}"></i>{v}</span>' for v, c in COLORS.items() if v) + \
        "<span>small dot: a light check of a busy node</span></div>"


def _coverage(data: ReportData) -> str:
    rows = coverage_by_profile(data)
    if not rows:
        return "<p class=empty>No GPU node known.</p>"
    body = "".join(
        f"<tr data-profile=\"{_esc(r['profile'])}\"><td>{_esc(r['profile'])}</td><td>{r['nodes']}</td>"
        f"<td>{r['fresh']}</td><td>{r['never']}</td><td>{r['held']}</td>"
        f"<td>{r['fresh'] / r['nodes']:.0%}</td></tr>" for r in rows)
    return ("<table class=coverage><thead><tr><th>profile</th><th>GPU nodes</th><th>swept within interval</th>"
            f"<th>never swept</th><th>held</th><th>coverage</th></tr></thead><tbody>{body}</tbody></table>")


def _held(data: ReportData, states: dict[str, dict[str, Any]], pages: set[str]) -> str:
    held = [(n, st) for n, st in states.items() if st["state"] == "held"]
    if not held:
        return "<p class=empty>No node is held.</p>"
    rows = "".join(
        f"<tr><td>{_node_link(n, pages)}</td><td>{_esc(st['profile'])}</td>"
        f"<td><b style='color:{COLORS[st['last']['verdict']]}'>{_esc(st['last']['verdict'])}</b></td>"
        f"<td>{_when(st['last']['started'])}</td>"
        f"<td>{_esc(', '.join(st['last'].get('rules') or []) or 'findings')}</td>"
        f"<td>{_esc('; '.join(st['last']['reasons'])[:400])}</td></tr>" for n, st in held)
    return ("<table class=held><thead><tr><th>node</th><th>profile</th><th>verdict</th><th>since</th><th>rule</th>"
            f"<th>why</th></tr></thead><tbody>{rows}</tbody></table>")


def _left(states: dict[str, dict[str, Any]], pages: set[str]) -> str:
    left = [(n, st) for n, st in states.items() if st["state"] in ("replaced", "gone")]
    if not left:
        return ""
    rows = "".join(
        f"<tr><td>{_node_link(n, pages)}</td><td>{_esc(st['profile'])}</td><td>{_esc(st['state'])}</td>"
        f"<td>{_when(st['replaced'] or (st['last'] or {}).get('started'))}</td>"
        f"<td>{_esc(', '.join((st['last'] or {}).get('rules') or []) or (st['last'] or {}).get('verdict') or '')}</td>"
        f"<td>{_esc('; '.join((st['last'] or {}).get('reasons') or [])[:300])}</td></tr>" for n, st in left)
    return ("<h2>Nodes that left the cluster</h2><table class=left><thead><tr><th>node</th><th>profile</th>"
            "<th>state</th><th>when</th><th>last verdict or rule</th><th>why</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _line_chart(lines: list[tuple[str, list[tuple[float, float]]]], w: int = 380, h: int = 150,
                limit: float | None = None, unit: str = "") -> str:
    """Lines over time (one per GPU), with a dashed line climbing at `limit` per day from the first
    reading when the chart is a trend rule's."""
    pts = [p for _, line in lines for p in line]
    if not pts:
        return "<p class=empty>no readings</p>"
    t0, t1 = min(t for t, _ in pts), max(t for t, _ in pts)
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    tspan, vspan = (t1 - t0) or 1.0, (hi - lo) or 1.0
    left, right, top, bottom = 44, 10, 10, 22

    def xy(t: float, v: float) -> str:
        return (f"{left + (t - t0) / tspan * (w - left - right):.1f},"
                f"{h - bottom - (v - lo) / vspan * (h - top - bottom):.1f}")

    parts = [f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role=img class=chart>',
             f'<text x="{left - 4}" y="{top + 4}" text-anchor=end>{hi:g}</text>'
             f'<text x="{left - 4}" y="{h - bottom}" text-anchor=end>{lo:g}</text>'
             f'<text x="{left}" y="{h - 6}">{_when(t0)}</text>'
             f'<text x="{w - right}" y="{h - 6}" text-anchor=end>{_when(t1)}</text>']
    if limit and len(pts) > 1:
        first = min(lines[0][1])  # the earliest reading of the line the rule judges
        end = first[1] + limit * (t1 - first[0]) / 86400
        clipped_t = t1 if end <= hi else first[0] + (hi - first[1]) / limit * 86400
        parts.append(f'<polyline class=limit fill=none stroke="#888" stroke-dasharray="5 4" '
                     f'points="{xy(first[0], first[1])} {xy(clipped_t, min(end, hi))}">'
                     f'<title>the rule\'s limit: {limit:g}/day</title></polyline>')
    for i, (name, line) in enumerate(lines):
        color = GPU_COLORS[i % len(GPU_COLORS)]
        if len(line) > 1:
            parts.append(f'<polyline fill=none stroke="{color}" stroke-width=2 points="'
                         + " ".join(xy(t, v) for t, v in line) + f'"><title>{_esc(name)}</title></polyline>')
        for t, v in (line if sum(len(pl) for _, pl in lines) <= 120 else line[-1:]):  # dots: the latest only
            cx, cy = xy(t, v).split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r=2.5 fill="{color}">'
                         f'<title>{_esc(name)} {_when(t)} UTC: {v:g}{_esc(unit)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _trends(data: ReportData, pages: set[str]) -> str:
    if not data.trends:
        return "<p class=empty>No rising counter of a trend rule in this window.</p>"
    cards = []
    for t in data.trends[:MAX_TREND_CARDS]:
        gpu = f" GPU {t['gpu']}" if t["gpu"] is not None else ""
        verdict = (f"<b style='color:{COLORS.get(t['then'], '#333')}'>{_esc(t['rule'])} fired: {_esc(t['then'])}</b>"
                   if t["fired"] else f"<span class=note>{_esc(t['rule'])}: below its limit</span>")
        line = (gpu.strip() or t["node"], t["points"])
        cards.append(f"<figure class=trend data-node=\"{_esc(t['node'])}\" data-rule=\"{_esc(t['rule'])}\">"
                     f"<figcaption>{_node_link(t['node'], pages)}{_esc(gpu)} {_esc(t['metric'])}: "
                     f"{t['slope']:.1f}/day (limit {t['limit']:g}/day) {verdict}</figcaption>"
                     f"{_line_chart([line], limit=t['limit'])}</figure>")
    more = len(data.trends) - MAX_TREND_CARDS
    return "<div class=cards>" + "".join(cards) + "</div>" + (
        f"<p class=note>and {more} more rising counters</p>" if more > 0 else "")


def _histogram(values: list[float], floor: float | None, w: int = 360, h: int = 130, bins: int = 16) -> str:
    lo = min(values + ([floor] if floor else []))
    hi = max(values + ([floor] if floor else []))
    if hi == lo:
        hi = lo + 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    top = max(counts)
    bw = (w - 20) / bins
    bars = "".join(f'<rect x="{10 + i * bw:.1f}" y="{h - 20 - c / top * (h - 40):.1f}" width="{bw - 2:.1f}" '
                   f'height="{c / top * (h - 40):.1f}" fill="#3b7dd8"><title>{c} node(s), '
                   f'{lo + i * (hi - lo) / bins:.0f} to {lo + (i + 1) * (hi - lo) / bins:.0f} GB/s</title></rect>'
                   for i, c in enumerate(counts) if c)
    mark = ""
    if floor:
        x = 10 + (floor - lo) / (hi - lo) * (w - 20)
        mark = (f'<line x1="{x:.1f}" x2="{x:.1f}" y1=14 y2="{h - 20}" stroke="#d03b3b" stroke-dasharray="4 3"/>'
                f'<text x="{x:.1f}" y=11 text-anchor={"start" if x < w / 3 else "end" if x > 2 * w / 3 else "middle"}>'
                f'floor {floor:g}</text>')
    return (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role=img class=histogram>{bars}{mark}'
            f'<text x=10 y="{h - 4}">{lo:.0f}</text><text x="{w - 10}" y="{h - 4}" text-anchor=end>{hi:.0f} GB/s'
            '</text></svg>')


def _bandwidth(data: ReportData, pages: set[str]) -> str:
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for b in data.bandwidth:
        by_profile.setdefault(b["profile"] or "?", []).append(b)
    if not by_profile:
        return "<p class=empty>No NCCL bandwidth recorded in this window.</p>"
    cards = []
    for profile, rows in sorted(by_profile.items()):
        values = [r["value"] for r in rows]
        med = statistics.median(values)
        low = min(rows, key=lambda r: r["value"])
        cards.append(f"<figure class=nccl data-profile=\"{_esc(profile)}\"><figcaption><b>{_esc(profile)}</b>: "
                     f"{len(values)} nodes, median {med:.0f} GB/s, lowest {low['value']:.0f} "
                     f"({_node_link(low['node'], pages)})</figcaption>"
                     f"{_histogram(values, data.floors.get(profile))}</figure>")
    return "<div class=cards>" + "".join(cards) + "</div>"


def _mode(mode: str, role: str = "node") -> str:
    if mode != "repair":
        return mode
    return "re-pair (suspect)" if role == "node" else "re-pair (known-good)"


def _gbps(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _more(total: int, what: str) -> str:
    more = total - MAX_PAIR_ROWS
    return f"<p class=note>and {more} more {what} (<code>sweeper history NODE</code>)</p>" if more > 0 else ""


def _pairs(data: ReportData, pages: set[str]) -> str:
    """Pair runs in the window: how many ended how, the culprits found by a re-pair, the nodes
    still waiting for one, the nodes that failed with several partners, and the latest failures."""
    counts = data.pairs.get("counts") or {}
    if not counts:
        return "<p class=empty>No pair sweep in this window.</p>"
    order = ("pass", "warn", "fail", "error", "inconclusive")
    statuses = [st for st in order if any(st in c for c in counts.values())]
    statuses += sorted({st for c in counts.values() for st in c} - set(statuses))
    body = "".join(f"<tr data-mode='{_esc(m)}'><td>{_esc(_mode(m))}</td><td>{sum(c.values())}</td>"
                   + "".join(f"<td>{c.get(st, 0)}</td>" for st in statuses) + "</tr>"
                   for m, c in sorted(counts.items(), key=lambda kv: kv[0] != "sweep"))
    parts = ["<table class=pair-counts><thead><tr><th>mode</th><th>pair runs</th>"
             + "".join(f"<th>{_esc(st)}</th>" for st in statuses) + f"</tr></thead><tbody>{body}</tbody></table>"]
    culprits = data.pairs.get("culprits") or []
    parts.append("<h3>Culprits</h3><p class=note>nodes that failed again with a known-good partner</p>")
    if culprits:
        rows = "".join(
            f"<tr data-node='{_esc(c['node'])}'><td>{_node_link(c['node'], pages)}</td><td>{_when(c['ts'])}</td>"
            f"<td>{_node_link(c['partner'], pages)}</td><td>{_gbps(c['busbw'])}</td>"
            f"<td><b style='color:{COLORS.get(c['verdict'] or '', '#999')}'>{_esc(c['verdict'] or 'unfinished')}</b>"
            f"</td><td>{_esc(', '.join(c['rules']))}</td><td>{_esc((c['detail'] or '')[:300])}</td></tr>"
            for c in culprits[:MAX_PAIR_ROWS])
        parts.append("<table class=pair-culprits><thead><tr><th>node</th><th>when</th><th>known-good partner</th>"
                     "<th>bus bandwidth GB/s</th><th>verdict</th><th>rule</th><th>detail</th></tr></thead>"
                     f"<tbody>{rows}</tbody></table>" + _more(len(culprits), "culprits"))
    else:
        parts.append("<p class=empty>No re-pair failed.</p>")
    if data.suspects:
        rows = "".join(f"<tr data-node='{_esc(n)}'><td>{_node_link(n, pages)}</td><td>{_node_link(p, pages)}</td></tr>"
                       for n, p in sorted(data.suspects.items())[:MAX_PAIR_ROWS])
        parts.append("<h3>Waiting for a re-pair</h3><p class=note>their latest pair failed; no known-good partner "
                     "has judged them yet</p><table class=pair-suspects><thead><tr><th>node</th><th>failed with"
                     f"</th></tr></thead><tbody>{rows}</tbody></table>" + _more(len(data.suspects), "nodes waiting"))
    many = sorted(((n, k) for n, k in (data.pairs.get("failed_partners") or {}).items() if k > 1),
                  key=lambda nk: (-nk[1], nk[0]))
    if many:
        rows = "".join(f"<tr data-node='{_esc(n)}'><td>{_node_link(n, pages)}</td><td>{k}</td></tr>"
                       for n, k in many[:MAX_PAIR_ROWS])
        parts.append("<h3>Failed with several partners</h3><table class=pair-partners><thead><tr><th>node</th>"
                     f"<th>different partners failed with</th></tr></thead><tbody>{rows}</tbody></table>"
                     + _more(len(many), "such nodes"))
    failures = (data.pairs.get("failures") or [])[:MAX_PAIR_ROWS]
    if failures:
        rows = "".join(
            f"<tr><td>{_when(f['ts'])}</td><td>{_node_link(f['node'], pages)}</td>"
            f"<td>{_node_link(f['partner'], pages)}</td><td>{_esc(_mode(f['mode']))}</td>"
            f"<td>{_esc(f['profile'] or '')}</td><td>{_gbps(f['busbw'])}</td>"
            f"<td>{_esc((f['detail'] or '')[:300])}</td></tr>" for f in failures)
        parts.append("<h3>Failed pairs</h3><table class=pairs><thead><tr><th>when</th><th>node</th><th>partner</th>"
                     "<th>mode</th><th>profile</th><th>bus bandwidth GB/s</th><th>detail</th></tr></thead>"
                     f"<tbody>{rows}</tbody></table>")
    return "".join(parts)


def _node_pairs(pairs: list[dict[str, Any]], pages: set[str] | frozenset[str]) -> str:
    """A node's pair runs: each with its partner, mode, bus bandwidth and status, and the
    bandwidth over time."""
    rows = "".join(
        f"<tr><td>{_when(p['ts'])}</td><td>{_node_link(p['partner'], pages)}</td>"
        f"<td>{_esc(_mode(p['mode'], p['role']))}</td><td>{_gbps(p['busbw'])}</td>"
        f"<td><b style='color:{COLORS.get(p['status'], '#d03b3b' if p['status'] == 'fail' else '#999')}'>"
        f"{_esc(p['status'])}</b></td><td>{_esc((p['detail'] or '')[:200])}</td></tr>" for p in pairs[:30])
    out = ("<h4>Pairs</h4><table class=pairs><thead><tr><th>when</th><th>partner</th><th>mode</th>"
           f"<th>bus bandwidth GB/s</th><th>status</th><th>detail</th></tr></thead><tbody>{rows}</tbody></table>")
    points = sorted((p["ts"], p["busbw"]) for p in pairs if p["busbw"] is not None)
    if len(points) > 1:
        out += ("<figure class=pair-busbw><figcaption>pair bus bandwidth, GB/s, with each partner</figcaption>"
                f"{_line_chart([('bus bandwidth', points)], unit=' GB/s')}</figure>")
    return out


def _node_page(page: dict[str, Any], pages: set[str] | frozenset[str] = frozenset()) -> str:
    h = page["history"]
    node = page["node"]
    parts = [f"<section class=node id=\"{anchor(node)}\"><h3>{_esc(node)} "
             f"<span class=state style='background:{STATE_COLORS.get(page['state'], '#888')}'>{_esc(page['state'])}"
             f"</span> <span class=note>{_esc(page['profile'])}</span> <a class=top href=\"#top\">top</a></h3>",
             f"<p class=note>from the command line: <code>sweeper history {_esc(node)}</code></p>"]
    for rule, meaning in page["rules"].items():
        parts.append(f"<p class=rule><b>{_esc(rule)}</b>: {_esc(meaning)}</p>")
    if h["sweeps"]:
        rows = "".join(
            f"<tr><td>{_when(s['started'])}</td><td>{_esc(s.get('kind') or 'sweep')}</td>"
            f"<td><b style='color:{COLORS.get(s['verdict'] or '', '#999')}'>{_esc(s['verdict'] or 'unfinished')}</b></td>"
            f"<td>{_esc(', '.join(s.get('rules') or []))}</td>"
            f"<td>{_esc('; '.join(s['reasons'])[:300] if s['verdict'] != 'pass' else '')}</td></tr>"
            for s in h["sweeps"])
        parts.append("<h4>Sweeps</h4><table class=sweeps><thead><tr><th>started</th><th>kind</th><th>verdict</th>"
                     f"<th>rule</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>")
    if h.get("pairs"):
        parts.append(_node_pairs(h["pairs"], pages))
    problems = [(s, p) for s in h["sweeps"] for p in s["problems"]][:40]
    if problems:
        rows = "".join(
            f"<tr><td>{_when(s['started'])}</td><td>{_esc(p['name'])}</td>"
            f"<td>{'' if p['gpu'] is None else _esc(p['gpu'])}</td><td>{_esc(p['status'])}</td><td>{_esc(p['code'] or '')}</td>"
            f"<td>{_esc((p['message'] or '')[:200])}</td></tr>" for s, p in problems)
        parts.append("<h4>Findings</h4><table class=findings><thead><tr><th>when</th><th>check</th><th>GPU</th>"
                     f"<th>status</th><th>code</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>")
    actions = [a for a in h["actions"] if not a["dry_run"]][:30]
    if actions:
        rows = "".join(f"<tr><td>{_when(a['ts'])}</td><td>{_esc(a['action'])}</td><td>{_esc(a['detail'][:200])}</td></tr>"
                       for a in actions)
        parts.append("<h4>Actions</h4><table class=actions><thead><tr><th>when</th><th>action</th><th>detail</th>"
                     f"</tr></thead><tbody>{rows}</tbody></table>")
    if page["series"]:
        charts, flat = [], []
        for s in page["series"]:
            lines = [(f"GPU {g}" if g is not None else node, pts) for g, pts in
                     sorted(s["by_gpu"].items(), key=_gpu_order)]
            values = {v for _, pts in lines for _, v in pts}
            if len(values) == 1:  # a counter that never moved needs no chart
                flat.append(f"{_esc(s['metric'])} {next(iter(values)):g}")
                continue
            key = "".join(f'<span><i style="background:{GPU_COLORS[i % len(GPU_COLORS)]}"></i>{_esc(name)}</span>'
                          for i, (name, _) in enumerate(lines)) if len(lines) > 1 else ""
            charts.append(f"<figure class=metric data-metric=\"{_esc(s['metric'])}\"><figcaption>{_esc(s['metric'])}"
                          f" per GPU</figcaption>{_line_chart(lines)}<div class=legend>{key}</div></figure>")
        parts.append("<h4>Metric trends</h4><div class=cards>" + "".join(charts) + "</div>" +
                     (f"<p class=note>unchanged on every GPU: {', '.join(flat)}</p>" if flat else ""))
    parts.append("</section>")
    return "".join(parts)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
h3{font-size:15px;margin:20px 0 4px}h4{font-size:13px;margin:12px 0 4px}
.note,.empty{color:#667}.tiles{display:flex;gap:12px;flex-wrap:wrap}.tile{background:#fff;border:1px solid #dde2ea;
border-radius:6px;padding:10px 16px;min-width:120px}.tile b{display:block;font-size:22px}
table{border-collapse:collapse;background:#fff;width:100%}td,th{border:1px solid #dde2ea;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f0f3f7}td a{white-space:nowrap}svg text{font-size:10px;fill:#334}svg.timeline text.node{font-size:10px}
svg .grid{stroke:#e3e7ee}svg .lane{stroke:#f0f2f6}svg circle.sweep{stroke:#fff;stroke-width:1}
.legend span{margin-right:12px;white-space:nowrap}figure .legend{font-size:11px;max-width:380px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;
border-radius:5px}.cards{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0;background:#fff;border:1px solid #dde2ea;
border-radius:6px;padding:8px}figcaption{font-size:12px;margin-bottom:4px;max-width:380px}.scroll{overflow-x:auto}
section.node{border-top:1px solid #dde2ea;margin-top:16px}.state{color:#fff;border-radius:4px;padding:1px 6px;
font-size:12px}a.top{font-size:12px;font-weight:normal}
"""


def _head(title: str, refresh: int) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">{meta}<title>{_esc(title)}</title>'
            f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
            f"<body id=top><h1>{_esc(title)}</h1>")


def render(data: ReportData, title: str = "Sweeper fleet report", refresh: int = 0) -> str:
    states = node_states(data)
    pages = {p["node"] for p in data.pages}
    fresh, known = coverage(data)
    count = {s: sum(1 for st in states.values() if st["state"] == s)
             for s in ("held", "never swept", "replaced", "gone", "in service")}
    pct = f"{fresh / known:.0%}" if known else "-"
    tiles = "".join(f"<div class=tile data-tile=\"{k}\"><b>{v}</b>{k}</div>" for k, v in (
        ("GPU nodes", known), ("swept within interval", f"{fresh} ({pct})"), ("never swept", count["never swept"]),
        ("held", count["held"]), ("replaced", count["replaced"] + count["gone"])))
    source = (f"GPU nodes from {_esc(data.node_source)}" if data.gpu_nodes is not None else
              "GPU nodes from the history alone (no cluster and no recorded plan: never-swept nodes are not counted)")
    since = _when(data.since) if data.since > 0 else "the start of the history"
    more = (f"<p class=note>{data.more_pages} more nodes have no page here: "
            "<code>sweeper report --node NODE</code> writes one.</p>" if data.more_pages else "")
    return (_head(title, refresh) +
            f"<p class=note>generated {_when(data.generated)} UTC; sweeps since {since}; {source}; coverage "
            f"counts a GPU node given a full sweep within {coverage_window(data) / 3600:g} h</p>"
            f"<div class=tiles>{tiles}</div>"
            f"<h2>Coverage by profile</h2>{_coverage(data)}"
            f"<h2>Nodes held, and why</h2>{_held(data, states, pages)}"
            f"{_left(states, pages)}"
            f"<h2>Sweeps over time</h2>{_legend()}<div class=scroll>{_timeline(data, pages, states)}</div>"
            f"<h2>Trends behind decisions</h2>{_trends(data, pages)}"
            f"<h2>NCCL bus bandwidth by profile</h2>{_bandwidth(data, pages)}"
            f"<h2>Pair sweeps</h2>{_pairs(data, pages)}"
            f"<h2>Nodes</h2>{more}" + "".join(_node_page(p, pages) for p in data.pages) +
            "</body></html>\n")


def render_node(data: ReportData, title: str = "") -> str:
    """One node's page alone (`sweeper report --node NODE`)."""
    page = data.pages[0]
    return (_head(title or f"Sweeper: {page['node']}", 0) +
            f"<p class=note>generated {_when(data.generated)} UTC</p>" + _node_page(page) + "</body></html>\n")
