"""Server-side printing: the meta.k8s.io Table that `kubectl get` asks for."""

from __future__ import annotations

from typing import Any

from sweeper.clock import parse_iso


def _age(ts: str | None, now: float) -> str:
    if not ts:
        return "<unknown>"
    secs = max(0, int(now - parse_iso(ts)))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _col(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


def _node_row(o: dict[str, Any], now: float) -> list[Any]:
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in o["status"].get("conditions", []))
    status = "Ready" if ready else "NotReady"
    if o["spec"].get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = ",".join(sorted(k.split("/", 1)[1] for k in (o["metadata"].get("labels") or {})
                            if k.startswith("node-role.kubernetes.io/"))) or "<none>"
    return [o["metadata"]["name"], status, roles, _age(o["metadata"].get("creationTimestamp"), now),
            o["status"].get("nodeInfo", {}).get("kubeletVersion", "")]


def _pod_row(o: dict[str, Any], now: float) -> list[Any]:
    statuses = o["status"].get("containerStatuses") or []
    total = len(o["spec"].get("containers") or [])
    ready = sum(1 for c in statuses if c.get("ready"))
    reason = o["status"].get("phase", "Pending")
    for c in statuses:
        term = (c.get("state") or {}).get("terminated")
        if term and o["status"].get("phase") == "Failed":
            reason = term.get("reason") or "Error"
    if o["status"].get("reason"):
        reason = o["status"]["reason"]
    if o["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    return [o["metadata"]["name"], f"{ready}/{total}", reason, restarts,
            _age(o["metadata"].get("creationTimestamp"), now), o["status"].get("podIP", "<none>"),
            o["spec"].get("nodeName", "<none>")]


def _job_row(o: dict[str, Any], now: float) -> list[Any]:
    st = o.get("status") or {}
    conds = {c["type"]: c for c in st.get("conditions") or [] if c.get("status") == "True"}
    status = "Complete" if "Complete" in conds else "Failed" if "Failed" in conds else "Running"
    comps = int(o["spec"].get("completions") or 1)
    dur = ""
    if st.get("startTime"):
        end = parse_iso(st["completionTime"]) if st.get("completionTime") else now
        dur = f"{max(0, int(end - parse_iso(st['startTime'])))}s"
    return [o["metadata"]["name"], status, f"{st.get('succeeded', 0)}/{comps}", dur,
            _age(o["metadata"].get("creationTimestamp"), now)]


def _event_row(o: dict[str, Any], now: float) -> list[Any]:
    inv = o.get("involvedObject") or {}
    return [_age(o.get("lastTimestamp") or o["metadata"].get("creationTimestamp"), now), o.get("type", ""),
            o.get("reason", ""), f"{inv.get('kind', '').lower()}/{inv.get('name', '')}", o.get("message", "")]


def _generic_row(o: dict[str, Any], now: float) -> list[Any]:
    return [o["metadata"]["name"], _age(o["metadata"].get("creationTimestamp"), now)]


COLUMNS: dict[str, tuple[list[dict[str, Any]], Any]] = {
    "nodes": ([_col("Name", fmt="name"), _col("Status"), _col("Roles"), _col("Age"), _col("Version")], _node_row),
    "pods": ([_col("Name", fmt="name"), _col("Ready"), _col("Status"), _col("Restarts", "integer"), _col("Age"),
              _col("IP", priority=1), _col("Node", priority=1)], _pod_row),
    "jobs": ([_col("Name", fmt="name"), _col("Status"), _col("Completions"), _col("Duration"), _col("Age")],
             _job_row),
    "events": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")], _event_row),
}


def table(plural: str, items: list[dict[str, Any]], list_meta: dict[str, Any], now: float,
          include_object: str = "Metadata") -> dict[str, Any]:
    columns, row_fn = COLUMNS.get(plural, ([_col("Name", fmt="name"), _col("Age")], _generic_row))
    rows = []
    for o in items:
        if include_object == "None":
            obj = None
        elif include_object == "Object":
            obj = o
        else:
            obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
        rows.append({"cells": row_fn(o, now), "object": obj})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": columns, "rows": rows}
