"""NVIDIA's XID catalogue as data (every code, its buckets), and what Sweeper does about each code."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import ConfigError
from sweeper.parsers.kernel_log import KernelLog, LostGpu, XidEvent, scan
from sweeper.result import CheckResult, Metric
from sweeper.schema import safe_load

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

# NVIDIA's Immediate Action bucket -> Sweeper's action. What each bucket means is the catalogue's
# "Fault Resolution Buckets" sheet (same page): IGNORE "no action required"; RESTART_APP "the
# application should be restarted, RESET_GPU or RESTART_BM is not deemed necessary"; RESET_GPU;
# RESTART_BM "restart bare metal"; RESTART_VM "VM owning the affected GPU must be restarted";
# CHECK_MECHANICALS "check device seating and connections"; UPDATE_SWFW "update firmware and
# software"; CONTACT_SUPPORT; XID_154 "follow XID 154 reported guidance"; CHECK_UVM "if UVM/vGPU is
# being utilized, RESET_GPU; otherwise IGNORE"; the WORKFLOW_* buckets (45, 48, 74, 144-150) name
# the workflow to follow. Rows 162-172 name no bucket.
BUCKET_ACTIONS = {
    "IGNORE": "ignore", "RESTART_APP": "restart_app", "RESET_GPU": "reset_gpu", "RESTART_BM": "reboot",
    "RESTART_VM": "reboot", "CHECK_MECHANICALS": "inspect", "UPDATE_SWFW": "update_swfw",
    "CONTACT_SUPPORT": "contact_support", "XID_154": "follow_text", "CHECK_UVM": "check_uvm",
    "WORKFLOW_XID_45": "workflow_45", "WORKFLOW_XID_48": "workflow_48", "WORKFLOW_NVLINK_ERR": "workflow_nvlink",
    "WORKFLOW_NVLINK5_ERR": "workflow_nvlink5", "": "none_listed",
}
ACTIONS = ("ignore", "restart_app", "reset_gpu", "reboot", "replace", "inspect", "update_swfw",
           "contact_support", "follow_text", "check_uvm", "workflow_45", "workflow_48", "workflow_nvlink",
           "workflow_nvlink5", "none_listed", "unknown")
SEVERITIES = ("info", "warning", "critical", "fatal")
# Actions that never hold a node: the finding is `warn` (kept in history with a per-GPU count,
# which a trend rule may escalate). CHECK_UVM: a swept node runs nothing, so no UVM is in use.
WARN_ONLY = frozenset({"ignore", "restart_app", "check_uvm", "none_listed", "unknown"})
# Actions a GPU reset clears (NVIDIA's RESET_GPU; XID 48's workflow resets, solo or with 63/64;
# a fatal NVLink error needs "a GPU reset or node reboot").
RESETS = frozenset({"reset_gpu", "workflow_48", "workflow_nvlink", "workflow_nvlink5"})
_SEVERITY = {"ignore": "info", "restart_app": "warning", "reboot": "fatal",
             "none_listed": "warning", "unknown": "warning", "check_uvm": "warning"}


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    action: str
    severity: str
    mnemonic: str = ""
    immediate: str = ""  # NVIDIA's Immediate Action bucket, as the catalogue spells it
    investigatory: str = ""  # NVIDIA's Investigatory Action bucket
    applies_to: tuple[str, ...] = ()  # the catalogue's A100, H100, B100, GB200 columns that say YES


def _from_catalog(code: int, row: dict[str, Any]) -> XidInfo:
    bucket = str(row.get("immediate") or "")
    if bucket not in BUCKET_ACTIONS:
        raise ConfigError(f"XID {code}: the catalogue's bucket {bucket!r} has no action in BUCKET_ACTIONS")
    action = BUCKET_ACTIONS[bucket]
    return XidInfo(code, str(row.get("description", "")), action, _SEVERITY.get(action, "critical"),
                   str(row.get("mnemonic", "")), bucket, str(row.get("investigatory") or ""),
                   tuple(row.get("applies_to") or ()))


def _parse(raw: object, origin: str) -> dict[int, XidInfo]:
    """A cluster's override: code -> {meaning, action, severity}."""
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
def catalog_document() -> dict[str, Any]:
    """sweeper/data/xid-catalog.yaml as it is: source, dates and the rows."""
    doc = safe_load(resources.files("sweeper").joinpath("data/xid-catalog.yaml").read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("codes"), dict):
        raise ConfigError("sweeper/data/xid-catalog.yaml: expected a mapping with `codes`")
    return doc


