"""The report's section on failures by cohort: the cohorts that stand apart from the rest of the
fleet (driver, CUDA, VBIOS, DCGM, zone, rack), with the failing checks behind them, and each fact's
table. Cohort names are node labels and NVML strings, written by others: escaped, and capped."""

from __future__ import annotations

from typing import Any

from sweeper.report.svg import _esc

REPORT_BY = ("driver", "cuda", "vbios", "dcgm", "zone", "rack")
MAX_ROWS = 12


def gather_cohorts(history: Any, since: float) -> list[dict[str, Any]]:
    from sweeper.cohorts import cohort_report, node_days_by

    keys = history.facts_recorded(REPORT_BY)
    if not keys:
        return []
    sweeps, facts = history.cohort_tables(keys, since)
    days = node_days_by(sweeps, facts, keys, since)
    return [doc for key in keys if (doc := cohort_report(history, key, since, days=days[key]))["node_days"]]


def _pct(x: float) -> str:
    return f"{x:.2%}"


def _causes(c: dict[str, Any]) -> str:
    return ", ".join(f"{x['check']} ({x['node_days']})" for x in c["causes"]) or "none recorded"


def _p(c: dict[str, Any]) -> str:
    return f"{c['p_adjusted']:.2g}" if c["tested"] else "not tested"


def _value(c: dict[str, Any]) -> str:
    return _esc(str(c["value"])[:160])


def cohorts_section(docs: list[dict[str, Any]]) -> str:
    if not docs:
        return "<p class=empty>No sweep in the window recorded the nodes' facts.</p>"
    flagged = [(d["by"], c) for d in docs for c in d["cohorts"] if c["flagged"]]
    head = (f"<p class=note>{_esc(docs[0]['test'])}; {_esc(docs[0]['interval'])} "
            "(<code>sweeper cohorts --help</code>).</p>")
    if flagged:
        items = "".join(
            f"<li><b>{_esc(by)} {_value(c)}</b> stands apart: {_pct(c['rate'])} of its {c['node_days']} node-days "
            f"failed (95% CI {_pct(c['low'])}-{_pct(c['high'])}, Holm-adjusted p {_p(c)}); failing checks: "
            f"{_esc(_causes(c))}</li>" for by, c in flagged)
        head += f"<ul class=flagged>{items}</ul>"
    else:
        head += "<p class=empty>No cohort stands apart from the rest of the fleet.</p>"
    tables = []
    for d in docs:
        rows = "".join(
            f"<tr{' class=flagged' if c['flagged'] else ''}><td>{_value(c)}</td><td>{c['nodes']}</td>"
            f"<td>{c['node_days']}</td><td>{c['failures']}</td><td>{_pct(c['rate'])}</td>"
            f"<td>{_pct(c['low'])}-{_pct(c['high'])}</td><td>{_p(c)}</td></tr>" for c in d["cohorts"][:MAX_ROWS])
        more = f"<p class=note>{len(d['cohorts']) - MAX_ROWS} more cohorts.</p>" if len(d["cohorts"]) > MAX_ROWS else ""
        tables.append(f"<h3>by {_esc(d['by'])}</h3><table class=cohorts><thead><tr><th>cohort</th><th>nodes</th>"
                      "<th>node-days</th><th>failed</th><th>rate</th><th>95% CI</th><th>p (Holm)</th></tr></thead>"
                      f"<tbody>{rows}</tbody></table>{more}")
    return head + "".join(tables)
