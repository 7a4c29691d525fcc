"""Readiness of the node for each UCCL API (NodePulse's table): which GPU vendor, which NICs,
ROCm version, architecture, and the environment UCCL needs. Each API gets a metric (1 ready,
0 not); the APIs the profile requires get a check, and missing variables a warning."""

from __future__ import annotations

import re

from sweeper.checks.collect import Collector
from sweeper.checks.fabric import IB, device_kind, physical_interfaces, rdma_devices, read_file
from sweeper.checks.host import Host
from sweeper.checks.options import CheckOptions

APIS = ("collective_rdma", "collective_efa", "collective_afxdp", "p2p", "ep")
REQUIRED_ENV = ("UCCL_SOCKET_IFNAME", "UCCL_IB_GID_INDEX")


def _rocm_version(host: Host) -> tuple[int, int] | None:
    raw, _ = read_file(host, "/opt/rocm/.info/version")
    m = re.match(r"^\s*(\d+)\.(\d+)", raw or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _amd_gpus(host: Host) -> int:
    n = 0
    for card in host.listdir("/sys/class/drm") or []:
        if re.fullmatch(r"card\d+", card):
            vendor, _ = read_file(host, f"/sys/class/drm/{card}/device/vendor")
            n += (vendor or "").strip().lower() == "0x1002"
    return n


def readiness(host: Host, nvidia_gpus: int) -> dict[str, tuple[bool, str]]:
    amd = _amd_gpus(host)
    vendor = "nvidia" if nvidia_gpus else ("amd" if amd else "")
    arm = host.machine().lower() in ("aarch64", "arm64")
    names, _ = rdma_devices(host)
    efa = [d for d in names or [] if device_kind(host, d) == "efa"]
    rdma = []
    for d in names or []:
        if device_kind(host, d) == "efa" or not d.startswith(("mlx5", "bnxt_re")):
            continue
        state, _ = read_file(host, f"{IB}/{d}/ports/1/state")
        if state and "ACTIVE" in state.upper():
            rdma.append(d)
    eth = [drv for _n, drv in physical_interfaces(host) if drv in ("ena", "virtio_net")]
    rocm = _rocm_version(host)
    out: dict[str, tuple[bool, str]] = {}
    gpu_why = "" if vendor else "no NVIDIA or AMD GPU"
    out["collective_rdma"] = (bool(vendor and rdma), gpu_why or ("" if rdma else "no active ConnectX or Thor port"))
    efa_why = gpu_why or ("" if efa else "no EFA device (rdmap*)") or ("ARM64" if arm else "") or \
        ("ROCm builds have no EFA collective" if vendor == "amd" else "")
    out["collective_efa"] = (not efa_why, efa_why)
    out["collective_afxdp"] = (bool(vendor and eth), gpu_why or ("" if eth else "no ENA or VirtIO NIC"))
    out["p2p"] = (bool(vendor and (rdma or efa)), gpu_why or ("" if rdma or efa else "no RDMA NIC"))
    ep_why = gpu_why or ("" if rdma or efa else "no RDMA or EFA NIC")
    if not ep_why and vendor == "amd":
        if arm:
            ep_why = "ARM64 with AMD GPUs: UCCL does not build for ROCm on ARM64"
        elif rocm is None or rocm < (7, 0):
            ep_why = f"EP on AMD needs ROCm 7 or later, found {'none' if rocm is None else '.'.join(map(str, rocm))}"
    out["ep"] = (not ep_why, ep_why)
    return out


def uccl_checks(opts: CheckOptions, host: Host, c: Collector, nvidia_gpus: int) -> None:
    required = [a.strip() for a in opts.uccl.split(",") if a.strip()]
    unknown = [a for a in required if a not in APIS]
    if unknown:
        c.check("uccl", "error", f"unknown UCCL API(s) {unknown}; known: {', '.join(APIS)}", "warning")
        return
    try:
        ready = readiness(host, nvidia_gpus)
    except OSError as exc:
        c.check("uccl", "error", f"cannot read the node's devices: {exc}", "warning")
        return
    for api, (ok, _why) in ready.items():
        c.metric(f"uccl.{api}.ready", 1 if ok else 0)
    for api in required:
        ok, why = ready[api]
        c.check(f"uccl.{api}", "pass" if ok else "fail", "ready" if ok else why, "info" if ok else "warning",
                code=None if ok else "UCCL_NOT_READY")
    if required:
        env = host.env()
        missing = [v for v in REQUIRED_ENV if not env.get(v)]
        if missing:
            c.check("uccl.env", "warn", f"unset: {', '.join(missing)} (UCCL EP can hang without them)", "warning")
        else:
            c.check("uccl.env", "pass", "UCCL variables set")
