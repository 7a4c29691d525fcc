"""The NVIDIA driver's lines in a kernel log, as dmesg, journalctl or syslog print them:
XIDs and SXIDs, and GPUs the driver lost or could not start, with or without an XID."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

# NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)$")
_SXID = re.compile(r"nvidia-nvswitch\d*: SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)$")
_STAMP = re.compile(r"^\s*(?:<\d+>)?\[\s*(?P<secs>\d+\.\d+)\]")
_RECOVERY = re.compile(r"GPU recovery action changed from \S+ \((?P<old>[^)]*)\) to \S+ \((?P<new>[^)]*)\)")
# The 5xx drivers end a derived XID (45, channels torn down) with the XID that caused it
# (open-gpu-kernel-modules, src/nvidia/src/kernel/diagnostics/journal.c: " caused by previous Xid %d").
_CAUSE = re.compile(r"caused by previous Xid\s+(\d+)", re.I)

# What a kernel log line starts with, one shape per tool. Lines are matched after leading
# blanks are stripped, since pasted logs are often indented.
_SHAPES = re.compile("|".join((
    r"(?:<\d+>)?\[\s*\+?\d+\.\d+\]",  # dmesg (and its --reltime); journalctl -o short-monotonic; <6>[ ...]
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]",  # dmesg -T
    r"\d+,\d+,\d+,[-c+][^;]*;",  # /dev/kmsg records
    r"(?:kern|user|daemon|syslog|auth)\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:",  # dmesg -x
    r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ [^\s:]+(?:\[\d+\])?: ",  # syslog, journalctl
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? (?:\S+ [^\s:]+(?:\[\d+\])?: )?",  # ISO
    r"kernel: ",  # journalctl -o cat of the kernel's unit, grep output
    r"NVRM: ", r"nvidia-nvswitch\d*: ",  # the driver's own lines, as people grep them
)))
_HEADER = re.compile(r"^\s*(?:" + _SHAPES.pattern + r")\s*")
# An ISO time alone starts other tools' lines too (`kubectl logs --timestamps` puts one before
# every line of any output), so for detection an ISO line must name its host and program, as
# journalctl -o short-iso does, or carry a kernel shape after the time.
_BARE_ISO = re.compile(r"^\s*\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? ")
_ISO_KERNEL = re.compile(_BARE_ISO.pattern + r"(?:\S+ [^\s:]+(?:\[\d+\])?: |\s*(?:<\d+>)?\[\s*\+?\d+\.\d+\])")

# A GPU the driver lost or never brought up, worded as the 4xx-5xx drivers print it (NVIDIA
# developer forums and issue threads, e.g. NVIDIA/NVSentinel#155, Bumblebee-Project/Bumblebee#554,
# Cyridd/cmpunlocker#4): "fallen off the bus", "not responding to commands",
# "RmInitAdapter failed!", "rm_init_adapter failed", "The NVIDIA probe routine failed for N
# device(s)", "None of the NVIDIA devices were initialized", "probe of <pci> failed".
_LOST = re.compile("|".join((
    r"fallen off the bus", r"not responding to commands", r"\bGPU is lost\b", r"RmInitAdapter failed",
    r"rm_init_adapter failed", r"probe routine failed for \d+ device", r"None of the NVIDIA devices were initiali[sz]ed",
    r"failed to initiali[sz]e the NVIDIA (?:GPU|kernel module)", r"GPU (?:\S+ )?(?:could not|cannot) be initiali[sz]ed",
    r"nvidia\S*: probe of \S+ failed", r"does not have the necessary power cables",
    # GSP firmware that stops answering (open-gpu-kernel-modules#446, #1230)
    r"_kgspIsHeartbeatTimedOut: Heartbeat timed out", r"\bGSP Timeout\b", r"Timeout waiting for RPC from GSP",
)), re.I)
_PCI = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")  # the domain is always there
_SENTENCE_END = (".", "!")
MAX_LINE = 64 * 1024  # a longer "line" is cut here: no kernel line is anywhere near it


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str
    message: str
    switch: bool = False
    uptime: float | None = None
    recovery_action: str | None = None  # XID 154: the driver's own verdict
    count: int = 1  # lines that repeated this one (same code, device and message)
    last_uptime: float | None = None  # when the last of them was logged
    cause: int | None = None  # "caused by previous Xid N": the XID behind this one


@dataclass(frozen=True)
class LostGpu:
    """The driver says a GPU is gone or did not start, whether or not it logged an XID."""

    pci: str  # "" when no line near it names the device
    message: str
    uptime: float | None = None
    count: int = 1
    last_uptime: float | None = None


@dataclass
class KernelLog:
    """What a kernel log holds, read line by line: `recognised` counts the lines shaped like a
    kernel log's, so that a file that is not one can be told apart from a clean one."""

    lines: int = 0
    recognised: int = 0
    events: list[XidEvent] = field(default_factory=list)
    lost: list[LostGpu] = field(default_factory=list)


