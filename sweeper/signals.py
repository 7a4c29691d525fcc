"""Outside signals that name suspect nodes: a Prometheus query (dcgm-exporter's XID metric)
and a Loki query for the driver's XID lines, as Konduktor does. Each is optional config;
an unreachable source is reported and skipped, never a reason to stop sweeping."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from sweeper.errors import ConfigError
from sweeper.parsers.kernel_log import parse_xids
from sweeper.xid import lookup

# dcgm-exporter's host label was `Hostname` until its PR #655 (May 2026) and is `hostname` since
# (NVIDIA/dcgm-exporter#655): the default query keeps both, and a series is read by whichever it has.
DEFAULT_PROMQL = "max by (Hostname, hostname) (DCGM_FI_DEV_XID_ERRORS) > 0"
HOST_LABELS = ("hostname", "Hostname")
DEFAULT_LOGQL = '{job="kernel"} |= "NVRM: Xid"'


@dataclass(frozen=True)
class Source:
    kind: str  # prometheus | loki
    url: str
    query: str
    node_label: str  # "" for Prometheus: dcgm-exporter's `hostname`, else its older `Hostname`
    window: float = 3600.0
    timeout: float = 10.0

    @classmethod
    def from_dict(cls, raw: Any) -> Source:
        if not isinstance(raw, dict) or raw.get("type") not in ("prometheus", "loki") or not raw.get("url"):
            raise ConfigError(f"suspect_sources: each needs type (prometheus or loki) and url, got {raw!r}")
        kind = raw["type"]
        return cls(kind=kind, url=str(raw["url"]).rstrip("/"),
                   query=str(raw.get("query") or (DEFAULT_PROMQL if kind == "prometheus" else DEFAULT_LOGQL)),
                   node_label=str(raw.get("node_label") or ("" if kind == "prometheus" else "node")),
                   window=float(raw.get("window", 3600)), timeout=float(raw.get("timeout", 10)))


def _get(url: str, params: dict[str, str], timeout: float) -> dict[str, Any]:
    full = url + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(full, timeout=timeout) as resp:  # noqa: S310 - an operator-configured URL
        doc = json.loads(resp.read().decode())
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ValueError(f"unexpected answer: {str(doc)[:200]}")
    return doc


def query(source: Source, now: float | None = None) -> dict[str, str]:
    """Node name to why the source names it."""
    now = time.time() if now is None else now
    out: dict[str, str] = {}
    if source.kind == "prometheus":
        doc = _get(f"{source.url}/api/v1/query", {"query": source.query}, source.timeout)
        for r in doc["data"]["result"]:
            metric = r.get("metric") or {}
            node = metric.get(source.node_label) if source.node_label else \
                next((metric[k] for k in HOST_LABELS if metric.get(k)), None)
            if node:
                value = (r.get("value") or [None, "?"])[1]
                out[node] = f"Prometheus: {source.query} = {value}"
        return out
    doc = _get(f"{source.url}/loki/api/v1/query_range",
               {"query": source.query, "start": str(int((now - source.window) * 1e9)), "end": str(int(now * 1e9)),
                "limit": "5000"}, source.timeout)
    for stream in doc["data"]["result"]:
        node = (stream.get("stream") or {}).get(source.node_label)
        if not node:
            continue
        events = parse_xids("\n".join(line for _, line in stream.get("values") or []))
        serious = sorted({e.code for e in events if lookup(e.code).action not in ("ignore", "restart_app")})
        if serious:
            out[node] = f"Loki: XID {', '.join(map(str, serious))} in the last {source.window / 3600:g}h"
    return out


def suspects(sources: list[Source], now: float | None = None) -> tuple[dict[str, str], list[str]]:
    """(node to reason, problems with sources that could not be read)."""
    found: dict[str, str] = {}
    problems: list[str] = []
    for s in sources:
        try:
            for node, why in query(s, now).items():
                found.setdefault(node, why)
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{s.kind} at {s.url}: {exc}")
    return found, problems
