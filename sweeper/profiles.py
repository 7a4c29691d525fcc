"""Per-instance-type hardware expectations, matched by instance type, then GPU product label,
then a conservative default that still checks what it can."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sweeper.errors import ConfigError
from sweeper.schema import check, model_of, read_yaml, reference_table, runtime_values, setting

DEFAULT = "default"
NIC_KINDS = ("efa", "ib", "gve", "ena", "none")
AFFINITIES = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class Profile:
    """A profile file's keys, declared once (the loader, lint's messages and docs/configuration.md use it)."""

    name: str = setting(help="the profile's name", min_length=1, shown_default="the file's stem")
    gpus: int = setting(help="GPUs per node", ge=1, le=64)
    gpu_model: str = setting("", "a word the GPU's name must contain (H100, A100)")
    instance_types: tuple[str, ...] = setting((), "instance types that get this profile")
    gpu_products: tuple[str, ...] = setting((), "`nvidia.com/gpu.product` labels that get it")
    description: str = setting("", "free text")
    gpu_memory_gb: int | None = setting(None, "memory per GPU", ge=1)
    nvlinks: int | None = setting(None, "NVLinks per GPU; 0: no NVLink; empty: whatever answers", ge=0)
    pcie_gen: int | None = setting(None, "PCIe generation of each GPU's link", ge=1, le=7)
    pcie_width: int | None = setting(None, "PCIe lanes of each GPU's link", ge=1, le=32)
    nic: str = setting("none", "the fabric: efa, ib (ConnectX), gve or ena (Ethernet), none", choices=NIC_KINDS)
    nics: int | None = setting(None, "fabric devices per node", ge=0)
    nic_rate_gbps: float | None = setting(None, "rate per port, Gb/s", gt=0)
    mtu: int | None = setting(None, "MTU of the primary interface", ge=576, le=65535)
    mtu_driver: str = setting("", "the driver whose interface carries that MTU")
    nic_affinity: str = setting("", "farthest acceptable path from a GPU to its nearest NIC",
                                choices=("",) + AFFINITIES)
    power_limit_w: float | None = setting(None, "power limit per GPU, W", gt=0)
    thermal_margin_min: float = setting(-2.0, "lowest acceptable thermal margin, degrees C")
    pcie_replay_per_min: float = setting(8.0, "PCIe replays per minute above which a GPU warns", ge=0)
    nccl_busbw_min: float | None = setting(None, "GB/s, all-reduce on one node at the largest message", gt=0)
    nccl_pair_busbw_min: float | None = setting(None, "GB/s, all-reduce between two nodes at the largest message "
                                                "(empty: no floor)", gt=0)
    fabric_resources: dict[str, int] = setting(help="resource -> count each pod of a pair sweep requests "
                                               "(vpc.amazonaws.com/efa: 32)", factory=dict, ge=1)
    fabric_ifaces: tuple[str, ...] = setting((), "interfaces a pair sweep probes the path MTU on (eth0)")
    uccl: tuple[str, ...] = setting((), "UCCL APIs the node must be ready for")
    dcgm_level: int | None = setting(None, "DCGM diagnostic level for this hardware (empty: the config's, else 2)",
                                     ge=1, le=4)
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

    def on_node(self, fabric: dict[str, int], labels: dict[str, str], annotations: dict[str, str]) -> Profile:
        """This profile with the fabric the node itself advertises in place of the instance type's
        figure (see `advertised_nics`): the NICs the check expects, the devices a pair requests."""
        count = advertised_nics(self.nic, fabric, labels, annotations)
        if count is None or count == self.nics:
            return self
        resources = dict(self.fabric_resources)
        if self.nic == "efa" and EFA_RESOURCE in resources:
            resources[EFA_RESOURCE] = count
        resources = {k: v for k, v in resources.items() if v > 0 and not (count == 0 and k.startswith(RDMA_PREFIX))}
        return dataclasses.replace(self, nics=count, fabric_resources=resources)

    def as_vars(self) -> dict[str, Any]:
        """What playbooks and job templates see as `node.profile`."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "source"}
        d["instance_types"], d["gpu_products"], d["uccl"] = list(self.instance_types), list(self.gpu_products), \
            list(self.uccl)
        d["fabric_resources"], d["fabric_ifaces"] = dict(self.fabric_resources), list(self.fabric_ifaces)
        d["check_args"] = self.check_args()
        return d


