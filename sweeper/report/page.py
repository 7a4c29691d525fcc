"""The whole HTML page: a page per node, the head with its Content-Security-Policy, and the
fleet report put together."""

from __future__ import annotations

from typing import Any

from sweeper.report.claims import claims_section
from sweeper.report.cohorts import cohorts_section
from sweeper.report.data import (
    BANDWIDTH,
    ReportData,
    coverage,
    coverage_by_profile,
    coverage_window,
    node_states,
)
from sweeper.report.sections import (
    _bandwidth,
    _coverage,
    _gbps,
    _held,
    _left,
    _legend,
    _mode,
    _pairs,
    _timeline,
    _trends,
)
from sweeper.report.svg import (
    COLORS,
    GPU_COLORS,
    STATE_COLORS,
    _esc,
    _gpu_order,
    _line_chart,
    _node_link,
    _when,
    anchor,
)

# The page has no script and fetches nothing: a browser runs none, whatever a field of the history holds.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


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
    # One line a partner: a line joining two partners' runs would draw a drop (or a rise) that is
    # only a change of partner.
    by_partner: dict[str, list[tuple[float, float]]] = {}
    for p in sorted((p for p in pairs if p["busbw"] is not None), key=lambda p: p["ts"]):
        by_partner.setdefault(str(p["partner"]), []).append((p["ts"], p["busbw"]))
    if sum(map(len, by_partner.values())) > 1:
        lines = list(by_partner.items())
        key = _key([name for name, _ in lines])
        out += ("<figure class=pair-busbw><figcaption>pair bus bandwidth, GB/s, with each partner</figcaption>"
                f"{_line_chart(lines, unit=' GB/s', zero=True)}<div class=legend>{key}</div></figure>")
    return out


def _key(names: list[str]) -> str:
    """A chart's legend: each line's colour (in _line_chart's order) and name."""
    return "".join(f'<span><i style="background:{GPU_COLORS[i % len(GPU_COLORS)]}"></i>{_esc(name)}</span>'
                   for i, name in enumerate(names))


def _bandwidth_chart(lines: list[tuple[str, list[tuple[float, float]]]], page: dict[str, Any]) -> str:
    """A node's NCCL bus bandwidth from 0 GB/s, with its profile's floor drawn where one is set."""
    return _line_chart(lines, unit=" GB/s", zero=True, floor=page.get("floor"))


def _node_page(page: dict[str, Any], pages: set[str] | frozenset[str] = frozenset()) -> str:
    h = page["history"]
    node = page["node"]
    parts = [f"<section class=node id=\"{anchor(node)}\"><h3>{_esc(node)} "
             f"<span class=state style='background:{STATE_COLORS.get(page['state'], '#888')}'>{_esc(page['state'])}"
             f"</span> <span class=note>{_esc(page['profile'])}</span> <a class=top href=\"#top\">top</a></h3>",
             f"<p class=note>from the command line: <code>sweeper history {_esc(node)}</code></p>"]
    last = page.get("last")
    if last is not None:  # the latest conclusive sweep, as the held table and `sweeper nodes` name it
        rules = ", ".join(last.get("rules") or []) or ("findings" if last["verdict"] not in ("pass", None) else "")
        why = "; ".join(last.get("reasons") or [])[:400] if last["verdict"] != "pass" else ""
        parts.append(f"<p class=latest data-rule=\"{_esc(rules)}\">latest: <b style='color:"
                     f"{COLORS.get(last['verdict'] or '', '#999')}'>{_esc(last['verdict'])}</b> "
                     f"{_when(last['started'])} UTC" + (f", rule <b>{_esc(rules)}</b>" if rules else "")
                     + (f": {_esc(why)}" if why else "") + "</p>")
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
            key = _key([name for name, _ in lines]) if len(lines) > 1 else ""
            charts.append(f"<figure class=metric data-metric=\"{_esc(s['metric'])}\"><figcaption>{_esc(s['metric'])}"
                          f" per GPU</figcaption>{_bandwidth_chart(lines, page) if s['metric'] == BANDWIDTH else _line_chart(lines)}"
                          f"<div class=legend>{key}</div></figure>")
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
        ("busy: light checks only", sum(r["busy"] for r in coverage_by_profile(data))),
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
            f"<h2>Other tools' claims, tested</h2>{claims_section(data.claims, data.claim_docs)}"
            f"<h2>Failures by cohort</h2>{cohorts_section(data.cohorts)}"
            f"<h2>Nodes</h2>{more}" + "".join(_node_page(p, pages) for p in data.pages) +
            "</body></html>\n")


def render_node(data: ReportData, title: str = "") -> str:
    """One node's page alone (`sweeper report --node NODE`)."""
    page = data.pages[0]
    return (_head(title or f"Sweeper: {page['node']}", 0) +
            f"<p class=note>generated {_when(data.generated)} UTC</p>" + _node_page(page) + "</body></html>\n")
