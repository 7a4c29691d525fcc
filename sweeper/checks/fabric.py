"""The node's fabric: EFA or InfiniBand devices from sysfs (count, port state, rate, error
counters), libfabric's view (`fi_info -p efa`), interface MTU, and how close each GPU sits to a
NIC (`nvidia-smi topo -m`)."""

from __future__ import annotations

import re

from sweeper.checks.collect import Collector
from sweeper.checks.host import Host
from sweeper.checks.options import CheckOptions
from sweeper.parsers import fi_info, topo
from sweeper.result import TOOL_CHECK

IB = "/sys/class/infiniband"
NET = "/sys/class/net"
EFA_VENDOR = "0x1d0f"
# Counters whose growth means trouble; recorded as metrics so the policy can judge rates.
EFA_COUNTERS = ("rx_drops", "rdma_read_wr_err", "rdma_write_wr_err", "retrans_timeout_events",
                "unresponsive_remote_events", "impaired_remote_conn_events")
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors")
# The EFA driver answers a port query with a constant: state ACTIVE, physical state LinkUp, and the
# device's maximum link speed as the rate (amzn-drivers, kernel/linux/efa/src/efa_verbs.c,
# efa_query_port). Neither says anything of the link's health, so neither is judged.
EFA_PORT_NOTE = ("EFA port state and rate not judged: the EFA driver reports every port ACTIVE at the device's "
                 "maximum rate, whatever the link does")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def read_file(host: Host, path: str) -> tuple[str | None, str]:
    try:
        return host.read(path), ""
    except OSError as exc:
        return None, str(exc)


def rdma_devices(host: Host) -> tuple[list[str] | None, str]:
    try:
        names = host.listdir(IB)
    except OSError as exc:
        return None, f"cannot list {IB}: {exc}"
    return names or [], ""


def device_kind(host: Host, dev: str) -> str:
    vendor, _ = read_file(host, f"{IB}/{dev}/device/vendor")
    if (vendor or "").strip().lower() == EFA_VENDOR or dev.startswith("rdmap"):
        return "efa"
    return "ib"


def nic_checks(opts: CheckOptions, host: Host, c: Collector) -> None:
    if opts.nic in ("efa", "ib") and opts.expect_nics == 0:
        # What the node advertises comes before the instance type's figure (profiles.advertised_nics):
        # a node given no fabric device (Karpenter's without a pod that asked for EFA) has none to check.
        c.check("nic.devices", "skip", f"no {opts.nic.upper()} device expected: the node advertises none")
    elif opts.nic in ("efa", "ib"):
        _rdma(opts, host, c)
    if opts.nic == "efa" and opts.expect_nics != 0:
        _fi_info(opts, host, c)
    if opts.nic == "gve" or opts.nic == "ena":
        _netdevs(opts, host, c)
    if opts.mtu:
        _mtu(opts, host, c)
    if opts.nic_affinity or opts.expect_nvlinks > 0:
        _topology(opts, host, c)


