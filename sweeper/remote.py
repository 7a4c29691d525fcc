"""The cluster's history, read from where a person is: a laptop with a kubeconfig and no local
history file. `sweeper serve` keeps the history in the cluster and serves it read-only under
/api/v1/ (sweeper.serve.Server.read); this reader asks it through the API server's service proxy
with the person's own credentials, so RBAC decides (`get` on `services/proxy`, the Role
`sweeper-history-reader` of deploy/serve/serve.yaml). It returns the shapes the CLI prints from a
local History. When the service cannot be reached or is forbidden, `LabelHistory` reads what the
nodes' own labels and annotation say of their last sweep, and the caller says so."""

from __future__ import annotations

import json
from typing import Any

from sweeper.config import Config
from sweeper.errors import KubeError, StateError

SERVICE = "sweeper:http"  # the Service of deploy/serve/serve.yaml, by its port's name
API = "api/v1"  # sweeper.serve.API, without its slashes


class Unreachable(StateError):
    """The cluster's Sweeper could not be read (no service, not allowed, not answering): exit 3."""


class RemoteHistory:
    """The history `sweeper serve` keeps in the cluster, read through the API server."""

    def __init__(self, kube: Any, namespace: str, service: str = SERVICE, timeout: float = 30.0) -> None:
        self.kube, self.namespace, self.service, self.timeout = kube, namespace, service, timeout

    @property
    def where(self) -> str:
        """Where this reads from, in words."""
        return f"the cluster's Sweeper, service {self.namespace}/{self.service.split(':')[0]} via the API server"

    def _get(self, path: str, **query: Any) -> bytes:
        try:
            return bytes(self.kube.service_get(self.namespace, self.service, f"{API}/{path}",
                                               {k: str(v) for k, v in query.items() if v not in (None, "")},
                                               timeout=self.timeout))
        except KubeError as exc:
            raise Unreachable(f"{self.where}: {exc}") from exc

    def _doc(self, path: str, **query: Any) -> dict[str, Any]:
        body = self._get(path, **query)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise Unreachable(f"{self.where}: not a JSON answer from {path} ({body[:80]!r})") from exc
        if not isinstance(doc, dict):
            raise Unreachable(f"{self.where}: an answer of the wrong shape from {path}")
        return doc

    def nodes(self) -> list[dict[str, Any]]:
        """The fleet's rows (sweeper.views.fleet_rows), as the cluster's Sweeper sees them."""
        return list(self._doc("nodes").get("nodes") or [])

    def node_history(self, node: str, since_seconds: float | None = None, check: str = "") -> dict[str, Any]:
        """One node's history (History.node_history's shape) and `known`: whether it was ever recorded."""
        return self._doc(f"nodes/{node}/history", since=since_seconds, check=check)

    def report(self, since_seconds: float, node: str | None = None) -> str:
        """The fleet report (or one node's page) as the cluster's Sweeper renders it."""
        return self._get("report", since=since_seconds, node=node).decode("utf-8", "replace")


class LabelHistory:
    """What the nodes say of their last sweep, when no history can be read: the `<prefix>/status`
    and `<prefix>/last-sweep` labels and the `<prefix>/last-result` annotation each sweep leaves
    (sweeper.actions.node.status_marks). It answers the History calls that `sweeper nodes` and
    `history NODE` make; a node never swept has no row."""

    def __init__(self, nodes: list[dict[str, Any]], cfg: Config) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        p = cfg.prefix
        for obj in nodes:
            meta = obj.get("metadata") or {}
            labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
            verdict, when = labels.get(f"{p}/status"), labels.get(f"{p}/last-sweep")
            if not verdict or not (when or "").isdigit():
                continue
            try:
                result = json.loads(notes.get(f"{p}/last-result") or "{}")
            except (ValueError, RecursionError):  # the node may rewrite it: RecursionError is nesting
                result = {}
            result = result if isinstance(result, dict) else {}
            self.rows[meta["name"]] = {
                "node": meta["name"], "profile": "", "started": float(str(when)), "finished": float(str(when)),
                "verdict": verdict, "kind": "sweep", "run_id": "", "playbook": "",
                "rules": [str(r) for r in result.get("rules") or []],
                "reasons": [str(r) for r in result.get("reasons") or []], "problems": []}

    def fleet(self) -> list[dict[str, Any]]:
        return [self.rows[n] for n in sorted(self.rows)]

    def last_swept(self, kind: str = "sweep") -> dict[str, float]:
        return {n: r["started"] for n, r in self.rows.items() if r["verdict"] != "inconclusive"}

    def knows(self, node: str) -> bool:
        return node in self.rows

    def node_history(self, node: str, since: float | None = None, check: str = "") -> dict[str, Any]:
        row = self.rows.get(node)
        sweeps = [row] if row is not None and row["started"] >= (since or 0.0) else []
        return {"node": node, "sweeps": sweeps, "actions": [], "pairs": [], "metrics": {}, "pruned_days": []}
