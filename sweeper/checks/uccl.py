"""Readiness of the node for each UCCL API (NodePulse's table): which GPU vendor, which NICs,
ROCm version, architecture, and what UCCL's RDMA paths need of the node itself: GPUDirect RDMA
(a peer-memory module loaded, or dma-buf), RDMA devices user space can open, and a NIC on each
GPU's NUMA node. Each API gets a metric (1 ready, 0 not); the APIs the profile requires get a
check. All of it is read from the node (sysfs, /proc through the host's root), never from the
check pod's own environment, which says nothing of the workload's.
https://github.com/uccl-project/uccl (efa/README.md: the EFA installer's module that lets EFA
reach GPU memory), https://docs.nvidia.com/cuda/gpudirect-rdma/ (nvidia-peermem, dma-buf)."""

from __future__ import annotations

import re

from sweeper.checks.collect import Collector
from sweeper.checks.fabric import IB, device_kind, physical_interfaces, rdma_devices, read_file
from sweeper.checks.host import Host
from sweeper.checks.options import CheckOptions

APIS = ("collective_rdma", "collective_efa", "collective_afxdp", "p2p", "ep")
RDMA_APIS = ("collective_rdma", "collective_efa", "p2p", "ep")
# Peer-memory modules that let an RDMA NIC read and write GPU memory: NVIDIA's for ConnectX
# (nvidia_peermem) and the EFA installer's (efa_nv_peermem).
PEERMEM = ("nvidia_peermem", "efa_nv_peermem")
NVIDIA_VENDOR = "0x10de"
PCI = "/sys/bus/pci/devices"


def gpudirect(host: Host) -> tuple[bool, str]:
    """GPUDirect RDMA: a peer-memory module loaded, or dma-buf (NVIDIA's open kernel modules on a
    kernel of 5.12 or later, where the NIC imports GPU memory as a dma-buf)."""
    loaded = [m for m in PEERMEM if host.exists(f"/sys/module/{m}")]
    if loaded:
        return True, f"{loaded[0]} loaded"
    version, _ = read_file(host, "/proc/driver/nvidia/version")
    release, _ = read_file(host, "/proc/sys/kernel/osrelease")
    m = re.match(r"^\s*(\d+)\.(\d+)", release or "")
    if version and "Open Kernel Module" in version and m and (int(m.group(1)), int(m.group(2))) >= (5, 12):
        return True, "dma-buf (open GPU kernel modules)"
    return False, f"no GPUDirect RDMA: neither {' nor '.join(PEERMEM)} is loaded, nor dma-buf available"


def _numa(host: Host, path: str) -> int | None:
    raw, _ = read_file(host, path)
    try:
        node = int((raw or "").strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def nic_affinity(host: Host, nics: list[str]) -> tuple[bool, str]:
    """Every NVIDIA GPU has an RDMA NIC on its NUMA node (unknown NUMA nodes are not judged)."""
    gpus = []
    for dev in host.listdir(PCI) or []:
        vendor, _ = read_file(host, f"{PCI}/{dev}/vendor")
        cls, _ = read_file(host, f"{PCI}/{dev}/class")
        if (vendor or "").strip().lower() == NVIDIA_VENDOR and (cls or "").strip().lower().startswith("0x0302"):
            gpus.append((dev, _numa(host, f"{PCI}/{dev}/numa_node")))
    near = {_numa(host, f"{IB}/{d}/device/numa_node") for d in nics}
    far = [dev for dev, node in gpus if node is not None and None not in near and node not in near]
    if far:
        return False, f"{len(far)} GPU(s) with no RDMA NIC on their NUMA node: {', '.join(far[:4])}"
    return True, ""


def _user_verbs(host: Host, dev: str) -> bool:
    """The device has a user-space verbs node (uverbsN): what an RDMA library opens."""
    return bool(host.listdir(f"{IB}/{dev}/device/infiniband_verbs"))


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
    efa, rdma = [], []
    for d in names or []:
        state, _ = read_file(host, f"{IB}/{d}/ports/1/state")
        if not (state and "ACTIVE" in state.upper() and _user_verbs(host, d)):
            continue
        if device_kind(host, d) == "efa":
            efa.append(d)
        elif d.startswith(("mlx5", "bnxt_re")):
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
    if vendor == "nvidia" and (rdma or efa):
        # What every RDMA path of UCCL needs besides the NIC: GPUDirect RDMA, and a NIC near each GPU.
        gdr, gdr_why = gpudirect(host)
        near, near_why = nic_affinity(host, rdma + efa)
        for api in RDMA_APIS:
            ok, why = out[api]
            if ok and not (gdr and near):
                out[api] = (False, gdr_why if not gdr else near_why)
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