def _rdma(opts: CheckOptions, host: Host, c: Collector) -> None:
    names, why = rdma_devices(host)
    if names is None:
        c.check("nic.devices", "error", why, "warning")
        return
    devs = [d for d in names if device_kind(host, d) == opts.nic]
    c.metric(f"{opts.nic}.devices", len(devs), "devices")
    if opts.expect_nics >= 0 and len(devs) != opts.expect_nics:
        c.check("nic.devices", "fail", f"{len(devs)} {opts.nic.upper()} devices in {IB}, the profile expects "
                f"{opts.expect_nics}", "critical", code="NIC_COUNT")
    elif not devs:
        c.check("nic.devices", "fail", f"no {opts.nic.upper()} device in {IB}", "critical", code="NIC_COUNT")
    else:
        c.check("nic.devices", "pass", f"{len(devs)} {opts.nic.upper()} devices")
    totals = dict.fromkeys(EFA_COUNTERS if opts.nic == "efa" else IB_COUNTERS, 0)
    down: list[str] = []
    slow: list[str] = []
    unreadable: list[str] = []
    no_gdr: list[str] = []
    for dev in devs:
        port = f"{IB}/{dev}/ports/1"
        state, err = read_file(host, f"{port}/state")
        if state is None:
            unreadable.append(f"{dev}: {err or 'no port state file'}")
            continue
        if opts.nic == "ib" and ("ACTIVE" not in state.upper() or "ACTIVE_DEFER" in state.upper()):
            down.append(f"{dev} ({state.strip()})")
        rate, _ = read_file(host, f"{port}/rate")
        m = _RATE.match(rate or "")
        if opts.nic == "ib" and m and opts.nic_rate_gbps and float(m.group(1)) < opts.nic_rate_gbps:
            slow.append(f"{dev} at {m.group(1)} Gb/s")
        base = f"{port}/hw_counters" if opts.nic == "efa" else f"{port}/counters"
        for name in totals:
            value, _ = read_file(host, f"{base}/{name}")
            if value is not None and value.strip().isdigit():
                totals[name] += int(value.strip())
        if opts.nic == "efa":
            p2p, _ = read_file(host, f"{IB}/{dev}/device/p2p")
            if p2p is not None and "NVIDIA" not in p2p:
                no_gdr.append(dev)
    if unreadable:
        c.check("nic.port", "error", f"{len(unreadable)} port(s) unreadable: {unreadable[0]}", "warning")
    if down:
        c.check("nic.port", "fail", f"{len(down)} port(s) not active: {', '.join(down[:4])}", "critical",
                code="NIC_PORT_DOWN")
    elif devs and not unreadable and opts.nic == "efa":
        c.check("nic.port", "skip", EFA_PORT_NOTE)
    elif devs and not unreadable:
        c.check("nic.port", "pass", f"{len(devs)} ports active")
    if slow:
        c.check("nic.rate", "fail", f"{len(slow)} link(s) below {opts.nic_rate_gbps:g} Gb/s: {', '.join(slow[:4])}",
                "critical", code="NIC_RATE")
    if no_gdr:
        c.check("nic.gpudirect", "fail", f"GPUDirect RDMA unavailable on {len(no_gdr)} device(s) "
                f"(no NVIDIA peer in device/p2p): {', '.join(no_gdr[:4])}", "critical", code="NO_GPUDIRECT")
    for name, total in totals.items():
        c.metric(f"{opts.nic}.{name}", total, "count")


FI_INFO = ["-p", "efa", "-t", "FI_EP_RDM"]
# Why the EFA installer's own fi_info (/opt/amazon/efa/bin) is not run from a check Job: it loads the
# host's libfabric beside it and the host's rdma-core (libibverbs, the libefa provider and its
# /etc/libibverbs.d entry), which the installer puts in the host's system library directories, built
# for the host's glibc; and libfabric opens /dev/infiniband/uverbs*, which a pod that requests no
# vpc.amazonaws.com/efa device cannot. Mounting all of that would be the host's root again.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html
HOST_FI_INFO = ("the host's fi_info (/opt/amazon/efa) needs the host's libfabric, rdma-core and /dev/infiniband, "
                "none of which the check Job mounts; the EFA devices are judged from sysfs (nic.devices)")


def _tool_skip(c: Collector, code: str, why: str) -> None:
    """A fault of the check's tooling, not of the node: named `check.tool` so the fleet sees it,
    `skip` so the node's verdict rests on what was read (sysfs), never on the missing tool."""
    c.check(TOOL_CHECK, "skip", f"libfabric's view of EFA not read: {why}; a fault of the check, not of the node",
            "warning", code=code)


def _fi_info(opts: CheckOptions, host: Host, c: Collector) -> None:
    """libfabric's view of EFA through the image's own fi_info, where an image carries one; the
    shipped image does not, and says so (`skip`, never a pass, never the node's fault)."""
    try:
        code, out, err = host.run(["fi_info", *FI_INFO], timeout=30)
    except FileNotFoundError:
        c.check("efa.fi_info", "skip", f"libfabric's view of EFA not read: {HOST_FI_INFO}", "info")
        return
    text = out + err
    if code != 0 and "fi_getinfo" not in text:
        # a library that does not load, a crash: the tool's fault
        _tool_skip(c, f"fi_info exit {code}", f"fi_info exited {code}: {(err or out).strip()[:160]}")
        return
    names, _ = rdma_devices(host)
    in_sysfs = [d for d in names or [] if device_kind(host, d) == "efa"]
    if "fi_getinfo" in text and "provider:" not in text and in_sysfs:
        # The EFA driver lists devices libfabric cannot open from this pod: its device cgroup or
        # a missing /dev/infiniband/uverbs*, not the node (sysfs is judged by nic.devices).
        _tool_skip(c, "fi_info sees none", f"the EFA driver lists {len(in_sysfs)} device(s) and libfabric opens none "
                   "from the check pod (no /dev/infiniband access)")
        return
    result = fi_info.parse(text, opts.node, 0.0, expect=opts.expect_nics if opts.expect_nics >= 0 else None)
    c.checks.extend(result.checks)
    c.metrics.extend(result.metrics)


