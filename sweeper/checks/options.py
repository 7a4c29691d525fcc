"""The options of `sweeper check`, declared once: the CLI builds its flags from this table and
the simulated kubelet reads a check pod's arguments with it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class CheckOptions:
    node: str = ""
    expect_gpus: int = 8
    gpu_model: str = ""
    kernel_log: str = ""
    skip_kernel_log: str = ""
    xid_window: float = 86400.0
    xid_since: float = 0.0
    gpu_memory_gb: float = 0.0
    expect_nvlinks: int = -1
    pcie_gen: int = 0
    pcie_width: int = 0
    pcie_replay_per_min: float = 8.0
    thermal_margin_min: float = -2.0
    power_limit_w: float = 0.0
    nic: str = ""
    expect_nics: int = -1
    nic_rate_gbps: float = 0.0
    mtu: int = 0
    mtu_driver: str = ""
    nic_affinity: str = ""
    uccl: str = ""
    host_root: str = "/"
    gpu_request: str = "all"

    @classmethod
    def from_argv(cls, argv: list[str]) -> CheckOptions:
        parser = argparse.ArgumentParser(prog="sweeper check", add_help=False, exit_on_error=False,
                                         allow_abbrev=False)
        for name, _type, _default, _help in OPTIONS:
            parser.add_argument("--" + name.replace("_", "-"), dest=name, type=_type, default=_default)
        parser.add_argument("--json", action="store_true")
        ns, _unknown = parser.parse_known_args(argv)
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})


OPTIONS: list[tuple[str, type, object, str]] = [
    ("node", str, "", "name of the node being checked (default: $NODE_NAME)"),
    ("expect_gpus", int, 8, "number of GPUs the node's profile expects"),
    ("gpu_model", str, "", "substring the GPU model name must contain (empty: any)"),
    ("kernel_log", str, "", "file with the kernel log (default: read `dmesg`)"),
    ("skip_kernel_log", str, "", "do not read the kernel log; the xid check is skip with this reason "
                                 "(an unprivileged check cannot read it)"),
    ("xid_window", float, 86400.0, "seconds of kernel log to consider for XIDs"),
    ("xid_since", float, 0.0, "wall-clock time (Unix seconds) before which XIDs are not judged: the node's "
                              "last passing sweep or GPU reset, which the sweep passes (0: none)"),
    ("gpu_memory_gb", float, 0.0, "memory per GPU the profile expects, in GB (0: not checked; 10% slack)"),
    ("expect_nvlinks", int, -1, "NVLink links per GPU the profile expects (0: none, -1: whatever answers)"),
    ("pcie_gen", int, 0, "PCIe generation the GPUs' links must reach (0: the GPU's own maximum)"),
    ("pcie_width", int, 0, "PCIe lanes per GPU link (0: the GPU's own maximum)"),
    ("pcie_replay_per_min", float, 8.0, "PCIe replays per minute of uptime above which a GPU fails"),
    ("thermal_margin_min", float, -2.0, "degrees C to the slowdown limit below which a GPU fails"),
    ("power_limit_w", float, 0.0, "enforced power limit expected per GPU in W (0: not checked)"),
    ("nic", str, "", "fabric NICs to check: efa, ib, gve, ena (empty: none)"),
    ("expect_nics", int, -1, "number of fabric NICs the profile expects (-1: any)"),
    ("nic_rate_gbps", float, 0.0, "link rate each RDMA port must reach in Gb/s (0: not checked)"),
    ("mtu", int, 0, "minimum MTU of the physical interfaces (0: not checked)"),
    ("mtu_driver", str, "", "check the MTU only of interfaces with this driver (e.g. ena)"),
    ("nic_affinity", str, "", "farthest path from a GPU to its nearest NIC: PIX, PXB, PHB, NODE or SYS"),
    ("uccl", str, "", "comma list of UCCL APIs the node must be ready for"),
    ("host_root", str, "/", "where the host's /sys and journal directories are mounted in the check container"),
    ("gpu_request", str, "all", "GPUs the check's pod requested: all, or none (a pod beside a workload: GPUs "
                                "it cannot see are the runtime's doing, an error, not a lost GPU)"),
]
