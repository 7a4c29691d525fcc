"""The XID catalogue as data: meaning, severity and action per code, overridable per cluster."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from sweeper.errors import ConfigError
from sweeper.parsers.kernel_log import KernelLog, LostGpu, XidEvent, scan
from sweeper.result import CheckResult, Metric
from sweeper.schema import safe_load

ACTIONS = ("ignore", "restart_app", "reset_gpu", "reboot", "replace", "inspect", "follow_text")
SEVERITIES = ("info", "warning", "critical", "fatal")


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    action: str
    severity: str


UNKNOWN_ACTION = "reset_gpu"


def _parse(raw: object, origin: str) -> dict[int, XidInfo]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: the XID catalogue must be a mapping of code to entry")
    out: dict[int, XidInfo] = {}
    for code, entry in raw.items():
        if not isinstance(code, int) or not isinstance(entry, dict):
            raise ConfigError(f"{origin}: XID {code!r}: expected an integer code with a mapping")
        action = entry.get("action", "")
        severity = entry.get("severity", "")
        if action not in ACTIONS or severity not in SEVERITIES:
            raise ConfigError(f"{origin}: XID {code}: action must be one of {ACTIONS}, severity one of {SEVERITIES}")
        out[code] = XidInfo(code, str(entry.get("meaning", "")), action, severity)
    return out


@lru_cache(maxsize=1)
def default_catalogue() -> dict[int, XidInfo]:
    text = resources.files("sweeper").joinpath("data/xid.yaml").read_text()
    return _parse(safe_load(text), "sweeper/data/xid.yaml")


def load_catalogue(override: Path | None = None) -> dict[int, XidInfo]:
    cat = dict(default_catalogue())
    if override is not None:
        try:
            raw = safe_load(override.read_text())
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read the XID catalogue {override}: {exc}") from exc
        cat.update(_parse(raw, str(override)))
    return cat


def lookup(code: int, catalogue: dict[int, XidInfo] | None = None) -> XidInfo:
    """An XID missing from the catalogue is treated as needing a GPU reset, never ignored."""
    cat = catalogue if catalogue is not None else default_catalogue()
    return cat.get(code) or XidInfo(code, "unknown XID", UNKNOWN_ACTION, "critical")


_STATUS = {"ignore": "pass", "restart_app": "warn"}
# NVLink XIDs: 74 and 136 on A100/H100, 144-150 on the Blackwell drivers, which say "Fatal" or
# "Nonfatal" in the line (NVIDIA's XID catalogue; leptonai/gpud#1160 shows the wording).
NVLINK = frozenset({74, 136, 137, 144, 145, 146, 147, 148, 149, 150, 155})
# SXIDs the Fabric Manager user guide lists as fatal, for lines that do not say which they are (its
# "NVSwitch SXid errors" table; leptonai/gpud#338 quotes the 12028 row).
FATAL_SXIDS = frozenset({12028})
_RANK = {"pass": 0, "warn": 1, "fail": 2}
# Bounded: a pid is a number or '<unknown>', a process name at most TASK_COMM_LEN (16) as the driver
# prints it; unbounded, a line of "pid=" repeated is scanned to its end from each one.
_PIDNAME = re.compile(r"pid=('[^'\n]{0,64}'|\S{1,64}?),\s*name=(\S{1,256}?),\s*")


def judge(events: Iterable[XidEvent], bus_to_gpu: dict[str, int] | None = None,
          catalogue: dict[int, XidInfo] | None = None) -> tuple[list[CheckResult], list[Metric]]:
    """One finding per (code, device, driver verdict), however many lines repeat it, so that an
    XID storm is one finding with a count and not thousands; and a count per code and GPU as a
    metric. XID 154 carries the driver's own recovery verdict, which outranks the catalogue.
    NVSwitch SXIDs number their own codes and say their own severity ("Fatal" or "Non-fatal"
    first in the message): a fatal one fails `sxid` (the fabric needs the GPUs and switches
    reset, which on these baseboards is a reboot), a non-fatal one warns and is counted."""
    groups: dict[tuple[bool, int, str, str | None], list[XidEvent]] = {}
    for e in events:
        groups.setdefault((e.switch, e.code, e.pci, e.recovery_action), []).append(e)
    checks: list[CheckResult] = []
    metrics: list[Metric] = []
    for (switch, code, pci, recovery), same in groups.items():
        detail = _PIDNAME.sub("", same[-1].message).strip().rstrip(".")
        n = sum(e.count for e in same)
        times = f" x{n}" if n > 1 else ""
        if switch:
            said = {e.message.split(",", 1)[0].strip().lower() for e in same}
            fatal = "fatal" in said or (code in FATAL_SXIDS and not said & {"non-fatal", "nonfatal"})
            checks.append(CheckResult(
                "sxid", "fail" if fatal else "warn",
                f"SXID {code} on NVSwitch {pci}{times}: {detail[:160]}; action: "
                + ("reset the GPUs and switches (reboot)" if fatal else "none unless it persists"),
                "critical" if fatal else "warning", None, str(code)))
            metrics.append(Metric(f"sxid.{code}", float(n), "events", None))
            continue
        info = lookup(code, catalogue)
        status = _STATUS.get(info.action, "fail")
        action = info.action
        if code == 154 and recovery:
            action = recovery
            status = "pass" if recovery.lower() == "none" else "fail"
        if code in NVLINK and re.search(r"\bNonfatal\b", same[-1].message):
            status = "warn"
        severity = info.severity
        causes = sorted({e.cause for e in same if e.cause is not None and e.cause != code})
        for cause in causes:  # the line's own code is what it reports; what caused it can raise it
            why = lookup(cause, catalogue)
            raised = "warn" if cause in NVLINK else _STATUS.get(why.action, "fail")
            if _RANK[raised] > _RANK[status]:
                status, severity = raised, why.severity if raised == "fail" else "warning"
                action = f"{why.action} (for XID {cause}, {why.meaning})"
        gpu = (bus_to_gpu or {}).get(pci)
        checks.append(CheckResult("xid", status, f"XID {code} ({info.meaning}) on {pci}{times}"
                                  + (f": {detail[:160]}" if detail else "") + f"; action: {action}",
                                  severity, gpu, str(code)))
        metrics.append(Metric(f"xid.{code}", float(n), "events", gpu))
    return checks, metrics


def _lost_checks(lost: Iterable[LostGpu], bus_to_gpu: dict[str, int] | None) -> list[CheckResult]:
    out = []
    for e in lost:
        times = f" x{e.count}" if e.count > 1 else ""
        where = e.pci or "a GPU the log does not name"
        out.append(CheckResult("gpu.lost", "fail", f"the driver lost or could not start {where}{times}: "
                               f"{e.message[:200]}; action: reboot, replace if it persists", "fatal",
                               (bus_to_gpu or {}).get(e.pci), "GPU_LOST"))
    return out


def judge_kernel_log(log: str | Iterable[str] | KernelLog, bus_to_gpu: dict[str, int] | None = None, *,
                     since: float | None = None,
                     catalogue: dict[int, XidInfo] | None = None) -> tuple[list[CheckResult], list[Metric]]:
    """The one judge of a kernel log (`sweeper check` and `sweeper ingest` both call it): its
    text, its lines (a stream), or a scan of them. A log with no line shaped like dmesg, the
    journal or syslog is `error` (it is not a kernel log); one with no XID and no lost GPU is
    `pass`. `since` (seconds of uptime) leaves out events logged before it."""
    found = log if isinstance(log, KernelLog) else scan(log.splitlines() if isinstance(log, str) else log)
    if not found.recognised:
        why = ("the kernel log is empty" if not found.lines else
               f"none of its {found.lines} line(s) is shaped like a kernel log's (dmesg, journalctl or syslog)")
        return [CheckResult("xid", "error", why, "critical", code="NOT_A_KERNEL_LOG")], []
    events, lost = found.events, found.lost
    if since is not None:
        events = [e for e in events if e.last_uptime is None or e.last_uptime >= since]
        lost = [e for e in lost if e.last_uptime is None or e.last_uptime >= since]
    if not events and not lost:
        return [CheckResult("xid", "pass", f"no XID and no lost GPU in {found.recognised} kernel log line(s)")], []
    checks, metrics = judge(events, bus_to_gpu, catalogue) if events else ([], [])
    return _lost_checks(lost, bus_to_gpu) + checks, metrics
