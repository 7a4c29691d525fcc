"""What nvidia-smi prints, read into one reading per GPU and judged by the same rules as the NVML
checks. Fields a GPU does not report (`N/A`, `[Not Supported]`) are skipped, never read as zero.

The shapes read (as printed, or pasted after a prompt line or a runner's prefix, see `paste`):
- `nvidia-smi -q`, whole, or one `-d ECC|PAGE_RETIREMENT|ROW_REMAPPER|TEMPERATURE|PERFORMANCE|CLOCK`
  section per GPU, with or without its `GPU <bus id>` line; `[...]` where GPUs were cut out;
- `nvidia-smi -q -x`, the same readings from nvidia-smi's XML (see `nvidia_smi_xml`);
- `--query-gpu=... --format=csv` (units in the header and the values, `[N/A]`, `[Not Supported]`),
  `--query-remapped-rows`, `--query-retired-pages` (rows of `[N/A]` are no page) and
  `--query-compute-apps` (a process list: `skip`, it says nothing of health);
- what nvidia-smi prints instead of readings: `No devices were found` and `Unable to determine the
  device handle for GPU <bus id>: Unknown Error` (or `GPU is lost`) fail, the GPU is gone; a
  field read as `Unknown Error` or `ERR!` means the GPU did not answer.
- the summary table (`nvidia-smi` alone): each GPU's volatile uncorrectable ECC count and the cells
  printed as `ERR!`; the rest of the health fields are only in `-q` and the CSV queries.

Why it is long: one tool, one parser. The shapes above all fill the same `Reading` through the
same field tables (what is not a value, which keys are health, which throttle reasons alert)
and are judged by one `judge`, the rules the NVML checks use; split by shape, each part would
import the tables and helpers of the others."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.parsers import nvidia_smi_xml
from sweeper.parsers.paste import Paste, clean, unreadable
from sweeper.result import CheckResult, Metric, Result, error_result

SOURCE = "nvidia-smi"
MAX_BYTES = 1024 * 1024  # a whole -q of eight GPUs is about 90 KB
MAX_GPUS = 256  # more is not one node's output
_NA = {"n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "unknown error", "", "[insufficient permissions]"}
_GPU_HEAD = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
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
    sram_threshold: bool | None = None
    recovery_action: int | None = None  # NVML's nvmlDeviceGpuRecoveryAction_t, from -q's words
    channel_repair_pending: bool | None = None
    tpc_repair_pending: bool | None = None
    unrepairable_memory: bool | None = None
    retired_unreported: bool = False  # a Retired Pages section whose every count is N/A
    unreadable: list[str] = field(default_factory=list)  # fields read as Unknown Error / ERR!
    strange: list[str] = field(default_factory=list)  # `field: value` where a value is not one the tool prints


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

# `GPU Recovery Action` in -q (and <gpu_recovery_action> in -q -x): the words of NVIDIA's "Error
# Recovery and Response Flags" (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
# error-recovery-and-response-flags.html) for nvmlDeviceGpuRecoveryAction_t's values 0-4.
RECOVERY_WORDS = {"none": 0, "reset": 1, "reboot": 2, "drain p2p": 3, "drain and reset": 4}
# What each action asks of the node, as the NVML check (`sweeper.checks.gpu`) judges it: (label, code).
RECOVERY = {0: ("none", "pass"), 1: ("GPU reset", "RECOVERY_RESET"), 2: ("node reboot", "RECOVERY_REBOOT"),
            3: ("drain P2P", "RECOVERY_DRAIN_P2P"), 4: ("drain and reset", "RECOVERY_RESET"),
            5: ("recover IMEX domain", "RECOVERY_IMEX"), 6: ("bus reset", "RECOVERY_RESET"),
            7: ("system reboot", "RECOVERY_REBOOT")}


def recovery_verdict(action: int) -> tuple[str, str, str, str | None]:
    """(status, message, severity, code) of a recovery action, the one rule for NVML and nvidia-smi."""
    label, code = RECOVERY.get(action, (f"unknown action {action}", "RECOVERY_UNKNOWN"))
    if action == 0:
        return "pass", "the driver asks for nothing", "info", None
    if code in ("RECOVERY_DRAIN_P2P", "RECOVERY_IMEX"):
        return "warn", f"the driver asks to {label}", "warning", code
    return "fail", f"the driver asks for a {label}", "critical", code


def _flag(r: Reading, name: str, value: Any) -> bool | None:
    """A Yes/No field: None when absent or N/A; any other word is noted as strange (an `error`)."""
    if value is None or isinstance(value, dict) or _na(str(value)):
        return None
    got = _yes(value)
    if got is None and str(value).strip().lower() not in _UNREADABLE:
        r.strange.append(f"{name}: {str(value)[:40]!r}")
    return got


# Sections that `nvidia-smi -q -d ECC|PAGE_RETIREMENT|ROW_REMAPPER|TEMPERATURE|PERFORMANCE|CLOCK`
# print on their own (nvidia-smi(1), "-d, --display"); a paste may carry one with no `GPU` line.
_SECTIONS = ("ecc errors", "ecc mode", "retired pages", "remapped rows", "temperature", "clocks event reasons",
             "clocks throttle reasons", "performance state", "clocks", "max clocks", "gpu power readings",
             "power readings", "pci", "product name")
_UNREADABLE = {"unknown error", "[unknown error]", "err!", "[err!]", "gpu is lost", "[gpu is lost]"}
# Fields some drivers print as `Unknown Error` on a healthy GPU (an RTX 4090 on 535.154.05 in
# leptonai/gpud's nvidia-smi -q captures): not a sign that the GPU stopped answering.
_BENIGN_UNKNOWN = {"addressing mode"}


def _key(k: str) -> str:
    return re.sub(r"\s+", " ", k.strip()).lower()


# What a -q key looks like ("GPU T.Limit Temp", "SRAM Uncorrectable SEC-DED", "Bank Remap
# Availability Histogram"); a line whose key is anything else is noise, not nvidia-smi's.
_Q_KEY = re.compile(r"^[a-z0-9][a-z0-9 ._()/+\-#&',]*$")


# Lines a section always prints (each tuple: names the drivers have used for one line); without
# them the section's verdict cannot be read, whatever the other lines say.
_REQUIRED: dict[str, list[tuple[str, ...]]] = {"remapped rows": [("pending",), ("remapping failure occurred",)],
                                               "retired pages": [("pending page blacklist", "pending page retirement")]}


def _noise(lines: list[str]) -> list[str]:
    """Lines of a -q paste that nvidia-smi cannot have printed (a corrupted or foreign line)."""
    out = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("=") or _GPU_HEAD.match(line):
            continue
        key = line.partition(" : ")[0] if " : " in line else line.partition(":")[0]
        if not _Q_KEY.match(_key(key)):
            out.append(line[:60])
    return out


def _tree(lines: list[str]) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """Top-level key/values and one nested mapping per `GPU <bus id>` section; keys lower-case."""
    top: dict[str, Any] = {}
    gpus: list[tuple[str, dict[str, Any]]] = []
    stack: list[tuple[int, dict[str, Any]]] = [(-1, top)]
    for raw in lines:
        raw = raw.expandtabs(4).rstrip()
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        m = _GPU_HEAD.match(line)
        if m:
            section: dict[str, Any] = {}
            gpus.append((m.group(1), section))
            stack = [(-1, top), (indent, section)]
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = line.partition(" : ") if " : " in line else line.partition(":")
        key, value = _key(key), value.strip()
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
    """kind 'uncorrectable' or 'correctable' over the DRAM/SRAM layout, or the older
    'Double Bit'/'Single Bit' layout (its Total line)."""
    if not isinstance(d, dict):
        return None
    if kind == "uncorrectable":
        new = _sum_where(d, ("uncorrectable",))
        old = _int(_get(d, "double bit", "total"))
    else:
        new = _sum_where(d, ("correctable",), exclude=("uncorrectable",))
        old = _int(_get(d, "single bit", "total"))
    return new if new is not None else old


def _unreadable(d: dict[str, Any], prefix: str = "") -> list[str]:
    """The fields nvidia-smi printed as `Unknown Error` or `ERR!`: it asked the GPU and got no answer."""
    out: list[str] = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.extend(_unreadable(v, k))
        elif str(v).strip().lower() in _UNREADABLE and k not in _BENIGN_UNKNOWN:
            out.append(f"{prefix} {k}".strip())
    return out


def _from_q(index: int, bus: str, g: dict[str, Any]) -> Reading:
    r = Reading(index=index, bus_id=bus, name=g.get("product name"))
    r.persistence = _yes(g.get("persistence mode"))
    ecc = g.get("ecc errors")
    r.volatile_uncorrected = _ecc(_get(ecc, "volatile"), "uncorrectable")
    r.aggregate_uncorrected = _ecc(_get(ecc, "aggregate"), "uncorrectable")
    r.aggregate_corrected = _ecc(_get(ecc, "aggregate"), "correctable")
    r.sram_threshold = _flag(r, "SRAM Threshold Exceeded", _get(ecc, "aggregate", "sram threshold exceeded"))
    # Driver 570 and later: a channel or TPC repair waits for the next reset; memory that cannot be
    # repaired (NVML's nvmlDeviceGetRepairStatus and nvmlDeviceGetUnrepairableMemoryFlag_v1).
    r.channel_repair_pending = _flag(r, "Channel Repair Pending", _get(ecc, "channel repair pending"))
    r.tpc_repair_pending = _flag(r, "TPC Repair Pending", _get(ecc, "tpc repair pending"))
    r.unrepairable_memory = _flag(r, "Unrepairable Memory", _get(ecc, "unrepairable memory"))
    action = g.get("gpu recovery action")
    if isinstance(action, str) and not _na(action):
        r.recovery_action = RECOVERY_WORDS.get(_key(action))
        if r.recovery_action is None and action.strip().lower() not in _UNREADABLE:
            r.strange.append(f"GPU Recovery Action: {action[:40]!r}")
    rows = g.get("remapped rows")
    if isinstance(rows, dict):
        r.remap_corrected = _int(rows.get("correctable error"))
        r.remap_uncorrected = _int(rows.get("uncorrectable error"))
        r.remap_pending = _yes(rows.get("pending"))
        r.remap_failure = _yes(rows.get("remapping failure occurred"))
    pages = g.get("retired pages")
    if isinstance(pages, dict):
        sb = _int(_get(pages, "single bit ecc") if not isinstance(pages.get("single bit ecc"), dict)
                  else _get(pages, "single bit ecc", "count"))
        db = _int(_get(pages, "double bit ecc") if not isinstance(pages.get("double bit ecc"), dict)
                  else _get(pages, "double bit ecc", "count"))
        r.retired_pages = None if sb is None and db is None else (sb or 0) + (db or 0)
        r.retired_pending = _yes(pages.get("pending page blacklist") or pages.get("pending page retirement"))
        r.retired_unreported = r.retired_pages is None and r.retired_pending is None
    link = _get(g, "pci", "gpu link info")
    r.pcie_gen = _int(_get(link, "pcie generation", "current"))
    r.pcie_gen_max = _int(_get(link, "pcie generation", "max"))
    r.pcie_width = _int(_get(link, "link width", "current"))
    r.pcie_width_max = _int(_get(link, "link width", "max"))
    temp = g.get("temperature")
    r.temperature = _num(_get(temp, "gpu current temp"))
    r.thermal_margin = _num(_get(temp, "gpu t.limit temp"))  # degrees to the slowdown limit, NVML's margin
    margin = _get(temp, "gpu t.limit temp")
    if r.thermal_margin is None and isinstance(margin, str) and not _na(margin) \
            and margin.strip().lower() not in _UNREADABLE:
        r.strange.append(f"GPU T.Limit Temp: {margin[:40]!r}")
    power = g.get("gpu power readings") or g.get("power readings")
    r.power_w = _num(_get(power, "power draw")) or _num(_get(power, "average power draw"))
    r.power_limit_w = _num(_get(power, "current power limit")) or _num(_get(power, "enforced power limit"))
    reasons = g.get("clocks event reasons") or g.get("clocks throttle reasons") or g.get("clocks throttle reason")
    if isinstance(reasons, dict):
        flat = _flatten(reasons)
        for key, label in THROTTLE_ALERTS.items():
            words = key.replace("_", " ")
            if any(k == words and _yes(v) for k, v in flat.items()):
                r.throttle.append(label)
    r.unreadable = _unreadable(g)
    return r


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v))
        else:
            out[k] = v
    return out


def _q(paste: Paste) -> tuple[list[Reading], list[CheckResult]] | str:
    """`nvidia-smi -q` (whole, or one `-d` section per GPU, with or without its `GPU` lines)."""
    top, sections = _tree(paste.lines)
    if not sections:
        if not any(k in top for k in _SECTIONS):
            return "no `GPU <bus id>` section and no section nvidia-smi -q prints"
        sections = [("", top)]  # one section pasted bare: a GPU whose bus id the paste left out
    return _sections(top, sections, paste.elided, _noise(paste.lines))


def _xml(paste: Paste) -> tuple[list[Reading], list[CheckResult]] | str:
    """`nvidia-smi -q -x`: the same tree as -q, read from nvidia-smi's XML."""
    try:
        top, sections = nvidia_smi_xml.parse_tree(paste.text)
    except nvidia_smi_xml.XmlRefused as exc:
        return f"nvidia-smi -q -x: {exc}"
    if not sections:
        return "nvidia-smi -q -x with no <gpu> element"
    return _sections(top, sections, paste.elided, [])


