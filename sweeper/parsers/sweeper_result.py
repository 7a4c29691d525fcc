"""Sweeper's own result document, read back from a check pod's log or termination message."""

from __future__ import annotations

import json
import math
from typing import Any

from sweeper.clock import parse_iso
from sweeper.result import (
    SCHEMA,
    SEVERITIES,
    STATUSES,
    CheckResult,
    Metric,
    Result,
    clean_facts,
    error_result,
)

# A result document is at most DOCUMENT_LIMIT bytes of JSON (a real check of eight GPUs prints a few
# tens of KiB): a larger one is not read at all but is an `error` (a check that printed what no check
# prints, a fault of the check or of a node taken over, never a pass), so the history keeps at most
# this much of any one document. Its messages are kept to MESSAGE_MAX characters each.
DOCUMENT_LIMIT = 1024 * 1024
MAX_BYTES = 8 * 1024 * 1024  # the most text looked at (a pod's log is read no further, sweeper.kube)
MESSAGE_MAX = 4096
OVERSIZE = "ResultTooLarge"


def parse(text: str, node: str, now: float) -> Result:
    """A full result document; anything else is an `error` result naming what was wrong."""
    if not text or not text.strip():
        return error_result(node, "sweeper", "empty output: the check printed nothing", now)
    if len(text) > MAX_BYTES:
        return error_result(node, "sweeper", f"output of {len(text)} bytes is over the {MAX_BYTES} limit", now,
                            code=OVERSIZE)
    start = text.find("{")
    if start < 0:
        return error_result(node, "sweeper", "no JSON document in the output: " + _snippet(text), now)
    try:
        doc, end = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as exc:
        return error_result(node, "sweeper", f"unreadable JSON ({exc}): " + _snippet(text), now)
    except RecursionError:  # json raises it, not ValueError, on arrays or objects nested too deep
        return error_result(node, "sweeper", "unreadable JSON (nested too deep): " + _snippet(text), now)
    size = len(text[start:start + end].encode("utf-8"))
    if size > DOCUMENT_LIMIT:
        return error_result(node, "sweeper", f"a result document of {size} bytes is over the {DOCUMENT_LIMIT}-byte "
                            "limit: not read", now, code=OVERSIZE)
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
    checks = [_check(c) for c in _list(doc, "checks")]
    metrics = [_metric(m) for m in _list(doc, "metrics", required=False)]
    if not checks:
        raise ValueError("the document has no checks")
    status = doc["status"]
    if status not in STATUSES:
        raise ValueError(f"overall status {status!r}")
    result = Result(node=node, source=_text(doc, "source", "sweeper"), started=parse_iso(doc["started"]),
                    finished=parse_iso(doc["finished"]), checks=tuple(checks), metrics=tuple(metrics),
                    facts=_facts(doc))
    if result.status != status:
        raise ValueError(f"overall status {status!r} disagrees with its checks ({result.status!r})")
    return result


MAX_GPU = 1024  # far above any node's GPU count: a larger index is not a GPU


def _list(doc: dict[str, Any], key: str, required: bool = True) -> list[Any]:
    value = doc[key] if required else doc.get(key, [])
    if not isinstance(value, list):
        raise TypeError(f"{key!r} is {type(value).__name__}, not a list")
    return value


def _text(item: dict[str, Any], key: str, default: str | None = None) -> str:
    """A string field; a number (an XID code written as 79) is taken as its text."""
    value = item.get(key, default) if default is not None else item[key]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"{key!r} is {type(value).__name__}, not a string")
    return str(value)


def _gpu(item: dict[str, Any]) -> int | None:
    """A GPU index: an integer from 0 (absent or null: the node as a whole)."""
    gpu = item.get("gpu")
    if gpu is None:
        return None
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < MAX_GPU:
        raise TypeError(f"gpu {str(gpu)[:40]!r} is not a GPU index (an integer from 0)")
    return gpu


def _check(c: Any) -> CheckResult:
    if not isinstance(c, dict):
        raise TypeError("a check is not an object")
    if c.get("status") not in STATUSES:
        raise ValueError(f"check {str(c.get('name'))[:80]!r} has status {str(c.get('status'))[:40]!r}")
    severity = _text(c, "severity", "info")
    if severity not in SEVERITIES:
        raise ValueError(f"check {str(c.get('name'))[:80]!r} has severity {severity[:40]!r}")
    return CheckResult(name=_text(c, "name"), status=c["status"], message=_text(c, "message", "")[:MESSAGE_MAX],
                       severity=severity, gpu=_gpu(c), code=None if c.get("code") is None else _text(c, "code"))


def _metric(m: Any) -> Metric:
    if not isinstance(m, dict):
        raise TypeError("a metric is not an object")
    value = m.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"metric {str(m.get('name'))[:80]!r} has value {str(value)[:40]!r}, not a finite number")
    return Metric(name=_text(m, "name"), value=float(value), unit=_text(m, "unit", ""), gpu=_gpu(m))


def _facts(doc: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The optional `facts` map (absent in documents written before it): an object of strings,
    cleaned and capped by sweeper.result.clean_facts."""
    facts = doc.get("facts", {})
    if not isinstance(facts, dict):
        raise TypeError(f"'facts' is {type(facts).__name__}, not an object")
    for key, value in facts.items():
        if not isinstance(value, str):
            raise TypeError(f"fact {str(key)[:80]!r} is {type(value).__name__}, not a string")
    return clean_facts(facts)


def _snippet(text: str, n: int = 120) -> str:
    s = text.strip().replace("\n", " ")
    return s[:n] + ("..." if len(s) > n else "")


def parse_summary(text: str, node: str, now: float) -> Result:
    """The compact termination-message form (status plus its problems), when no log is left."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("status") not in STATUSES:
            raise ValueError("not a Sweeper summary")
        checks = [_check(p) for p in doc.get("problems") or []]
        if doc["status"] == "pass" and not checks:
            checks = [CheckResult("summary", "pass", f"{doc.get('checks', 0)} checks passed")]
        result = Result(node=node, source="sweeper", started=now, finished=now, checks=tuple(checks))
        if result.status != doc["status"] and not doc.get("truncated"):
            raise ValueError(f"summary status {doc['status']!r} disagrees with its problems")
        return result
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: nested too deep
        return error_result(node, "sweeper", f"unreadable termination message ({exc}): {_snippet(text)}", now)
