"""`dcgmi diag -r N` into the common result: the JSON of `-j` (DCGM 4.x and every 3.x layout,
the runtime_error form, the iterations wrapper, a preamble before it) and the bordered table
printed without `-j` (3.x and 4.x), whole or pasted in part. The exit code is a cross-check,
never a verdict; a status word outside DCGM's own set is an error, never a pass.

Why it is long: it reads one tool's two forms, the JSON and the printed table, into the same
checks: both go through one status table, one test-level rule, one reading of DCGM's own
failures and of a CUDA build mismatch, and one cross-check with the exit code."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from sweeper.result import CheckResult, Metric, Result, error_result

# dcgmErrorSeverity_t
SEVERITY = {0: "info", 1: "info", 2: "critical", 3: "warning", 4: "warning", 5: "warning", 6: "critical"}
# NVVS result words (DCGM's nvvs/include/NvvsCommon.h and dcgmi's diag output): Pass, Fail, Warn
# (Warning in older tables), Skip, Not Run.
STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "not run": "skip"}
FAIL_EXITS = {205, 226}
# A failure DCGM calls its own: DCGM_FR_INTERNAL (44, "There was an internal error during the test"),
# category DCGM_FR_EC_INTERNAL_OTHER (16), or a plugin whose child's output it could not parse
# (dcgmlib/dcgm_errors.h in NVIDIA/DCGM). Such a test says nothing about the GPU: `error`.
OWN_ERROR_IDS = {44}
OWN_ERROR_CATEGORIES = {16}
_OWN_WORDS = re.compile(r"internal error|(?:couldn't|could not|unable to|failed to) parse", re.I)
_NAMES_GPU = re.compile(r"\bGPU\s*(\d+)\b")
_BW = re.compile(r"GPU (\d+) (GPU to Host|Host to GPU|bidirectional)[^:]*bandwidth:\s*([\d.]+)\s*GB/s", re.I)
MAX_BYTES = 32 * 1024 * 1024
# The image's DCGM build does not fit the node's driver: a fault of the check (its image), never of
# the node. DCGM 4.x ships one build per CUDA major (packages datacenter-gpu-manager-4-cuda12,
# -cuda13) and nvvs loads the plugins of the major the driver runs, from plugins/cudaNN/; an image
# without that build cannot load them ("Cannot load plugins. Unable to change to the plugin dir
# '.../plugins/cuda13/'"; an unknown major: "Detected unsupported Cuda version"). NVIDIA/DCGM:
# nvvs/include/TestFramework.inl (GetPluginCudaDirExtension, LoadPluginWithDir). A CUDA runtime newer
# than the driver says cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA
# runtime version" (https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html), or
# CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination"
# (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html).
CUDA_BUILD_CODE = "DCGM_CUDA_BUILD"
_CUDA_BUILD = re.compile(r"plugin dir\W+\S*?/cuda(\d+)/?|unsupported Cuda version|driver version is insufficient "
                         r"for CUDA runtime|unsupported display driver\s*/\s*cuda driver combination", re.I)
_CUDA_HINT = ("the DCGM image's CUDA build does not match the node's driver{major}: a fault of the check's image, "
              "not of the node; set dcgm_images so each driver branch gets an image with its build (docs/install-notes.md#platforms)")


def parse(text: str, node: str, now: float, exit_code: int | None = None, expect_gpus: int | None = None) -> Result:
    if not text or not text.strip():
        return error_result(node, "dcgm", "dcgmi printed nothing" + (f" (exit {exit_code})" if exit_code else ""), now)
    if len(text) > MAX_BYTES:
        return error_result(node, "dcgm", f"{len(text)} bytes of output is over the {MAX_BYTES} limit", now)
    doc, why = _find_json(text)
    if doc is None:
        table = parse_table(text, node, now, exit_code, expect_gpus)
        if table is not None:
            m = _TABLE_VERSION.search(text)
            return _with_version(table, m.group(1) if m else None)
        return error_result(node, "dcgm", why or "no JSON object and no dcgmi diag table in the output", now)
    try:
        result = _parse_doc(doc, node, now, exit_code, expect_gpus)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return error_result(node, "dcgm", f"unexpected DCGM JSON layout: {exc!r}", now)
    meta = doc.get("metadata")
    return _with_version(result, (meta.get("version") if isinstance(meta, dict) else None) or doc.get("version"))


# The DCGM version a diagnostic reports (4.x JSON: metadata.version; 3.x JSON: version; the table's
# "DCGM Version" row): a fact of the node's software, so that failures can be read by DCGM release
# (an upgrade that failed a whole fleet's PCIe test at once: NVIDIA/DCGM#253).
_TABLE_VERSION = re.compile(r"^\W*DCGM Version\s*\|\s*([0-9][\w.+-]*)\s*\|", re.M)


def _with_version(result: Result, version: Any) -> Result:
    if not isinstance(version, str) or not version.strip():
        return result
    return replace(result, facts=(*result.facts, ("dcgm", version)))


_ROOTS = ('"DCGM Diagnostic"', '"DCGM GPU Diagnostic"', '"iterations"')


def _find_json(text: str) -> tuple[dict[str, Any] | None, str]:
    """The diagnostic's JSON object, after whatever was printed before it (a kubectl banner, a
    warning): the first `{` that opens a line and decodes to an object. (None, why) if none."""
    why = ""
    starts = [m.start(1) for m in re.finditer(r"(?m)^[ \t]*({)", text)][:50] or ([text.find("{")] if "{" in text else [])
    for start in starts:
        try:
            doc, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError as exc:
            why = why or f"not JSON ({exc}); was -j given?"
            continue
        except RecursionError:  # json raises it, not ValueError, on arrays or objects nested too deep
            why = why or "not JSON (nested too deep)"
            continue
        if isinstance(doc, dict):
            return doc, ""
    return None, why


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
        words = str(root["runtime_error"])[:300]
        if _CUDA_BUILD.search(words):
            return error_result(node, "dcgm", f"{cuda_build_hint(words)}: {words}", now, code=CUDA_BUILD_CODE)
        return error_result(node, "dcgm", f"DCGM could not run: {words}", now,
                            code=None if exit_code is None else f"exit {exit_code}")
    checks: list[CheckResult] = []
    metrics: list[Metric] = []
    gpus: set[int] = set()
    categories = root.get("test_categories") or []
    if not isinstance(categories, list):
        raise TypeError(f"test_categories is a {type(categories).__name__}, not a list")
    for cat in categories:
        if not isinstance(cat, dict):  # DCGM has printed literal nulls inside these lists
            continue
        for test in _as_list(cat.get("tests")):
            if not isinstance(test, dict):
                continue
            name = "dcgm." + re.sub(r"[^a-z0-9]+", "_", str(test.get("name", "unknown")).lower()).strip("_")
            first = len(checks)
            for r in _as_list(test.get("results")):
                if not isinstance(r, dict):
                    continue
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
            summary = test.get("test_summary")
            if isinstance(summary, dict):
                checks[first:] = _test_level(name, summary.get("status"), _warnings(summary), checks[first:])
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
    for g in _as_list(doc.get("entity_groups")):
        if isinstance(g, dict) and g.get("entity_group") == "GPU":
            out |= {int(e["entity_id"]) for e in _as_list(g.get("entities"))
                    if isinstance(e, dict) and str(e.get("entity_id")).isdigit()}
    if not out and isinstance(doc.get("GPU Device IDs"), list):
        out = set(range(len(doc["GPU Device IDs"])))
    return out


def _gpu(r: dict[str, Any]) -> int | None:
    if r.get("entity_group", "GPU") != "GPU":
        return None
    for key in ("entity_id", "gpu_id", "gpu_ids"):
        value = r.get(key)
        if isinstance(value, list) and len(value) == 1:  # gpu_ids: [3] in one layout, "3" in another
            value = value[0]
        if value is not None and not isinstance(value, bool) and str(value).strip().isdigit():
            return int(str(value).strip())
    return None


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _check(name: str, r: dict[str, Any], gpu: int | None) -> CheckResult:
    raw = r.get("status")
    status = STATUS.get(raw.strip().lower()) if isinstance(raw, str) else None
    if "status" in r and status is None:
        return CheckResult(name, "error", f"DCGM reported a status outside its own set: {raw!r}", "critical", gpu,
                           "UNKNOWN_STATUS")
    warnings = _warnings(r)
    if status is None:  # a 3.x flat deployment entry carries no status: its warnings decide
        status = "fail" if warnings else "pass"
    severities = [w.get("error_severity") for w in warnings if isinstance(w.get("error_severity"), int)]
    # DCGM has reported ISOLATE/RESET errors under a Pass (its issue #284): the error ids decide too.
    if status in ("pass", "warn") and any(s in (2, 6) for s in severities):
        status = "fail"
    first = warnings[0] if warnings else {}
    severity = SEVERITY.get(first.get("error_severity"), "critical" if status == "fail" else "info")  # type: ignore[arg-type]
    code = None if first.get("error_id") is None else str(first["error_id"])
    message = "; ".join(str(w["warning"]) for w in warnings)[:500] or str(r.get("status", ""))
    if status in ("fail", "warn") and any(_CUDA_BUILD.search(str(w.get("warning", ""))) for w in warnings):
        return CheckResult(name, "error", f"{cuda_build_hint(message)}: {message}"[:700], "critical", gpu,
                           CUDA_BUILD_CODE)
    if status in ("fail", "warn") and warnings and all(_own(w) for w in warnings):
        return CheckResult(name, "error", f"DCGM's own failure, not the GPU's: {message}", "critical", gpu,
                           code or "DCGM_INTERNAL")
    return CheckResult(name, status, message, severity, gpu, code)


def _warnings(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The warnings of a result or a test_summary, in every layout (a string, a list of objects)."""
    if isinstance(r.get("warnings"), str):
        return [{"warning": r["warnings"], "error_id": r.get("error_id"), "error_severity": r.get("error_severity"),
                 "error_category": r.get("error_category")}]
    out: list[dict[str, Any]] = []
    for w in _as_list(r.get("warnings")):
        if isinstance(w, dict):
            out.append({"warning": w.get("warning", w.get("warnings", "")), "error_id": w.get("error_id"),
                        "error_severity": w.get("error_severity"), "error_category": w.get("error_category")})
        else:
            out.append({"warning": str(w)})
    return out