def _netdevs(opts: CheckOptions, host: Host, c: Collector) -> None:
    """Ethernet NICs that carry GPU traffic (gVNIC on GCP A3): how many, and up."""
    found = [(n, d) for n, d in physical_interfaces(host) if d == opts.nic]
    up = [n for n, _ in found if (read_file(host, f"{NET}/{n}/operstate")[0] or "").strip() == "up"]
    if opts.expect_nics >= 0 and len(found) < opts.expect_nics:
        c.check("nic.devices", "fail", f"{len(found)} {opts.nic} interfaces, the profile expects {opts.expect_nics}",
                "critical", code="NIC_COUNT")
    elif len(up) < len(found):
        c.check("nic.port", "fail", f"{len(found) - len(up)} {opts.nic} interface(s) not up", "critical",
                code="NIC_PORT_DOWN")
    else:
        c.check("nic.devices", "pass", f"{len(found)} {opts.nic} interfaces up")


def physical_interfaces(host: Host) -> list[tuple[str, str]]:
    """(name, driver) of interfaces backed by a device (not lo, bridges or veths)."""
    out = []
    for name in host.listdir(NET) or []:
        if not host.exists(f"{NET}/{name}/device"):
            continue
        uevent, _ = read_file(host, f"{NET}/{name}/device/uevent")
        driver = next((ln.split("=", 1)[1].strip() for ln in (uevent or "").splitlines()
                       if ln.startswith("DRIVER=")), "")
        out.append((name, driver))
    return out


def _mtu(opts: CheckOptions, host: Host, c: Collector) -> None:
    try:
        ifaces = physical_interfaces(host)
    except OSError as exc:
        c.check("net.mtu", "error", f"cannot list {NET}: {exc}", "warning")
        return
    ifaces = [(n, d) for n, d in ifaces if not opts.mtu_driver or d == opts.mtu_driver]
    if not ifaces:
        c.check("net.mtu", "error", f"no {opts.mtu_driver or 'physical'} interface in {NET}", "warning")
        return
    low = []
    for name, _driver in ifaces:
        raw, _ = read_file(host, f"{NET}/{name}/mtu")
        if raw is None or not raw.strip().isdigit():
            c.check("net.mtu", "error", f"cannot read the MTU of {name}", "warning")
            return
        mtu = int(raw.strip())
        c.metric(f"net.mtu.{name}", mtu, "bytes")
        if mtu < opts.mtu:
            low.append(f"{name} {mtu}")
    if low:
        c.check("net.mtu", "fail", f"MTU below {opts.mtu}: {', '.join(low)}", "warning", code="MTU")
    else:
        c.check("net.mtu", "pass", f"{len(ifaces)} interface(s) at MTU {opts.mtu} or more")


def _topology(opts: CheckOptions, host: Host, c: Collector) -> None:
    try:
        code, out, err = host.run(["nvidia-smi", "topo", "-m"], timeout=60)
    except FileNotFoundError:
        c.check("topology", "error", "nvidia-smi is not installed in the check image", "warning")
        return
    if code != 0:
        c.check("topology", "error", f"nvidia-smi topo -m exited {code}: {(err or out).strip()[:160]}", "warning")
        return
    matrix = topo.parse_matrix(out)
    if matrix is None:
        c.check("topology", "error", "no complete topology matrix in nvidia-smi topo -m", "warning")
        return
    c.checks.extend(topo.judge(matrix, opts.expect_nvlinks if opts.expect_nvlinks > 0 else None, opts.nic_affinity))
