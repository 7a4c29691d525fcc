"""Reading the fleet: every node's latest verdict, the verdicts over time, pair runs, metric
trends and the rows a backtest replays, for the report and `sweeper backtest`."""

from __future__ import annotations

import json
from typing import Any

from sweeper.history.base import Base
from sweeper.history.schema import CONCLUSIVE_PAIRS, CONCLUSIVE_SWEEP
from sweeper.history.store import locked

CONCLUSIVE = CONCLUSIVE_SWEEP


class Fleet(Base):
    @locked
    def fleet(self) -> list[dict[str, Any]]:
        """Every node's latest conclusive sweep: id, node, cluster, run_id, profile, started, finished,
        verdict, reasons, rules, kind, and `swept` (the start of its latest full sweep, or None). Read from
        node_latest, which the Recorder keeps as sweeps finish: one row a node, not every sweep."""
        rows = self._rows("select sweep_id as id, node, cluster, run_id, profile, started, finished, verdict, reasons, "
                          f"rules, kind, swept from node_latest where 1 = 1{self._in()} order by node, cluster")
        for r in rows:
            r["reasons"] = json.loads(r["reasons"] or "[]")
            r["rules"] = json.loads(r.get("rules") or "[]")
        return rows

    @locked
    def cluster_overview(self, since: float, failing: tuple[str, ...]) -> list[dict[str, Any]]:
        """One row per cluster in the store, whatever this view reads (the fleet page): cluster,
        nodes (with a conclusive sweep), held (whose latest conclusive verdict is in `failing`),
        failures (conclusive sweeps since `since` with a verdict in `failing`), first (its first
        conclusive failing sweep or run since `since`), daily (day since `since` -> failures), last_run and
        last_status (its latest run)."""
        verdicts = ", ".join(f":v{i}" for i in range(len(failing))) or "null"
        p: dict[str, Any] = {"since": since, **{f"v{i}": v for i, v in enumerate(failing)}}
        out: dict[str, dict[str, Any]] = {}
        for cluster, nodes, held in self._tuples(
                f"select cluster, count(*), sum(case when verdict in ({verdicts}) then 1 else 0 end) from node_latest "
                "group by cluster", p):
            out[cluster] = {"cluster": cluster, "nodes": int(nodes), "held": int(held or 0), "failures": 0,
                            "first": None, "daily": {}, "last_run": None, "last_status": None}
        # the failing sweeps alone, through the (verdict, finished) index: a fleet's passes are never read.
        # The day is floored on both backends: PostgreSQL's cast of a float to integer rounds, so a
        # failure in the second half of a day fell into the next (SQLite's truncates).
        day_of = "floor((started - :since) / 86400)" if self.backend == "postgresql" else \
            "cast((started - :since) / 86400 as integer)"
        for cluster, day, failures, first in self._tuples(
                f"select cluster, {day_of} as day, count(*), min(started) "
                f"from node_sweeps where verdict in ({verdicts}) and finished >= :since and started >= :since "
                f"and {CONCLUSIVE} group by cluster, day", p):
            row = out.get(cluster)
            if row is not None:
                row["failures"] += int(failures)
                row["daily"][int(day)] = int(failures)
                row["first"] = first if row["first"] is None else min(row["first"], first)
        # where the window starts for each cluster: its first run in it (runs are few)
        for cluster, first in self._tuples("select cluster, min(started) from runs where started >= :since "
                                           "group by cluster", p):
            row = out.get(cluster)
            if row is not None:
                row["first"] = first if row["first"] is None else min(row["first"], first)
        for cluster, started, status in self._tuples(
                "select r.cluster, r.started, r.status from runs r join (select cluster, max(started) as last "
                "from runs group by cluster) l on r.cluster = l.cluster and r.started = l.last"):
            if cluster in out:
                out[cluster].update(last_run=started, last_status=status)
        return [out[c] for c in sorted(out)]

    @locked
    def verdict_matrix(self, since: float) -> dict[str, list[tuple[float, str]]]:
        """Node to its conclusive sweeps since `since`: (started, verdict), oldest first."""
        out: dict[str, list[tuple[float, str]]] = {}
        for node, started, verdict in self._tuples(
                f"select node, started, verdict from node_sweeps where started >= :since and {CONCLUSIVE}"
                f"{self._in()} order by started", {"since": since}):
            out.setdefault(node, []).append((started, verdict))
        return out

    @locked
    def sweep_timeline(self, since: float) -> list[dict[str, Any]]:
        """Every conclusive sweep since `since`, oldest first: node, started, verdict, reasons (as JSON
        text: a fleet's worth is read only for the rows drawn), rules, kind."""
        rows = self._rows(f"select node, started, verdict, reasons, rules, kind from node_sweeps where started >= "
                          f":since and {CONCLUSIVE}{self._in()} order by started", {"since": since})
        for r in rows:
            r["rules"] = json.loads(r["rules"]) if r["rules"] and r["rules"] != "[]" else []
        return rows

    @locked
    def pair_overview(self, since: float, limit: int = 200) -> dict[str, Any]:
        """The fleet's pair runs since `since`, for the report: counts by mode and status; the
        latest failed pairs (with each side's profile); the culprits (suspects whose re-pair
        failed, with the verdict they were held with); and each node that failed pairs, with how
        many different partners (a failed re-pair counts against its suspect only)."""
        counts: dict[str, dict[str, int]] = {}
        p: dict[str, Any] = {"since": since, "limit": limit}
        for status in (*CONCLUSIVE_PAIRS, "error", "inconclusive"):  # one index range each
            for mode in ("sweep", "repair"):
                n = self._scalar(f"select count(*) from pairs where status = :status and mode = :mode and ts >= :since"
                                 f"{self._in()}", {**p, "status": status, "mode": mode})
                if n:
                    counts.setdefault(mode, {})[status] = int(n)
        failures = self._rows(
            "select p.ts, p.run_id, p.node, p.partner, p.mode, p.busbw, p.status, p.detail, s.profile "
            "from pairs p left join node_sweeps s on s.id = p.node_sweep_id "
            f"where p.status = 'fail' and p.mode in ('sweep', 'repair') and p.ts >= :since{self._in('p.')} "
            "order by p.ts desc, p.id desc limit :limit", p)
        latest: dict[str, dict[str, Any]] = {}  # the failed re-pairs are few: the latest per node in Python
        for c in self._rows("select p.node, p.ts, p.partner, p.busbw, p.detail, s.verdict, s.rules from pairs p "
                            "left join node_sweeps s on s.id = p.node_sweep_id where p.status = 'fail' "
                            f"and p.mode = 'repair' and p.ts >= :since{self._in('p.')} order by p.ts, p.id", p):
            latest[c["node"]] = c
        culprits = sorted(latest.values(), key=lambda c: -c["ts"])
        for c in culprits:
            c["rules"] = json.loads(c["rules"] or "[]")
        partners = {n: int(k) for n, k in self._tuples(
            "select n, count(distinct other) from (select node as n, partner as other from pairs where status = 'fail' "
            f"and mode in ('sweep', 'repair') and ts >= :since{self._in()} union all select partner, node from pairs "
            f"where status = 'fail' and mode = 'sweep' and ts >= :since{self._in()}) as u group by n", p)}
        return {"counts": counts, "failures": failures, "culprits": culprits, "failed_partners": partners}

    @locked
    def metric_slopes(self, metric: str, since: float, until: float) -> list[tuple[str, int | None, int, float]]:
        """(node, GPU, readings, least-squares slope per day) of a metric in the window, for every
        node and GPU with two readings or more, computed in the database (a fleet's worth of rows
        never reaches Python). Time is in days from `since`, which keeps the sums well conditioned."""
        rows = self._tuples(
            "select node, gpu, count(*), sum(x), sum(v), sum(x * x), sum(x * v) from (select node, gpu, "
            "(ts - :since) / 86400.0 as x, value as v from metrics where name = :metric and ts >= :since "
            f"and ts <= :until{self._in()}) as w group by node, gpu having count(*) >= 2",
            {"metric": metric, "since": since, "until": until})
        out = []
        for node, gpu, n, sx, sv, sxx, sxv in rows:
            den = n * sxx - sx * sx
            out.append((node, gpu, int(n), (n * sxv - sx * sv) / den if den > 1e-12 else 0.0))
        return out

    @locked
    def metric_latest(self, metric: str, since: float) -> list[dict[str, Any]]:
        """Each node's latest reading of a metric (lowest over GPUs), with its profile."""
        latest: dict[str, dict[str, Any]] = {}
        for node, profile, ts, value in self._tuples(
                "select m.node, max(s.profile), m.ts, min(m.value) from metrics m join node_sweeps s "
                f"on s.id = m.sweep_id where m.name = :metric and m.ts >= :since{self._in('m.')} "
                "group by m.node, m.ts order by m.ts", {"metric": metric, "since": since}):
            latest[node] = {"node": node, "profile": profile, "ts": ts, "value": value}
        return list(latest.values())

    @locked
    def replay_rows(self, since: float) -> list[dict[str, Any]]:
        """Every conclusive sweep since `since` with what its policy decided on, oldest first. A
        sweep of a pair carries its pair: pair_status, pair_mode, pair_role, pair_partner, pair_ts
        (None elsewhere); the inconclusive sweeps of a pair that failed (waiting for a re-pair) are
        there too, as a stricter pair rule would have decided them."""
        rows = self._rows(
            "select s.id, s.node, s.cluster, s.profile, s.started, s.finished, s.decided, s.verdict, "
            "s.policy_verdict, s.reasons, s.causes, s.rules, s.policy, s.kind, "
            "coalesce(a.status, b.status) as pair_status, coalesce(a.mode, b.mode) as pair_mode, "
            "case when a.id is not null then 'node' when b.id is not null then 'partner' end as pair_role, "
            "coalesce(a.partner, b.node) as pair_partner, coalesce(a.ts, b.ts) as pair_ts from node_sweeps s "
            "left join pairs a on s.kind = 'pair' and a.node_sweep_id = s.id "
            "left join pairs b on s.kind = 'pair' and a.id is null and b.partner_sweep_id = s.id "
            "where s.started >= :since and s.finished is not null and s.dry_run = 0 "
            f"and s.kind in ('sweep', 'light', 'pair'){self._in('s.')} and (s.verdict != 'inconclusive' "
            "or (coalesce(a.status, b.status) = 'fail' and coalesce(a.mode, b.mode) = 'sweep')) "
            "order by s.started, s.id", {"since": since})
        for r in rows:
            for k in ("reasons", "causes", "rules"):
                r[k] = json.loads(r[k] or "[]")
        return rows