def cuda_build_hint(words: str) -> str:
    """Why DCGM could not run the image's build on this node, and what to set (config dcgm_images)."""
    m = _CUDA_BUILD.search(words)
    major = f" (it runs CUDA {m.group(1)})" if m and m.group(1) else ""
    return _CUDA_HINT.format(major=major)


def _own(w: dict[str, Any]) -> bool:
    """Whether DCGM says this failure is its own (an internal error), not the GPU's."""
    return (w.get("error_id") in OWN_ERROR_IDS or w.get("error_category") in OWN_ERROR_CATEGORIES
            or bool(_OWN_WORDS.search(str(w.get("warning", "")))))


def _test_level(name: str, raw: Any, warnings: list[dict[str, Any]], rows: list[CheckResult]) -> list[CheckResult]:
    """A test's own result over its per-GPU rows: a test-level Fail or Warn is never a pass
    (NVIDIA/DCGM#253: `pcie` Fail while every GPU row says Pass). `error` when DCGM says the failure
    is its own; else the GPUs its messages name fail (or warn), or the test as a whole does."""
    status = STATUS.get(raw.strip().lower()) if isinstance(raw, str) else None
    if status not in ("fail", "warn") or any(c.status in ("fail", "warn", "error") for c in rows):
        return rows
    message = "; ".join(str(w["warning"]) for w in warnings)[:500] or f"DCGM reported the test {raw}"
    if _CUDA_BUILD.search(message):
        return [*rows, CheckResult(name, "error", f"{cuda_build_hint(message)}: {message}"[:700], "critical", None,
                                   CUDA_BUILD_CODE)]
    if warnings and all(_own(w) for w in warnings):
        return [*rows, CheckResult(name, "error", f"DCGM's own failure, not the GPU's: {message}", "critical", None,
                                   "DCGM_INTERNAL")]
    severity = "critical" if status == "fail" else "warning"
    named: dict[int, list[dict[str, Any]]] = {}
    for w in warnings:
        for g in {int(x) for x in _NAMES_GPU.findall(str(w["warning"]))}:
            named.setdefault(g, []).append(w)
    if not named:
        return [*rows, CheckResult(name, status, message, severity, None, _code(warnings))]
    out = [c for c in rows if c.gpu not in named]
    for g, ws in sorted(named.items()):
        out.append(CheckResult(name, status, "; ".join(str(w["warning"]) for w in ws)[:500], severity, g, _code(ws)))
    return out