def _sections(top: dict[str, Any], sections: list[tuple[str, dict[str, Any]]], elided: bool,
              noise: list[str]) -> tuple[list[Reading], list[CheckResult]]:
    """The readings of -q's (or -q -x's) GPU sections, and what is missing from them."""
    problems: list[CheckResult] = []
    if noise:
        problems.append(CheckResult("nvidia-smi.read", "error", f"{len(noise)} line(s) nvidia-smi -q does not print, "
                                    f"e.g. {noise[0]!r}", "critical"))
    for bus, g in sections:
        if not any(k in g for k in _SECTIONS):
            problems.append(CheckResult("nvidia-smi.read", "error", f"GPU {bus or '(unnamed)'}: no section "
                                        "nvidia-smi -q prints (cut right after its GPU line?)", "critical"))
        for title, groups in _REQUIRED.items():
            sec = g.get(title)
            lacking = [names[0] for names in groups if isinstance(sec, dict) and not any(n in sec for n in names)]
            if lacking:
                problems.append(CheckResult("nvidia-smi.read", "error", f"GPU {bus or '(unnamed)'}: the {title} "
                                            f"section lacks its {lacking[0]} line", "critical"))
    attached = _int(top.get("attached gpus"))
    if attached is not None and attached > len(sections) and not elided and sections[0][0]:
        problems.append(CheckResult("nvidia-smi.read", "error", f"truncated: {attached} GPUs attached, "
                                    f"{len(sections)} listed", "critical"))
    elif not elided and "product name" in sections[-1][1] and "processes" not in sections[-1][1]:
        # A whole `-q` ends every GPU with its Processes section (`-d` output has no Product Name).
        problems.append(CheckResult("nvidia-smi.read", "error", "truncated: the last GPU's section stops before "
                                    "its Processes section", "critical"))
    return [_from_q(i, bus, g) for i, (bus, g) in enumerate(sections)], problems


