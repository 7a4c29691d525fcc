"""The fleet file: nodes by instance type and labels, training pods that come and go, and
per-node faults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, Strict

from sweeper.schema import (
    ConfigProblems,
    NodeRef,
    check,
    duration_type,
    locate,
    read_yaml,
    runtime_values,
)
from sweeper.sim.demofleet import DEMO_FLEET as DEMO_FLEET
from sweeper.sim.dra import KueueWorkload
from sweeper.sim.faults import _FAULTS, FAULT_KEYS, Faults, _Strict  # noqa: F401  (FAULT_KEYS, Faults: their old home)
from sweeper.sim.rollout import Rollout, apply_rollouts

# What each instance type *is* (the simulated hardware), not what Sweeper expects of it.
# `fabric_resources`: what the node's fabric device plugin advertises. AWS's EFA device plugin names
# each EFA device `vpc.amazonaws.com/efa` (p5/p5e: 32, p5en: 16, p4d/p4de: 4, p6-b200: 8 as the
# instance types' network cards list them: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html,
# https://github.com/aws/eks-charts/tree/master/stable/aws-efa-k8s-device-plugin). AKS's ND H100 v5 gets
# its 8 InfiniBand HCAs from the NVIDIA Network Operator's RDMA shared device plugin, configured per
# HCA as `rdma/ib` (https://github.com/Mellanox/k8s-rdma-shared-dev-plugin; the plugin's pooled form
# is `rdma/shared_ib`). GKE's A3 High moves GPU traffic over GPUDirect-TCPX on gVNICs through
# multi-networking, with no device plugin resource (https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx).
# `nccl_pair_peak`: a healthy two-node all_reduce_perf bus bandwidth at 8 GB (GB/s, 16 ranks). p5's 479
# GB/s and p4de's 78 GB/s (at 2 GB) are the 2-node runs in aws-samples/awsome-distributed-training,
# micro-benchmarks/nccl-tests/README.md; nccl-tests' two-node busbw can exceed the node's line rate
# (NCCL's tree, https://github.com/NVIDIA/nccl-tests/issues/22). The other 3,200 Gbps shapes (p5e,
# p5en, p6-b200, ND H100 v5's 8 x 400 Gb/s NDR) are taken as p5, and A3 High's 4 x 200 Gbps of
# GPUDirect-TCPX as a third of it: estimates, for want of a published two-node figure.
_H100 = {"gpus": 8, "model": "NVIDIA H100 80GB HBM3", "cpu": "192", "memory": "2097152Mi", "device_id": "2330",
         "nccl_peak": 480.0, "nvlinks": 18, "pcie_gen": 5, "arch": "x86_64", "memory_mib": 81559,
         "nvswitch_fabric": True}
_EFA = "vpc.amazonaws.com/efa"
DEFAULT_DRIVER = "570.133.20"
# The CUDA release each driver branch ships with, for GPU feature discovery's runtime-version labels
# (the CUDA Toolkit release notes' table of toolkit and driver versions:
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#cuda-driver).
CUDA_OF_BRANCH = {535: "12.2", 550: "12.4", 560: "12.6", 565: "12.7", 570: "12.8", 575: "12.9", 580: "13.0"}

HARDWARE: dict[str, dict[str, Any]] = {
    "p5.48xlarge": {**_H100, "nic": "efa", "nics": 32, "nic_rate": 100, "fabric_resources": {_EFA: 32},
                    "nccl_pair_peak": 479.0},
    "p5e.48xlarge": {**_H100, "model": "NVIDIA H200", "device_id": "2335", "memory_mib": 143771, "nic": "efa", "nics": 32, "nic_rate": 100,
                     "fabric_resources": {_EFA: 32}, "nccl_pair_peak": 479.0},
    "p5en.48xlarge": {**_H100, "model": "NVIDIA H200", "device_id": "2335", "memory_mib": 143771, "nic": "efa", "nics": 16,
                      "nic_rate": 200, "fabric_resources": {_EFA: 16}, "nccl_pair_peak": 479.0},
    "p4d.24xlarge": {**_H100, "nvswitch_fabric": False, "model": "NVIDIA A100-SXM4-40GB", "cpu": "96", "memory": "1179648Mi", "memory_mib": 40960,
                     "device_id": "20b0", "nccl_peak": 235.0, "nvlinks": 12, "pcie_gen": 4, "nic": "efa", "nics": 4,
                     "nic_rate": 100, "fabric_resources": {_EFA: 4}, "nccl_pair_peak": 80.0},
    "p4de.24xlarge": {**_H100, "nvswitch_fabric": False, "model": "NVIDIA A100-SXM4-80GB", "cpu": "96", "memory": "1179648Mi", "memory_mib": 81920,
                      "device_id": "20b2", "nccl_peak": 235.0, "nvlinks": 12, "pcie_gen": 4, "nic": "efa", "nics": 4,
                      "nic_rate": 100, "fabric_resources": {_EFA: 4}, "nccl_pair_peak": 80.0},
    "p6-b200.48xlarge": {**_H100, "model": "NVIDIA B200", "device_id": "2901", "memory_mib": 183359, "nccl_peak": 800.0, "nic": "efa",
                         "nics": 8, "nic_rate": 400, "fabric_resources": {_EFA: 8}, "nccl_pair_peak": 479.0},
    "Standard_ND96isr_H100_v5": {**_H100, "cpu": "96", "memory": "1900Gi", "nic": "ib", "nics": 8, "nic_rate": 400,
                                 "fabric_resources": {"rdma/ib": 8}, "nccl_pair_peak": 479.0},
    "a3-highgpu-8g": {**_H100, "cpu": "208", "memory": "1872Gi", "nic": "gve", "nics": 5, "nic_rate": 200,
                      "fabric_resources": {}, "nccl_pair_peak": 160.0},
    "m7i.4xlarge": {"gpus": 0, "model": "", "cpu": "16", "memory": "65536Mi", "device_id": "", "nccl_peak": 0.0,
                    "nvlinks": 0, "pcie_gen": 0, "nic": "ena", "nics": 1, "nic_rate": 0, "arch": "x86_64", "memory_mib": 0,
                    "fabric_resources": {}, "nccl_pair_peak": 0.0},
}
for _hw in HARDWARE.values():
    _hw["nic_rate_gbps"] = _hw["nic_rate"]  # the name the pair sweep's contract uses for the same figure


class _Taint(_Strict):
    key: Annotated[str, Strict(), Field(min_length=1)]
    value: Annotated[str, Strict()] = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class _NodeGroup(_Strict):
    instance_type: Literal[tuple(HARDWARE)] = "p5.48xlarge"  # type: ignore[valid-type]
    name_prefix: Annotated[str, Strict()] | None = None
    count: Annotated[int, Strict(), Field(ge=0, le=100_000)] = 1
    zone: Annotated[str, Strict()] = "us-east-1a"
    labels: dict[str, Annotated[str, Strict()]] = {}
    age: duration_type(ge=0) = 2 * 86400.0  # type: ignore[valid-type]
    gpu_operator: Annotated[bool, Strict()] = True  # false: no GPU feature discovery labels
    operands: Annotated[bool, Strict()] = False  # the GPU Operator's operand pods run on these nodes
    # The standalone device plugin's DaemonSet pod (kube-system) runs on these nodes (with `operands`,
    # the operator's pod is the device plugin): deleting it restarts the plugin.
    device_plugin_pod: Annotated[bool, Strict()] = False
    # The NVIDIA driver these nodes run, as NVML prints it: its branch (the major) sets the CUDA major
    # it runs (sweeper.drivers), which GPU feature discovery labels and DCGM loads the build of.
    driver: Annotated[str, Strict(), Field(pattern=r"^\d{3,4}\.\d+(\.\d+)?$")] = DEFAULT_DRIVER
    # GKE: the node pool's additional networks (multi-networking); without them an A3 has its primary gVNIC only
    multi_network: Annotated[bool, Strict()] = True
    dra: Annotated[bool, Strict()] = False  # GPUs as a DRA ResourceSlice, not nvidia.com/gpu (sweeper.sim.dra)
    # Taints a node of this group registers with and that another controller is to remove: a Karpenter
    # NodePool's startupTaints (https://karpenter.sh/docs/concepts/nodepools/), an EKS node group's
    # taints. Every replacement carries them, and the group's own nodes of age 0 (just launched).
    startup_taints: list[_Taint] = []
    # A node launched registers NotReady with no GPU advertised, and is Ready with its GPUs this long after.
    boot: duration_type(ge=0) = 0.0  # type: ignore[valid-type]


class _Workload(_Strict):
    node: Annotated[str, Strict()] | None = None
    gpus: Annotated[int, Strict(), Field(ge=0)] = 8
    duration: duration_type(gt=0) | None = None  # type: ignore[valid-type]
    count: Annotated[int, Strict(), Field(ge=0)] = 1


class _Arrivals(_Strict):
    per_hour: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] = 0.0
    gpus: Annotated[int, Strict(), Field(ge=1)] = 8
    duration: tuple[duration_type(gt=0), duration_type(gt=0)] | None = None  # type: ignore[valid-type]


_Rate = Annotated[float, Strict(), Field(ge=0, le=1)]


class _ApiFaults(_Strict):
    rate: _Rate = 0.0
    lost_reply_rate: _Rate = 0.0
    latency: Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)] = 0.0
    slow_rate: _Rate = 0.0
    drop_rate: _Rate = 0.0


class _Registry(_Strict):
    missing: list[Annotated[str, Strict()]] = []  # image references that do not exist
    lacking: dict[str, list[Annotated[str, Strict()]]] = {}  # image -> programs it does not carry
    # image -> the CUDA majors of the DCGM builds it carries (datacenter-gpu-manager-4-cuda12, -cuda13);
    # an image not named carries every build. DCGM loads the build of the major the node's driver runs.
    cuda_builds: dict[str, list[Annotated[int, Strict(), Field(ge=11)]]] = {}


class FleetFile(_Strict):
    """The fleet file, described once: its loader and its file:line messages come from here."""

    name: Annotated[str, Strict()] = "fleet"
    seed: Annotated[int, Strict()] = 1
    speed: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] = 600.0
    namespace: Annotated[str, Strict()] = "sweeper"
    node_groups: list[_NodeGroup] | None = None
    workloads: list[_Workload] | None = None
    arrivals: _Arrivals | None = None
    faults: dict[str, _FAULTS | None] | None = None  # type: ignore[valid-type]
    check_seconds: duration_type(gt=0) = 45.0  # type: ignore[valid-type]
    api_faults: _ApiFaults | None = None
    registry: _Registry | None = None
    # The platform's shape: its node labels and providerIDs, and the defaults of the three keys
    # below and of each node group's gpu_operator. generic: the GPU Operator (RuntimeClass nvidia,
    # GPU feature discovery labels); eks, aks: no operator, no RuntimeClass, NVIDIA's runtime as
    # containerd's default (EKS's accelerated AMIs, AKS's GPU node images); gke: no operator, no
    # RuntimeClass, runc, the driver mounted by GKE's device plugin at /usr/local/nvidia.
    platform: Literal["generic", "eks", "aks", "gke"] = "generic"
    # RuntimeClasses the cluster has: the GPU Operator creates `nvidia`; [] is a cluster without it.
    runtime_classes: list[Annotated[str, Strict()]] = ["nvidia"]
    # containerd's default runtime on the GPU nodes: NVIDIA's on EKS's and AKS's GPU images, runc on GKE's.
    default_runtime: Literal["nvidia", "runc"] = "nvidia"
    # The Kubeflow MPI Operator is installed: kubeflow.org/v2beta1 mpijobs are served and run.
    mpi_operator: Annotated[bool, Strict()] = False
    kueue: Annotated[bool, Strict()] = False  # Kueue is installed: kueue.x-k8s.io/v1beta1 Workloads are served
    kueue_workloads: list[KueueWorkload] | None = None  # pending ones (sweeper.sim.dra)
    fail_rate: _Rate = 0.0  # each node's chance to fail its check on a simulated day (sweeper.sim.rollout)
    rollouts: list[Rollout] | None = None  # a driver on part of the fleet, failing at its own rate


@dataclass
class NodeSpec:
    name: str
    instance_type: str
    zone: str
    labels: dict[str, str]
    age: float
    faults: Faults
    gpu_operator: bool = True  # False: no GPU feature discovery labels (nvidia.com/gpu.present), as on EKS, GKE, AKS
    operands: bool = False  # the GPU Operator's device plugin, GFD, DCGM and dcgm-exporter pods run here
    device_plugin_pod: bool = False  # the standalone device plugin's pod runs here
    driver: str = DEFAULT_DRIVER  # the NVIDIA driver version (node group key `driver`)
    multi_network: bool = True  # GKE: attached to its pool's additional networks (an A3's GPU gVNICs)
    dra: bool = False  # its GPUs are published as a DRA ResourceSlice (node group key `dra`)
    startup_taints: list[dict[str, str]] = field(default_factory=list)  # node group key `startup_taints`
    boot: float = 0.0  # node group key `boot`: NotReady, no GPU advertised, this long after launch
    fail_rate: float = 0.0  # chance a simulated day that its check fails (PCIe replays): fleet `fail_rate`, `rollouts`


@dataclass
class Workload:
    node: str | None  # None: let the scheduler choose
    gpus: int
    duration: float | None  # None: runs until deleted


@dataclass
class Fleet:
    name: str = "fleet"
    seed: int = 1
    speed: float = 600.0
    speed_given: bool = False  # the file itself set `speed` (not the default)
    namespace: str = "sweeper"
    nodes: list[NodeSpec] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    arrivals_per_hour: float = 0.0
    arrival_gpus: int = 8
    arrival_duration: tuple[float, float] = (3600.0, 6 * 3600.0)
    check_seconds: float = 45.0
    api_fault_rate: float = 0.0
    api_lost_reply_rate: float = 0.0
    api_latency: float = 0.0  # seconds of real time added to a share of requests (api_faults.slow_rate)
    api_slow_rate: float = 0.0
    api_drop_rate: float = 0.0  # share of requests whose connection is dropped without an answer
    missing_images: list[str] = field(default_factory=list)  # registry.missing: references that do not exist
    image_lacks: dict[str, list[str]] = field(default_factory=dict)  # registry.lacking: image -> absent programs
    cuda_builds: dict[str, list[int]] = field(default_factory=dict)  # registry.cuda_builds: image -> CUDA majors
    runtime_classes: list[str] = field(default_factory=lambda: ["nvidia"])
    default_runtime: str = "nvidia"
    mpi_operator: bool = False
    platform: str = "generic"
    kueue: bool = False  # kueue.x-k8s.io is served
    kueue_workloads: list[dict[str, Any]] = field(default_factory=list)  # pending: name, namespace, gpus, count, claim
    dra: bool = False  # resource.k8s.io is served: some node group publishes its GPUs through DRA


def platform_labels(platform: str, pool: str) -> dict[str, str]:
    """The labels a managed platform puts on a GPU pool's nodes (beside the well-known ones):
    https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html,
    https://learn.microsoft.com/azure/aks/use-labels,
    https://cloud.google.com/kubernetes-engine/docs/how-to/gpus."""
    return {"eks": {"eks.amazonaws.com/nodegroup": pool, "eks.amazonaws.com/capacityType": "ON_DEMAND"},
            "aks": {"kubernetes.azure.com/cluster": "MC_sweeper_aks_eastus", "kubernetes.azure.com/agentpool": pool,
                    "agentpool": pool},
            "gke": {"cloud.google.com/gke-nodepool": pool, "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            }.get(platform, {})


def load_fleet(path: Path) -> Fleet:
    data, node = read_yaml(path, "fleet file")
    return parse_fleet(data, str(path), node)


def parse_fleet(raw: Any, origin: str = "fleet", node: NodeRef = None) -> Fleet:
    """A fleet from its file's data; every problem as `file:line: key: what; allowed: ...`."""
    spec = check(FleetFile, raw, origin, node, None, "fleet file")
    assert isinstance(spec, FleetFile)
    api = spec.api_faults or _ApiFaults()
    fleet = Fleet(name=spec.name, seed=spec.seed, speed=spec.speed, speed_given="speed" in spec.model_fields_set,
                  namespace=spec.namespace, check_seconds=spec.check_seconds, api_fault_rate=api.rate,
                  api_lost_reply_rate=api.lost_reply_rate, api_latency=api.latency, api_slow_rate=api.slow_rate,
                  api_drop_rate=api.drop_rate)
    managed = spec.platform != "generic"
    for group in spec.node_groups or []:
        prefix = group.instance_type.split(".")[0] + "-" if group.name_prefix is None else group.name_prefix
        operator = group.gpu_operator if "gpu_operator" in group.model_fields_set or not managed else False
        labels = {**platform_labels(spec.platform, prefix.rstrip("-") or "gpu"), **group.labels}
        for i in range(group.count):
            fleet.nodes.append(NodeSpec(name=f"{prefix}{i:0{max(2, len(str(group.count)))}d}",
                                        instance_type=group.instance_type, zone=group.zone,
                                        labels=dict(labels), age=group.age, faults=Faults(),
                                        gpu_operator=operator, operands=group.operands,
                                        device_plugin_pod=group.device_plugin_pod, driver=group.driver,
                                        multi_network=group.multi_network, dra=group.dra,
                                        startup_taints=[t.model_dump() for t in group.startup_taints],
                                        boot=group.boot))
    fleet.platform = spec.platform
    registry = spec.registry or _Registry()
    fleet.missing_images = list(registry.missing)
    fleet.image_lacks = {k: list(v) for k, v in registry.lacking.items()}
    fleet.cuda_builds = {k: list(v) for k, v in registry.cuda_builds.items()}
    fleet.runtime_classes = list(spec.runtime_classes) if "runtime_classes" in spec.model_fields_set or not managed else []
    fleet.default_runtime = spec.default_runtime if "default_runtime" in spec.model_fields_set \
        else "runc" if spec.platform == "gke" else "nvidia"
    fleet.mpi_operator = spec.mpi_operator
    apply_rollouts(fleet.nodes, list(spec.rollouts or []), spec.seed, spec.fail_rate)
    fleet.kueue, fleet.dra = spec.kueue or bool(spec.kueue_workloads), any(n.dra for n in fleet.nodes)
    fleet.kueue_workloads, by_name = [w.model_dump() for w in spec.kueue_workloads or []], {n.name: n for n in fleet.nodes}
    for name, faults in (spec.faults or {}).items():
        if name not in by_name:
            line, _ = locate(node, ("faults", name))
            raise ConfigProblems([f"{origin}:{line}: faults.{name}: the fleet has no such node; allowed: one of "
                                  f"{', '.join(list(by_name)[:8])}{', ...' if len(by_name) > 8 else ''}"])
        by_name[name].faults = Faults(**runtime_values(Faults, faults)) if faults is not None else Faults()
    for w in spec.workloads or []:
        for _ in range(w.count):
            fleet.workloads.append(Workload(node=w.node, gpus=w.gpus, duration=w.duration))
    arr = spec.arrivals or _Arrivals()
    fleet.arrivals_per_hour, fleet.arrival_gpus = arr.per_hour, arr.gpus
    if arr.duration is not None:
        fleet.arrival_duration = arr.duration
    return fleet