def _code(warnings: list[dict[str, Any]]) -> str | None:
    ids = [w.get("error_id") for w in warnings if w.get("error_id") is not None]
    return str(ids[0]) if ids else None


def _cross_check(result: Result, exit_code: int | None, now: float) -> Result:
    if exit_code in FAIL_EXITS and result.status in ("pass", "warn", "skip"):
        return error_result(result.node, "dcgm", f"dcgmi exited {exit_code} (a failure) but its JSON shows none", now,
                            code=f"exit {exit_code}")
    if exit_code not in (None, 0) and exit_code not in FAIL_EXITS and result.status not in ("fail", "error"):
        return error_result(result.node, "dcgm", f"dcgmi exited {exit_code}", now, code=f"exit {exit_code}")
    return result


# -- the table that `dcgmi diag` prints without -j -----------------------------------------
# 3.x: "| Memory Bandwidth | Pass - GPUs: 1, 2, 3 |", "|   | Fail - GPU: 0 |", "| Warning | GPU 0 ... |";
# 4.x: "| memory | Fail |" then "|   | GPU0: Fail |" and "| Warning: GPU0 | ... |". Long messages go
# on over rows with an empty first cell, cut at the column's width, mid-word. (Seen in
# NVIDIA/DCGM issues #55, #253 and NVIDIA/go-dcgm#52.)
_SECTION = re.compile(r"^[|+]?-{3,}\s+([A-Za-z][A-Za-z ]*?)\s+-{3,}")
_WORDS = r"Pass|Fail|Warn(?:ing)?|Skip|Not Run"
_RESULT = re.compile(rf"^(?P<status>{_WORDS})\b(?:\s*-\s*(?P<who>All|GPUs?\s*:\s*[\d,\s]+))?\s*$", re.I)
_PER_GPU = re.compile(rf"^GPU\s*(?P<gpu>\d+)\s*:\s*(?P<status>{_WORDS}|\S+)\s*$", re.I)
_LABEL = re.compile(r"^(?P<kind>Warning|Warnings|Error|Info)\b(?:\s*:\s*GPU\s*(?P<gpu>\d+))?\s*$", re.I)
_MSG_GPU = re.compile(r"^GPU\s*(\d+)\b")
# Linear in a line, however long: no two pieces can match the same blank, so nothing backtracks
# over a run of them ([^\S\n] is a blank within the line; a name holds no two blanks in a row).
_ROW = re.compile(rf"^[^\S\n]*(?:\|[^\S\n]*)?[A-Za-z][\w /+().\t-]*\|\s*(?:{_WORDS})\b(?:\s*-\s*(?:All|GPUs?:))?",
                  re.I | re.M)
