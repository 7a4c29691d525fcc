"""The fleet report's sections: coverage, nodes held and nodes that left, every sweep on a time
axis, trends behind decisions, NCCL bandwidth by profile and pair sweeps."""

from __future__ import annotations

import json
import statistics
from typing import Any

from sweeper.report.data import MAX_TREND_CARDS, ReportData, coverage_by_profile
from sweeper.report.svg import (
    COLORS,
    _esc,
    _histogram,
    _line_chart,
    _node_link,
    _tick_format,
    _tick_label,
    _ticks,
    _when,
)

MAX_TIMELINE_NODES = 400
MAX_PAIR_ROWS = 50


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
    t1 = max(data.generated, t0 + 3600, max(s["started"] for s in data.timeline))
    row, label, plot = 16, 170, 760
    width, height = label + plot + 20, len(nodes) * row + 30

    def x(ts: float) -> float:
        return label + (ts - t0) / (t1 - t0) * plot

    parts = [f'<svg class=timeline width="{width}" height="{height}" viewBox="0 0 {width} {height}" role=img '
             'aria-label="every sweep of each node at its time, coloured by verdict">']
    ticks = _ticks(t0, t1)
    fmt = _tick_format(ticks, t0, t1)
    for tick in ticks:
        parts.append(f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1=0 y2="{height - 22}" class=grid />'
                     f'<text x="{x(tick):.1f}" y="{height - 8}" text-anchor=middle class=tick data-ts="{tick:.0f}">'
                     f'{_tick_label(tick, fmt)}</text>')
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
        f"<td>{r['fresh']}</td><td data-col=busy>{r['busy']}</td><td data-col=overdue>{r['overdue']}</td>"
        f"<td>{r['never']}</td><td>{r['held']}</td><td>{r['fresh'] / r['nodes']:.0%}</td></tr>" for r in rows)
    busy, overdue = sum(r["busy"] for r in rows), sum(r["overdue"] for r in rows)
    note = ("<p class=note>Where the nodes not swept within the interval went: <b>busy</b>, GPU pods kept them, so "
            "each got only the light check (read-only, beside the workload) and gets a full sweep once idle; "
            "<b>overdue</b>, neither a full sweep nor a light check within the interval (over budget, opted out, too "
            "young, light checks off, or no run); <b>never swept</b>; <b>held</b> (a held node swept within the "
            f"interval counts there too). Busy now: {busy}, overdue: {overdue}.</p>")
    return ("<table class=coverage><thead><tr><th>profile</th><th>GPU nodes</th><th>swept within interval</th>"
            "<th>busy: light checks only</th><th>overdue</th><th>never swept</th><th>held</th><th>coverage</th>"
            f"</tr></thead><tbody>{body}</tbody></table>{note}")


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
