"""`ibv_devinfo`: RDMA devices (EFA or InfiniBand HCAs) and their ports."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sweeper.result import CheckResult, Metric, Result, error_result

MAX_BYTES = 4 * 1024 * 1024
_KV = re.compile(r"^\s*([a-z_]+):\s*(.*?)\s*$")


@dataclass
class Port:
    number: int
    state: str = ""  # PORT_ACTIVE, PORT_DOWN, ...
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


def devices(text: str) -> list[Device] | None:
    """The devices in the output; None when there is no `hca_id:` line at all."""
    devs: list[Device] = []
    for line in text.splitlines():
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
        elif devs[-1].ports and key == "state":
            devs[-1].ports[-1].state = value.split()[0]
        elif devs[-1].ports and key == "active_mtu":
            num = re.match(r"\d+", value)
            devs[-1].ports[-1].active_mtu = int(num.group(0)) if num else None
        elif devs[-1].ports and key == "link_layer":
            devs[-1].ports[-1].link_layer = value
    return devs if devs else None


def parse(text: str, node: str, now: float, expect: int | None = None, kind: str = "") -> Result:
    """Every port ACTIVE, and as many devices of `kind` (efa or ib) as the profile expects."""
    if not text or not text.strip():
        return error_result(node, "ibv_devinfo", "ibv_devinfo printed nothing", now)
    if len(text) > MAX_BYTES:
        return error_result(node, "ibv_devinfo", f"{len(text)} bytes of output is over the {MAX_BYTES} limit", now)
    if re.search(r"No IB devices found", text):
        devs: list[Device] = []
    else:
        found = devices(text)
        if found is None:
            return error_result(node, "ibv_devinfo", "no hca_id line: not ibv_devinfo output", now)
        devs = found
    checks: list[CheckResult] = []
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
        for p in d.ports:
            if p.state == "PORT_ACTIVE":
                checks.append(CheckResult("rdma.port", "pass", f"{d.name} port {p.number} active"))
            else:
                checks.append(CheckResult("rdma.port", "fail", f"{d.name} port {p.number} is {p.state or 'unknown'}",
                                          "critical", code="NIC_PORT_DOWN"))
    active = sum(1 for d in mine for p in d.ports if p.state == "PORT_ACTIVE")
    return Result(node=node, source="ibv_devinfo", started=now, finished=now, checks=tuple(checks),
                  metrics=(Metric("rdma.active_ports", active, "ports"),))