_BARE_ROW = re.compile(rf"^[^\S\n]*[A-Za-z](?:[\w/+().-]| (?! ))*\s{{2,}}(?:{_WORDS})\s+-\s+(?:All|GPUs?:)", re.I | re.M)
_META_SECTIONS = {"metadata"}


def looks_like_table(head: str) -> bool:
    """Whether the text is dcgmi's diag table, whole or a part of it (for `--format auto`)."""
    if "Successfully ran diagnostic" in head or re.search(
            r"(?<!-)-{3,}\s+(?:Metadata|Deployment|Integration|Hardware|Stress)\s+-{3,}", head):
        return True
    return bool(re.search(r"\|\s*GPU\d+:\s*(?:Pass|Fail|Warn|Skip)\b", head) or _ROW.search(head)
                or _BARE_ROW.search(head))


def _cells(line: str) -> tuple[str, str, bool] | None:
    """(name, result, bordered) of one table row, or None for a border or something else."""
    body = line.strip()
    if not body or set(body) <= set("+-=| "):
        return None
    if "|" in body:
        parts = body.strip("|").split("|")
        return (parts[0].strip(), parts[1], True) if len(parts) == 2 else None
    parts = re.split(r"\s{2,}", body, maxsplit=1)  # pasted without its borders
    if len(parts) == 2:
        return parts[0].strip(), parts[1], False
    if line.startswith("    ") or re.match(rf"^(?:{_WORDS})\b|^GPU\s*\d+\s*:", body, re.I):
        return "", body, False  # a row that goes on from the one above
    return None