# -- nvidia-smi --query-gpu|--query-remapped-rows|--query-retired-pages|--query-compute-apps --format=csv

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
# What nvidia-smi prints in the header for a query name that has a long and a short form
# (`nvidia-smi --help-query-gpu`: "gpu_name" or "name", "gpu_bus_id" or "pci.bus_id", ...).
_ALIASES = {"gpu_name": "name", "gpu_bus_id": "pci.bus_id", "gpu_uuid": "uuid", "gpu_serial": "serial"}
_FIELD = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*$")
_THROTTLE_PREFIXES = ("clocks_event_reasons.", "clocks_throttle_reasons.")
_HEALTH_PREFIXES = ("ecc.", "remapped_rows.", "retired_pages.", "pcie.", "temperature.", "power.",
                    "enforced.power", "clocks_event_reasons.", "clocks_throttle_reasons.")
_IDENT = ("pci.bus_id", "uuid", "index", "serial", "name")


def _no_unit(cell: str) -> str:
    """A header cell without its trailing `[unit]` (`memory.used [MiB]`): from the first `[`
    after the one `]` before the last; no regular expression, so no backtracking."""
    if not cell.endswith("]"):
        return cell
    start = cell.find("[", cell.rfind("]", 0, len(cell) - 1) + 1, len(cell) - 1)
    return cell if start < 0 else cell[:start].rstrip()


