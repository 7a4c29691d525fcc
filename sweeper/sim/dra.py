"""Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34) and Kueue's Workloads,
as the simulated cluster serves them.

A node group with `dra: true` publishes its GPUs as NVIDIA's DRA driver does (one ResourceSlice per
node, driver `gpu.nvidia.com`, pool named after the node, devices `gpu-N`) instead of the device
plugin's `nvidia.com/gpu` (https://github.com/NVIDIA/k8s-dra-driver-gpu). A pod that names a claim
(`spec.resourceClaims`: a `resourceClaimName`, or a `resourceClaimTemplateName` the resourceclaim
controller makes a claim from, owned by the pod and named in `status.resourceClaimStatuses`) is
placed only where the claim's requests can be allocated; binding writes the claim's
`status.allocation` (devices.results[].driver/pool/device, nodeSelector) and `status.reservedFor`
(https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/).
A claim's devices are free again once no live pod holds it."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

from sweeper.clock import iso

GROUP = "resource.k8s.io"
DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver and its DeviceClass (k8s-dra-driver-gpu)
KUEUE = "kueue.x-k8s.io"
QUEUE_LABEL = f"{KUEUE}/queue-name"
TERMINAL = ("Succeeded", "Failed")


class KueueWorkload(BaseModel):
    """A fleet file's `kueue_workloads` entry: a Job Kueue keeps suspended for want of quota."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Strict()]
    namespace: Annotated[str, Strict()] = "training"
    gpus: Annotated[int, Strict(), Field(ge=0)] = 8  # per pod
    count: Annotated[int, Strict(), Field(ge=1)] = 1  # pods of the podSet
    claim: Annotated[bool, Strict()] = False  # the pods get GPUs through a ResourceClaimTemplate, not nvidia.com/gpu


def device_class() -> dict[str, Any]:
    """The DeviceClass the driver's chart installs: devices of its driver."""
    return {"apiVersion": f"{GROUP}/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}


def resource_slice(node: str, gpus: int, model: str) -> dict[str, Any]:
    """A node's GPUs as one ResourceSlice: spec.driver, spec.nodeName, spec.pool, spec.devices."""
    suffix = hashlib.sha1(node.encode()).hexdigest()[:5]
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-{suffix}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "type": {"string": "gpu"}, "index": {"int": i}, "productName": {"string": model},
                         "uuid": {"string": f"GPU-{hashlib.sha1(f'{node}/{i}'.encode()).hexdigest()[:32]}"}}}
                         for i in range(gpus)]}}


