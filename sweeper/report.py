"""`sweeper report`: the fleet at a glance as one self-contained HTML file (inline CSS and SVG,
no script, nothing fetched): a heatmap of nodes by sweeps, the nodes held and why, the trends
behind decisions, per-profile bandwidth distributions, and coverage."""

from __future__ import annotations

import html
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from sweeper.policy import HOLDING, Policy

COLORS = {"pass": "#2e9d5b", "warn": "#e0b020", "reboot": "#b455c9", "replace": "#d03b3b", "quarantine": "#e8743b",
          "error": "#7d2b2b", "inconclusive": "#5fa8d3", "": "#cccccc"}
BANDWIDTH = "nccl.busbw_largest"
MAX_HEATMAP_NODES = 400
MAX_HEATMAP_SWEEPS = 60


@dataclass
class ReportData:
    generated: float
    since: float
    interval: float
    fleet: list[dict[str, Any]]  # latest sweep per node
    matrix: dict[str, list[tuple[float, str]]]  # node -> (started, verdict) over the window
    trends: list[dict[str, Any]] = field(default_factory=list)  # {node, metric, rule, points: [(ts, value)]}
    bandwidth: list[dict[str, Any]] = field(default_factory=list)  # {node, profile, value}
    floors: dict[str, float] = field(default_factory=dict)  # profile -> NCCL floor


def gather(history: Any, policy: Policy, since: float, now: float, interval: float,
           floors: dict[str, float] | None = None) -> ReportData:
    fleet = history.fleet()
    # A history whose clock ran ahead of this one (a simulation) is reported as of its latest sweep.
    now = max([now] + [r["started"] for r in fleet])
    data = ReportData(generated=now, since=since, interval=interval, fleet=fleet,
                      matrix=history.verdict_matrix(since), floors=floors or {})
    trend_metrics = {t.name: t.metric for t in policy.trends} | {p.name: p.metric for p in policy.peers}
    for row in fleet:
        for rule in row.get("rules") or []:
            metric = trend_metrics.get(rule)
            if metric:
                pts: dict[float, float] = {}
                for ts, _gpu, value in history.series(row["node"], metric, since, now):
                    pts[ts] = max(value, pts.get(ts, value))
                data.trends.append({"node": row["node"], "metric": metric, "rule": rule,
                                    "points": sorted(pts.items())})
    data.bandwidth = history.metric_latest(BANDWIDTH, since)
    return data


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _when(ts: float | None) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def coverage_window(data: ReportData) -> float:
    """The sweep interval, or a day where sweeping is continuous (interval 0)."""
    return data.interval if data.interval > 0 else 86400.0


def coverage(data: ReportData) -> tuple[int, int]:
    """(nodes swept within their interval, nodes known)."""
    fresh = sum(1 for r in data.fleet if r["started"] >= data.generated - coverage_window(data))
    return fresh, len(data.fleet)


def _heatmap(data: ReportData) -> str:
    nodes = sorted(data.matrix)[:MAX_HEATMAP_NODES]
    if not nodes:
        return "<p class=empty>No sweeps in this window.</p>"
    cell, label = 12, 150
    cols = min(MAX_HEATMAP_SWEEPS, max(len(v) for v in data.matrix.values()))
    span = max(cols * cell, 120)  # room for the axis words under a short history
    width, height = label + span + 10, len(nodes) * cell + 20
    parts = [f'<svg class=heat width="{width}" height="{height}" viewBox="0 0 {width} {height}" role=img '
             f'aria-label="verdict of each node\'s sweeps, oldest left">']
    for i, node in enumerate(nodes):
        y = i * cell
        parts.append(f'<text x="{label - 6}" y="{y + cell - 2}" text-anchor=end>{_esc(node)}</text>')
        for j, (ts, verdict) in enumerate(data.matrix[node][-cols:]):
            parts.append(f'<rect x="{label + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                         f'fill="{COLORS.get(verdict, "#999")}"><title>{_esc(node)} {_when(ts)}: {_esc(verdict)}'
                         '</title></rect>')
    parts.append(f'<text x="{label}" y="{height - 4}">oldest</text>'
                 f'<text x="{label + span}" y="{height - 4}" text-anchor=end>latest</text></svg>')
    more = len(data.matrix) - len(nodes)
    return "".join(parts) + (f"<p class=note>and {more} more nodes (see <code>sweeper nodes</code>)</p>" if more else "")


def _legend() -> str:
    return "<div class=legend>" + "".join(
        f'<span><i style="background:{c}"></i>{v}</span>' for v, c in COLORS.items() if v) + "</div>"


def _held(data: ReportData) -> str:
    held = [r for r in data.fleet if r["verdict"] in HOLDING]
    if not held:
        return "<p class=empty>No node is held.</p>"
    rows = "".join(
        f"<tr><td>{_esc(r['node'])}</td><td>{_esc(r['profile'] or '')}</td>"
        f"<td><b style='color:{COLORS[r['verdict']]}'>{_esc(r['verdict'])}</b></td><td>{_when(r['started'])}</td>"
        f"<td>{_esc(', '.join(r.get('rules') or []) or 'findings')}</td>"
        f"<td>{_esc('; '.join(r['reasons'])[:400])}</td></tr>" for r in held)
    return ("<table><thead><tr><th>node</th><th>profile</th><th>verdict</th><th>since</th><th>rule</th>"
            f"<th>why</th></tr></thead><tbody>{rows}</tbody></table>")