def normalise_pci(pci: str) -> str:
    """'0000:4e:00' and '00000000:4E:00.0' name the same device."""
    parts = pci.lower().split(":")
    try:
        if len(parts) == 3:
            domain, bus, devfn = parts
        elif len(parts) == 2:
            domain, (bus, devfn) = "0", parts
        else:
            return pci.lower()
        dev = devfn.split(".")[0]
        return f"{int(domain, 16):04x}:{bus[-2:]}:{dev}"
    except ValueError:
        return pci.lower()


def scan(lines: Iterable[str]) -> KernelLog:
    """One pass over the lines (a file can be streamed through it). XIDs and lost GPUs that
    repeat the same code, device and message fold into one event with a count."""
    out = KernelLog()
    xid_index: dict[tuple[int, str, str], int] = {}
    lost_index: dict[str, int] = {}
    body = ""  # the driver's message so far, joined over its continuation lines
    last_pci = ""
    for raw in lines:
        line = raw[:MAX_LINE].rstrip("\r\n")
        out.lines += 1
        header = _HEADER.match(line)
        if header or "NVRM: " in line:  # the driver's lines behind any prefix (a Talos "kern: warning:")
            out.recognised += 1
        stamp = _STAMP.match(line)
        when = float(stamp.group("secs")) if stamp else None
        m = _XID.search(line) if "Xid (" in line else None
        switch = False
        if m is None and "SXid (" in line:
            m = _SXID.search(line)
            switch = m is not None
        if m is not None:
            if not header and "NVRM: " not in line:
                out.recognised += 1
            _add_xid(out, xid_index, m, switch, when)
            body = ""
            continue
        text = line[header.end():] if header else line.lstrip()
        if "NVRM:" in line:
            part = line.split("NVRM:", 1)[1].strip()
        elif text.lower().startswith("nvidia"):
            part = text.strip()
        else:
            body = ""
            continue
        # A message the driver split over lines goes on where the last one did not end a sentence.
        body = f"{body[-2000:]} {part}" if body and not body.endswith(_SENTENCE_END) else part
        pci = _PCI.search(part)
        if pci:
            last_pci = normalise_pci(pci.group(1))
        if _LOST.search(body):
            _add_lost(out, lost_index, last_pci, body, when)
            body = ""
    return out


def _add_xid(out: KernelLog, index: dict[tuple[int, str, str], int], m: re.Match[str], switch: bool,
             when: float | None) -> None:
    code = int(m.group("code"))
    pci = normalise_pci(m.group("pci"))
    rest = m.group("rest").strip()
    key = (code, pci, rest)
    if key in index:
        e = out.events[index[key]]
        out.events[index[key]] = replace(e, count=e.count + 1,
                                         last_uptime=when if when is not None else e.last_uptime)
        return
    index[key] = len(out.events)
    recovery = None
    if code == 154:
        r = _RECOVERY.search(rest)
        recovery = r.group("new") if r else None
    cause = None if switch else _CAUSE.search(rest)
    out.events.append(XidEvent(code, pci, rest, switch, when, recovery, last_uptime=when,
                               cause=int(cause.group(1)) if cause else None))


def _add_lost(out: KernelLog, index: dict[str, int], pci: str, message: str, when: float | None) -> None:
    if pci in index:
        e = out.lost[index[pci]]
        out.lost[index[pci]] = replace(e, count=e.count + 1, last_uptime=when if when is not None else e.last_uptime)
        return
    index[pci] = len(out.lost)
    out.lost.append(LostGpu(pci, message[:300], when, last_uptime=when))


def looks_like(head: str) -> bool:
    """Whether the text is a kernel log (for `--format auto`): most of its first lines are
    shaped like one, or the driver speaks in it."""
    if "NVRM:" in head or "SXid" in head:
        return True
    lines = [line for line in head.splitlines()[:200] if line.strip()]
    shaped = sum(1 for line in lines
                 if _HEADER.match(line) and (not _BARE_ISO.match(line) or _ISO_KERNEL.match(line)))
    return bool(lines) and shaped >= max(1, len(lines) // 2)


def parse_xids(text: str) -> list[XidEvent]:
    """Every XID and SXID, in order of first appearance; lines repeating the same code, device
    and message fold into one event with a count and the time of the last."""
    return scan(text.splitlines()).events