def _header(line: str) -> list[str] | None:
    """The field names of a `--format=csv` header line, or None when it is not one."""
    cells = [_no_unit(c.strip()).lower() for c in line.split(",")]
    if not cells or not all(_FIELD.match(c) for c in cells):
        return None
    cells = [_ALIASES.get(c, c) for c in cells]
    known = set(_CSV_FIELDS) | set(_IDENT) | {"pid", "process_name", "used_memory", "used_gpu_memory",
                                               "timestamp", "retired_pages.address", "retired_pages.cause"}
    if not any(c in known or c.startswith(_HEALTH_PREFIXES) or c.startswith(("memory.", "utilization.", "clocks."))
               for c in cells):
        return None
    if len(cells) == 1 and cells[0] not in known:
        return None
    return cells


def _csv_rows(lines: list[str], width: int) -> tuple[list[list[str]], list[CheckResult]]:
    rows: list[list[str]] = []
    problems: list[CheckResult] = []
    body = [ln for ln in lines if ln.strip()]
    for n, line in enumerate(body):
        row = [c.strip() for c in next(csv.reader([line], skipinitialspace=True), [])]
        if len(row) != width:
            where = "the last row" if n == len(body) - 1 else f"row {n + 1}"
            problems.append(CheckResult("nvidia-smi.read", "error", f"{where} has {len(row)} fields, the header "
                                        f"{width}: cut or not this query's output", "critical"))
            if n != len(body) - 1:
                break
            continue
        rows.append(row)
    return rows, problems


