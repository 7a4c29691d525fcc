"""Outside claims as the history keeps them: each judgment a sweep made of a condition or taint
another tool set (confirmed, refuted, inconclusive), what the queue reads back (the claims already
settled, not tested again until they change), and each source's precision for the report."""

from __future__ import annotations

from typing import Any

from sweeper.history.base import Base
from sweeper.history.store import locked

OUTCOMES = ("confirmed", "refuted", "inconclusive")


class Claims(Base):
    @locked
    def claim_result(self, run_id: str, sweep_id: int | None, node: str, ts: float, claim: dict[str, Any],
                     outcome: str, evidence: str) -> None:
        """One claim judged: `claim` has source, code, kind, test and since (sweeper.claims.Claim)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"claim outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
        self._write("claims", {"run_id": run_id, "sweep_id": sweep_id, "node": node, "ts": ts,
                               "source": claim["source"], "code": claim["code"], "kind": claim["kind"],
                               "test": claim["test"], "since": float(claim.get("since") or 0.0),
                               "outcome": outcome, "evidence": evidence[:1000]})

    @locked
    def claims_settled(self, nodes: list[str]) -> dict[tuple[str, str, str], float]:
        """(node, source, code) -> when its last confirmed or refuted judgment was made; a claim
        made again after that (a newer `since`) is tested again, an inconclusive one always is."""
        if not nodes:
            return {}
        # one query of every settled claim (a row a claim judged, not a row a sweep), kept to `nodes` here
        wanted = set(nodes)
        rows = self._tuples("select node, source, code, max(ts) from claims where outcome in ('confirmed', 'refuted')"
                            f"{self._in()} group by node, source, code")
        return {(r[0], r[1], r[2]): float(r[3]) for r in rows if r[0] in wanted}

    @locked
    def claim_precision(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Per source and code since `since`: confirmed, refuted and inconclusive counts, nodes,
        and the last judgment's time; sources in name order."""
        rows = self._rows(
            "select source, code, outcome, count(*) as n, count(distinct node) as nodes, max(ts) as last "
            f"from claims where ts >= :since{self._in()} group by source, code, outcome", {"since": since})
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for r in rows:
            entry = out.setdefault((r["source"], r["code"]), {"source": r["source"], "code": r["code"],
                                                              "confirmed": 0, "refuted": 0, "inconclusive": 0,
                                                              "nodes": 0, "last": 0.0})
            if r["outcome"] in OUTCOMES:
                entry[r["outcome"]] += int(r["n"])
            entry["nodes"] = max(entry["nodes"], int(r["nodes"]))
            entry["last"] = max(entry["last"], float(r["last"] or 0.0))
        return [out[k] for k in sorted(out)]

    @locked
    def node_claims(self, node: str, limit: int = 50) -> list[dict[str, Any]]:
        """The node's judged claims, newest first."""
        return self._rows(f"select ts, source, code, kind, test, outcome, evidence, run_id from claims "
                          f"where node = :node{self._in()} order by ts desc limit :limit",
                          {"node": node, "limit": limit})
