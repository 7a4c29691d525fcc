"""Sweeper's own result document, read back from a check pod's log or termination message."""

from __future__ import annotations

import json
from typing import Any

from sweeper.clock import parse_iso
from sweeper.result import SCHEMA, STATUSES, CheckResult, Metric, Result, error_result

MAX_BYTES = 8 * 1024 * 1024


def parse(text: str, node: str, now: float) -> Result:
    """A full result document; anything else is an `error` result naming what was wrong."""
    if not text or not text.strip():
        return error_result(node, "sweeper", "empty output: the check printed nothing", now)
    if len(text) > MAX_BYTES:
        return error_result(node, "sweeper", f"output of {len(text)} bytes is over the {MAX_BYTES} limit", now)
    start = text.find("{")
    if start < 0:
        return error_result(node, "sweeper", "no JSON document in the output: " + _snippet(text), now)
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as exc:
        return error_result(node, "sweeper", f"unreadable JSON ({exc}): " + _snippet(text), now)
    try:
        return from_dict(doc, node)
    except (KeyError, TypeError, ValueError) as exc:
        return error_result(node, "sweeper", f"not a result document: {exc}", now)


def from_dict(doc: Any, node: str) -> Result:
    if not isinstance(doc, dict):
        raise TypeError("the document is not an object")
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"schema {doc.get('schema')!r} is not {SCHEMA!r}")
    if doc.get("node") not in (node, None, ""):
        raise ValueError(f"document is for node {doc.get('node')!r}, expected {node!r}")
    checks = []
    for c in doc["checks"]:
        if c["status"] not in STATUSES:
            raise ValueError(f"check {c.get('name')!r} has status {c['status']!r}")
        checks.append(CheckResult(name=str(c["name"]), status=c["status"], message=str(c.get("message", "")),
                                  severity=str(c.get("severity", "info")), gpu=c.get("gpu"),
                                  code=None if c.get("code") is None else str(c["code"])))
    metrics = [Metric(name=str(m["name"]), value=float(m["value"]), unit=str(m.get("unit", "")),
                      gpu=m.get("gpu")) for m in doc.get("metrics", [])]
    if not checks:
        raise ValueError("the document has no checks")
    status = doc["status"]
    if status not in STATUSES:
        raise ValueError(f"overall status {status!r}")
    result = Result(node=node, source=str(doc.get("source", "sweeper")), started=parse_iso(doc["started"]),
                    finished=parse_iso(doc["finished"]), checks=tuple(checks), metrics=tuple(metrics))
    if result.status != status:
        raise ValueError(f"overall status {status!r} disagrees with its checks ({result.status!r})")
    return result


def _snippet(text: str, n: int = 120) -> str:
    s = text.strip().replace("\n", " ")
    return s[:n] + ("..." if len(s) > n else "")


def parse_summary(text: str, node: str, now: float) -> Result:
    """The compact termination-message form (status plus its problems), when no log is left."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("status") not in STATUSES:
            raise ValueError("not a Sweeper summary")
        checks = [CheckResult(name=str(p["name"]), status=p["status"], message=str(p.get("message", "")),
                              severity=str(p.get("severity", "info")), gpu=p.get("gpu"),
                              code=None if p.get("code") is None else str(p["code"]))
                  for p in doc.get("problems") or []]
        if doc["status"] == "pass" and not checks:
            checks = [CheckResult("summary", "pass", f"{doc.get('checks', 0)} checks passed")]
        result = Result(node=node, source="sweeper", started=now, finished=now, checks=tuple(checks))
        if result.status != doc["status"] and not doc.get("truncated"):
            raise ValueError(f"summary status {doc['status']!r} disagrees with its problems")
        return result
    except (ValueError, KeyError, TypeError) as exc:
        return error_result(node, "sweeper", f"unreadable termination message ({exc}): {_snippet(text)}", now)