def _na(value: str) -> bool:
    return value.strip().lower() in _NA


def _retired_pages(header: list[str], rows: list[list[str]]) -> tuple[list[CheckResult], list[Metric]]:
    """`--query-retired-pages`: one row per retired page. A row whose address is `[N/A]` is no page:
    nvidia-smi prints such a row for a GPU that has retired none (`[N/A], [N/A]`), and one per cause
    (`[N/A], Single Bit ECC` and `[N/A], Double Bit ECC`) where the GPU does not report page
    retirement at all: on Ampere and later row remapping replaced it and NVML's
    nvmlDeviceGetRetiredPages answers NotSupported (an H100 on driver 580 prints exactly that)."""
    gpu_col = next((header.index(c) for c in ("pci.bus_id", "uuid", "serial", "name") if c in header), None)
    addr_col = header.index("retired_pages.address") if "retired_pages.address" in header else None
    key_cols = [header.index(c) for c in ("retired_pages.address", "retired_pages.cause") if c in header]
    pages: dict[str, int] = {}
    unreported: set[str] = set()  # GPUs with a cause but no address: page retirement not reported
    for row in rows:
        gpu = row[gpu_col] if gpu_col is not None else ""
        pages.setdefault(gpu, 0)
        if all(_na(row[i]) for i in key_cols):
            continue
        if addr_col is not None and _na(row[addr_col]):
            unreported.add(gpu)
            continue
        pages[gpu] += 1
    checks: list[CheckResult] = []
    metrics: list[Metric] = []
    for i, (gpu, count) in enumerate(sorted(pages.items())):
        label = f"{gpu}: " if gpu else ""
        if count >= 60:
            checks.append(CheckResult("retired_pages", "fail", f"{label}{count} retired pages (limit 60)", "fatal",
                                      gpu=i, code="RETIRED_PAGES"))
        elif gpu in unreported and not count:
            checks.append(CheckResult("retired_pages", "skip", f"{label}no page address, only causes ([N/A]): this "
                                      "GPU does not report page retirement (row remapping replaced it on Ampere "
                                      "and later)", gpu=i))
            continue
        else:
            checks.append(CheckResult("retired_pages", "pass", f"{label}{count} retired pages (limit 60)", gpu=i))
        metrics.append(Metric("retired_pages", count, "pages", gpu=i))
    if not pages:
        checks.append(CheckResult("retired_pages", "pass", "no retired page listed"))
    return checks, metrics


