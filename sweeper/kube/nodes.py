"""The calls on nodes (and their RuntimeClasses), Karpenter's NodeClaims, and pods: what a
discovery pass lists and what holding, checking and replacing a node writes."""

from __future__ import annotations

import ssl
from typing import Any

import urllib3
from kubernetes import client

from sweeper.errors import Forbidden, NotFound
from sweeper.kube.dra import DraCalls
from sweeper.kube.retry import JSON_PATCH


class NodeCalls(DraCalls):
    """Nodes, RuntimeClasses, NodeClaims and pods."""

    # -- nodes -------------------------------------------------------------------
    def list_nodes(self, label_selector: str = "", page_size: int = 500, devices: bool = True) -> list[dict[str, Any]]:
        """The nodes, each with the DRA devices its ResourceSlices publish (sweeper.kube.dra); with
        devices=False the nodes alone (a reader that needs only their labels asks for nothing more)."""
        nodes = list(self._pages("list nodes", self.core.list_node, page_size, label_selector=label_selector))
        return self.fold_devices(nodes, page_size) if devices else nodes

    def runtime_class_names(self) -> set[str] | None:
        """The cluster's RuntimeClasses (node.k8s.io/v1), or None where they cannot be read (403, not served)."""
        api = client.NodeV1Api(self.api_client)
        try:
            return {str((rc.get("metadata") or {}).get("name")) for rc in
                    self._pages("list runtimeclasses", api.list_runtime_class, 500)}
        except (Forbidden, NotFound):
            return None

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call(f"get node {name}", lambda: self.core.read_node(name, _preload_content=False))

    def patch_node(self, name: str, body: Any, content_type: str = JSON_PATCH) -> dict[str, Any]:
        return self._call(f"patch node {name}", lambda: self.core.patch_node(
            name, body, _content_type=content_type, _preload_content=False), write=True)

    def patch_node_status(self, name: str, body: Any) -> dict[str, Any]:
        """A strategic merge of the node's status (its conditions, by type)."""
        return self._call(f"patch node status {name}", lambda: self.core.patch_node_status(
            name, body, _content_type="application/strategic-merge-patch+json", _preload_content=False), write=True)

    # -- Karpenter ---------------------------------------------------------------
    def list_nodeclaims(self) -> list[dict[str, Any]]:
        doc = self._call("list nodeclaims", lambda: self.custom.list_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", _preload_content=False))
        return list(doc.get("items") or [])

    def delete_nodeclaim(self, name: str) -> bool:
        """Delete a NodeClaim (Karpenter drains and terminates its node); False when already gone."""
        return self._delete(f"delete nodeclaim {name}", lambda: self.custom.delete_cluster_custom_object(
                "karpenter.sh", "v1", "nodeclaims", name, _preload_content=False))

    def delete_node(self, name: str) -> dict[str, Any]:
        return self._call(f"delete node {name}", lambda: self.core.delete_node(name, _preload_content=False),
                          write=True)

    # -- pods --------------------------------------------------------------------
    def list_pods(self, field_selector: str = "", label_selector: str = "",
                  page_size: int = 500) -> list[dict[str, Any]]:
        return list(self._pages("list pods", self.core.list_pod_for_all_namespaces, page_size,
                                field_selector=field_selector, label_selector=label_selector))

    def active_pods(self, node: str | None = None, page_size: int = 500) -> list[dict[str, Any]]:
        """Pods that have not finished, on one node or across the cluster, trimmed to the fields
        that say who holds which GPUs (a fleet's pods are most of a discovery pass's memory)."""
        sel = "status.phase!=Succeeded,status.phase!=Failed"
        if node:
            sel = f"spec.nodeName={node}," + sel
        pods = list(self._pages("list pods", self.core.list_pod_for_all_namespaces, page_size, keep=slim_pod,
                                field_selector=sel))
        # Pods that hold GPUs through DRA claims; across the cluster, Kueue's pending Workloads too.
        pods = self.fold_claims(pods, page_size, always=not node)
        return pods if node else pods + self.kueue_demand(page_size)

    def pending_pods(self) -> list[dict[str, Any]]:
        """Pods waiting to be scheduled, across the cluster (trimmed like active_pods), with their
        claims, and Kueue's pending Workloads (the demand that aborts abortable checks)."""
        pods = list(self._pages("list pods", self.core.list_pod_for_all_namespaces, 500, keep=slim_pod,
                                field_selector="status.phase=Pending,spec.nodeName="))
        return self.fold_claims(pods) + self.kueue_demand()

    def namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return list(self._pages("list pods", lambda **kw: self.core.list_namespaced_pod(namespace, **kw), 500,
                                label_selector=label_selector))

    def pod_log(self, namespace: str, name: str, limit_bytes: int = 8 * 1024 * 1024) -> str:
        """The pod's log, at most `limit_bytes` of it. The kubelet applies limitBytes and the API server
        passes its answer through: a node taken over may send more, so no more is read here either.
        Each read of the body waits at most the policy's read timeout, as the request did."""
        what = f"read log of pod {namespace}/{name}"
        resp = self._call(what, lambda: self.core.read_namespaced_pod_log(
            name, namespace, limit_bytes=limit_bytes, _preload_content=False), raw=False)
        try:
            data = resp.read(limit_bytes)
            if resp.read(1):  # more than asked for: the rest is never read, the connection is dropped
                resp.close()
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, ssl.SSLError) as exc:
            raise self._unanswered(exc, what) from None
        finally:
            resp.release_conn()
        return bytes(data).decode("utf-8", errors="replace")

    def evict_pod(self, namespace: str, name: str) -> None:
        """One eviction through the Eviction API; a 429 (a PodDisruptionBudget says no) is
        raised to the caller, which waits on its own deadline, not retried here."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        self._call(f"evict pod {namespace}/{name}", lambda: self.core.create_namespaced_pod_eviction(
            name, namespace, body, _preload_content=False), attempts=1, write=True)

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete one pod (its DaemonSet starts a new one); False when already gone."""
        return self._delete(f"delete pod {namespace}/{name}", lambda: self.core.delete_namespaced_pod(
                name, namespace, _preload_content=False))


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "labels": meta.get("labels") or {},
                     "uid": meta.get("uid"),
                     "ownerReferences": [{"kind": o.get("kind"), "name": o.get("name")}
                                         for o in meta.get("ownerReferences") or []]},
        "spec": {"nodeName": spec.get("nodeName"),
                 "containers": [{"name": c.get("name"), "resources": c.get("resources") or {}}
                                for c in spec.get("containers") or []],
                 **({"resourceClaims": spec["resourceClaims"]} if spec.get("resourceClaims") else {}),
                 # where a pending pod may land: which checks abort_on_demand stops for it (sweeper.demand)
                 **({k: spec[k] for k in ("nodeSelector", "affinity") if spec.get(k) and not spec.get("nodeName")})},
        # the claims a pod names, and those the resourceclaim controller made for it (sweeper.kube.dra)
        "status": {"phase": status.get("phase"),
                   **({"resourceClaimStatuses": status["resourceClaimStatuses"]}
                      if status.get("resourceClaimStatuses") else {})},
    }

