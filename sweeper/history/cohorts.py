"""The history's side of `sweeper cohorts`: every conclusive sweep of a window with the value of a
fact as the node had it then (sweeper.cohorts reads them into node-days). Facts are written when they
change (sweeper.history.recorder), so a sweep's value is its own run's fact, else the latest before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sweeper.history.base import Base
from sweeper.history.store import locked


class Cohorts(Base):
    @locked
    def cohort_rows(self, key: str, since: float, until: float | None = None) -> list[tuple[Any, ...]]:
        """(node, time, verdict, causes as JSON text, value of fact `key` or None), oldest first: each
        finished, non-dry-run node or pair sweep that started in [since, until) with the fact its run
        recorded, and (verdict None) each change of the fact recorded outside those sweeps, the ones
        before the window included, so that a node's value carries into it. Two queries, one pass.
        Across clusters (no scope) a node is `cluster/node`."""
        return self._cohort_rows((key,), since, until)[key]

    @locked
    def cohort_rows_by(self, keys: Sequence[str], since: float, until: float | None = None) -> dict[str, Any]:
        """cohort_rows for several facts, reading the sweeps once (the report's section)."""
        return self._cohort_rows(keys, since, until)

    @locked
    def cohort_tables(self, keys: Sequence[str], since: float,
                      until: float | None = None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """What cohort_rows merges, as stored, for sweeper.cohorts.node_days_by: the sweeps (node, started,
        verdict, causes as JSON text, id) in (started, id) order, and the changes of the facts `keys`
        (node, key, value, ts, and the started and id of each sweep of the window in the fact's run, or
        None twice) in time order, those before the window included. Two queries, whatever the number
        of facts; across clusters (no scope) a node is `cluster/node`."""
        p: dict[str, Any] = {"since": since, "until": until if until is not None else 1e18,
                             **{f"k{i}": k for i, k in enumerate(keys)}}
        window = ("s.started >= :since and s.started < :until and s.finished is not null and s.dry_run = 0 "
                  "and s.kind in ('sweep', 'pair')")
        sweeps = self._tuples(f"select s.cluster, s.node, s.started, s.verdict, s.causes, s.id from node_sweeps s "
                              f"where {window}{self._in('s.')} order by s.started, s.id", p)
        marks = ", ".join(f":k{i}" for i in range(len(keys))) or "null"
        facts = self._tuples(
            "select f.cluster, f.node, f.key, f.value, f.ts, s.started, s.id from facts f left join node_sweeps s "
            f"on s.cluster = f.cluster and s.node = f.node and s.run_id = f.run_id and {window} where f.key in "
            f"({marks}) and f.ts < :until{self._in('f.')} order by f.ts, f.cluster, f.node, f.run_id, f.key, "
            "s.started, s.id", p)
        name = self._cohort_name()
        return [(name(c, n), st, vd, cs, i) for c, n, st, vd, cs, i in sweeps], \
            [(name(c, n), k, v, ts, st, i) for c, n, k, v, ts, st, i in facts]

    def _cohort_name(self) -> Any:
        return (lambda c, n: n) if self.scope is not None else (lambda c, n: f"{c}/{n}" if c else n)

    def _cohort_read(self, keys: Sequence[str], since: float,
                     until: float | None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        p: dict[str, Any] = {"since": since, "until": until if until is not None else 1e18,
                             **{f"k{i}": k for i, k in enumerate(keys)}}
        sweeps = self._tuples(
            "select s.cluster, s.node, s.started, s.verdict, s.causes, s.run_id from node_sweeps s where s.started >= "
            ":since and s.started < :until and s.finished is not null and s.dry_run = 0 and s.kind in ('sweep', 'pair')"
            f"{self._in('s.')} order by s.started, s.id", p)
        marks = ", ".join(f":k{i}" for i in range(len(keys))) or "null"
        facts = self._tuples(f"select cluster, node, run_id, key, value, ts from facts where key in ({marks}) and "
                             f"ts < :until{self._in()} order by ts, cluster, node, run_id, key", p)  # ties: one order
        return sweeps, facts

    def _cohort_rows(self, keys: Sequence[str], since: float, until: float | None) -> dict[str, Any]:
        sweeps, facts = self._cohort_read(keys, since, until)
        name = self._cohort_name()
        runs = {(c, n, r) for c, n, _, _, _, r in sweeps}
        out: dict[str, Any] = {}
        for key in keys:
            mine = [(c, n, r, v, ts) for c, n, r, k, v, ts in facts if k == key]
            by_run = {(c, n, r): v for c, n, r, v, _ in mine}
            rows = [(name(c, n), st, vd, cs, by_run.get((c, n, r))) for c, n, st, vd, cs, r in sweeps]
            carry = [(name(c, n), ts, None, None, v) for c, n, r, v, ts in mine if (c, n, r) not in runs]
            out[key] = sorted(carry + rows, key=lambda row: row[1]) if carry else rows
        return out

    @locked
    def facts_recorded(self, keys: Sequence[str]) -> list[str]:
        """The facts of `keys` that any sweep recorded, in their order: one query for them all."""
        if not keys:
            return []
        found = {int(i) for (i,) in self._tuples(" union all ".join(
            f"select {i} as i where exists (select 1 from facts where key = :k{i}{self._in()})"
            for i in range(len(keys))), {f"k{i}": k for i, k in enumerate(keys)})}
        return [k for i, k in enumerate(keys) if i in found]

    @locked
    def fact_keys(self) -> list[str]:
        """Every fact key any sweep recorded (what `cohorts --by` may name beside its own names)."""
        return [str(k) for (k,) in self._tuples(f"select distinct key from facts where 1 = 1{self._in()} order by 1")]

    @locked
    def has_facts(self, key: str, since: float) -> bool:
        """Whether any fact `key` was recorded (the report skips a fact no sweep read)."""
        return self._scalar(f"select 1 from facts where key = :key{self._in()} limit 1", {"key": key}) is not None