def _from_csv(paste: Paste) -> tuple[str, list[Reading], list[CheckResult], list[Metric]] | str:
    """(query kind, readings, checks, metrics) of a `--format=csv` output, or why it is not one."""
    lines = paste.lines
    candidates = [i for i, line in enumerate(lines[:200]) if line.strip()][:50]  # after a banner, not deeper
    at = next((i for i in candidates if _header(lines[i]) is not None), None)
    header = _header(lines[at]) if at is not None else None
    if header is None or at is None:
        return "no --format=csv header line (run without noheader)"
    rows, problems = _csv_rows(lines[at + 1:], len(header))
    if "retired_pages.address" in header or "retired_pages.cause" in header:
        checks, metrics = _retired_pages(header, rows)
        return "retired-pages", [], problems + checks, metrics
    if "pid" in header or "process_name" in header:
        apps = [r for r in rows if not all(_na(c) for c in r)]
        return "compute-apps", [], problems + [CheckResult(
            "compute.apps", "skip", f"{len(apps)} compute processes listed: a process list says nothing about "
            "the GPU's health")], [Metric("compute.apps", len(apps), "processes")]
    out: list[Reading] = []
    for n, row in enumerate(rows):
        r = Reading(index=n)
        for h, value in zip(header, row, strict=True):
            if h in _CSV_FIELDS:
                attr, conv = _CSV_FIELDS[h]
                if _na(value):
                    if value.strip().lower() in _UNREADABLE:
                        r.unreadable.append(h)
                    continue
                parsed = conv(value)
                if parsed is not None:
                    setattr(r, attr, parsed)
            elif h.startswith(_THROTTLE_PREFIXES):
                reason = h.split(".", 1)[1]
                if reason in THROTTLE_ALERTS and _yes(value):
                    r.throttle.append(THROTTLE_ALERTS[reason])
            elif value.strip().lower() in _UNREADABLE:
                r.unreadable.append(h)
        out.append(r)
    kind = "remapped-rows" if header and all(h.startswith("remapped_rows.") or h in _IDENT for h in header) \
        else "gpu"
    if not any(h in _CSV_FIELDS and h not in _IDENT or h.startswith(_THROTTLE_PREFIXES) for h in header):
        problems.append(CheckResult("nvidia-smi.fields", "skip", "the query holds no health field ("
                                    + ", ".join(header[:6]) + (", ..." if len(header) > 6 else "") + ")"))
    return kind, out, problems, []

# -- judging ---------------------------------------------------------------------------

def judge(readings: list[Reading], expect_gpus: int | None = None, gpu_model: str = "",
          thermal_margin_min: float | None = None) -> tuple[list[CheckResult], list[Metric]]:
    thermal_margin_min = -2.0 if thermal_margin_min is None else thermal_margin_min
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
        elif r.remap_pending is None and not r.remap_failure:
            checks.append(CheckResult("row_remap", "skip", "pending not reported", gpu=i))
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
        elif r.retired_pages is not None and r.retired_pending is False:
            checks.append(CheckResult("retired_pages", "pass", f"{r.retired_pages} retired pages (limit 60), "
                                      "none pending", gpu=i))
        elif r.retired_unreported:
            checks.append(CheckResult("retired_pages", "skip", "Retired Pages: N/A, this GPU does not report page "
                                      "retirement (row remapping replaced it on Ampere and later)", gpu=i))
        if r.pcie_width is not None and r.pcie_width_max is not None:
            ok = r.pcie_width >= r.pcie_width_max
            checks.append(CheckResult("pcie.link", "pass" if ok else "fail",
                                      f"x{r.pcie_width} of x{r.pcie_width_max}", "info" if ok else "critical",
                                      gpu=i, code=None if ok else "PCIE_DOWNTRAINED"))
        if r.sram_threshold:
            checks.append(CheckResult("ecc.sram_threshold", "fail", "SRAM uncorrectable errors over the threshold: "
                                      "the GPU is an RMA candidate", "fatal", gpu=i, code="SRAM_THRESHOLD"))
        if r.unreadable:
            many = len(r.unreadable) > 1
            checks.append(CheckResult("gpu.unreadable", "fail" if many else "warn", f"{len(r.unreadable)} field(s) "
                                      "read as Unknown Error or ERR!: " + ", ".join(r.unreadable[:4])
                                      + (": the GPU does not answer" if many else ""),
                                      "critical" if many else "warning", gpu=i, code="GPU_UNREADABLE"))
        if r.throttle:
            checks.append(CheckResult("clocks.events", "warn", "active: " + ", ".join(r.throttle), "warning", gpu=i))
        if r.thermal_margin is not None and r.thermal_margin < thermal_margin_min:
            checks.append(CheckResult("thermal.margin", "fail", f"{r.thermal_margin:g} C to the slowdown limit "
                                      f"(floor {thermal_margin_min:g})", "fatal", gpu=i, code="THERMAL"))
        elif r.thermal_margin is not None:
            checks.append(CheckResult("thermal.margin", "pass", f"{r.thermal_margin:g} C of margin", gpu=i))
        checks.extend(_judge_flags(r))
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