EFA_RESOURCE = "vpc.amazonaws.com/efa"  # AWS's EFA device plugin: one per EFA device the node has
RDMA_PREFIX = "rdma/"  # the RDMA shared device plugin (Mellanox/k8s-rdma-shared-dev-plugin)
GKE_NETWORKS = "networking.gke.io.networks/"  # a GKE node's multi-network networks (<name>, <name>.IP)
GKE_NORTH = "networking.gke.io/north-interfaces"  # a GKE node's additional interfaces: [{network, ipAddress}]
KARPENTER_POOL = "karpenter.sh/nodepool"


def advertised_nics(nic: str, fabric: dict[str, int], labels: dict[str, str],
                    annotations: dict[str, str]) -> int | None:
    """The fabric NICs a node says it has, or None where it says nothing the instance type's figure
    should yield to.
    - efa: the `vpc.amazonaws.com/efa` count of AWS's device plugin. Karpenter (and EKS Auto Mode)
      gives an instance EFA interfaces only when a pod that requests that resource made it launch
      (https://docs.aws.amazon.com/eks/latest/userguide/device-management-efa.html), so a Karpenter
      node that advertises none has none to check.
    - ib: `rdma/*` at 0 means no RDMA device; above 0 it is the shared plugin's `rdmaHcaMax`, how many
      pods may share the HCAs, not how many there are (github.com/Mellanox/k8s-rdma-shared-dev-plugin).
    - gve: the additional networks of GKE's multi-networking; an A3's GPU gVNICs exist only with it
      (https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx)."""
    if nic == "efa":
        if EFA_RESOURCE in fabric:
            return fabric[EFA_RESOURCE]
        return 0 if KARPENTER_POOL in labels else None
    if nic == "ib":
        rdma = [v for k, v in fabric.items() if k.startswith(RDMA_PREFIX)]
        return 0 if rdma and not any(rdma) else None
    if nic == "gve":
        return len(gke_networks(fabric, annotations))
    return None


def gke_networks(fabric: dict[str, int], annotations: dict[str, str]) -> set[str]:
    """The additional networks a GKE node is attached to: its `networking.gke.io.networks/<name>`
    resources and the networks its north-interfaces annotation lists."""
    names = {k.removeprefix(GKE_NETWORKS).removesuffix(".IP") for k in fabric if k.startswith(GKE_NETWORKS)}
    try:
        listed = json.loads(annotations.get(GKE_NORTH) or "[]")
    except (ValueError, RecursionError):  # the node's own words: RecursionError is `[` nested too deep
        listed = []
    names |= {str(i["network"]) for i in (listed if isinstance(listed, list) else [])
              if isinstance(i, dict) and i.get("network")}
    return names - {"default"}


@functools.cache
def file_model() -> type[BaseModel]:
    return model_of(Profile, "ProfileFile")


def load_profile(path: Path) -> Profile:
    """A profile file, checked key by key; every problem as `file:line: key: what; allowed: ...`."""
    data, node = read_yaml(path, "profile")
    if isinstance(data, dict):
        data.setdefault("name", path.stem)
    model = check(file_model(), data, str(path), node, Profile, "mapping of profile keys")
    kw = runtime_values(Profile, model)
    kw["description"] = str(kw.get("description", "")).strip()
    return Profile(**kw, source=str(path))


def load_profiles(directory: Path) -> dict[str, Profile]:
    out: dict[str, Profile] = {}
    for path in sorted(directory.glob("*.yaml")):
        p = load_profile(path)
        if p.name in out:
            raise ConfigError(f"{path}:1: name: profile {p.name!r} is also defined in {out[p.name].source}")
        out[p.name] = p
    if DEFAULT not in out:
        out[DEFAULT] = Profile(DEFAULT, gpus=8, source="built-in")
    return out


def profile_table() -> str:
    """The table of profile keys (docs/configuration.md)."""
    return reference_table(Profile)


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