@lru_cache(maxsize=1)
def default_catalogue() -> dict[int, XidInfo]:
    return {int(code): _from_catalog(int(code), row) for code, row in catalog_document()["codes"].items()}


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
    """A code the catalogue lacks is `unknown`: a warning ("unknown XID N"), never a reset on first sight."""
    cat = catalogue if catalogue is not None else default_catalogue()
    return cat.get(code) or XidInfo(code, f"unknown XID {code}", "unknown", "warning")


def resets(code: int) -> bool:
    """Whether a failed XID of this code is cleared by a GPU reset (the remedy may reset, not reboot)."""
    return lookup(code).action in RESETS


# NVLink XIDs: 74 and 136 on A100/H100, 144-150 on the Blackwell drivers, which say "Fatal" or
# "Nonfatal" in the line (NVIDIA's XID catalogue; leptonai/gpud#1160 shows the wording).
NVLINK = frozenset({74, 136, 137, 144, 145, 146, 147, 148, 149, 150, 155})
NVLINK5 = frozenset(range(144, 151))
# SXIDs the Fabric Manager user guide lists as fatal, for lines that do not say which they are (its
# "NVSwitch SXid errors" table; leptonai/gpud#338 quotes the 12028 row).
FATAL_SXIDS = frozenset({12028})
_RANK = {"pass": 0, "warn": 1, "fail": 2}
# Bounded: a pid is a number or '<unknown>', a process name at most TASK_COMM_LEN (16) as the driver
# prints it; unbounded, a line of "pid=" repeated is scanned to its end from each one.
_PIDNAME = re.compile(r"pid=('[^'\n]{0,64}'|\S{1,64}?),\s*name=(\S{1,256}?),\s*")
# XID 154's text -> (status, finding code): the catalogue's row 154 lists the values "None",
# "Drain P2P", "Drain and Reset", "GPU Reset Required", "Node Reboot Required". The codes are those
# of the NVML reading of the same verdict (sweeper/checks/gpu.py RECOVERY): a swept node is
# already drained, so "Drain and Reset" is a reset.
RECOVERY_TEXT = {"none": ("pass", ""), "drain p2p": ("warn", "RECOVERY_DRAIN_P2P"),
                 "drain and reset": ("fail", "RECOVERY_RESET"), "gpu reset required": ("fail", "RECOVERY_RESET"),
                 "node reboot required": ("fail", "RECOVERY_REBOOT")}
# WORKFLOW_NVLINK_ERR (XID 74), the catalogue's "Fault Resolution Buckets" sheet: of the seven
# fields, the first, third, fourth and fifth are valid on Hopper; first-register bits 0, 23 and 30
# "can be safely ignored", fifth-register bits 20, 23, 26 and 29 are a corrected-ECC threshold
# ("continue operation"). Every other bit it lists needs the link looked at: the row says a GPU
# reset or node reboot clears the error.
_NVLINK74_HARMLESS = {0: 1 << 0 | 1 << 23 | 1 << 30, 4: 1 << 20 | 1 << 23 | 1 << 26 | 1 << 29}
_NVLINK74_FIELDS = re.compile(r"\((0x[0-9a-fA-F]+(?:,\s*0x[0-9a-fA-F]+){3,})\)")


def nvlink74(message: str) -> tuple[str, str]:
    """XID 74 decoded by NVIDIA's workflow: `warn` when every set bit is one it says to ignore or to
    continue past, `fail` otherwise (and when the line has no fields to decode)."""
    m = _NVLINK74_FIELDS.search(message)
    if m is None:
        return "fail", "no error fields to decode: reset the GPU (NVIDIA's XID 74 row)"
    regs = [int(v, 16) for v in re.split(r",\s*", m.group(1))]
    left = [(i, v & ~_NVLINK74_HARMLESS.get(i, 0)) for i, v in enumerate(regs) if i in (0, 2, 3, 4)]
    bits = [f"register {i + 1} bit {b}" for i, v in left for b in range(32) if v >> b & 1]
    if not bits:
        return "warn", "only bits NVIDIA's XID 74 workflow says to ignore or continue past"
    return "fail", f"{', '.join(bits[:4])}: reset the GPU, check the link if it returns (NVIDIA's XID 74 workflow)"


