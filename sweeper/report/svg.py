"""The report's drawing: inline SVG with the browser's own tooltips (`<title>`), no script; colours,
escaping, links between a node's mentions and its page, the time axis and its ticks, line charts
and histograms."""

from __future__ import annotations

import html
import math
import time
from typing import Any

COLORS = {"pass": "#2e9d5b", "warn": "#e0b020", "reboot": "#b455c9", "replace": "#d03b3b", "quarantine": "#e8743b",
          "error": "#7d2b2b", "inconclusive": "#5fa8d3", "": "#cccccc"}
STATE_COLORS = {"in service": "#2e9d5b", "held": "#d03b3b", "never swept": "#8a94a6", "replaced": "#555f73",
                "gone": "#555f73"}
GPU_COLORS = ("#3b7dd8", "#d03b3b", "#2e9d5b", "#b455c9", "#e0b020", "#17a2b8", "#e8743b", "#6c757d")


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

def _when(ts: float | None) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def anchor(node: str) -> str:
    return "node-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in node)


def _node_link(node: str, pages: set[str] | frozenset[str]) -> str:
    return f'<a href="#{anchor(node)}">{_esc(node)}</a>' if node in pages else _esc(node)


TICKS = (300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400,
         30 * 86400, 91 * 86400, 365 * 86400)
EDGE = 0.05  # no tick this close (a share of the axis) to either end: its centred label would be cut off


def _ticks(t0: float, t1: float, most: int = 8) -> list[float]:
    """Round times strictly inside the window [t0, t1] and clear of its ends: the finest step
    (five minutes to a year) that gives no more than `most`."""
    span = t1 - t0
    if span <= 0:
        return []
    lo, hi = t0 + span * EDGE, t1 - span * EDGE
    for step in TICKS:
        first = math.ceil(lo / step) * step
        count = int((hi - first) // step) + 1 if first <= hi else 0
        if count <= most:
            return [float(first + i * step) for i in range(count)]
    return []


def _tick_format(ticks: list[float], t0: float, t1: float) -> str:
    """Dates alone when every tick is a midnight (UTC), times alone within one day, else both:
    never two ticks with one label."""
    if ticks and all(t % 86400 == 0 for t in ticks):
        return "%m-%d"
    if time.gmtime(t0)[:3] == time.gmtime(t1)[:3]:
        return "%H:%M"
    return "%m-%d %H:%M"


def _tick_label(ts: float, fmt: str) -> str:
    return time.strftime(fmt, time.gmtime(ts))


def _line_chart(lines: list[tuple[str, list[tuple[float, float]]]], w: int = 380, h: int = 150,
                limit: float | None = None, unit: str = "", zero: bool = False, floor: float | None = None) -> str:
    """Lines over time (one per GPU), with a dashed line climbing at `limit` per day from the first
    reading when the chart is a trend rule's. `zero`: the value axis starts at 0 (a bandwidth, whose
    size a cut axis would exaggerate); `floor`: a level the values must stay above, drawn across."""
    pts = [p for _, line in lines for p in line]
    if not pts:
        return "<p class=empty>no readings</p>"
    t0, t1 = min(t for t, _ in pts), max(t for t, _ in pts)
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if zero:
        lo = min(lo, 0.0)
    if floor is not None:
        lo, hi = min(lo, floor), max(hi, floor)
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
    if floor is not None:
        _, fy = xy(t0, floor).split(",")
        parts.append(f'<line class=floor x1="{left}" x2="{w - right}" y1="{fy}" y2="{fy}" stroke="#d03b3b" '
                     f'stroke-dasharray="4 3"><title>floor {floor:g}{_esc(unit)}</title></line>'
                     f'<text x="{w - right}" y="{float(fy) - 3:.1f}" text-anchor=end>floor {floor:g}</text>')
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


def _histogram(values: list[float], floor: float | None, w: int = 360, h: int = 130, bins: int = 16) -> str:
    """Nodes per bandwidth bin, from 0 GB/s (a cut axis makes 2% look like half), the floor drawn."""
    lo = min([0.0, *values])
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
