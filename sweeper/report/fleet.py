"""The fleet page: every cluster a shared history holds, one row each (nodes, held, failures per
node-day, the last run, the trend), linking to each cluster's own report. Cluster names are input
(a config or $SWEEPER_CLUSTER wrote them): every one is escaped, in text and in links."""

from __future__ import annotations

import math
import re
from typing import Any

from sweeper.policy import HOLDING
from sweeper.report.page import _head
from sweeper.report.svg import _esc, _when

TREND_DAYS = 7  # the trend: failures per node-day over the last week against the week before


def page_name(stem: str, cluster: str, taken: set[str]) -> str:
    """The file of a cluster's page beside the fleet page: `<stem>-<cluster>.html`, the name reduced to
    letters, digits, '.', '_' and '-' (never a path), and made unique among `taken`."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", cluster).strip("._") or "cluster"
    name, n = f"{stem}-{safe}.html", 1
    while name in taken:
        n += 1
        name = f"{stem}-{safe}-{n}.html"
    taken.add(name)
    return name


def overview(history: Any, since: float, now: float) -> list[dict[str, Any]]:
    """Each cluster's row: the history's cluster_overview, with failures per node-day over the window
    and the trend (the last TREND_DAYS days' rate against the TREND_DAYS before)."""
    rows = history.cluster_overview(since, HOLDING)
    now = max([now] + [r["last_run"] or 0.0 for r in rows])  # a simulated clock may run ahead of this one
    for r in rows:
        start = max(since, r["first"] or now)
        days = max(1.0, (now - start) / 86400)
        nodes = max(1, r["nodes"])
        r["per_node_day"] = r["failures"] / (nodes * days)
        # the day that holds the moment just before `now` (days count from `since`): with a window of
        # whole days, `(now - since) // 86400` is the day that begins at `now`, always empty, which
        # left the spark line ending at 0 and the last week six days long
        today = max(0, math.ceil((now - since) / 86400) - 1)
        recent = sum(v for d, v in r["daily"].items() if today - d < TREND_DAYS)
        before = sum(v for d, v in r["daily"].items() if TREND_DAYS <= today - d < 2 * TREND_DAYS)
        if r["first"] is None or now - r["first"] < 2 * TREND_DAYS * 86400:
            r["trend"] = "new"  # less than two weeks of sweeps in the window: no week before to compare
        else:
            r["trend"] = "rising" if recent > before * 1.25 and recent - before >= 2 else \
                "falling" if before > recent * 1.25 and before - recent >= 2 else "steady"
        r["recent"], r["before"] = recent, before
        r["spark"] = [r["daily"].get(d, 0) for d in range(max(0, today - 2 * TREND_DAYS + 1), today + 1)]
    return rows


def _spark(values: list[int], w: int = 120, h: int = 24) -> str:
    """Daily failures as a small line (inline SVG: the page's CSP allows it)."""
    if len(values) < 2:
        return ""
    top = max(values) or 1
    pts = " ".join(f"{i * w / (len(values) - 1):.1f},{h - 2 - v * (h - 4) / top:.1f}" for i, v in enumerate(values))
    return (f"<svg class=spark width={w} height={h} viewBox='0 0 {w} {h}' role=img aria-label='daily failures'>"
            f"<polyline fill=none stroke='#d03b3b' stroke-width=1.5 points='{pts}'/></svg>")


def render_fleet(rows: list[dict[str, Any]], links: dict[str, str], generated: float, since: float,
                 title: str = "Sweeper: the fleet across clusters") -> str:
    """The fleet page. `links`: cluster -> the file of its page (relative, beside this one)."""
    body = "".join(
        f"<tr data-cluster=\"{_esc(r['cluster'])}\"><td>"
        + (f"<a href=\"{_esc(links[r['cluster']])}\">{_esc(r['cluster'])}</a>" if r["cluster"] in links
           else _esc(r["cluster"]))
        + f"</td><td>{r['nodes']}</td><td>{r['held']}</td><td>{r['failures']}</td>"
        f"<td>{r['per_node_day']:.4f}</td><td>{_when(r['last_run']) if r['last_run'] else 'never'}"
        f"{' (' + _esc(r['last_status']) + ')' if r['last_status'] else ''}</td>"
        f"<td class=trend data-trend=\"{r['trend']}\">{r['trend']} ({r['recent']} in {TREND_DAYS} d"
        + (f", {r['before']} the {TREND_DAYS} d before" if r["trend"] != "new" else ", under 2 weeks of sweeps")
        + f") {_spark(r['spark'])}</td></tr>" for r in rows)
    nodes, held = sum(r["nodes"] for r in rows), sum(r["held"] for r in rows)
    tiles = "".join(f"<div class=tile data-tile=\"{k}\"><b>{v}</b>{k}</div>"
                    for k, v in (("clusters", len(rows)), ("nodes", nodes), ("held", held)))
    span = _when(since) if since > 0 else "the start of the history"
    return (_head(title, 0) +
            f"<p class=note>generated {_when(generated)} UTC; failures (sweeps ending in "
            f"{', '.join(HOLDING)}) since {span}</p><div class=tiles>{tiles}</div>"
            "<h2>Clusters</h2><table class=fleet><thead><tr><th>cluster</th><th>nodes</th><th>held</th>"
            "<th>failures</th><th>failures per node-day</th><th>last run</th><th>trend</th></tr></thead>"
            f"<tbody>{body}</tbody></table>" +
            ("" if rows else "<p class=empty>no cluster has recorded a sweep in this history</p>") +
            "</body></html>\n")