# The catalogue's "XID 144-150 Decode" sheet: per sub-component (as the line names it, before and
# from R575) and Error Status (the second field), the Immediate bucket: I = IGNORE, E = XID_154_EVAL
# (RESTART_APP without an XID 154), R = RESET_GPU. A status not listed is decided by the line's own
# "Fatal"/"Nonfatal". RLW_RXPIPE's 0x1-0x4 are promoted to RESET_GPU when IntrInfo's action-2 bit is
# set (bit 10 before R575, bit 7 from it). NETIR sub-components are RESET_GPU ("Link Fatal"), but for
# the link-down reasons 0b100110 and 0b101000 (IGNORE); before R575 the reason is IntrInfo[25:20]
# (leptonai/gpud's tests read 0x026001c6 as reason 38 and 0x025001c6 as 37, a peer device).
_TLW = {0x1: "I", 0x2: "I", 0x4: "R", 0x80000000: "I"}
NVLINK5_DECODE: dict[str, dict[int, str]] = {
    "SAW_MVB": {0x1: "I", 0x2: "R", 0x4: "I", 0x8: "I", 0x10: "R", 0x20: "I"},
    "RLW_CTRL": {0x80000000: "I"},
    "RLW_REMAP": {**dict.fromkeys((0x1, 0x2, 0x4, 0x8, 0x10, 0x20), "E"), 0x40: "R", 0x80: "R", 0x100: "I",
                  0x200: "I", 0x80000000: "I"},
    "RLW_RSPCOL": {0x1: "I", 0x2: "R", 0x80000000: "I"},
    "RLW_RXPIPE": {0x1: "I", 0x2: "I", 0x4: "I", 0x8: "I", 0x80000000: "I"},
    "RLW_SRC_TRACK": {0x1: "R", 0x2: "I", 0x4: "E", 0x8: "E", 0x10: "R", 0x20: "R", 0x80000000: "I"},
    "RLW_TAGSTATE": {0x1: "I", 0x2: "R", 0x10000: "I", 0x20000: "R", 0x100000: "R", 0x80000000: "I"},
    **dict.fromkeys(("TLW_CTRL", "TLW_RX", "TLW_RX_PIPE0", "TLW_RX_PIPE1", "TLW_TX", "TLW_TX_PIPE0",
                     "TLW_TX_PIPE1"), _TLW),
    "TREX": {0x1: "I", 0x80000000: "I"},
    "NVLPW_CTRL": {0x80000000: "I"}, "NVLPW": {0x80000000: "I"},
    "NETIR_BER_EVENT": {0x0: "I", 0x1: "I", 0x2: "I", 0x3: "I"},
    "NETIR_MFDE_EVENT": {0x1: "R", 0x3: "I", 0x4: "R", 0x5: "R", 0x7: "R"},
    "MSE_WATCHDOG": {0x0: "R"},
}
_NETIR_FATAL = ("NETIR", "NETIR_INT", "NETIR_LINK_EVT", "NETIR_LINK_DOWN")
_NETIR_IGNORED_REASONS = {0b100110, 0b101000}
_NVLINK5_LINE = re.compile(r"\b(?P<sub>[A-Z][A-Z0-9_]*)\s+(?P<sev>Fatal|Nonfatal)\b.*?\(\s*(?P<intr>0x[0-9a-fA-F]+)"
                           r"(?:[\s,]+(?P<status>0x[0-9a-fA-F]+))?")
_BUCKET_STATUS = {"I": ("warn", "IGNORE"), "E": ("warn", "XID_154_EVAL: restart the application, or follow "
                                                          "XID 154"), "R": ("fail", "RESET_GPU")}


def nvlink5(message: str) -> tuple[str, str] | None:
    """An XID 144-150 line decoded by the catalogue's sheet: (status, why), or None where the sheet
    does not say (the line's own Fatal/Nonfatal decides then)."""
    m = _NVLINK5_LINE.search(message)
    if m is None:
        return None
    sub, intr = m.group("sub"), int(m.group("intr"), 16)
    status = int(m.group("status"), 16) if m.group("status") else None
    if sub in _NETIR_FATAL:
        reason = intr >> 20 & 0x3F
        if sub == "NETIR_LINK_EVT" and reason in _NETIR_IGNORED_REASONS:
            return "warn", f"{sub} reason {reason:#08b}: IGNORE (NVIDIA's XID 144-150 decode)"
        return "fail", f"{sub}: RESET_GPU (NVIDIA's XID 144-150 decode: link fatal)"
    table = NVLINK5_DECODE.get(sub)
    if table is None or status is None:
        return None
    bits = [status] if status in table else [1 << b for b in range(32) if status >> b & 1]
    if not bits or any(b not in table for b in bits):
        return None
    buckets = {table[b] for b in bits}
    if sub == "RLW_RXPIPE" and buckets & {"I"} and bits[0] in (0x1, 0x2, 0x4):
        promoted = intr >> 10 & 1 if intr & 0x3FF == 0b0011000010 else intr >> 7 & 1
        if promoted:
            buckets.add("R")
    worst = "R" if "R" in buckets else "E" if "E" in buckets else "I"
    verdict, bucket = _BUCKET_STATUS[worst]
    return verdict, f"{sub} status {status:#010x}: {bucket} (NVIDIA's XID 144-150 decode)"


