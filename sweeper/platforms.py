"""Where the GPU nodes run, read from the cluster (`platform: auto`): the managed platform from the
GPU nodes' labels and providerID, whether RuntimeClass `nvidia` exists, and whether the GPU
Operator's standalone DCGM runs on every GPU node. What is found sets the runtime class, GKE's
driver mount and the DCGM host engine of check Jobs; `sweeper plan` prints the reasons."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sweeper.config import PLATFORM_RUNTIME_CLASS, Config

# Labels and providerID schemes each platform puts on its nodes:
# EKS: managed node groups label eks.amazonaws.com/nodegroup, EKS Auto Mode and hybrid nodes
#   eks.amazonaws.com/compute-type, Karpenter's AWS provider karpenter.k8s.aws/*; the AWS cloud
#   provider's providerID is aws:///ZONE/INSTANCE
#   (https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html,
#   https://karpenter.sh/docs/reference/instance-types/).
# AKS: kubernetes.azure.com/cluster and kubernetes.azure.com/agentpool, providerID azure:///subscriptions/...
#   (https://learn.microsoft.com/azure/aks/use-labels).
# GKE: cloud.google.com/gke-nodepool, and cloud.google.com/gke-accelerator on GPU pools, providerID
#   gce://PROJECT/ZONE/INSTANCE (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus).
_MARKS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("gke", ("cloud.google.com/gke-nodepool", "cloud.google.com/gke-accelerator"), "gce://"),
    ("aks", ("kubernetes.azure.com/cluster", "kubernetes.azure.com/agentpool"), "azure://"),
    ("eks", ("eks.amazonaws.com/nodegroup", "eks.amazonaws.com/compute-type", "karpenter.k8s.aws/"), "aws://"),
)
# The GPU Operator's GPU feature discovery labels every GPU node nvidia.com/gpu.present=true, and its
# operands' deploy labels nvidia.com/gpu.deploy.<operand>; its standalone DCGM DaemonSet's pods carry
# app=nvidia-dcgm, and their nv-hostengine listens on the node's port 5555 (a hostPort)
# (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html).
OPERATOR_LABEL = "nvidia.com/gpu.present"
DCGM_APP = "nvidia-dcgm"


@dataclass(frozen=True)
class Found:
    """What `platform: auto` read from the cluster, and why."""

    platform: str
    runtime_class: str
    dcgm_hostengine: str
    operator: bool
    why: tuple[str, ...]

    def apply(self, cfg: Config) -> Config:
        """The config with what was found in place of each `auto`."""
        # A named platform keeps its own runtime class (`runtime_class: auto` follows the platform).
        return replace(cfg, platform=self.platform if cfg.platform == "auto" else cfg.platform,
                       runtime_class=self.runtime_class if cfg.platform == "auto" and cfg.runtime_class == "auto"
                       else cfg.runtime_class,
                       dcgm_hostengine=self.dcgm_hostengine if cfg.dcgm_hostengine == "auto" else cfg.dcgm_hostengine)


def node_platform(node: dict[str, Any]) -> tuple[str, str]:
    """(platform, the mark that says so) of one node; ("generic", "") when none does."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    provider = str((node.get("spec") or {}).get("providerID") or "")
    for name, keys, scheme in _MARKS:
        for key in keys:
            hit = next((k for k in labels if k == key or (key.endswith("/") and k.startswith(key))), None)
            if hit:
                return name, f"label {hit}"
        if provider.startswith(scheme):
            return name, f"providerID {scheme}"
    return "generic", ""


def detect(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], runtime_classes: set[str] | None) -> Found:
    """The platform of the GPU nodes `nodes`, the runtime class and DCGM host engine to use there."""
    why: list[str] = []
    seen = Counter(node_platform(n) for n in nodes)
    by_platform = Counter[str]()
    for (name, _), count in seen.items():
        by_platform[name] += count
    platform = by_platform.most_common(1)[0][0] if by_platform else "generic"
    mark = next((m for (name, m), _ in seen.most_common() if name == platform and m), "")
    why.append(f"platform {platform}: " + (f"{by_platform[platform]} of {len(nodes)} GPU nodes carry the {mark}"
                                            if mark else "no EKS, AKS or GKE label or providerID on the GPU nodes"))
    if len(by_platform) > 1:
        why.append("the GPU nodes disagree: " + ", ".join(f"{k} {v}" for k, v in sorted(by_platform.items())))
    operator = any(((n.get("metadata") or {}).get("labels") or {}).get(OPERATOR_LABEL) == "true" for n in nodes)
    if runtime_classes is None:
        runtime_class = PLATFORM_RUNTIME_CLASS[platform]
        why.append(f"RuntimeClasses could not be read (RBAC: list runtimeclasses.node.k8s.io): "
                   f"{runtime_class or 'none'} as on {platform}")
    elif "nvidia" in runtime_classes:
        runtime_class = "nvidia"
        why.append("RuntimeClass nvidia exists" + (" (the GPU Operator's)" if operator else "") +
                   ": check pods name it")
    else:
        runtime_class = ""
        why.append("no RuntimeClass nvidia: check pods name none and run under the node's default runtime" + {
            "eks": " (NVIDIA's on EKS's GPU AMIs)", "aks": " (NVIDIA's on AKS's GPU node images)",
            "gke": "; GKE's device plugin mounts the driver from /home/kubernetes/bin/nvidia at /usr/local/nvidia",
            "generic": "; that must be NVIDIA's on these nodes"}[platform])
    why.append("the GPU Operator runs (nvidia.com/gpu.present on the GPU nodes)" if operator
               else "no GPU Operator (no nvidia.com/gpu.present label on the GPU nodes)")
    names = {str((n.get("metadata") or {}).get("name")) for n in nodes}
    dcgm = {str((p.get("spec") or {}).get("nodeName")) for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get("app") == DCGM_APP} & names
    if names and dcgm == names:
        engine = "node"
        why.append(f"the GPU Operator's {DCGM_APP} runs on every GPU node: DCGM checks use its host engine (node:5555)")
    else:
        engine = ""
        why.append("DCGM checks start their own host engine" +
                   (f" ({DCGM_APP} runs on {len(dcgm)} of {len(names)} GPU nodes)" if dcgm else ""))
    return Found(platform, runtime_class, engine, operator, tuple(why))


def resolve(cfg: Config, nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
            runtime_classes: Callable[[], set[str] | None]) -> tuple[Config, Found | None]:
    """The config with `auto` settled from the cluster (runtime_classes: a callable that reads them,
    called only when needed), and what was found; (cfg, None) when nothing is `auto`."""
    if "auto" not in (cfg.platform, cfg.dcgm_hostengine):  # a named platform names its runtime class
        return cfg, None
    found = detect(nodes, pods, runtime_classes())
    return found.apply(cfg), found
