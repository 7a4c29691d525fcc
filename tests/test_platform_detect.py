"""What `platform: auto` concludes from the GPU nodes, the RuntimeClasses and the GPU Operator's pods
(sweeper/platforms.py), each mark from the platform's own documentation: EKS managed node groups'
eks.amazonaws.com/nodegroup and Karpenter's karpenter.k8s.aws/* labels, the AWS providerID aws:///
(https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html); AKS's
kubernetes.azure.com/agentpool and azure:// (https://learn.microsoft.com/azure/aks/use-labels); GKE's
cloud.google.com/gke-nodepool and gce:// (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus)."""

from __future__ import annotations

from typing import Any

import pytest

from sweeper.config import Config
from sweeper.platforms import detect, node_platform, resolve


def node(name: str = "n1", labels: dict[str, str] | None = None, provider: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"providerID": provider} if provider else {}}


@pytest.mark.parametrize(("obj", "platform"), [
    (node(labels={"karpenter.k8s.aws/instance-family": "p5"}), "eks"),
    (node(provider="aws:///us-east-1a/i-0abc"), "eks"),
    (node(provider="azure:///subscriptions/x/resourceGroups/y"), "aks"),
    (node(labels={"kubernetes.azure.com/agentpool": "gpu"}), "aks"),
    (node(labels={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, provider="gce://p/z/n"), "gke"),
    (node(provider="kind://docker/kind/kind-worker"), "generic"),
])
def test_a_nodes_platform_from_its_labels_or_provider_id(obj: dict[str, Any], platform: str) -> None:
    assert node_platform(obj)[0] == platform


def test_the_runtime_class_is_named_only_where_it_exists() -> None:
    eks = [node(labels={"eks.amazonaws.com/nodegroup": "gpu"})]
    assert detect(eks, [], set()).runtime_class == ""
    assert detect(eks, [], {"nvidia"}).runtime_class == "nvidia"
    unread = detect(eks, [], None)  # RBAC refused the list: the platform's own default, and it says so
    assert unread.runtime_class == "" and any("could not be read" in w for w in unread.why)
    assert detect([node()], [], None).runtime_class == "nvidia", "generic: the GPU Operator's"


def test_the_node_engine_only_where_nvidia_dcgm_runs_on_every_gpu_node() -> None:
    nodes = [node("a"), node("b")]
    dcgm = [{"metadata": {"labels": {"app": "nvidia-dcgm"}}, "spec": {"nodeName": n}} for n in ("a", "b")]
    assert detect(nodes, dcgm, {"nvidia"}).dcgm_hostengine == "node"
    half = detect(nodes, dcgm[:1], {"nvidia"})
    assert half.dcgm_hostengine == "" and any("1 of 2" in w for w in half.why)


def test_what_is_named_in_the_config_is_kept() -> None:
    nodes = [node(labels={"cloud.google.com/gke-nodepool": "gpu"})]
    cfg, found = resolve(Config(), nodes, [], lambda: {"nvidia"})
    assert found is not None and (cfg.platform, cfg.runtime_class_name) == ("gke", "nvidia")
    cfg, _ = resolve(Config(platform="generic", dcgm_hostengine=""), nodes, [], set)
    assert (cfg.platform, cfg.runtime_class_name) == ("generic", "nvidia"), "a named platform keeps its class"
    calls: list[int] = []
    cfg, found = resolve(Config(platform="eks", dcgm_hostengine=""), nodes, [], lambda: calls.append(1) or set())
    assert found is None and calls == [], "nothing auto: the cluster is not read"