def _verdict(code: int, info: XidInfo, same: list[XidEvent], others: set[int]) -> tuple[str, str, str]:
    """(status, what to do, finding code) for one group of lines of one code on one device."""
    a = info.action
    if code == 154 and a == "follow_text":
        said = same[-1].recovery_action
        if said is None:
            return "warn", "follow_text: the line names no recovery action", "154"
        status, finding = RECOVERY_TEXT.get(said.strip().lower(), ("fail", "RECOVERY_UNKNOWN"))
        return status, said, finding or "154"
    if a == "workflow_45":
        if others:
            return "warn", f"ignore, follow XID {', '.join(map(str, sorted(others)))} (NVIDIA's XID 45 workflow)", str(code)
        return ("warn", "restart Fabric Manager where it runs (NVIDIA's solo XID 45 workflow); "
                "the gpu.fabric check holds the node if the fabric is not ready", str(code))
    if a == "workflow_48":
        return ("fail", "reset the GPU (NVIDIA's XID 48 workflow: RESET_GPU, with 63/64 DRAIN_AND_RESET); "
                "the ECC and row-remap checks say whether to replace", str(code))
    if a == "workflow_nvlink":
        status, why = nvlink74(same[-1].message)
        return status, why, str(code)
    if a == "workflow_nvlink5":
        decoded = nvlink5(same[-1].message)
        if decoded is not None:
            return decoded[0], decoded[1], str(code)
        if re.search(r"\bNonfatal\b", same[-1].message, re.I):
            return "warn", "nonfatal: ignore, or follow XID 154 (NVIDIA's XID 144-150 decode)", str(code)
        return "fail", "reset the GPU (NVIDIA's XID 144-150 decode: fatal errors are RESET_GPU)", str(code)
    if a == "unknown":
        return "warn", f"none: unknown XID {code}, not in NVIDIA's catalogue", str(code)
    if a == "none_listed":
        return "warn", "none: NVIDIA's catalogue names no action for this code", str(code)
    if code in NVLINK and re.search(r"\bNonfatal\b", same[-1].message):
        return "warn", a, str(code)
    return ("warn" if a in WARN_ONLY else "fail"), a, str(code)


def judge(events: Iterable[XidEvent], bus_to_gpu: dict[str, int] | None = None,
          catalogue: dict[int, XidInfo] | None = None) -> tuple[list[CheckResult], list[Metric]]:
    """One finding per (code, device, driver verdict), however many lines repeat it, so that an
    XID storm is one finding with a count and not thousands; and a count per code and GPU as a
    metric. Each code does what NVIDIA's catalogue says (BUCKET_ACTIONS; the workflows in
    `_verdict`); XID 154 carries the driver's own recovery verdict, which outranks the catalogue.
    NVSwitch SXIDs number their own codes and say their own severity ("Fatal" or "Non-fatal"
    first in the message): a fatal one fails `sxid` (the fabric needs the GPUs and switches
    reset, which on these baseboards is a reboot), a non-fatal one warns and is counted."""
    events = list(events)
    groups: dict[tuple[bool, int, str, str | None], list[XidEvent]] = {}
    for e in events:
        groups.setdefault((e.switch, e.code, e.pci, e.recovery_action), []).append(e)
    codes = {e.code for e in events if not e.switch}
    checks: list[CheckResult] = []
    metrics: list[Metric] = []
    for (switch, code, pci, _recovery), same in groups.items():
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
        causes = sorted({e.cause for e in same if e.cause is not None and e.cause != code})
        status, action, finding = _verdict(code, info, same, (codes | set(causes)) - {code, 154} if code == 45
                                           else set())
        severity = info.severity if status == "fail" else "warning" if status == "warn" else "info"
        for cause in causes:  # the line's own code is what it reports; what caused it can raise it
            why = lookup(cause, catalogue)
            raised = "warn" if cause in NVLINK or why.action in WARN_ONLY or why.action.startswith("workflow") \
                else "fail"
            if _RANK[raised] > _RANK[status]:
                status, severity = raised, why.severity if raised == "fail" else "warning"
                action = f"{why.action} (for XID {cause}, {why.meaning})"
        gpu = (bus_to_gpu or {}).get(pci)
        name = info.mnemonic if info.meaning in ("", "Unused") else info.meaning
        if detail and detail.lower() in name.lower():  # the driver's words are the catalogue's: say them once
            detail = ""
        checks.append(CheckResult("xid", status, f"XID {code} ({name}) on {pci}{times}"
                                  + (f": {detail[:160]}" if detail else "") + f"; action: {action}",
                                  severity, gpu, finding))
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