class _Test:
    def __init__(self, name: str, section: str) -> None:
        self.name, self.section = name, section
        self.results: list[tuple[str, int | None, str]] = []  # (status, gpu, raw word)
        self.messages: list[tuple[str, int | None, str]] = []  # (kind, gpu, text)


def parse_table(text: str, node: str, now: float, exit_code: int | None = None,
                expect_gpus: int | None = None) -> Result | None:
    """The table `dcgmi diag` prints without -j, per GPU; None when no row of it is found."""
    section = ""
    tests: list[_Test] = []
    current: _Test | None = None
    message: list[Any] | None = None  # [kind, gpu, text, width of its cell, length of its last piece]
    gpu_ids: list[str] = []
    seen = False
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _SECTION.match(line.strip())
        if m:
            section, current, message, seen = m.group(1).strip(), None, None, True
            continue
        cells = _cells(line)
        if cells is None:
            continue
        name, result_raw, bordered = cells
        result = result_raw.strip()
        if (section.lower() in _META_SECTIONS or (name == "Diagnostic" and result == "Result")
                or re.search(r"Version|Detected|Number of", name)):
            if name == "GPU Device IDs Detected":
                gpu_ids = [x for x in re.split(r"[,\s]+", result) if x]
            if name and result:
                seen = seen or section.lower() in _META_SECTIONS
            continue
        label = _LABEL.match(name) if name else None
        if label and current is not None:
            g = label.group("gpu")
            first = _MSG_GPU.match(result)
            gpu = int(g) if g is not None else (int(first.group(1)) if first else None)
            message = [label.group("kind").lower(), gpu, result, len(result_raw) if bordered else 0, len(result)]
            current.messages.append(tuple(message[:3]))  # type: ignore[arg-type]
            continue
        if name:
            current, message = _Test(name, section), None
            tests.append(current)
            seen = True
            r = _RESULT.match(result)
            if r:
                _add_results(current, r)
            else:
                current.results.append(("error", None, result))
            continue
        if current is None:
            continue
        per = _PER_GPU.match(result)
        r = _RESULT.match(result)
        if per:
            word = per.group("status")
            current.results.append((STATUS.get(word.lower(), "error"), int(per.group("gpu")), word))
            message = None
        elif r and message is None:
            _add_results(current, r)
        elif message is not None:  # a message going on over the next row
            # dcgmi cuts a long message at the cell's width, mid-word: a piece that filled its
            # cell goes on without a space.
            joiner = "" if message[3] and message[4] >= message[3] - 3 else " "
            message[2], message[4] = message[2] + joiner + result, len(result)
            current.messages[-1] = tuple(message[:3])  # type: ignore[assignment]
    if not seen or not tests:
        return None
    return _table_result(tests, gpu_ids, node, now, exit_code, expect_gpus)


