"""RDMA devices (EFA or InfiniBand HCAs) and their ports, from what people paste of them:

- `ibv_devinfo` (rdma-core), whole or `-v`, or filtered by grep: `state:` and `phys_state:` lines
  with no `port:` line belong to the `hca_id` before them;
- `ibv_devinfo -l` (names only: no port state to judge, an `error`);
- `ibstat` and `ibstatus` (infiniband-diags), whole, grep-filtered or a fragment from `Port 1:`, which report the same port states from the same
  driver (`State: Active`, `Physical state: LinkUp`; `state: 4: ACTIVE`); rdma-core's man pages
  ibstat(8) and ibstatus(8) describe them as the same information as ibv_devinfo's.

A port is healthy only when ACTIVE. `PORT_DOWN` while the physical link is up (`LINK_UP`,
`LinkUp`) is still a port down: the cable trains but no subnet manager has brought the port up
(InfiniBand Architecture Specification, Vol. 1, "Port States": the SM moves a port from Down,
Initialize, Armed to Active)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sweeper.parsers.paste import clean, unreadable
from sweeper.result import CheckResult, Metric, Result, error_result

SOURCE = "ibv-devinfo"
MAX_BYTES = 4 * 1024 * 1024
_KV = re.compile(r"^\s*([a-z_]+):\s*(.*?)\s*$")
_IBSTAT_CA = re.compile(r"^\s*CA '([^']+)'\s*$")
_IBSTAT_PORT = re.compile(r"^\s*Port (\d+):\s*$")
_IBSTAT_KV = re.compile(r"^\s*(State|Physical state|Link layer|Rate):\s*(.*?)\s*$")
_IBSTATUS_DEV = re.compile(r"^\s*Infiniband device '([^']+)' port (\d+) status:\s*$")
_IBSTATUS_KV = re.compile(r"^\s*(state|phys state|link_layer|rate):\s*(?:\d+:\s*)?(.*?)\s*$")
# ibstat/ibstatus name the logical states as the specification does; ibv_devinfo as the verbs enum.
_STATES = {"active": "PORT_ACTIVE", "down": "PORT_DOWN", "initializing": "PORT_INIT", "init": "PORT_INIT",
           "armed": "PORT_ARMED", "active_defer": "PORT_ACTIVE_DEFER"}


@dataclass
class Port:
    number: int
    state: str = ""  # PORT_ACTIVE, PORT_DOWN, ...
    phys_state: str = ""  # LINK_UP, POLLING, DISABLED, ...
    active_mtu: int | None = None
    link_layer: str = ""


@dataclass
class Device:
    name: str
    vendor_id: str = ""
    ports: list[Port] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.vendor_id.lower() == "0x1d0f" or self.name.startswith(("rdmap", "efa")):
            return "efa"
        return "ib"


def _phys(value: str) -> str:
    """`LINK_UP (5)`, `LinkUp`, `5: LinkUp` -> LINK_UP."""
    word = re.sub(r"^\d+:\s*", "", value).split("(")[0].strip()
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", word).upper().replace(" ", "_")


_LIST = re.compile(r"^\s*\d+ HCAs? found:\s*$")  # `ibv_devinfo -l`: names only


def _listed(lines: list[str]) -> list[Device]:
    at = next(i for i, ln in enumerate(lines) if _LIST.match(ln))
    return [Device(ln.strip()) for ln in lines[at + 1:] if re.fullmatch(r"\s+[\w.-]+\s*", ln)]


def _ibstat(lines: list[str]) -> list[Device]:
    devs: list[Device] = []
    for line in lines:
        if not devs and _IBSTAT_PORT.match(line):  # a fragment that starts at a port: its CA line was cut
            devs.append(Device("(CA not shown)"))
        m = _IBSTAT_CA.match(line) or _IBSTATUS_DEV.match(line)
        if m:
            name = m.group(1)
            if not devs or devs[-1].name != name:
                devs.append(Device(name))
            if m.re is _IBSTATUS_DEV:
                devs[-1].ports.append(Port(int(m.group(2))))
            continue
        if not devs:
            continue
        p = _IBSTAT_PORT.match(line)
        if p:
            devs[-1].ports.append(Port(int(p.group(1))))
            continue
        kv = _IBSTAT_KV.match(line) or _IBSTATUS_KV.match(line)
        if not kv or not devs[-1].ports:
            continue
        key, value = kv.group(1).lower(), kv.group(2)
        port = devs[-1].ports[-1]
        if key == "state":
            word = re.sub(r"^\d+:\s*", "", value).strip().lower()
            port.state = _STATES.get(word, word.upper())
        elif key in ("physical state", "phys state"):
            port.phys_state = _phys(value)
        elif key in ("link layer", "link_layer"):
            port.link_layer = value
    return devs


def devices(text: str) -> list[Device] | None:
    """The devices in the output; None when there is no `hca_id:` (nor ibstat `CA '...'`) line."""
    return _devices(clean(text).lines)


def _devices(lines: list[str]) -> list[Device] | None:
    if not any(re.match(r"^\s*hca_id:", ln) for ln in lines):
        if any(_LIST.match(ln) for ln in lines):
            return _listed(lines)
        found = _ibstat(lines)
        return found or None
    devs: list[Device] = []
    for line in lines:
        m = _KV.match(line)
        if not m:
            continue
        key, value = m.groups()
        if key == "hca_id":
            devs.append(Device(value))
        elif not devs:
            continue
        elif key == "vendor_id":
            devs[-1].vendor_id = value
        elif key == "port":
            num = re.match(r"\d+", value)
            devs[-1].ports.append(Port(int(num.group(0)) if num else 0))
        elif key == "state":
            ports = devs[-1].ports
            if not ports or ports[-1].state:  # a grep kept the state but not the `port:` line
                ports.append(Port(len(ports) + 1))
            ports[-1].state = value.split()[0] if value else ""
        elif key == "phys_state":
            ports = devs[-1].ports
            if not ports or ports[-1].phys_state:
                ports.append(Port(len(ports) + 1))
            ports[-1].phys_state = _phys(value)
        elif devs[-1].ports and key == "active_mtu":
            num = re.match(r"\d+", value)
            devs[-1].ports[-1].active_mtu = int(num.group(0)) if num else None
        elif devs[-1].ports and key == "link_layer":
            devs[-1].ports[-1].link_layer = value
    return devs


def looks_like(text: str) -> bool:
    paste = clean(text[:200_000])
    lines = paste.lines
    if paste.command.startswith(("ibv_devinfo", "ibstat")):
        return True
    if any(re.match(r"^\s*hca_id:\s*\S", ln) or "No IB devices found" in ln or _IBSTATUS_DEV.match(ln)
           or _IBSTAT_CA.match(ln) or _LIST.match(ln) for ln in lines):
        return True
    return any(_IBSTAT_PORT.match(ln) for ln in lines) and any(
        _IBSTAT_KV.match(ln) and ln.strip().startswith("Physical state") for ln in lines)


def _port_check(d: Device, p: Port) -> CheckResult:
    if p.state == "PORT_ACTIVE":
        return CheckResult("rdma.port", "pass", f"{d.name} port {p.number} active")
    if not p.state:
        return CheckResult("rdma.port", "error", f"{d.name} port {p.number}: no state line", "warning")
    why = ""
    if p.phys_state == "LINK_UP":
        why = " with the physical link up: no subnet manager has brought it up"
    elif p.phys_state:
        why = f" (physical state {p.phys_state})"
    return CheckResult("rdma.port", "fail", f"{d.name} port {p.number} is {p.state}{why}", "critical",
                       code="NIC_PORT_DOWN")


def parse(text: str, node: str, now: float, expect: int | None = None, kind: str = "") -> Result:
    """Every port ACTIVE, and as many devices of `kind` (efa or ib) as the profile expects."""
    why = unreadable(text, "ibv_devinfo", MAX_BYTES)
    if why:
        return error_result(node, SOURCE, why, now)
    lines = clean(text).lines
    if "No IB devices found" in text:
        devs: list[Device] = []
    else:
        found = _devices(lines)
        if found is None:
            return error_result(node, SOURCE, "no hca_id line (nor an ibstat CA line): not ibv_devinfo output", now)
        devs = found
    checks: list[CheckResult] = []
    for line in lines:
        if "ibpanic:" in line and re.match(r"^\s*ibpanic:", line):  # ibstat stopped part-way: the devices after it are unknown
            checks.append(CheckResult("rdma.read", "error", f"ibstat stopped: {line.strip()[:160]}", "critical"))
    mine = [d for d in devs if not kind or d.kind == kind]
    if expect is not None and len(mine) != expect:
        checks.append(CheckResult("rdma.devices", "fail", f"{len(mine)} {kind or 'RDMA'} devices, the profile "
                                  f"expects {expect}", "critical", code="NIC_COUNT"))
    elif not mine:
        checks.append(CheckResult("rdma.devices", "fail", f"no {kind or 'RDMA'} device", "critical", code="NIC_COUNT"))
    else:
        checks.append(CheckResult("rdma.devices", "pass", f"{len(mine)} {kind or 'RDMA'} devices"))
    for d in mine:
        if not d.ports:
            checks.append(CheckResult("rdma.port", "error", f"{d.name}: no port listed", "warning"))
        elif d.kind == "efa":
            # The EFA driver reports every port PORT_ACTIVE / LINK_UP, whatever the link does
            # (amzn-drivers, kernel/linux/efa/src/efa_verbs.c, efa_query_port): not a finding.
            checks.append(CheckResult("rdma.port", "skip", f"{d.name}: EFA port state not judged (the EFA driver "
                                      "reports it ACTIVE always)"))
        else:
            checks.extend(_port_check(d, p) for p in d.ports)
    active = sum(1 for d in mine for p in d.ports if p.state == "PORT_ACTIVE")
    return Result(node=node, source=SOURCE, started=now, finished=now, checks=tuple(checks),
                  metrics=(Metric("rdma.active_ports", active, "ports"),))
