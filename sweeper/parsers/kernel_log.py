"""XID lines of the NVIDIA kernel driver, as dmesg or the journal print them."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)$")
_SXID = re.compile(r"nvidia-nvswitch\d*: SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)$")
_STAMP = re.compile(r"^\[\s*(?P<secs>\d+\.\d+)\]")
_RECOVERY = re.compile(r"GPU recovery action changed from \S+ \((?P<old>[^)]*)\) to \S+ \((?P<new>[^)]*)\)")


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


def normalise_pci(pci: str) -> str:
    """'0000:4e:00' and '00000000:4E:00.0' name the same device."""
    parts = pci.lower().split(":")
    if len(parts) == 3:
        domain, bus, devfn = parts
    elif len(parts) == 2:
        domain, (bus, devfn) = "0", parts
    else:
        return pci.lower()
    dev = devfn.split(".")[0]
    return f"{int(domain, 16):04x}:{bus[-2:]}:{dev}"


def parse_xids(text: str) -> list[XidEvent]:
    """Every XID and SXID, in order of first appearance; lines repeating the same code, device
    and message fold into one event with a count and the time of the last."""
    index: dict[tuple[int, str, str], int] = {}
    out: list[XidEvent] = []
    for line in text.splitlines():
        m = _XID.search(line)
        switch = False
        if m is None:
            m = _SXID.search(line)
            switch = m is not None
        if m is None:
            continue
        code = int(m.group("code"))
        pci = normalise_pci(m.group("pci"))
        rest = m.group("rest").strip()
        stamp = _STAMP.match(line)
        when = float(stamp.group("secs")) if stamp else None
        key = (code, pci, rest)
        if key in index:
            e = out[index[key]]
            out[index[key]] = replace(e, count=e.count + 1, last_uptime=when if when is not None else e.last_uptime)
            continue
        index[key] = len(out)
        recovery = None
        if code == 154:
            r = _RECOVERY.search(rest)
            recovery = r.group("new") if r else None
        out.append(XidEvent(code, pci, rest, switch, when, recovery, last_uptime=when))
    return out
