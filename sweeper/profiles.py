"""Per-instance-type hardware expectations, matched by instance type, then GPU product label,
then a conservative default that still checks what it can."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import ConfigError

DEFAULT = "default"
NIC_KINDS = ("efa", "ib", "gve", "ena", "none")
AFFINITIES = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class Profile:
    name: str
    gpus: int
    gpu_model: str = ""
    instance_types: tuple[str, ...] = ()
    gpu_products: tuple[str, ...] = ()
    description: str = ""
    gpu_memory_gb: int | None = None
    nvlinks: int | None = None  # links per GPU; 0: no NVLink; None: whatever answers
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nic: str = "none"  # the fabric: efa, ib (ConnectX), gve or ena (Ethernet), none
    nics: int | None = None  # fabric devices per node
    nic_rate_gbps: float | None = None  # per port
    mtu: int | None = None
    mtu_driver: str = ""
    nic_affinity: str = ""  # farthest acceptable path from a GPU to its nearest NIC
    power_limit_w: float | None = None
    thermal_margin_min: float = -2.0
    pcie_replay_per_min: float = 8.0
    nccl_busbw_min: float | None = None  # GB/s, all-reduce on one node at the largest message
    uccl: tuple[str, ...] = ()  # UCCL APIs the node must be ready for
    source: str = ""

    def check_args(self) -> list[str]:
        """`sweeper check` flags carrying this profile's expectations into the check Job."""
        args = ["--expect-gpus", str(self.gpus), "--gpu-model", self.gpu_model,
                "--thermal-margin-min", f"{self.thermal_margin_min:g}",
                "--pcie-replay-per-min", f"{self.pcie_replay_per_min:g}"]
        optional: list[tuple[str, Any]] = [
            ("--expect-nvlinks", self.nvlinks), ("--pcie-gen", self.pcie_gen), ("--pcie-width", self.pcie_width),
            ("--expect-nics", self.nics if self.nic != "none" else None), ("--nic-rate-gbps", self.nic_rate_gbps),
            ("--mtu", self.mtu), ("--power-limit-w", self.power_limit_w), ("--gpu-memory-gb", self.gpu_memory_gb)]
        for flag, value in optional:
            if value is not None:
                args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        for flag, text in (("--nic", "" if self.nic == "none" else self.nic), ("--mtu-driver", self.mtu_driver),
                           ("--nic-affinity", self.nic_affinity), ("--uccl", ",".join(self.uccl))):
            if text:
                args += [flag, text]
        return args

    def as_vars(self) -> dict[str, Any]:
        """What playbooks and job templates see as `node.profile`."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "source"}
        d["instance_types"], d["gpu_products"], d["uccl"] = list(self.instance_types), list(self.gpu_products), \
            list(self.uccl)
        d["check_args"] = self.check_args()
        return d


_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "gpus": (int,), "gpu_model": (str,), "instance_types": (list,), "gpu_products": (list,),
    "description": (str,), "gpu_memory_gb": (int,), "nvlinks": (int,), "pcie_gen": (int,), "pcie_width": (int,),
    "nic": (str,), "nics": (int,), "nic_rate_gbps": (int, float), "mtu": (int,), "mtu_driver": (str,),
    "nic_affinity": (str,), "power_limit_w": (int, float), "thermal_margin_min": (int, float),
    "pcie_replay_per_min": (int, float), "nccl_busbw_min": (int, float), "uccl": (list,)}


def load_profile(path: Path) -> Profile:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return _profile(raw, path)


def load_profiles(directory: Path) -> dict[str, Profile]:
    out: dict[str, Profile] = {}
    for path in sorted(directory.glob("*.yaml")):
        p = load_profile(path)
        if p.name in out:
            raise ConfigError(f"{path}: profile {p.name!r} is also defined in {out[p.name].source}")
        out[p.name] = p
    if DEFAULT not in out:
        out[DEFAULT] = Profile(DEFAULT, gpus=8, source="built-in")
    return out


def _profile(raw: Any, path: Path) -> Profile:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a profile is a mapping")
    unknown = set(raw) - set(_TYPES)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(_TYPES)}")
    for key, value in raw.items():
        if value is not None and (not isinstance(value, _TYPES[key]) or isinstance(value, bool)):
            raise ConfigError(f"{path}: {key} must be {' or '.join(t.__name__ for t in _TYPES[key])}, "
                              f"not {type(value).__name__}")
    if not isinstance(raw.get("gpus"), int) or raw["gpus"] < 1:
        raise ConfigError(f"{path}: gpus must be a positive integer")
    if raw.get("nic", "none") not in NIC_KINDS:
        raise ConfigError(f"{path}: nic must be one of {', '.join(NIC_KINDS)}")
    if raw.get("nic_affinity") and raw["nic_affinity"] not in AFFINITIES:
        raise ConfigError(f"{path}: nic_affinity must be one of {', '.join(AFFINITIES)}")
    kw: dict[str, Any] = {k: v for k, v in raw.items() if v is not None}
    for key in ("instance_types", "gpu_products", "uccl"):
        kw[key] = tuple(str(x) for x in kw.get(key, ()))
    for key in ("nic_rate_gbps", "power_limit_w", "thermal_margin_min", "pcie_replay_per_min", "nccl_busbw_min"):
        if key in kw:
            kw[key] = float(kw[key])
    kw["name"] = str(kw.get("name", path.stem))
    kw["description"] = str(kw.get("description", "")).strip()
    return Profile(**kw, source=str(path))


def match(profiles: dict[str, Profile], labels: dict[str, str]) -> Profile:
    itype = labels.get("node.kubernetes.io/instance-type") or labels.get("beta.kubernetes.io/instance-type")
    product = labels.get("nvidia.com/gpu.product")
    for p in profiles.values():
        if itype and itype in p.instance_types:
            return p
    for p in profiles.values():
        if product and product in p.gpu_products:
            return p
    return profiles[DEFAULT]
