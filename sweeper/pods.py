"""Pods as Sweeper reads them: which hold or wait for GPUs (device-plugin resources or DRA claims),
which are a DaemonSet's, and which are Sweeper's own."""

from __future__ import annotations

from typing import Any

from sweeper.config import Config
from sweeper.kube.dra import CLAIMS, DEMAND


def is_gpu_resource(name: str, gpu_resources: tuple[str, ...], gpu_prefixes: tuple[str, ...]) -> bool:
    return name in gpu_resources or name.startswith(tuple(gpu_prefixes))


def holds_dra_gpus(pod: dict[str, Any], cfg: Config) -> bool:
    """The pod's claims (folded in by sweeper.kube.dra) ask for the driver's DeviceClass or hold its
    devices; a pending Workload's podSet that names a claim asks for devices too."""
    if not cfg.dra_driver:
        return False
    if pod.get(DEMAND) and (pod.get("spec") or {}).get("resourceClaims"):
        return True
    return any(cfg.dra_driver in c.get("classes", ()) or any(d.get("driver") == cfg.dra_driver for d in c["devices"])
               for c in pod.get(CLAIMS) or ())


def requests_gpu(pod: dict[str, Any], cfg: Config) -> bool:
    if holds_dra_gpus(pod, cfg):
        return True
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for section in ("requests", "limits"):
            for name, value in (res.get(section) or {}).items():
                gpu = is_gpu_resource(name, cfg.gpu_resources, cfg.gpu_resource_prefixes)
                if gpu and str(value) not in ("0", ""):
                    return True
    return False


def is_daemonset_pod(pod: dict[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or [])


MANAGED_BY = "app.kubernetes.io/managed-by"


def sweeper_namespaces(cfg: Config) -> frozenset[str]:
    """The namespaces whose pods Sweeper creates: its check Jobs (and a pair's Job or MPIJob launcher),
    its reboot and GPU reset Jobs, and its own controller's."""
    return frozenset((cfg.check_namespace, cfg.remediation_namespace, cfg.namespace))


def is_sweeper_pod(pod: dict[str, Any], cfg: Config) -> bool:
    """Sweeper's own pod: its managed-by label in one of Sweeper's namespaces. The label alone proves
    nothing: anyone who may create a pod in a namespace of their own may set it, and a workload so
    labelled would be invisible to the gate and to the demand that stops a sweep."""
    md = pod["metadata"]
    return (md.get("labels") or {}).get(MANAGED_BY) == "sweeper" and md.get("namespace") in sweeper_namespaces(cfg)


def gpu_pods_by_node(pods: list[dict[str, Any]], cfg: Config) -> dict[str, list[str]]:
    """Node name to the non-DaemonSet pods on it that hold GPUs (workloads Sweeper must not disturb)."""
    out: dict[str, list[str]] = {}
    for p in pods:
        # a pod holds the node's GPUs once bound there, or once its claim is allocated on the node's pool
        node = (p.get("spec") or {}).get("nodeName") or next(
            (c["node"] for c in p.get(CLAIMS) or () if c.get("node") and c.get("devices")), None)
        if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if is_daemonset_pod(p) or not requests_gpu(p, cfg):
            continue
        out.setdefault(node, []).append(f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}")
    return out


def pending_gpu_pods(pods: list[dict[str, Any]], cfg: Config) -> list[str]:
    """Workload pods waiting for GPUs (not Sweeper's own check pods)."""
    out = []
    for p in pods:
        if (p.get("spec") or {}).get("nodeName") or is_sweeper_pod(p, cfg):
            continue
        if (p.get("status") or {}).get("phase") == "Pending" and requests_gpu(p, cfg):
            out.append(p.get(DEMAND) or f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}")
    return out
