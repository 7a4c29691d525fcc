"""When GPU nodes were idle: one row a spell, opened when a discovery first sees the node idle and
closed when one sees it busy; and when each node last had each depth of test. What the idle-window
estimate and the depth ladder read (sweeper.window)."""

from __future__ import annotations

from collections.abc import Mapping

from sweeper.history.base import Base
from sweeper.history.store import locked


class Idle(Base):
    @locked
    def idle_seen(self, ts: float, seen: Mapping[str, tuple[str, bool]]) -> None:
        """What one discovery saw: node -> (its pool, idle). A node seen idle with no open spell opens
        one; a node seen busy closes its open spell. Nodes not named (held, cordoned, not Ready)
        leave their spell as it is."""
        open_ = {r[0]: r[1] for r in self._tuples(
            f"select node, id from idle_spells where ended is null{self._in()}")}
        self._insert_many("idle_spells", [{"node": n, "pool": pool, "started": ts, "ended": None}
                                          for n, (pool, idle) in sorted(seen.items()) if idle and n not in open_])
        for n, (_, idle) in seen.items():
            if not idle and n in open_:
                self._run("update idle_spells set ended = :ts where id = :id", {"ts": ts, "id": open_[n]})

    @locked
    def idle_spells(self, pool: str, since: float, now: float) -> list[tuple[float, float, bool]]:
        """The pool's spells that began between `since` and `now`: (start, length, still open at
        `now`); an open spell counts as long as it had lasted by `now` (a backtest asks as of then)."""
        rows = self._tuples(f"select started, ended from idle_spells where pool = :pool and started >= :since "
                            f"and started < :now{self._in()} order by started", {"pool": pool, "since": since, "now": now})
        return [(float(s), min(now, float(e) if e is not None else now) - float(s), e is None or float(e) > now)
                for s, e in rows]

    @locked
    def last_depth(self, depth: str) -> dict[str, float]:
        """Node -> when it last finished a sweep at depth `depth` (its `depth` action row)."""
        return dict(self._tuples(f"select node, max(ts) from actions where action = 'depth' and "
                                 f"detail like :d and dry_run = 0{self._in()} group by node", {"d": f"{depth}:%"}))
