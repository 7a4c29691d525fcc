"""`sweeper state prune`: old rows go, one summary a node a day stays."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from sweeper.errors import StateError
from sweeper.history.base import Base
from sweeper.history.store import _reason, locked

OLD = "started < :before and finished is not null"


class Retention(Base):
    def prune(self, before: float, dry_run: bool = False) -> dict[str, int]:
        """Delete sweeps (with their checks and metrics), pair results, actions, intents, closed idle
        spells and runs older than `before`, keeping one summary row a node a day: sweeps, verdict
        counts, and per metric the min, max and last value. A SQLite file is vacuumed after (PostgreSQL's autovacuum
        reclaims the space there)."""
        counts = self._prune(before, dry_run)
        if counts["node_sweeps"] and not dry_run and self.backend == "sqlite":
            try:
                with self._link.lock:
                    self._conn.exec_driver_sql("vacuum")
                    self._conn.commit()
            except SQLAlchemyError as exc:
                raise StateError(f"history {self._link.where}: {_reason(exc)}") from exc
        return counts

    @locked
    def _prune(self, before: float, dry_run: bool) -> dict[str, int]:
        p, c = {"before": before}, self._in()
        old = [r[0] for r in self._tuples(f"select id from node_sweeps where {OLD}{c}", p)]
        counts = {"node_sweeps": len(old), "pairs": int(self._scalar(f"select count(*) from pairs where ts < :before{c}",
                                                                     p))}
        if not old:
            return {**counts, "checks": 0, "metrics": 0, "summaries": 0}
        marks = f"select id from node_sweeps where {OLD}{c}"
        counts["checks"] = int(self._scalar(f"select count(*) from checks where sweep_id in ({marks})", p))
        counts["metrics"] = int(self._scalar(f"select count(*) from metrics where sweep_id in ({marks})", p))
        summaries: dict[tuple[str, str, str], dict[str, Any]] = {}
        for cluster, node, started, verdict in self._tuples(
                f"select cluster, node, started, verdict from node_sweeps where {OLD}{c}", p):
            day = time.strftime("%Y-%m-%d", time.gmtime(started))
            s = summaries.setdefault((cluster, node, day), {"sweeps": 0, "verdicts": {}, "metrics": {}})
            s["sweeps"] += 1
            s["verdicts"][verdict] = s["verdicts"].get(verdict, 0) + 1
        for cluster, node, ts, name, value in self._tuples(
                f"select cluster, node, ts, name, value from metrics where sweep_id in ({marks}) order by ts", p):
            day = time.strftime("%Y-%m-%d", time.gmtime(ts))
            s = summaries.setdefault((cluster, node, day), {"sweeps": 0, "verdicts": {}, "metrics": {}})
            m = s["metrics"].setdefault(name, {"min": value, "max": value, "last": value})
            m["min"], m["max"], m["last"] = min(m["min"], value), max(m["max"], value), value
        counts["summaries"] = len(summaries)
        if dry_run:
            return counts
        for (cluster, node, day), s in summaries.items():
            key = {"c": cluster, "node": node, "day": day}
            prior = self._rows("select * from summaries where cluster = :c and node = :node and day = :day", key)
            if prior:  # merge with what an earlier prune kept of the same day
                pr = prior[0]
                s["sweeps"] += pr["sweeps"]
                for v, n in json.loads(pr["verdicts"]).items():
                    s["verdicts"][v] = s["verdicts"].get(v, 0) + n
                for name, m in json.loads(pr["metrics"]).items():
                    cur = s["metrics"].setdefault(name, m)
                    cur["min"], cur["max"] = min(cur["min"], m["min"]), max(cur["max"], m["max"])
            self._run("insert into summaries (cluster, node, day, sweeps, verdicts, metrics) values (:c, :node, :day, "
                      ":sweeps, :verdicts, :metrics) on conflict (cluster, node, day) do update set "
                      "sweeps = excluded.sweeps, verdicts = excluded.verdicts, metrics = excluded.metrics",
                      {**key, "sweeps": s["sweeps"], "verdicts": json.dumps(s["verdicts"]),
                       "metrics": json.dumps(s["metrics"])})
        self._run(f"delete from checks where sweep_id in ({marks})", p)
        self._run(f"delete from metrics where sweep_id in ({marks})", p)
        self._run(f"delete from node_sweeps where {OLD}{c}", p)
        # node_latest as the sweeps left leave it: a node whose latest sweep went has none left; one whose
        # latest full sweep went has no full sweep left
        self._run(f"delete from node_latest where started < :before{c}", p)
        self._run(f"update node_latest set swept = null where swept < :before{c}", p)
        for table in ("actions", "pairs", "pair_latest", "intents", "claims", "evidence"):
            self._run(f"delete from {table} where ts < :before{c}", p)
        self._run(f"delete from idle_spells where ended is not null and ended < :before{c}", p)
        # A fact is written when it changes: the value a node had at `before` is kept, its older ones go.
        self._run("delete from facts where ts < :before and exists (select 1 from facts g where g.cluster = "
                  "facts.cluster and g.node = facts.node and g.key = facts.key and g.ts > facts.ts and "
                  f"g.ts < :before){c}", p)
        self._run(f"delete from runs where finished is not null and finished < :before{c} and id not in "
                  "(select distinct run_id from node_sweeps where run_id is not null)", p)
        return counts
