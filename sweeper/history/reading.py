"""Reading one node's story (`sweeper history NODE`) and the policy's Past protocol: the sweeps,
pair results, metric series and peer readings a decision weighs."""

from __future__ import annotations

import json
from typing import Any

from sweeper.history.base import Base
from sweeper.history.store import locked
from sweeper.result import NODE_LOWEST, NODE_SETTINGS

HISTORY_TABLES = ("runs", "node_sweeps", "checks", "metrics", "actions", "intents", "summaries", "pairs")


def _names(prefix: str, values: list[str]) -> tuple[str, dict[str, Any]]:
    """`:p0, :p1, ...` and their values, for an IN list."""
    return ", ".join(f":{prefix}{i}" for i in range(len(values))) or "null", \
        {f"{prefix}{i}": v for i, v in enumerate(values)}


class Reading(Base):
    @locked
    def node_history(self, node: str, since: float | None = None, limit: int = 50,
                     check: str = "") -> dict[str, Any]:
        """`check`: only findings and metrics whose name starts with it (e.g. `ecc`, `nvlink`)."""
        p: dict[str, Any] = {"node": node, "since": since or 0.0, "limit": limit, "check": check + "%"}
        sweeps = self._rows(f"select * from node_sweeps where node = :node and started >= :since{self._in()} "
                            "order by started desc limit :limit", p)
        ids, idp = _names("sw", [s["id"] for s in sweeps])
        problems: dict[int, list[dict[str, Any]]] = {}
        for r in self._rows(  # one query for every sweep's findings: one round trip, not one a sweep
                "select sweep_id, source, name, status, severity, gpu, code, message from checks where sweep_id in "
                f"({ids}) and status in ('fail', 'error', 'warn') and name like :check order by id", {**p, **idp}):
            problems.setdefault(r.pop("sweep_id"), []).append(r)
        for s in sweeps:
            s["reasons"] = json.loads(s["reasons"] or "[]")
            s["rules"] = json.loads(s.get("rules") or "[]")
            s["causes"] = json.loads(s.get("causes") or "[]")
            s["problems"] = problems.get(s["id"], [])
        actions = self._rows("select run_id, ts, action, detail, dry_run from actions where node = :node "
                             f"and ts >= :since{self._in()} order by ts desc limit :limit", p)
        metrics: dict[str, list[tuple[float, float]]] = {}
        lowest, lp = _names("low", sorted(NODE_LOWEST))
        settings, sp = _names("set", sorted(NODE_SETTINGS))
        for r in self._rows(
                f"select name, ts, case when name in ({lowest}) then min(value) when max(unit) = 'C' "
                "then max(value) else sum(value) end as value from metrics where node = :node and ts >= :since "
                f"and name like :check and name not in ({settings}){self._in()} group by name, ts order by ts",
                {**p, **lp, **sp}):
            metrics.setdefault(r["name"], []).append((r["ts"], r["value"]))
        summaries = self._rows(f"select day, sweeps, verdicts from summaries where node = :node{self._in()} "
                               "order by day", p)
        pairs = self._rows(
            "select ts, run_id, partner, mode, role, busbw, status, detail from ("
            "select id, ts, run_id, partner, mode, 'node' as role, busbw, status, detail from pairs "
            f"where node = :node and ts >= :since{self._in()} union all "
            "select id, ts, run_id, node, mode, 'partner', busbw, status, detail from pairs "
            f"where partner = :node and ts >= :since{self._in()}) as u order by ts desc, id desc limit :limit", p)
        claims = self._rows("select ts, run_id, source, code, kind, test, outcome, evidence from claims "
                            f"where node = :node and ts >= :since{self._in()} order by ts desc, id desc limit :limit", p)
        return {"node": node, "sweeps": sweeps, "actions": actions, "metrics": metrics, "pruned_days": summaries,
                "pairs": pairs, "claims": claims}

    @locked
    def knows(self, node: str) -> bool:
        """Whether anything was ever recorded of the node (a sweep, an action, a pruned day's summary)."""
        return any(self._rows(f"select 1 from {table} where node = :node{self._in()} limit 1", {"node": node})
                   for table in ("node_sweeps", "actions", "summaries"))

    @locked
    def node_names(self) -> list[str]:
        """Every node anything was recorded of (a sweep, an ingested result, an action, a pruned day)."""
        return [str(n) for (n,) in self._tuples(" union ".join(
            f"select node from {t} where 1 = 1{self._in()}" for t in ("node_sweeps", "actions", "summaries"))
            + " order by 1")]

    @locked
    def node_clusters(self, node: str) -> list[str]:
        """The clusters read that recorded something of a node by this name (names repeat across
        clusters: each is its own node)."""
        return [c for (c,) in self._tuples(" union ".join(
            f"select cluster from {t} where node = :node{self._in()}" for t in ("node_sweeps", "actions", "summaries"))
            + " order by 1", {"node": node})]

    @locked
    def counts(self) -> dict[str, int]:
        return {t: int(self._scalar(f"select count(*) from {t} where 1 = 1{self._in()}")) for t in HISTORY_TABLES}

    # -- the Past protocol of the policy ---------------------------------------------------
    @locked
    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        rows = self._rows(
            "select started, verdict, causes from node_sweeps where node = :node and started >= :since "
            "and started <= :until and finished is not null and dry_run = 0 and kind in ('sweep', 'pair') "
            f"and verdict not in ('inconclusive', 'error'){self._in()} order by started",
            {"node": node, "since": since, "until": until})
        return [{"started": r["started"], "verdict": r["verdict"], "causes": json.loads(r["causes"] or "[]")}
                for r in rows]

    @locked
    def pair_results(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        """The node's pair results from either side, oldest first: ts, run_id, partner (the other
        node), status, mode, busbw, detail, role (node: it was A or the suspect; partner: it was B
        or the known-good partner) and sweep_id (its own sweep row of that pair run)."""
        return self._rows(
            "select ts, run_id, partner, status, mode, busbw, detail, role, sweep_id from ("
            "select id, ts, run_id, partner, status, mode, busbw, detail, 'node' as role, node_sweep_id as sweep_id "
            f"from pairs where node = :node and ts >= :since and ts <= :until{self._in()} union all "
            "select id, ts, run_id, node, status, mode, busbw, detail, 'partner', partner_sweep_id "
            f"from pairs where partner = :node and ts >= :since and ts <= :until{self._in()}) as u order by ts, id",
            {"node": node, "since": since, "until": until})

    @locked
    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]:
        return [(r[0], r[1], r[2]) for r in self._tuples(
            "select ts, gpu, value from metrics where node = :node and name = :metric and ts >= :since "
            f"and ts <= :until{self._in()} order by ts",
            {"node": node, "metric": metric, "since": since, "until": until})]

    @locked
    def peer_values(self, profile: str, metric: str, since: float, until: float, exclude: str) -> dict[str, float]:
        """Each other node of the profile: its latest reading of the metric in the window (the
        lowest GPU where the metric is per GPU)."""
        latest: dict[str, float] = {}
        for node, _ts, value in self._tuples(
                "select m.node, m.ts, min(m.value) from metrics m join node_sweeps s on s.id = m.sweep_id "
                "where m.name = :metric and m.ts >= :since and m.ts <= :until and s.profile = :profile "
                f"and m.node != :exclude{self._in('m.')} group by m.node, m.ts order by m.ts",
                {"metric": metric, "since": since, "until": until, "profile": profile, "exclude": exclude}):
            latest[node] = value
        return latest

    @locked
    def sweep_documents(self, sweep_id: int) -> list[dict[str, Any]]:
        """A sweep's recorded results, one document per source, as the policy reads them."""
        docs: dict[str, dict[str, Any]] = {}
        for r in self._rows("select source, name, status, severity, gpu, code, message from checks "
                            "where sweep_id = :id order by id", {"id": sweep_id}):
            d = docs.setdefault(r["source"], {"source": r["source"], "checks": [], "metrics": []})
            d["checks"].append({k: r[k] for k in ("name", "status", "severity", "gpu", "code", "message")})
        for r in self._rows("select name, gpu, value, unit from metrics where sweep_id = :id order by id",
                            {"id": sweep_id}):
            if docs:
                next(iter(docs.values()))["metrics"].append(dict(r))
        return list(docs.values())

    @locked
    def dismissals(self) -> list[dict[str, Any]]:
        """Each time a person released a node Sweeper held, oldest first: the node, when Sweeper
        noticed, and the failed checks of the sweep that held it (the findings that node's decisions
        ignore from then on, until the next dismissal)."""
        out = []
        for a in self._rows(f"select node, ts from actions where action = 'false-positive' and dry_run = 0"
                            f"{self._in()} order by ts"):
            held = self._rows(
                "select id from node_sweeps where node = :node and finished is not null and finished <= :ts "
                f"and dry_run = 0 and kind in ('sweep', 'pair'){self._in()} order by finished desc limit 1", a)
            findings = self._rows("select name, code, gpu from checks where sweep_id = :id and status = 'fail'",
                                  held[0]) if held else []
            out.append({"node": a["node"], "ts": a["ts"], "findings": findings})
        # Dismissals made by a sweeper with another history, seen in the cluster by a run of this one.
        for a in self._rows("select node, ts, detail from actions where action = 'control-seen' and dry_run = 0 "
                            f"and detail like 'dismissed.%'{self._in()} order by ts"):
            try:
                seen = json.loads(a["detail"].split(": ", 1)[1])
            except (IndexError, ValueError):
                continue  # 'cleared', or cut short
            out.append({"node": a["node"], "ts": float(seen.get("at", a["ts"])), "findings": [],
                        "keys": list(seen.get("keys") or [])})
        out.sort(key=lambda d: d["ts"])
        return out

    @locked
    def replaced(self) -> dict[str, float]:
        """Node to when Sweeper saw its replacement through (the provider took it away)."""
        return dict(self._tuples("select node, max(ts) from actions where action = 'replaced' and dry_run = 0"
                                 f"{self._in()} group by node"))
