"""The report's section on other tools' claims: per source, and per code within it, how many of
its conditions and taints Sweeper's checks confirmed, refuted, or could not settle, and the
source's precision (confirmed / (confirmed + refuted)). Every value is escaped: a source's code is
whatever its condition or taint said."""

from __future__ import annotations

from typing import Any

from sweeper.claims import precision
from sweeper.report.svg import _esc, _when

OUTCOMES = ("confirmed", "refuted", "inconclusive")


def by_source(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-code rows (history.claim_precision) summed per source, with each source's precision."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["source"], {"source": r["source"], "codes": [], "last": 0.0,
                                         **dict.fromkeys(OUTCOMES, 0)})
        s["codes"].append(r)
        s["last"] = max(s["last"], r.get("last") or 0.0)
        for k in OUTCOMES:
            s[k] += int(r.get(k) or 0)
    for s in out.values():
        s["precision"] = precision(s)
    return [out[k] for k in sorted(out)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def claims_section(rows: list[dict[str, Any]], docs: dict[str, str] | None = None) -> str:
    """The table: one row per source (its precision), then one per code it claimed."""
    if not rows:
        return "<p class=empty>No other tool's claim was tested in this window.</p>"
    docs = docs or {}
    body = []
    for s in by_source(rows):
        doc = docs.get(s["source"], "")
        name = (f'<a href="{_esc(doc)}">{_esc(s["source"])}</a>' if doc.startswith("https://")
                else _esc(s["source"]))
        body.append(f"<tr class=source data-source=\"{_esc(s['source'])}\"><td><b>{name}</b></td><td>all</td>"
                    + "".join(f"<td>{s[k]}</td>" for k in OUTCOMES)
                    + f"<td><b>{_pct(s['precision'])}</b></td><td>{_when(s['last'])}</td></tr>")
        body += [f"<tr data-code=\"{_esc(c['code'])}\"><td></td><td><code>{_esc(c['code'])}</code></td>"
                 + "".join(f"<td>{int(c.get(k) or 0)}</td>" for k in OUTCOMES)
                 + f"<td>{_pct(precision(c))}</td><td>{_when(c.get('last'))}</td></tr>" for c in s["codes"]]
    return ("<p class=note>Conditions and taints other tools set, tested by Sweeper's own checks when the node "
            "was idle. Precision: confirmed / (confirmed + refuted); an inconclusive test (the check could not "
            "run) counts for neither. A refuted claim is recorded, never cleared: its owner keeps it.</p>"
            "<table class=claims><tr><th>source</th><th>claim</th><th>confirmed</th><th>refuted</th>"
            "<th>inconclusive</th><th>precision</th><th>last tested</th></tr>" + "".join(body) + "</table>")
