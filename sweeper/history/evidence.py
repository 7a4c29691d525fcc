"""Held nodes' evidence bundles: kept by node and run (a node Karpenter removed keeps its bundle),
in the history itself or, where the bundle went to object storage, its address there. The bundles
kept in the history are held under a total size: past it, the oldest bundles' bytes go first."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from sweeper.history.base import Base
from sweeper.history.store import locked

PRUNED = "pruned"


def _safe(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(value))[:64] or "?"  # the location of a bundle whose bytes the size cap took


class Evidence(Base):
    @locked
    def keep_evidence(self, run_id: str, node: str, ts: float, bundle: bytes, manifest: dict[str, Any],
                      location: str = "", keep_bytes: int = 0) -> list[tuple[str, str]]:
        """Record a node's bundle for run `run_id`: its bytes here (`location` ""), or where it
        is stored. `keep_bytes` > 0: then the oldest bundles' bytes kept here are dropped until the
        total is within it (their rows stay, saying so). The (node, run) of each bundle dropped."""
        self._run("delete from evidence where node = :node and run_id = :run and cluster = :c",
                  {"node": node, "run": run_id, "c": self.cluster})
        self._write("evidence", {"run_id": run_id, "node": node, "ts": ts, "bytes": len(bundle),
                                 "sha256": hashlib.sha256(bundle).hexdigest(), "location": location,
                                 "manifest": json.dumps(manifest), "data": None if location else bundle})
        return self._cap(keep_bytes) if keep_bytes > 0 else []

    def _cap(self, keep_bytes: int) -> list[tuple[str, str]]:
        rows = self._rows("select id, node, run_id, bytes from evidence where location = '' and cluster = :c "
                          "order by ts desc, id desc", {"c": self.cluster})
        total, dropped = 0, []
        for r in rows:
            total += int(r["bytes"] or 0)
            if total > keep_bytes:
                self._run("update evidence set data = null, location = :p where id = :id", {"p": PRUNED, "id": r["id"]})
                dropped.append((str(r["node"]), str(r["run_id"])))
        return dropped

    @locked
    def evidence_runs(self, node: str) -> list[dict[str, Any]]:
        """The node's bundles, newest first, without their bytes: run, when, size, where, and the
        manifest's parts (file and status)."""
        rows = self._rows("select run_id, ts, bytes, sha256, location, manifest from evidence where node = :node"
                          f"{self._in()} order by ts desc, id desc", {"node": node})
        for r in rows:
            r["where"] = r.pop("location") or "history"
            try:
                parts = json.loads(r.pop("manifest") or "{}").get("parts") or []
            except ValueError:
                parts = []
            # the manifest is the node's words: names and statuses kept to a safe alphabet and length
            r["parts"] = {_safe(p.get("file")): _safe(p.get("status")) for p in parts[:32] if isinstance(p, dict)}
        return rows

    @locked
    def evidence_of(self, node: str, run_id: str) -> dict[str, Any] | None:
        """The node's bundle of run `run_id` (`data` None where it is elsewhere or was pruned), or None."""
        rows = self._rows("select run_id, ts, bytes, sha256, location, data from evidence where node = :node and "
                          f"run_id = :run{self._in()} order by ts desc limit 1", {"node": node, "run": run_id})
        if not rows:
            return None
        row = rows[0]
        row["data"] = bytes(row["data"]) if row["data"] is not None else None
        return row
