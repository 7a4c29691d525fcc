"""The history's side of `sweeper cohorts`: every conclusive sweep of a window with the fact its run
recorded for the node under one key (sweeper.cohorts reads them into node-days)."""

from __future__ import annotations

from typing import Any

from sweeper.history.base import Base
from sweeper.history.store import locked


class Cohorts(Base):
    @locked
    def cohort_rows(self, key: str, since: float, until: float | None = None) -> list[tuple[Any, ...]]:
        """(node, started, verdict, causes as JSON text, value of fact `key` or None) for every finished,
        non-dry-run node or pair sweep that started in [since, until), oldest first, and the sweeps of the
        week before `since` (so that a node's fact carries into the window). One query, one index range."""
        p = {"key": key, "since": since - 7 * 86400.0, "until": until if until is not None else 1e18}
        return self._tuples(
            "select s.node, s.started, s.verdict, s.causes, f.value from node_sweeps s left join facts f on "
            "f.cluster = s.cluster and f.node = s.node and f.run_id = s.run_id and f.key = :key "
            "where s.started >= :since and s.started < :until and s.finished is not null and s.dry_run = 0 "
            f"and s.kind in ('sweep', 'pair'){self._in('s.')} order by s.started, s.id", p)