def _line_chart(points: list[tuple[float, float]], w: int = 360, h: int = 120) -> str:
    if len(points) < 2:
        return "<p class=empty>one reading</p>"
    t0, t1 = points[0][0], points[-1][0]
    lo, hi = min(v for _, v in points), max(v for _, v in points)
    span, vspan = (t1 - t0) or 1.0, (hi - lo) or 1.0
    xy = " ".join(f"{10 + (t - t0) / span * (w - 20):.1f},{h - 20 - (v - lo) / vspan * (h - 35):.1f}"
                  for t, v in points)
    return (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role=img>'
            f'<polyline fill=none stroke="#d03b3b" stroke-width=2 points="{xy}"/>'
            f'<text x=10 y=12>{hi:g}</text><text x=10 y="{h - 4}">{lo:g}</text>'
            f'<text x="{w - 10}" y="{h - 4}" text-anchor=end>{(t1 - t0) / 86400:.1f} days</text></svg>')


def _trends(data: ReportData) -> str:
    if not data.trends:
        return "<p class=empty>No trend or peer rule drove a current decision.</p>"
    return "<div class=cards>" + "".join(
        f"<figure><figcaption><b>{_esc(t['node'])}</b> {_esc(t['metric'])} <span class=note>({_esc(t['rule'])})"
        f"</span></figcaption>{_line_chart(t['points'])}</figure>" for t in data.trends[:24]) + "</div>"


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
                   f'height="{c / top * (h - 40):.1f}" fill="#3b7dd8"><title>{c} node(s)</title></rect>'
                   for i, c in enumerate(counts) if c)
    mark = ""
    if floor:
        x = 10 + (floor - lo) / (hi - lo) * (w - 20)
        mark = (f'<line x1="{x:.1f}" x2="{x:.1f}" y1=14 y2="{h - 20}" stroke="#d03b3b" stroke-dasharray="4 3"/>'
                f'<text x="{x:.1f}" y=11 text-anchor={"start" if x < w / 3 else "end" if x > 2 * w / 3 else "middle"}>'
                f'floor {floor:g}</text>')
    return (f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role=img>{bars}{mark}'
            f'<text x=10 y="{h - 4}">{lo:.0f}</text><text x="{w - 10}" y="{h - 4}" text-anchor=end>{hi:.0f} GB/s'
            '</text></svg>')


def _bandwidth(data: ReportData) -> str:
    by_profile: dict[str, list[float]] = {}
    for b in data.bandwidth:
        by_profile.setdefault(b["profile"] or "?", []).append(b["value"])
    if not by_profile:
        return "<p class=empty>No NCCL bandwidth recorded in this window.</p>"
    cards = []
    for profile, values in sorted(by_profile.items()):
        med = statistics.median(values)
        cards.append(f"<figure><figcaption><b>{_esc(profile)}</b>: {len(values)} nodes, median {med:.0f} GB/s, "
                     f"lowest {min(values):.0f}</figcaption>{_histogram(values, data.floors.get(profile))}</figure>")
    return "<div class=cards>" + "".join(cards) + "</div>"


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
.note,.empty{color:#667}.tiles{display:flex;gap:12px;flex-wrap:wrap}.tile{background:#fff;border:1px solid #dde2ea;
border-radius:6px;padding:10px 16px;min-width:120px}.tile b{display:block;font-size:22px}
table{border-collapse:collapse;background:#fff;width:100%}td,th{border:1px solid #dde2ea;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f0f3f7}svg text{font-size:10px;fill:#334}svg.heat text{font-size:9px}
.legend span{margin-right:12px;white-space:nowrap}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;
border-radius:2px}.cards{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0;background:#fff;border:1px solid #dde2ea;
border-radius:6px;padding:8px}figcaption{font-size:12px;margin-bottom:4px}.scroll{overflow-x:auto}
"""


def render(data: ReportData, title: str = "Sweeper fleet report", refresh: int = 0) -> str:
    fresh, known = coverage(data)
    held = sum(1 for r in data.fleet if r["verdict"] in HOLDING)
    counts: dict[str, int] = {}
    for r in data.fleet:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    pct = f"{fresh / known:.0%}" if known else "-"
    tiles = "".join(f"<div class=tile><b>{v}</b>{k}</div>" for k, v in (
        ("nodes in history", known), ("swept within interval", f"{fresh} ({pct})"), ("held", held),
        ("passing", counts.get("pass", 0)), ("replace", counts.get("replace", 0))))
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>{meta}<title>{_esc(title)}</title>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{CSS}</style></head><body>"
            f"<h1>{_esc(title)}</h1><p class=note>generated {_when(data.generated)} UTC; sweeps since "
            f"{_when(data.since)}; coverage counts a node swept within {coverage_window(data) / 3600:g} h</p>"
            f"<div class=tiles>{tiles}</div>"
            f"<h2>Nodes held, and why</h2>{_held(data)}"
            f"<h2>Sweeps by node</h2>{_legend()}<div class=scroll>{_heatmap(data)}</div>"
            f"<h2>Trends behind decisions</h2>{_trends(data)}"
            f"<h2>NCCL bus bandwidth by profile</h2>{_bandwidth(data)}"
            "</body></html>\n")
