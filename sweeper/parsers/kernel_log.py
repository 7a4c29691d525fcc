"""XID lines of the NVIDIA kernel driver, as dmesg or the journal print them."""

from __future__ import annotations

import re
from dataclasses import dataclass

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
    """Every XID and SXID line, in order, deduplicated on (code, device, message)."""
    seen: set[tuple[int, str, str]] = set()
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
        key = (code, pci, rest)
        if key in seen:
            continue
        seen.add(key)
        stamp = _STAMP.match(line)
        recovery = None
        if code == 154:
            r = _RECOVERY.search(rest)
            recovery = r.group("new") if r else None
        out.append(XidEvent(code, pci, rest, switch, float(stamp.group("secs")) if stamp else None, recovery))
    return out
