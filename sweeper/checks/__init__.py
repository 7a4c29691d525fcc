"""Node-local health checks: what `sweeper check` runs inside a Job on the node.

The checks talk to NVML through whatever module is handed to them: the real `pynvml`
bindings on a GPU node, or `checks.fake.FakeNvml` in the simulated cluster. A counter the
GPU does not support is `skip` with a reason; a library or log that cannot be read is
`error`; nothing is a pass without a reading.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeper.checks.options import CheckOptions
from sweeper.parsers.kernel_log import normalise_pci, parse_xids
from sweeper.result import CheckResult, Metric, Result
from sweeper.xid import lookup

_XID_STATUS = {"ignore": "pass", "restart_app": "warn"}
_PIDNAME = re.compile(r"pid=('[^']*'|\S+?),\s*name=(\S+?),\s*")


class _Collector:
    def __init__(self) -> None:
        self.checks: list[CheckResult] = []
        self.metrics: list[Metric] = []

    def check(self, name: str, status: str, message: str = "", severity: str = "info",
              gpu: int | None = None, code: str | None = None) -> None:
        self.checks.append(CheckResult(name, status, message, severity, gpu, code))

    def metric(self, name: str, value: float, unit: str = "", gpu: int | None = None) -> None:
        self.metrics.append(Metric(name, float(value), unit, gpu))


def _nvml_call(nvml: Any, fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """('ok', value), ('unsupported', None) or ('error', message)."""
    try:
        return "ok", fn(*args)
    except nvml.NVMLError_NotSupported:
        return "unsupported", None
    except nvml.NVMLError as exc:
        return "error", str(exc)


def read_kernel_log(opts: CheckOptions) -> tuple[str | None, str]:
    """The kernel log text, or None and why it could not be read."""
    if opts.kernel_log:
        try:
            return Path(opts.kernel_log).read_text(errors="replace"), ""
        except OSError as exc:
            return None, f"cannot read {opts.kernel_log}: {exc}"
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run dmesg: {exc}"
    if proc.returncode != 0:
        return None, f"dmesg exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return proc.stdout, ""


def system_uptime() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run_node_checks(opts: CheckOptions, nvml: Any, kernel_log: str | None, *, now: float,
                    uptime: float | None = None, kernel_log_error: str = "") -> Result:
    """Every node-local check, as one result document."""
    c = _Collector()
    bus_to_gpu = _gpu_checks(opts, nvml, c)
    _xid_checks(opts, kernel_log, kernel_log_error, uptime, bus_to_gpu, c)
    return Result(node=opts.node, source="sweeper-check", started=now, finished=now,
                  checks=tuple(c.checks), metrics=tuple(c.metrics))


def _gpu_checks(opts: CheckOptions, nvml: Any, c: _Collector) -> dict[str, int]:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        c.check("nvml.init", "error", f"NVML could not be initialised: {exc}", "critical")
        return {}
    bus_to_gpu: dict[str, int] = {}
    try:
        state, count = _nvml_call(nvml, nvml.nvmlDeviceGetCount)
        if state != "ok":
            c.check("gpu.count", "error", f"cannot count GPUs: {count}", "critical")
            return {}
        c.metric("gpu.count", count)
        if count != opts.expect_gpus:
            c.check("gpu.count", "fail", f"{count} GPUs visible, the profile expects {opts.expect_gpus}",
                    "critical")
        else:
            c.check("gpu.count", "pass", f"{count} GPUs")
        state, driver = _nvml_call(nvml, nvml.nvmlSystemGetDriverVersion)
        if state == "ok":
            c.check("driver.version", "pass", str(driver))
        for i in range(count):
            state, h = _nvml_call(nvml, nvml.nvmlDeviceGetHandleByIndex, i)
            if state != "ok":
                c.check("gpu.handle", "fail", f"GPU {i} does not answer: {h}", "critical", gpu=i)
                continue
            _one_gpu(opts, nvml, h, i, c, bus_to_gpu)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return bus_to_gpu


def _one_gpu(opts: CheckOptions, nvml: Any, h: Any, i: int, c: _Collector, bus_to_gpu: dict[str, int]) -> None:
    state, pci = _nvml_call(nvml, nvml.nvmlDeviceGetPciInfo, h)
    if state == "ok":
        bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        bus_to_gpu[normalise_pci(bus)] = i
    state, name = _nvml_call(nvml, nvml.nvmlDeviceGetName, h)
    if state != "ok":
        c.check("gpu.model", "error", f"cannot read the model: {name}", "warning", gpu=i)
    elif opts.gpu_model and opts.gpu_model.lower() not in str(name).lower():
        c.check("gpu.model", "fail", f"model {name!r}, the profile expects {opts.gpu_model!r}", "critical", gpu=i)
    else:
        c.check("gpu.model", "pass", str(name), gpu=i)
    state, temp = _nvml_call(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    if state == "ok":
        c.metric("gpu.temperature", temp, "C", gpu=i)
    _ecc(nvml, h, i, c)
    _remap(nvml, h, i, c)


def _ecc(nvml: Any, h: Any, i: int, c: _Collector) -> None:
    unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    cor = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    state, dbe = _nvml_call(nvml, nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_VOLATILE_ECC)
    if state == "unsupported":
        c.check("ecc.volatile_uncorrected", "skip", "ECC counters not supported on this GPU", gpu=i)
        return
    if state == "error":
        c.check("ecc.volatile_uncorrected", "error", f"cannot read ECC counters: {dbe}", "warning", gpu=i)
        return
    if dbe > 0:
        c.check("ecc.volatile_uncorrected", "fail", f"{dbe} volatile uncorrectable ECC errors", "critical",
                gpu=i, code="DBE")
    else:
        c.check("ecc.volatile_uncorrected", "pass", "no volatile uncorrectable ECC errors", gpu=i)
    for label, etype in (("corrected", cor), ("uncorrected", unc)):
        state, value = _nvml_call(nvml, nvml.nvmlDeviceGetTotalEccErrors, h, etype, nvml.NVML_AGGREGATE_ECC)
        if state == "ok":
            c.metric(f"ecc.aggregate_{label}", value, "count", gpu=i)


def _remap(nvml: Any, h: Any, i: int, c: _Collector) -> None:
    state, rows = _nvml_call(nvml, nvml.nvmlDeviceGetRemappedRows, h)
    if state == "unsupported":
        c.check("row_remap", "skip", "row remapping not supported on this GPU", gpu=i)
        return
    if state == "error":
        c.check("row_remap", "error", f"cannot read row remapping: {rows}", "warning", gpu=i)
        return
    corrected, uncorrected, pending, failure = rows
    c.metric("row_remap.corrected", corrected, "rows", gpu=i)
    c.metric("row_remap.uncorrected", uncorrected, "rows", gpu=i)
    if failure:
        c.check("row_remap", "fail", "row remapping failure: the GPU is an RMA candidate", "fatal", gpu=i,
                code="REMAP_FAILURE")
    elif pending:
        c.check("row_remap", "fail", "row remapping pending: the GPU needs a reset", "critical", gpu=i,
                code="REMAP_PENDING")
    else:
        c.check("row_remap", "pass", f"{corrected + uncorrected} rows remapped, none pending", gpu=i)


def _xid_checks(opts: CheckOptions, kernel_log: str | None, why: str, uptime: float | None,
                bus_to_gpu: dict[str, int], c: _Collector) -> None:
    if kernel_log is None:
        c.check("xid", "error", f"kernel log unreadable: {why}", "critical")
        return
    events = parse_xids(kernel_log)
    if uptime is not None:
        events = [e for e in events if e.uptime is None or e.uptime >= uptime - opts.xid_window]
    if not events:
        c.check("xid", "pass", "no XID in the kernel log window")
        return
    for e in events:
        info = lookup(e.code)
        status = _XID_STATUS.get(info.action, "fail")
        action = info.action
        if e.code == 154 and e.recovery_action:
            action = e.recovery_action
            status = "pass" if e.recovery_action.lower() == "none" else "fail"
        detail = _PIDNAME.sub("", e.message).strip().rstrip(".")
        c.check("xid", status, f"XID {e.code} ({info.meaning}) on {e.pci}" + (f": {detail[:160]}" if detail else "")
                + f"; action: {action}",
                info.severity, gpu=bus_to_gpu.get(e.pci), code=str(e.code))
