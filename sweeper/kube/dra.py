"""The calls on Dynamic Resource Allocation (resource.k8s.io/v1: ResourceSlices, ResourceClaims,
ResourceClaimTemplates) and Kueue (kueue.x-k8s.io/v1beta1 Workloads), and the joins that fold
them into what a discovery pass lists, so that every reader of nodes and pods sees them.

Either API may be absent: a 404 on the collection (not installed, or an older cluster) or a 403
(the RBAC not yet applied) reads as "none", never as an error. One paged LIST per kind a pass.

What is folded, under keys the API never sets (`DEVICES`, `CLAIMS`, `DEMAND`):
- a node's DRA devices, by driver: `{driver: {"pool": ..., "devices": [names]}}`, with `taints`
  (each device taint, its device named) where a device has some;
  (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/);
- a pod's allocated claims: each result's driver, pool, device, the node the allocation is on, and
  the device classes the claim asks for (https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/);
- Kueue's pending Workloads, as pod-shaped demand (`kind: Workload`, phase Pending, no node, the
  podSets' containers and claims): what yield_to_pending counts like a pending pod
  (https://kueue.sigs.k8s.io/docs/concepts/workload/)."""

from __future__ import annotations

import threading
from typing import Any

from sweeper.errors import AlreadyExists, Forbidden, NotFound
from sweeper.kube.adapter import _Adapter

RESOURCE = ("resource.k8s.io", "v1")
KUEUE = ("kueue.x-k8s.io", "v1beta1")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
DEVICES, CLAIMS, DEMAND = "x-sweeper-devices", "x-sweeper-claims", "x-sweeper-demand"


class DraCalls(_Adapter):
    """ResourceSlices, ResourceClaims and their templates, Kueue's Workloads."""

    def _optional(self, group_version: tuple[str, str], plural: str, page_size: int = 500,
                  **kw: Any) -> list[dict[str, Any]]:
        """A cluster-wide paged LIST of a kind the cluster may not serve: [] when it does not."""
        try:
            return list(self._pages(f"list {plural}", lambda **k: self.custom.list_cluster_custom_object(
                *group_version, plural, **k), page_size, **kw))
        except (NotFound, Forbidden):
            return []

    def list_resource_slices(self, page_size: int = 500, node: str = "", driver: str = "") -> list[dict[str, Any]]:
        """Every ResourceSlice, or one node's (and one driver's) through the field selectors the API
        serves for them (spec.nodeName, spec.driver), so asking for one node is not a cluster-wide LIST."""
        terms = [f"spec.nodeName={_field_value(node)}"] * bool(node) + [f"spec.driver={_field_value(driver)}"] * bool(driver)
        kw = {"field_selector": ",".join(terms)} if terms else {}
        return self._optional(RESOURCE, "resourceslices", page_size, **kw)

    def list_resource_claims(self, page_size: int = 500) -> list[dict[str, Any]]:
        return self._optional(RESOURCE, "resourceclaims", page_size)

    def list_workloads(self, page_size: int = 500) -> list[dict[str, Any]]:
        return self._optional(KUEUE, "workloads", page_size)

    def ensure_claim_template(self, namespace: str, body: dict[str, Any], once_per: str = "") -> None:
        """Create the check Jobs' ResourceClaimTemplate where it is not yet (an existing one is kept).
        With `once_per` (a run's id), asked once in that run, not once per Job."""
        name = body["metadata"]["name"]
        ensured: set[tuple[str, str, str]] = self.__dict__.setdefault("_claim_templates", set())
        with self.__dict__.setdefault("_claim_lock", threading.Lock()):  # a run's nodes render Jobs at once
            if once_per and (once_per, namespace, name) in ensured:
                return
            try:
                self._call(f"create resourceclaimtemplate {namespace}/{name}",
                           lambda: self.custom.create_namespaced_custom_object(
                               *RESOURCE, namespace, "resourceclaimtemplates", body, _preload_content=False), write=True)
            except AlreadyExists:
                pass
            if once_per:
                ensured.add((once_per, namespace, name))

    # -- joins ---------------------------------------------------------------------
    def fold_devices(self, nodes: list[dict[str, Any]], page_size: int = 500) -> list[dict[str, Any]]:
        """Each node with the DRA devices its ResourceSlices publish (`DEVICES`)."""
        slices = self.list_resource_slices(page_size) if nodes else []
        return fold_devices(nodes, slices)

    def fold_claims(self, pods: list[dict[str, Any]], page_size: int = 500,
                    always: bool = False) -> list[dict[str, Any]]:
        """Each pod that names claims with those claims' allocations (`CLAIMS`). The claims are
        listed when some pod names one (or `always`, a discovery pass)."""
        if not always and not any((p.get("spec") or {}).get("resourceClaims") for p in pods):
            return pods
        return fold_claims(pods, self.list_resource_claims(page_size))

    def kueue_demand(self, page_size: int = 500) -> list[dict[str, Any]]:
        return workload_demand(self.list_workloads(page_size))


