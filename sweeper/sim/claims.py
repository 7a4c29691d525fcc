"""What other tools claim of a simulated node (fault key `outside_claims`): a node condition, a
node taint or a DRA device taint, put on the node object (or its ResourceSlice) as the tool would.
A claim is true or false only by what the node's other faults make the checks find.

The shapes are the tools' own: the EKS node monitoring agent's AcceleratedHardwareReady=False with
a reason such as NvidiaXID79Error (https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html);
NVSentinel's per-check condition, status True, reason <Check>IsNotHealthy, and its quarantine taint
AggregatedNodeHealth=False:NoSchedule (NVIDIA/NVSentinel#753, #911); NVIDIA's DRA driver's device
taint gpu.nvidia.com/xid=<code>:NoSchedule in the ResourceSlice
(kubernetes-sigs/dra-driver-nvidia-gpu, docs/guides/gpu-health-checking.md).

That driver's GPU kubelet plugin runs as a DaemonSet pod on each DRA node (namespace and selector
label as its Helm chart names them); its device taints stay until the plugin restarts, which then
re-evaluates device health and taints only what NVML still reports (the guide's "Recovering from an
unhealthy device"): here, a GPU lost now."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from sweeper.clock import iso

_Text = Annotated[str, Strict(), Field(max_length=2000)]


class OutsideClaim(BaseModel):
    """One of `condition`, `taint`, `device_taint` (with `device`, else gpu-0)."""

    model_config = ConfigDict(extra="forbid")
    condition: _Text | None = None
    taint: _Text | None = None
    device_taint: _Text | None = None
    device: _Text = "gpu-0"
    status: Literal["True", "False", "Unknown"] = "True"
    reason: _Text = ""
    message: _Text = ""
    value: _Text = ""
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule", "None"] = "NoSchedule"

    @model_validator(mode="after")
    def _one(self) -> OutsideClaim:
        if sum(1 for k in (self.condition, self.taint, self.device_taint) if k) != 1:
            raise ValueError("name exactly one of condition, taint, device_taint")
        return self


def on_node(node: dict[str, Any], claims: list[dict[str, Any]], now: float) -> None:
    """Put the claims that are conditions or node taints on a node object about to be created."""
    for c in claims:
        if c.get("condition"):
            node["status"]["conditions"].append({
                "type": c["condition"], "status": c.get("status", "True"), "reason": c.get("reason", ""),
                "message": c.get("message", ""), "lastHeartbeatTime": iso(now), "lastTransitionTime": iso(now)})
        elif c.get("taint"):
            node["spec"].setdefault("taints", []).append({
                "key": c["taint"], "value": c.get("value", ""), "effect": c.get("effect", "NoSchedule"),
                "timeAdded": iso(now)})


def on_slice(rslice: dict[str, Any], claims: list[dict[str, Any]], now: float) -> None:
    """Put the claims that are device taints on the node's ResourceSlice (KEP-5055: each device's
    `taints`, with key, value, effect and timeAdded)."""
    by_name = {d["name"]: d for d in rslice["spec"]["devices"]}
    for c in claims:
        device = by_name.get(c.get("device", "gpu-0")) if c.get("device_taint") else None
        if device is not None:
            device.setdefault("taints", []).append({"key": c["device_taint"], "value": c.get("value", ""),
                                                    "effect": c.get("effect", "NoSchedule"),
                                                    "timeAdded": iso(now)})


DRA_PLUGIN_NS = "dra-driver-nvidia-gpu"
DRA_PLUGIN_LABEL = ("dra-driver-nvidia-gpu-component", "kubelet-plugin")  # the chart's selectorLabels


def dra_plugin_pod(node: str) -> dict[str, Any]:
    """The DRA driver's kubelet plugin pod on a node, as its DaemonSet makes it (not yet started)."""
    name = f"dra-driver-nvidia-gpu-kubelet-plugin-{hashlib.sha1(node.encode()).hexdigest()[:5]}"
    return {"metadata": {"name": name, "namespace": DRA_PLUGIN_NS,
                         "labels": {DRA_PLUGIN_LABEL[0]: DRA_PLUGIN_LABEL[1],
                                    "app.kubernetes.io/name": "dra-driver-nvidia-gpu"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                              "name": "dra-driver-nvidia-gpu-kubelet-plugin",
                                              "uid": "dra-driver-nvidia-gpu-kubelet-plugin", "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "gpus", "image": "registry.k8s.io/dra-driver-nvidia/"
                                                                                "dra-driver-nvidia-gpu:v25.12.0"}],
                     "tolerations": [{"operator": "Exists"}]},
            "status": {"phase": "Pending"}}


def republish(rslice: dict[str, Any], lost: list[int], now: float) -> None:
    """The kubelet plugin started again: every device taint is gone but a lost GPU's, and the pool's
    generation moves on (a new publication of the slice)."""
    for device in rslice["spec"]["devices"]:
        device.pop("taints", None)
        index = (device.get("attributes") or {}).get("index", {}).get("int")
        if index in lost:
            device["taints"] = [{"key": "gpu.nvidia.com/gpu-lost", "value": "", "effect": "NoSchedule",
                                 "timeAdded": iso(now)}]
    rslice["spec"]["pool"]["generation"] = int(rslice["spec"]["pool"].get("generation", 1)) + 1