def claim_template(name: str, namespace: str, count: int = 0) -> dict[str, Any]:
    """A ResourceClaimTemplate for `count` of the driver's devices (ExactCount), or all of a node's (All)."""
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count} if count \
        else {"deviceClassName": DRIVER, "allocationMode": "All"}
    return {"apiVersion": f"{GROUP}/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}


def _requests(claim: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exact = r.get("exactly") or {}
        out.append({"name": r.get("name", ""), "class": exact.get("deviceClassName", ""),
                    "all": exact.get("allocationMode") == "All", "count": int(exact.get("count") or 1)})
    return out


def pod_claims(store: Any, pod: dict[str, Any]) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    """Each claim the pod names: (its name in the pod, the ResourceClaim if it exists, the template
    to make it from if not)."""
    ns = pod["metadata"].get("namespace", "default")
    made = {s.get("name"): s.get("resourceClaimName") for s in pod.get("status", {}).get("resourceClaimStatuses") or []}
    out: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for ref in pod["spec"].get("resourceClaims") or []:
        claim_name = ref.get("resourceClaimName") or made.get(ref.get("name"))
        if claim_name:
            out.append((ref.get("name", ""), store.peek("resourceclaims", ns, claim_name), None))
        elif ref.get("resourceClaimTemplateName"):
            out.append((ref.get("name", ""), None,
                        store.peek("resourceclaimtemplates", ns, ref["resourceClaimTemplateName"])))
    return out


def used_devices(store: Any) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of each allocated claim some unfinished pod still holds."""
    live = {p["metadata"].get("uid") for p in store.iter("pods") if p.get("status", {}).get("phase") not in TERMINAL}
    out: set[tuple[str, str, str]] = set()
    for c in store.iter("resourceclaims"):
        status = c.get("status") or {}
        if any(r.get("uid") in live for r in status.get("reservedFor") or []):
            for res in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
                out.add((res.get("driver", ""), res.get("pool", ""), res.get("device", "")))
    return out


def _pick(store: Any, pod: dict[str, Any], node: str, used: set[tuple[str, str, str]]
          ) -> tuple[str, list[tuple[str, list[dict[str, Any]]]]]:
    """('' and each claim's results) where the pod's claims can be allocated on `node`, else the reason."""
    slices = [s for s in store.iter("resourceslices") if (s.get("spec") or {}).get("nodeName") == node]
    taken = set(used)
    plan: list[tuple[str, list[dict[str, Any]]]] = []
    for ref_name, claim, template in pod_claims(store, pod):
        if claim is None and template is None:
            return "resourceclaim not found", []
        spec_of = claim if claim is not None else {"spec": (template or {}).get("spec", {}).get("spec") or {}}
        alloc = ((claim or {}).get("status") or {}).get("allocation")
        if alloc:  # allocated already: usable only on its node
            nodes = [v for t in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
                     for f in t.get("matchFields") or [] for v in f.get("values") or []]
            if node not in nodes:
                return "node(s) cannot allocate all claims", []
            plan.append((ref_name, []))
            continue
        results: list[dict[str, Any]] = []
        for req in _requests(spec_of):
            driver = req["class"]  # the simulator's DeviceClasses are named after their driver
            free = [(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]) for s in slices
                    if s["spec"]["driver"] == driver for d in s["spec"].get("devices") or []]
            mine = [f for f in free if f not in taken]
            if req["all"]:
                # All: every matching device of the node, and none may be allocated elsewhere.
                if not free or len(mine) < len(free):
                    return "node(s) cannot allocate all claims", []
                chosen = mine
            else:
                if len(mine) < req["count"]:
                    return "node(s) cannot allocate all claims", []
                chosen = mine[:req["count"]]
            taken.update(chosen)
            results += [{"request": req["name"], "driver": d, "pool": p, "device": dev} for d, p, dev in chosen]
        plan.append((ref_name, results))
    return "", plan


def feasible(store: Any, pod: dict[str, Any], node: str, used: set[tuple[str, str, str]]) -> str:
    """'' when the pod's claims fit the node's free devices, else the scheduler's reason."""
    if not pod["spec"].get("resourceClaims"):
        return ""
    return _pick(store, pod, node, used)[0]


def make_claims(store: Any, pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The resourceclaim controller: a claim from each template the pod names, made as the pod is
    (before it is scheduled), owned by the pod. The pod's status.resourceClaimStatuses after, or []
    when there was nothing to make."""
    ns, pod_name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"].get("uid", "")
    statuses = list(pod.get("status", {}).get("resourceClaimStatuses") or [])
    made = False
    for ref, claim, template in pod_claims(store, pod):
        if claim is None and template is not None:
            claim = store.create("resourceclaims", ns, {
                "apiVersion": f"{GROUP}/v1", "kind": "ResourceClaim",
                "metadata": {"generateName": f"{pod_name}-{ref}-", "namespace": ns,
                             "annotations": {"resource.kubernetes.io/pod-claim-name": ref},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid,
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": (template.get("spec") or {}).get("spec") or {}})
            statuses.append({"name": ref, "resourceClaimName": claim["metadata"]["name"]})
            made = True
    return statuses if made else []


def allocate(store: Any, pod: dict[str, Any], node: str, now: float, used: set[tuple[str, str, str]]) -> None:
    """Bind the pod's claims (made already: make_claims) on `node`: allocate the devices and reserve
    each claim for the pod."""
    if not pod["spec"].get("resourceClaims"):
        return
    why, plan = _pick(store, pod, node, used)
    if why:
        return
    ns, pod_name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"].get("uid", "")
    claims = {ref: claim for ref, claim, _ in pod_claims(store, pod)}
    for ref, results in plan:
        claim = claims.get(ref)
        if claim is None:
            continue

        def write(c: dict[str, Any], results: list[dict[str, Any]] = results) -> None:
            status = c.setdefault("status", {})
            if results:
                status["allocation"] = {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                    "allocationTimestamp": iso(now)}
            reserved = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
            status["reservedFor"] = [*reserved, {"resource": "pods", "name": pod_name, "uid": uid}]
        store.mutate("resourceclaims", ns, claim["metadata"]["name"], write)
        used.update((r["driver"], r["pool"], r["device"]) for r in results)


def holds_devices(store: Any, pod: dict[str, Any]) -> int:
    """How many devices the pod's allocated claims give it."""
    return sum(len((((c or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or [])
               for _, c, _ in pod_claims(store, pod))


def forget_pod(store: Any, pod: dict[str, Any]) -> None:
    """The resourceclaim controller deletes the claims it made for a pod once the pod is gone."""
    ns, uid = pod["metadata"].get("namespace", "default"), pod["metadata"].get("uid")
    for c in list(store.iter("resourceclaims")):
        if c["metadata"].get("namespace") == ns and any(
                o.get("uid") == uid and o.get("kind") == "Pod" for o in c["metadata"].get("ownerReferences") or []):
            store.delete("resourceclaims", ns, c["metadata"]["name"])


def pending_workload(name: str, namespace: str, gpus: int, count: int, claim: str = "",
                     queue: str = "user-queue", now: float = 0.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Job Kueue holds suspended (label kueue.x-k8s.io/queue-name, spec.suspend: true) and its
    Workload (kueue.x-k8s.io/v1beta1), pending for quota: QuotaReserved False, no Admitted
    (https://kueue.sigs.k8s.io/docs/concepts/workload/,
    https://kueue.sigs.k8s.io/docs/tasks/troubleshooting/troubleshooting_jobs/)."""
    container: dict[str, Any] = {"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3"}
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if claim:
        pod_spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": claim}]
        container["resources"] = {"claims": [{"name": "gpus"}]}
    else:
        container["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
           "spec": {"suspend": True, "parallelism": count, "completions": count,
                    "template": {"metadata": {}, "spec": pod_spec}}}
    workload = {"apiVersion": f"{KUEUE}/v1beta1", "kind": "Workload",
                "metadata": {"name": f"job-{name}-{hashlib.sha1(name.encode()).hexdigest()[:5]}",
                             "namespace": namespace, "labels": {f"{KUEUE}/job-uid": ""},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                  "controller": True}]},
                "spec": {"queueName": queue, "podSets": [{"name": "main", "count": count,
                                                          "template": {"spec": pod_spec}}]},
                "status": {"conditions": [{
                    "type": "QuotaReserved", "status": "False", "reason": "Pending",
                    "lastTransitionTime": iso(now),
                    "message": f"couldn't assign flavors to pod set main: insufficient unused quota for "
                               f"nvidia.com/gpu in flavor default-flavor, {gpus * count} more needed"}]}}
    return job, workload