def _field_value(value: str) -> str:
    """A field selector value with `\\`, `,` and `=` escaped (fields.EscapeValue)."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _items(doc: Any, *path: str) -> list[Any]:
    for key in path:
        doc = (doc or {}).get(key) if isinstance(doc, dict) else None
    return list(doc or []) if isinstance(doc, list) else []


def fold_devices(nodes: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_node: dict[str, dict[str, dict[str, Any]]] = {}
    generation: dict[tuple[str, str], int] = {}
    for s in slices:  # only a pool's newest generation counts (ResourceSlice v1, spec.pool.generation)
        spec = s.get("spec") or {}
        key = (str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", "")))
        generation[key] = max(generation.get(key, 0), int((spec.get("pool") or {}).get("generation") or 0))
    for s in slices:
        spec = s.get("spec") or {}
        node, driver, pool = spec.get("nodeName"), str(spec.get("driver", "")), spec.get("pool") or {}
        if not node or int(pool.get("generation") or 0) < generation.get((driver, str(pool.get("name", ""))), 0):
            continue
        entry = by_node.setdefault(node, {}).setdefault(driver, {"pool": str(pool.get("name", "")), "devices": []})
        entry["devices"] += [str(d.get("name", "")) for d in spec.get("devices") or [] if isinstance(d, dict)]
        taints = [{**t, "device": str(d.get("name", ""))} for d in spec.get("devices") or [] if isinstance(d, dict)
                  for t in d.get("taints") or [] if isinstance(t, dict)]
        if taints:  # a device's taints (KEP-5055): what the driver claims of it
            entry.setdefault("taints", []).extend(taints)
    if not by_node:
        return nodes
    return [{**n, DEVICES: by_node[n["metadata"]["name"]]} if n["metadata"]["name"] in by_node else n for n in nodes]


def _claim_node(alloc: dict[str, Any]) -> str:
    for term in _items(alloc, "nodeSelector", "nodeSelectorTerms"):
        for f in (term or {}).get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return str(f["values"][0])
    return ""


def fold_claims(pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name = {(c["metadata"].get("namespace"), c["metadata"].get("name")): c for c in claims}
    reserved: dict[str, list[dict[str, Any]]] = {}
    for c in claims:
        for r in _items(c, "status", "reservedFor"):
            if r.get("resource") == "pods" and r.get("uid"):
                reserved.setdefault(str(r["uid"]), []).append(c)
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        made = {s.get("name"): s.get("resourceClaimName") for s in _items(p, "status", "resourceClaimStatuses")}
        mine = [by_name.get((meta.get("namespace"), ref.get("resourceClaimName") or made.get(ref.get("name"))))
                for ref in _items(p, "spec", "resourceClaims")]
        found = {id(c): c for c in [*(c for c in mine if c), *reserved.get(str(meta.get("uid", "")), [])]}
        if not found:
            out.append(p)
            continue
        held = []
        for c in found.values():
            alloc = (c.get("status") or {}).get("allocation") or {}
            classes = [str((r.get("exactly") or {}).get("deviceClassName", "")) for r in _items(c, "spec", "devices", "requests")]
            held.append({"classes": classes, "node": _claim_node(alloc),
                         "devices": [{"driver": r.get("driver", ""), "pool": r.get("pool", ""), "device": r.get("device", "")}
                                     for r in _items(alloc, "devices", "results")]})
        out.append({**p, CLAIMS: held})
    return out


def _pending(workload: dict[str, Any]) -> bool:
    """Waiting for quota: not admitted, no quota reserved, not finished, active."""
    if (workload.get("spec") or {}).get("active") is False:
        return False
    conds = {c.get("type"): c.get("status") for c in _items(workload, "status", "conditions")}
    return not any(conds.get(t) == "True" for t in ("QuotaReserved", "Admitted", "Finished"))


def workload_demand(workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pending Workload as one pod-shaped entry per podSet: phase Pending, no node, the podSet's
    containers (their GPU resources times its count) and whether it names claims."""
    out = []
    for w in workloads:
        if not _pending(w):
            continue
        meta = w.get("metadata") or {}
        for ps in _items(w, "spec", "podSets"):
            spec = ((ps.get("template") or {}).get("spec") or {}) if isinstance(ps, dict) else {}
            count = int(ps.get("count") or 1)
            containers = []
            for c in spec.get("containers") or []:
                res = c.get("resources") or {}
                containers.append({"name": c.get("name"), "resources": {
                    part: {k: str(_times(v, count)) for k, v in (res.get(part) or {}).items()}
                    for part in ("requests", "limits") if res.get(part)} | (
                        {"claims": res["claims"]} if res.get("claims") else {})})
            out.append({"kind": "Workload",
                        "metadata": {"name": f"{meta.get('name')}", "namespace": meta.get("namespace"),
                                     "labels": {}, "ownerReferences": []},
                        "spec": {"nodeName": None, "containers": containers,
                                 "resourceClaims": spec.get("resourceClaims") or [],
                                 **{k: spec[k] for k in ("nodeSelector", "affinity") if spec.get(k)}},
                        "x-sweeper-pods": count,  # its GPUs above are the podSet's total
                        "status": {"phase": "Pending"}, DEMAND: f"kueue workload {meta.get('namespace')}/{meta.get('name')}"})
    return out


def _times(value: Any, count: int) -> Any:
    try:
        return int(str(value)) * count
    except ValueError:
        return value