def _add_results(test: _Test, r: re.Match[str]) -> None:
    status = STATUS[r.group("status").lower()]
    who = (r.group("who") or "").strip()
    gpus = [int(x) for x in re.findall(r"\d+", who)] if who.lower().startswith("gpu") else []
    if not gpus:
        test.results.append((status, None, r.group("status")))
    for g in gpus:
        test.results.append((status, g, r.group("status")))


def _row_check(name: str, status: str, gpu: int | None, word: str,
               messages: list[tuple[str, int | None, str]]) -> CheckResult:
    """One GPU's (or the test's) row of the table with the Warning and Error rows that concern it."""
    notes = [text for kind, g, text in messages if kind != "info" and (g is None or gpu is None or g == gpu)]
    if status == "error":
        return CheckResult(name, "error", f"DCGM reported a status outside its own set: {word!r}", "critical", gpu,
                           "UNKNOWN_STATUS")
    message = "; ".join(notes)[:500] or word
    if status in ("fail", "warn") and _CUDA_BUILD.search(message):
        return CheckResult(name, "error", f"{cuda_build_hint(message)}: {message}"[:700], "critical", gpu,
                           CUDA_BUILD_CODE)
    if status in ("fail", "warn") and notes and all(_own({"warning": n}) for n in notes):
        return CheckResult(name, "error", f"DCGM's own failure, not the GPU's: {message}", "critical", gpu,
                           "DCGM_INTERNAL")
    sev = "critical" if status == "fail" else "warning" if status == "warn" else "info"
    return CheckResult(name, status, message, sev, gpu)


def _table_result(tests: list[_Test], gpu_ids: list[str], node: str, now: float, exit_code: int | None,
                  expect_gpus: int | None) -> Result:
    checks: list[CheckResult] = []
    gpus: set[int] = set()
    for t in tests:
        name = "dcgm." + re.sub(r"[^a-z0-9]+", "_", t.name.lower()).strip("_")
        per_gpu = [x for x in t.results if x[1] is not None]
        rows = per_gpu or t.results  # 4.x prints an overall row above the per-GPU ones
        # An Error row that names a GPU fails that GPU, whatever its own row says (NVIDIA/DCGM#253).
        errors = {g: text for kind, g, text in t.messages if kind == "error" and g is not None}
        rows = [(s if s == "error" or g not in errors else "fail", g, w) for s, g, w in rows]
        rows += [("fail", g, "Fail") for g in errors if g not in {x[1] for x in rows}]
        test_checks: list[CheckResult] = []
        for status, gpu, word in rows:
            if gpu is not None:
                gpus.add(gpu)
            test_checks.append(_row_check(name, status, gpu, word, t.messages))
        overall = [w for s, g, w in t.results if g is None and s in ("fail", "warn")] if per_gpu else []
        notes = [{"warning": text} for kind, g, text in t.messages if kind != "info"]
        checks += _test_level(name, overall[0], notes, test_checks) if overall else test_checks
    if expect_gpus is not None and (gpu_ids or gpus):
        seen = len(gpu_ids) or len(gpus)
        if seen != expect_gpus:
            checks.append(CheckResult("dcgm.gpu_count", "fail", f"DCGM saw {seen} GPUs, the profile expects "
                                      f"{expect_gpus}", "critical"))
    return _cross_check(Result(node, "dcgm", now, now, tuple(checks)), exit_code, now)
