"""`nvidia-smi -q` and `nvidia-smi --query-gpu=... --format=csv`: one reading per GPU, judged
by the same rules as the NVML checks. Fields a GPU does not report (`N/A`, `[Not Supported]`)
are skipped, never read as zero."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.result import CheckResult, Metric, Result, error_result

MAX_BYTES = 16 * 1024 * 1024
_NA = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "unknown error", "", "[insufficient permissions]"}
_GPU_HEAD = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
THROTTLE_ALERTS = {"hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
                   "hw_power_brake_slowdown": "HW power brake", "sw_thermal_slowdown": "SW thermal slowdown"}


@dataclass
class Reading:
    """One GPU as nvidia-smi saw it; None: not reported."""

    index: int
    bus_id: str = ""
    name: str | None = None
    persistence: bool | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    remap_corrected: int | None = None
    remap_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages: int | None = None
    retired_pending: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    temperature: float | None = None
    thermal_margin: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: list[str] = field(default_factory=list)


def _num(value: Any) -> float | None:
    if value is None or str(value).strip().lower() in _NA:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", str(value))
    return float(m.group(1)) if m else None


def _int(value: Any) -> int | None:
    n = _num(value)
    return None if n is None else int(n)


def _yes(value: Any) -> bool | None:
    if value is None:
        return None
    v = str(value).strip().lower()
    if v in ("yes", "enabled", "active", "1", "true"):
        return True
    if v in ("no", "disabled", "not active", "0", "false"):
        return False
    return None


# -- nvidia-smi -q ---------------------------------------------------------------------

def _tree(text: str) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """Top-level key/values and one nested mapping per `GPU <bus id>` section."""
    top: dict[str, Any] = {}
    gpus: list[tuple[str, dict[str, Any]]] = []
    stack: list[tuple[int, dict[str, Any]]] = [(-1, top)]
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        m = _GPU_HEAD.match(line) if indent == 0 else None
        if m:
            section: dict[str, Any] = {}
            gpus.append((m.group(1), section))
            stack = [(-1, top), (0, section)]
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = line.partition(" : ") if " : " in line else line.partition(":")
        key, value = key.strip(), value.strip()
        if sep and value:
            stack[-1][1].setdefault(key, value)
        else:
            child: dict[str, Any] = {}
            stack[-1][1].setdefault(key, child)
            stack.append((indent, child))
    return top, gpus


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _sum_where(d: Any, words: tuple[str, ...], exclude: tuple[str, ...] = ()) -> int | None:
    """Sum of numeric leaves whose key contains one of `words`; None if none was readable."""
    if not isinstance(d, dict):
        return None
    total, seen = 0, False
    for k, v in d.items():
        if any(x in k for x in exclude):
            continue
        if isinstance(v, dict):
            sub = _sum_where(v, words, exclude)
        elif any(w in k for w in words):
            sub = _int(v)
        else:
            continue
        if sub is not None:
            total, seen = total + sub, True
    return total if seen else None


def _ecc(d: Any, kind: str) -> int | None:
    """kind 'Uncorrectable' or 'Correctable' over the DRAM/SRAM layout, or the older
    'Double Bit'/'Single Bit' layout (its Total line)."""
    if not isinstance(d, dict):
        return None
    if kind == "Uncorrectable":
        new = _sum_where(d, ("Uncorrectable",))
        old = _int(_get(d, "Double Bit", "Total"))
    else:
        new = _sum_where(d, ("Correctable",), exclude=("Uncorrectable",))
        old = _int(_get(d, "Single Bit", "Total"))
    return new if new is not None else old


def _from_q(index: int, bus: str, g: dict[str, Any]) -> Reading:
    r = Reading(index=index, bus_id=bus, name=g.get("Product Name"))
    r.persistence = _yes(g.get("Persistence Mode"))
    ecc = g.get("ECC Errors")
    r.volatile_uncorrected = _ecc(_get(ecc, "Volatile"), "Uncorrectable")
    r.aggregate_uncorrected = _ecc(_get(ecc, "Aggregate"), "Uncorrectable")
    r.aggregate_corrected = _ecc(_get(ecc, "Aggregate"), "Correctable")
    rows = g.get("Remapped Rows")
    if isinstance(rows, dict):
        r.remap_corrected = _int(rows.get("Correctable Error"))
        r.remap_uncorrected = _int(rows.get("Uncorrectable Error"))
        r.remap_pending = _yes(rows.get("Pending"))
        r.remap_failure = _yes(rows.get("Remapping Failure Occurred"))
    pages = g.get("Retired Pages")
    if isinstance(pages, dict):
        sb = _int(_get(pages, "Single Bit ECC") if not isinstance(pages.get("Single Bit ECC"), dict)
                  else _get(pages, "Single Bit ECC", "Count"))
        db = _int(_get(pages, "Double Bit ECC") if not isinstance(pages.get("Double Bit ECC"), dict)
                  else _get(pages, "Double Bit ECC", "Count"))
        r.retired_pages = None if sb is None and db is None else (sb or 0) + (db or 0)
        r.retired_pending = _yes(pages.get("Pending Page Blacklist") or pages.get("Pending Page Retirement"))
    link = _get(g, "PCI", "GPU Link Info")
    r.pcie_gen = _int(_get(link, "PCIe Generation", "Current"))
    r.pcie_gen_max = _int(_get(link, "PCIe Generation", "Max"))
    r.pcie_width = _int(_get(link, "Link Width", "Current"))
    r.pcie_width_max = _int(_get(link, "Link Width", "Max"))
    temp = g.get("Temperature")
    r.temperature = _num(_get(temp, "GPU Current Temp"))
    r.thermal_margin = _num(_get(temp, "GPU T.Limit Temp"))
    power = g.get("GPU Power Readings") or g.get("Power Readings")
    r.power_w = _num(_get(power, "Power Draw")) or _num(_get(power, "Average Power Draw"))
    r.power_limit_w = _num(_get(power, "Current Power Limit")) or _num(_get(power, "Enforced Power Limit"))
    reasons = g.get("Clocks Event Reasons") or g.get("Clocks Throttle Reasons") or g.get("Clocks Throttle Reason")
    if isinstance(reasons, dict):
        flat = _flatten(reasons)
        for key, label in THROTTLE_ALERTS.items():
            words = key.replace("_", " ")
            if any(k.lower() == words and _yes(v) for k, v in flat.items()):
                r.throttle.append(label)
    return r


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v))
        else:
            out[k] = v
    return out


# -- nvidia-smi --query-gpu=... --format=csv -------------------------------------------

_CSV_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "name": ("name", str), "pci.bus_id": ("bus_id", str), "index": ("index", int),
    "persistence_mode": ("persistence", _yes),
    "ecc.errors.uncorrected.volatile.total": ("volatile_uncorrected", _int),
    "ecc.errors.corrected.aggregate.total": ("aggregate_corrected", _int),
    "ecc.errors.uncorrected.aggregate.total": ("aggregate_uncorrected", _int),
    "remapped_rows.correctable": ("remap_corrected", _int), "remapped_rows.uncorrectable": ("remap_uncorrected", _int),
    "remapped_rows.pending": ("remap_pending", _yes), "remapped_rows.failure": ("remap_failure", _yes),
    "retired_pages.pending": ("retired_pending", _yes),
    "pcie.link.gen.current": ("pcie_gen", _int), "pcie.link.gen.gpucurrent": ("pcie_gen", _int),
    "pcie.link.gen.max": ("pcie_gen_max", _int), "pcie.link.gen.gpumax": ("pcie_gen_max", _int),
    "pcie.link.width.current": ("pcie_width", _int), "pcie.link.width.max": ("pcie_width_max", _int),
    "temperature.gpu": ("temperature", _num), "temperature.gpu.tlimit": ("thermal_margin", _num),
    "power.draw": ("power_w", _num), "power.limit": ("power_limit_w", _num),
    "enforced.power.limit": ("power_limit_w", _num),
}


def _from_csv(text: str) -> list[Reading] | str:
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    header = [re.sub(r"\s*\[.*?\]\s*$", "", h.strip()).lower() for h in rows[0]]
    if not any(h in _CSV_FIELDS or h.startswith(("clocks_event_reasons.", "clocks_throttle_reasons.")) for h in header):
        return "the first line is not a --query-gpu header (run without noheader)"
    out: list[Reading] = []
    for n, row in enumerate(rows[1:]):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            return f"row {n + 2} has {len(row)} fields, the header {len(header)}"
        r = Reading(index=n)
        for h, value in zip(header, row, strict=True):
            value = value.strip()
            if h in _CSV_FIELDS:
                attr, conv = _CSV_FIELDS[h]
                if value.lower() in _NA:
                    continue
                parsed = conv(value)
                if parsed is not None:
                    setattr(r, attr, parsed)
            elif h.startswith(("clocks_event_reasons.", "clocks_throttle_reasons.")):
                reason = h.split(".", 1)[1]
                if reason in THROTTLE_ALERTS and _yes(value):
                    r.throttle.append(THROTTLE_ALERTS[reason])
        out.append(r)
    return out


# -- judging ---------------------------------------------------------------------------

def judge(readings: list[Reading], expect_gpus: int | None = None, gpu_model: str = "",
          thermal_margin_min: float = -2.0) -> tuple[list[CheckResult], list[Metric]]:
    checks: list[CheckResult] = []
    metrics: list[Metric] = [Metric("gpu.count", len(readings), "gpus")]
    if expect_gpus is not None:
        ok = len(readings) == expect_gpus
        checks.append(CheckResult("gpu.count", "pass" if ok else "fail",
                                  f"{len(readings)} GPUs" + ("" if ok else f", the profile expects {expect_gpus}"),
                                  "info" if ok else "critical"))
    for r in readings:
        i = r.index
        if gpu_model and r.name is not None:
            ok = gpu_model.lower() in r.name.lower()
            checks.append(CheckResult("gpu.model", "pass" if ok else "fail", r.name, "info" if ok else "critical", gpu=i))
        if r.volatile_uncorrected is None:
            checks.append(CheckResult("ecc.volatile_uncorrected", "skip", "not reported", gpu=i))
        elif r.volatile_uncorrected > 0:
            checks.append(CheckResult("ecc.volatile_uncorrected", "fail", f"{r.volatile_uncorrected} volatile "
                                      "uncorrectable ECC errors", "critical", gpu=i, code="DBE"))
        else:
            checks.append(CheckResult("ecc.volatile_uncorrected", "pass", "none", gpu=i))
        if r.remap_failure is None and r.remap_pending is None:
            checks.append(CheckResult("row_remap", "skip", "not reported", gpu=i))
        elif r.remap_failure:
            checks.append(CheckResult("row_remap", "fail", "row remapping failure: the GPU is an RMA candidate",
                                      "fatal", gpu=i, code="REMAP_FAILURE"))
        elif r.remap_pending:
            checks.append(CheckResult("row_remap", "fail", "row remapping pending: the GPU needs a reset",
                                      "critical", gpu=i, code="REMAP_PENDING"))
        else:
            checks.append(CheckResult("row_remap", "pass", "none pending", gpu=i))
        if r.retired_pending:
            checks.append(CheckResult("retired_pages", "fail", "page retirement pending: the GPU needs a reset",
                                      "critical", gpu=i, code="RETIRE_PENDING"))
        if r.retired_pages is not None and r.retired_pages >= 60:
            checks.append(CheckResult("retired_pages", "fail", f"{r.retired_pages} retired pages (limit 60)",
                                      "fatal", gpu=i, code="RETIRED_PAGES"))
        if r.pcie_width is not None and r.pcie_width_max is not None:
            ok = r.pcie_width >= r.pcie_width_max
            checks.append(CheckResult("pcie.link", "pass" if ok else "fail",
                                      f"x{r.pcie_width} of x{r.pcie_width_max}", "info" if ok else "critical",
                                      gpu=i, code=None if ok else "PCIE_DOWNTRAINED"))
        if r.throttle:
            checks.append(CheckResult("clocks.events", "warn", "active: " + ", ".join(r.throttle), "warning", gpu=i))
        if r.thermal_margin is not None and r.thermal_margin < thermal_margin_min:
            checks.append(CheckResult("thermal.margin", "fail", f"{r.thermal_margin:g} C to the slowdown limit "
                                      f"(floor {thermal_margin_min:g})", "fatal", gpu=i, code="THERMAL"))
        for name, value, unit in (("ecc.aggregate_corrected", r.aggregate_corrected, "count"),
                                  ("ecc.aggregate_uncorrected", r.aggregate_uncorrected, "count"),
                                  ("row_remap.corrected", r.remap_corrected, "rows"),
                                  ("row_remap.uncorrected", r.remap_uncorrected, "rows"),
                                  ("gpu.temperature", r.temperature, "C"),
                                  ("gpu.thermal_margin", r.thermal_margin, "C"),
                                  ("gpu.power", r.power_w, "W"), ("pcie.gen", r.pcie_gen, "")):
            if value is not None:
                metrics.append(Metric(name, float(value), unit, gpu=i))
    return checks, metrics


def readings(text: str) -> tuple[str, list[Reading]] | str:
    """('q' or 'csv', readings), or why the text is neither form."""
    if "GPU " in text and ("NVSMI LOG" in text or "Product Name" in text):
        top, sections = _tree(text)
        if not sections:
            return "no `GPU <bus id>` section"
        attached = _int(top.get("Attached GPUs"))
        if attached is not None and attached != len(sections):
            return f"truncated: {attached} GPUs attached, {len(sections)} listed"
        return "q", [_from_q(i, bus, g) for i, (bus, g) in enumerate(sections)]
    first = text.strip().splitlines()[0] if text.strip() else ""
    if "," in first or first.strip().lower() in _CSV_FIELDS:
        got = _from_csv(text)
        return got if isinstance(got, str) else ("csv", got)
    return "neither `nvidia-smi -q` nor `--query-gpu --format=csv` output"


def parse(text: str, node: str, now: float, expect_gpus: int | None = None, gpu_model: str = "") -> Result:
    if not text or not text.strip():
        return error_result(node, "nvidia-smi", "nvidia-smi printed nothing", now)
    if len(text) > MAX_BYTES:
        return error_result(node, "nvidia-smi", f"{len(text)} bytes of output is over the {MAX_BYTES} limit", now)
    if "NVIDIA-SMI has failed" in text or "couldn't communicate with the NVIDIA driver" in text:
        return Result(node=node, source="nvidia-smi", started=now, finished=now,
                      checks=(CheckResult("nvml.init", "error", text.strip().splitlines()[0][:200], "critical"),))
    got = readings(text)
    if isinstance(got, str):
        return error_result(node, "nvidia-smi", got, now)
    form, rs = got
    if not rs:
        return error_result(node, "nvidia-smi", "no GPU in the output", now)
    checks, metrics = judge(rs, expect_gpus, gpu_model)
    if not checks:
        return error_result(node, "nvidia-smi", f"{form} output with no field a check can use", now)
    return Result(node=node, source=f"nvidia-smi-{form}", started=now, finished=now, checks=tuple(checks),
                  metrics=tuple(metrics))