def _judge_flags(r: Reading) -> list[CheckResult]:
    """The driver's own verdicts in -q: its recovery action, pending repairs, unrepairable memory,
    and the fields whose value is not one nvidia-smi prints (`error`: never read as healthy)."""
    i = r.index
    out: list[CheckResult] = []
    if r.recovery_action is not None:
        status, message, severity, code = recovery_verdict(r.recovery_action)
        out.append(CheckResult("gpu.recovery_action", status, message, severity, gpu=i, code=code))
    pending = [name for name, flag in (("channel", r.channel_repair_pending), ("TPC", r.tpc_repair_pending)) if flag]
    if pending:
        out.append(CheckResult("gpu.repair", "fail", f"{' and '.join(pending)} repair pending: the GPU needs a reset",
                               "critical", gpu=i, code="REPAIR_PENDING"))
    elif r.channel_repair_pending is False or r.tpc_repair_pending is False:
        out.append(CheckResult("gpu.repair", "pass", "no channel or TPC repair pending", gpu=i))
    if r.unrepairable_memory:
        out.append(CheckResult("gpu.unrepairable_memory", "fail", "the driver flags memory it cannot repair: the GPU "
                               "is an RMA candidate", "fatal", gpu=i, code="UNREPAIRABLE_MEMORY"))
    if r.strange:
        out.append(CheckResult("nvidia-smi.read", "error", f"{len(r.strange)} field(s) with a value nvidia-smi is not "
                               "known to print: " + "; ".join(r.strange[:4]), "warning", gpu=i))
    return out


# -- the summary table (`nvidia-smi` alone) ---------------------------------------------

_TABLE_GPU = re.compile(r"^\|\s*(\d+)\s+(.*?)\s+(?:On|Off|N/A)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                        r"\.[0-9A-Fa-f])\s+\S+\s*\|\s*(\S+)\s*\|")


def _table(lines: list[str]) -> list[Reading]:
    """One reading per GPU box of the summary table: its bus id, its volatile uncorrectable ECC
    count, and the cells printed as `ERR!` (nvidia-smi could not read them from the GPU)."""
    out: list[Reading] = []
    open_box = False
    for line in lines:
        m = _TABLE_GPU.match(line.strip())
        if m:
            r = Reading(index=int(m.group(1)), bus_id=m.group(3), name=m.group(2).strip())
            r.volatile_uncorrected = _int(m.group(4))
            out.append(r)
            open_box = True
        elif line.strip().startswith(("+", "|=")) or not line.strip().startswith("|"):
            open_box = False  # the box is closed: later `ERR!` cells belong to no GPU
        if out and open_box and "ERR!" in line:
            out[-1].unreadable.extend(["summary table cell"] * line.count("ERR!"))
    return out


# -- what nvidia-smi prints instead of readings ---------------------------------------

