"""`dcgmi diag -r N -j`: DCGM 4.x and every 3.x layout, the runtime_error form and the
iterations wrapper, into the common result. The exit code is a cross-check, never a verdict."""

from __future__ import annotations

import json
import re
from typing import Any

from sweeper.result import CheckResult, Metric, Result, error_result

# dcgmErrorSeverity_t
SEVERITY = {0: "info", 1: "info", 2: "critical", 3: "warning", 4: "warning", 5: "warning", 6: "critical"}
STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip", "not run": "skip"}
FAIL_EXITS = {205, 226}
_BW = re.compile(r"GPU (\d+) (GPU to Host|Host to GPU|bidirectional)[^:]*bandwidth:\s*([\d.]+)\s*GB/s", re.I)
MAX_BYTES = 32 * 1024 * 1024


def parse(text: str, node: str, now: float, exit_code: int | None = None, expect_gpus: int | None = None) -> Result:
    if not text or not text.strip():
        return error_result(node, "dcgm", "dcgmi printed nothing" + (f" (exit {exit_code})" if exit_code else ""), now)
    if len(text) > MAX_BYTES:
        return error_result(node, "dcgm", f"{len(text)} bytes of output is over the {MAX_BYTES} limit", now)
    start = text.find("{")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except ValueError as exc:
        return error_result(node, "dcgm", f"not JSON ({exc}); was -j given?", now)
    if not isinstance(doc, dict):
        return error_result(node, "dcgm", "no JSON object in the output", now)
    try:
        return _parse_doc(doc, node, now, exit_code, expect_gpus)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return error_result(node, "dcgm", f"unexpected DCGM JSON layout: {exc!r}", now)


def _parse_doc(doc: dict[str, Any], node: str, now: float, exit_code: int | None,
               expect_gpus: int | None) -> Result:
    if "iterations" in doc:
        runs = doc["iterations"]
        if not isinstance(runs, list) or not runs:
            return error_result(node, "dcgm", "an iterations wrapper with no iterations", now)
        results = [_parse_doc(r, node, now, None, expect_gpus) for r in runs]
        merged = tuple(CheckResult(c.name, c.status, f"iteration {i + 1}: {c.message}", c.severity, c.gpu, c.code)
                       for i, r in enumerate(results) for c in r.checks)
        return _cross_check(Result(node, "dcgm", now, now, merged, tuple(m for r in results for m in r.metrics)),
                            exit_code, now)
    root = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(root, dict):
        return error_result(node, "dcgm", "neither 'DCGM Diagnostic' (4.x) nor 'DCGM GPU Diagnostic' (3.x) found",
                            now)
    if "runtime_error" in root:
        return error_result(node, "dcgm", f"DCGM could not run: {str(root['runtime_error'])[:300]}", now,
                            code=None if exit_code is None else f"exit {exit_code}")
    checks: list[CheckResult] = []
    metrics: list[Metric] = []
    gpus: set[int] = set()
    for cat in root.get("test_categories") or []:
        for test in cat.get("tests") or []:
            name = "dcgm." + re.sub(r"[^a-z0-9]+", "_", str(test.get("name", "unknown")).lower()).strip("_")
            for r in test.get("results") or []:
                gpu = _gpu(r)
                if gpu is not None:
                    gpus.add(gpu)
                checks.append(_check(name, r, gpu))
                for info in _as_list(r.get("info")):
                    m = _BW.search(str(info))
                    if m:
                        direction = m.group(2).lower().replace(" ", "_")
                        metrics.append(Metric(f"dcgm.pcie.{direction}_bandwidth", float(m.group(3)), "GB/s",
                                              int(m.group(1))))
    if expect_gpus is not None:
        entities = _entities(doc) or gpus
        if len(entities) != expect_gpus:
            checks.append(CheckResult("dcgm.gpu_count", "fail", f"DCGM saw {len(entities)} GPUs, the profile "
                                      f"expects {expect_gpus}", "critical"))
    if not checks:
        return error_result(node, "dcgm", "the diagnostic reported no results", now)
    return _cross_check(Result(node, "dcgm", now, now, tuple(checks), tuple(metrics)), exit_code, now)


def _entities(doc: dict[str, Any]) -> set[int]:
    out: set[int] = set()
    for g in doc.get("entity_groups") or []:
        if g.get("entity_group") == "GPU":
            out |= {int(e["entity_id"]) for e in g.get("entities") or []}
    if not out and isinstance(doc.get("GPU Device IDs"), list):
        out = set(range(len(doc["GPU Device IDs"])))
    return out


def _gpu(r: dict[str, Any]) -> int | None:
    if r.get("entity_group", "GPU") != "GPU":
        return None
    for key in ("entity_id", "gpu_id", "gpu_ids"):
        if key in r and str(r[key]).strip().isdigit():
            return int(r[key])
    return None


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _check(name: str, r: dict[str, Any], gpu: int | None) -> CheckResult:
    status = STATUS.get(str(r.get("status", "")).strip().lower())
    warnings = []
    if isinstance(r.get("warnings"), str):
        warnings.append({"warning": r["warnings"], "error_id": r.get("error_id"), "error_severity": r.get("error_severity")})
    else:
        for w in _as_list(r.get("warnings")):
            if isinstance(w, dict):
                warnings.append({"warning": w.get("warning", w.get("warnings", "")), "error_id": w.get("error_id"),
                                 "error_severity": w.get("error_severity")})
            else:
                warnings.append({"warning": str(w)})
    if status is None:
        status = "fail" if warnings else "pass"  # a 3.x flat deployment entry carries no status
    severities = [w.get("error_severity") for w in warnings if isinstance(w.get("error_severity"), int)]
    # DCGM has reported ISOLATE/RESET errors under a Pass (its issue #284): the error ids decide too.
    if status in ("pass", "warn") and any(s in (2, 6) for s in severities):
        status = "fail"
    first = warnings[0] if warnings else {}
    severity = SEVERITY.get(first.get("error_severity"), "critical" if status == "fail" else "info")  # type: ignore[arg-type]
    code = None if first.get("error_id") is None else str(first["error_id"])
    message = "; ".join(str(w["warning"]) for w in warnings)[:500] or str(r.get("status", ""))
    return CheckResult(name, status, message, severity, gpu, code)


def _cross_check(result: Result, exit_code: int | None, now: float) -> Result:
    if exit_code in FAIL_EXITS and result.status in ("pass", "warn", "skip"):
        return error_result(result.node, "dcgm", f"dcgmi exited {exit_code} (a failure) but its JSON shows none", now,
                            code=f"exit {exit_code}")
    if exit_code not in (None, 0) and exit_code not in FAIL_EXITS and result.status != "fail":
        return error_result(result.node, "dcgm", f"dcgmi exited {exit_code}", now, code=f"exit {exit_code}")
    return result
