"""The outputs of the node's tools that the fake host runs (fi_info, nvidia-smi topo -m), built from
a simulated node's hardware."""

from __future__ import annotations


def fi_info_output(devices: list[str]) -> str:
    """`fi_info -p efa -t FI_EP_RDM` for these devices, libfabric 1.x layout."""
    if not devices:
        return "fi_getinfo: -61 (No data available)\n"
    blocks = [f"provider: efa\n    fabric: efa\n    domain: {d}-rdm\n    version: 120.0\n"
              f"    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n" for d in devices]
    return "".join(blocks)


def topo_output(gpus: int, nvlinks: int, nics: int, nic_path: str = "PXB", far: bool = False) -> str:
    """`nvidia-smi topo -m` for `gpus` GPUs joined by `nvlinks` NVLinks each and `nics` NICs
    spread over the PCIe switches; `far` puts every NIC across the CPU socket (SYS)."""
    cols = [f"GPU{i}" for i in range(gpus)] + [f"NIC{k}" for k in range(nics)]
    head = "\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    per_switch = max(1, gpus // max(1, nics)) if nics else 1

    def gpu_nic(g: int, k: int) -> str:
        if far:
            return "SYS"
        if g // per_switch == k:
            return nic_path
        return "NODE" if (g < gpus // 2) == (k < nics // 2) else "SYS"

    lines = [head]
    for g in range(gpus):
        cells = [" X " if g == h else (f"NV{nvlinks}" if nvlinks else "SYS") for h in range(gpus)]
        cells += [gpu_nic(g, k) for k in range(nics)]
        cpus = "0-47,96-143" if g < gpus // 2 else "48-95,144-191"
        lines.append(f"GPU{g}\t" + "\t".join(cells) + f"\t{cpus}\t{0 if g < gpus // 2 else 1}\t\tN/A")
    for k in range(nics):
        cells = [gpu_nic(g, k) for g in range(gpus)]
        cells += [" X " if k == j else "SYS" for j in range(nics)]
        lines.append(f"NIC{k}\t" + "\t".join(cells))
    legend = ["", "Legend:", "", "  X    = Self", "  SYS  = Connection traversing PCIe as well as the SMP "
              "interconnect between NUMA nodes (e.g., QPI/UPI)", "  PXB  = Connection traversing multiple PCIe "
              "bridges (without traversing the PCIe Host Bridge)", "  NV#  = Connection traversing a bonded set "
              "of # NVLinks", "", "NIC Legend:", ""]
    legend += [f"  NIC{k}: mlx5_{k}" for k in range(nics)]
    return "\n".join(lines + legend) + "\n"