# NVML could not open a GPU that the PCI bus lists: "Unable to determine the device handle for GPU
# 0000:3B:00.0: Unknown Error" or "...: GPU is lost.  Reboot the system to recover this GPU".
_LOST = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*([0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:"
                   r"[0-9A-Fa-f]{2}\.[0-9A-Fa-f])?\s*:?\s*(.*)$")
_NO_DEVICES = re.compile(r"^\s*No devices were found\s*$")
_DRIVER = re.compile(r"NVIDIA-SMI has failed|couldn't communicate with the NVIDIA driver")
_TABLE = re.compile(r"^\|\s*NVIDIA-SMI \d|^\|\s*GPU\s+Name\s")


def _gone(paste: Paste) -> tuple[list[CheckResult], list[str]]:
    """Checks for GPUs nvidia-smi says it cannot reach, and the lines left to read."""
    checks: list[CheckResult] = []
    rest: list[str] = []
    for line in paste.lines:
        m = _LOST.search(line) if "device handle" in line else None
        if m:
            bus, why = m.group(1) or "(bus id not printed)", m.group(2).strip().rstrip(".") or "no reason given"
            checks.append(CheckResult("gpu.lost", "fail", f"nvidia-smi cannot open GPU {bus}: {why}", "fatal",
                                      code="GPU_LOST"))
        elif "No devices" in line and _NO_DEVICES.match(line):
            checks.append(CheckResult("gpu.count", "fail", "nvidia-smi found no GPU (No devices were found)",
                                      "critical", code="NO_GPU"))
        else:
            rest.append(line)
    return checks, rest


def readings(text: str) -> tuple[str, list[Reading]] | str:
    """('q' or 'csv', readings), or why the text is neither form."""
    paste = clean(text)
    got = _xml(paste) if nvidia_smi_xml.looks_like(paste.text) else _q(paste) if _looks_q(paste.lines) \
        else _from_csv(paste)
    if isinstance(got, str):
        return got
    if len(got) == 2:
        return "q", got[0]
    return "csv", got[1]


def looks_like(text: str) -> bool:
    """Whether `text` (pasted or not) is one of the shapes this module reads."""
    paste = clean(text[:200_000])
    lines = paste.lines[:2000]
    if paste.command.startswith("nvidia-smi") and " topo" not in paste.command:
        return True
    if nvidia_smi_xml.looks_like(paste.text[:4000]):
        return True
    if any(_LOST.search(ln) or _NO_DEVICES.match(ln) or _DRIVER.search(ln) or _TABLE.match(ln.strip())
           for ln in lines):
        return True
    if _looks_q(lines):
        return any(" : " in ln for ln in lines)
    first = next((ln for ln in lines if ln.strip()), "")
    return _header(first) is not None


def _looks_q(lines: list[str]) -> bool:
    head = lines[:400]
    return any("NVSMI LOG" in ln or _GPU_HEAD.match(ln.strip()) for ln in head) or any(
        _key(ln.partition(":")[0]) in _SECTIONS and not ln.partition(":")[2].strip() for ln in head)


def parse(text: str, node: str, now: float, expect_gpus: int | None = None, gpu_model: str = "",
          thermal_margin_min: float | None = None) -> Result:
    """Any of the shapes in the module docstring, as printed or as pasted; the result's source is
    `nvidia-smi` whatever the shape."""
    why = unreadable(text, "nvidia-smi", MAX_BYTES)
    if why:
        return error_result(node, SOURCE, why, now)
    paste = clean(text)
    if any(_DRIVER.search(ln) for ln in paste.lines[:50]):
        first = next(ln for ln in paste.lines if _DRIVER.search(ln))
        return Result(node=node, source=SOURCE, started=now, finished=now,
                      checks=(CheckResult("nvml.init", "error", first.strip()[:200], "critical"),))
    gone, rest = _gone(paste)
    paste.lines = rest
    if not any(ln.strip() for ln in rest):
        if gone:
            return Result(node=node, source=SOURCE, started=now, finished=now, checks=tuple(gone))
        return error_result(node, SOURCE, "nvidia-smi printed nothing but a prompt or a runner's prefix", now)
    extra: list[CheckResult] = []
    metrics: list[Metric] = []
    rs: list[Reading] = []
    if nvidia_smi_xml.looks_like(paste.text):
        got_q = _xml(paste)
        if isinstance(got_q, str):
            return _unread(node, now, gone, got_q)
        rs, extra = got_q
    elif _looks_q(rest):
        got_q = _q(paste)
        if isinstance(got_q, str):
            return _unread(node, now, gone, got_q)
        rs, extra = got_q
    elif any(_TABLE.match(ln.strip()) for ln in rest[:40]):
        rs = _table(rest)
        if not rs:
            return _unread(node, now, gone, "the nvidia-smi summary table with no GPU row: ingest `nvidia-smi -q` "
                           "or a `--query-gpu=... --format=csv` output instead")
    else:
        got_csv = _from_csv(paste)
        if isinstance(got_csv, str):
            return _unread(node, now, gone, "neither `nvidia-smi -q` nor `--format=csv` output: " + got_csv)
        _kind, rs, extra, metrics = got_csv
    if len(rs) > MAX_GPUS:
        return _unread(node, now, gone, f"{len(rs)} GPUs: more than one node's output")
    checks = list(gone) + extra
    if rs:
        judged, judged_metrics = judge(rs, None if gone else expect_gpus, gpu_model, thermal_margin_min)
        checks += judged
        metrics = judged_metrics + metrics
    if not any(c.status != "skip" for c in checks) and expect_gpus is not None and rs:
        ok = len(rs) == expect_gpus
        checks.append(CheckResult("gpu.count", "pass" if ok else "fail", f"{len(rs)} GPUs listed"
                                  + ("" if ok else f", the profile expects {expect_gpus}"), "info" if ok else "critical"))
    if not checks:
        return error_result(node, SOURCE, "no GPU in the output", now)
    return Result(node=node, source=SOURCE, started=now, finished=now, checks=tuple(checks), metrics=tuple(metrics))


def _unread(node: str, now: float, gone: list[CheckResult], why: str) -> Result:
    """The rest could not be read: the lost GPUs still fail, and the rest is an error beside them."""
    if not gone:
        return error_result(node, SOURCE, why, now)
    return Result(node=node, source=SOURCE, started=now, finished=now,
                  checks=(*gone, CheckResult("nvidia-smi.read", "error", why, "warning")))
