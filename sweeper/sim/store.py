"""An in-memory object store with the apiserver's bookkeeping: uids, resourceVersions,
generateName, optimistic concurrency and consistent paging."""

from __future__ import annotations

import base64
import bisect
import json
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sweeper.clock import Clock, iso
from sweeper.sim.errors import ApiError, already_exists, bad_request, conflict, invalid, not_found
from sweeper.sim.selectors import labels_match, parse_field_selector, parse_label_selector


def _copy(obj: Any) -> Any:
    """A deep copy of JSON data; several times faster than copy.deepcopy."""
    return json.loads(json.dumps(obj))


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str  # "" for core
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


# The characters of a generated name (k8s.io/apimachinery/pkg/util/rand: no vowels, no 0/1/3).
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

RESOURCES: dict[str, Resource] = {r.plural: r for r in (
    Resource("nodes", "Node", "", "v1", False, ("no",)),
    Resource("pods", "Pod", "", "v1", True, ("po",)),
    Resource("events", "Event", "", "v1", True, ("ev",)),
    Resource("namespaces", "Namespace", "", "v1", False, ("ns",)),
    Resource("jobs", "Job", "batch", "v1", True),
    Resource("leases", "Lease", "coordination.k8s.io", "v1", True),
    Resource("configmaps", "ConfigMap", "", "v1", True, ("cm",)),
    Resource("nodeclaims", "NodeClaim", "karpenter.sh", "v1", False),
    Resource("poddisruptionbudgets", "PodDisruptionBudget", "policy", "v1", True, ("pdb",)),
    # Kinds the simulator stores and serves but runs no controller for: what `kubectl apply -f deploy/`
    # creates (a CronJob is kept, never started; a PVC stays Pending).
    Resource("configmaps", "ConfigMap", "", "v1", True, ("cm",)),
    Resource("secrets", "Secret", "", "v1", True),
    Resource("serviceaccounts", "ServiceAccount", "", "v1", True, ("sa",)),
    Resource("persistentvolumeclaims", "PersistentVolumeClaim", "", "v1", True, ("pvc",)),
    Resource("services", "Service", "", "v1", True, ("svc",)),
    Resource("endpoints", "Endpoints", "", "v1", True, ("ep",)),  # where the apiserver's service proxy goes
    Resource("deployments", "Deployment", "apps", "v1", True, ("deploy",)),
    Resource("cronjobs", "CronJob", "batch", "v1", True, ("cj",)),
    Resource("roles", "Role", "rbac.authorization.k8s.io", "v1", True),
    Resource("rolebindings", "RoleBinding", "rbac.authorization.k8s.io", "v1", True),
    Resource("clusterroles", "ClusterRole", "rbac.authorization.k8s.io", "v1", False),
    Resource("clusterrolebindings", "ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", False),
    Resource("networkpolicies", "NetworkPolicy", "networking.k8s.io", "v1", True, ("netpol",)),
    Resource("storageclasses", "StorageClass", "storage.k8s.io", "v1", False, ("sc",)),  # deploy/eks's gp3
    # Stored as deploy/admission-policy.yaml applies them; the server enforces the policies it is given
    # (ApiServer.admission), not those stored.
    Resource("validatingadmissionpolicies", "ValidatingAdmissionPolicy", "admissionregistration.k8s.io", "v1",
             False),
    Resource("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
             "admissionregistration.k8s.io", "v1", False),
    # Reviews are answered, never stored (kubectl auth can-i).
    Resource("selfsubjectrulesreviews", "SelfSubjectRulesReview", "authorization.k8s.io", "v1", False,
             verbs=("create",)),
    Resource("selfsubjectaccessreviews", "SelfSubjectAccessReview", "authorization.k8s.io", "v1", False,
             verbs=("create",)),
    Resource("runtimeclasses", "RuntimeClass", "node.k8s.io", "v1", False),
    # Dynamic Resource Allocation (GA in 1.34) where a node group has `dra: true`, and Kueue's
    # Workloads where the fleet has `kueue: true` (sweeper.sim.dra).
    Resource("resourceslices", "ResourceSlice", "resource.k8s.io", "v1", False),
    Resource("resourceclaims", "ResourceClaim", "resource.k8s.io", "v1", True),
    Resource("resourceclaimtemplates", "ResourceClaimTemplate", "resource.k8s.io", "v1", True),
    Resource("deviceclasses", "DeviceClass", "resource.k8s.io", "v1", False),
    Resource("workloads", "Workload", "kueue.x-k8s.io", "v1beta1", True),
    # The MPI Operator's custom resource, served only where the fleet installs the operator
    # (`mpi_operator: true`); elsewhere its path is a 404, as without the CRD.
    Resource("mpijobs", "MPIJob", "kubeflow.org", "v2beta1", True),
)}


# How many changes the store remembers for watches, as etcd keeps a window of history until it is
# compacted: a watch from a resourceVersion older than the window is answered 410 Gone.
WATCH_WINDOW = 50_000


class Change:
    """One change of an object, as a watch sends it: the object after (and, for a modification,
    before) it, kept serialized and parsed only when a watch must filter it."""

    __slots__ = ("rv", "type", "plural", "namespace", "_new", "_old", "_new_obj", "_old_obj")

    def __init__(self, rv: int, type_: str, plural: str, namespace: str, new: str, old: str | None) -> None:
        self.rv, self.type, self.plural, self.namespace = rv, type_, plural, namespace
        self._new, self._old = new, old
        self._new_obj: dict[str, Any] | None = None
        self._old_obj: dict[str, Any] | None = None

    @property
    def raw(self) -> str:
        return self._new

    @property
    def new(self) -> dict[str, Any]:
        if self._new_obj is None:
            self._new_obj = json.loads(self._new)
        return self._new_obj

    @property
    def old(self) -> dict[str, Any] | None:
        if self._old is None:
            return None
        if self._old_obj is None:
            self._old_obj = json.loads(self._old)
        return self._old_obj


class Store:
    """Every object of the simulated cluster. One lock guards all of it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self._rv = 1000
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {p: {} for p in RESOURCES}
        self.requests: list[tuple[str, str]] = []  # (verb, path) of every API request, for tests and benchmarks
        self.field_selectors: list[tuple[str, str]] = []  # (path, fieldSelector) of every request that gave one
        self.on_delete: list[Callable[[str, dict[str, Any]], None]] = []
        self._sorted: dict[str, list[tuple[str, str]]] = {}  # sorted keys per resource, dropped on create/delete
        self.changes: deque[Change] = deque(maxlen=WATCH_WINDOW)  # the watch history, oldest first
        self.changed = threading.Condition(self.lock)  # notified on every change, for watches
        self._compacted = 0

    def _record(self, type_: str, plural: str, obj: dict[str, Any], old: str | None = None) -> None:
        """Remember a change for watches (the lock is held) and wake them."""
        meta = obj["metadata"]
        self.changes.append(Change(int(meta["resourceVersion"]), type_, plural, meta.get("namespace", ""),
                                   json.dumps(obj), old))
        self.changed.notify_all()

    def oldest_watchable(self) -> int:
        """The oldest resourceVersion a watch may start from: changes after it are all remembered."""
        with self.lock:
            if len(self.changes) < (self.changes.maxlen or 0):
                return self._compacted
            return max(self._compacted, self.changes[0].rv - 1)

    def compact(self) -> None:
        """Forget the history of changes up to now, as etcd's compaction does: a watch from an
        older resourceVersion is then told 410 Gone."""
        with self.lock:
            self._compacted = self._rv
            self.changes.clear()

    # -- bookkeeping -------------------------------------------------------
    def next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def _key(self, res: Resource, namespace: str | None, name: str) -> tuple[str, str]:
        return ((namespace or "") if res.namespaced else "", name)

    # -- verbs -------------------------------------------------------------
    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        res = RESOURCES[plural]
        with self.lock:
            obj = self._objects[plural].get(self._key(res, namespace, name))
            if obj is None:
                raise not_found(plural, name, res.group)
            return _copy(obj)

    def peek(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The stored object itself (no copy), for controllers that hold the lock."""
        res = RESOURCES[plural]
        return self._objects[plural].get(self._key(res, namespace, name))

    def iter(self, plural: str) -> Iterator[dict[str, Any]]:
        """Stored objects without copies, for controllers that hold the lock."""
        return iter(list(self._objects[plural].values()))

    def create(self, plural: str, namespace: str | None, obj: dict[str, Any], *,
               dry_run: bool = False) -> dict[str, Any]:
        """Store a new object; with `dry_run`, validate and answer what would be stored, storing
        nothing (no resourceVersion is spent)."""
        res = RESOURCES[plural]
        with self.lock:
            obj = _copy(obj)
            meta = obj.setdefault("metadata", {})
            if res.namespaced:
                ns = namespace or meta.get("namespace") or "default"
                if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                    raise bad_request("the namespace of the provided object does not match the namespace "
                                      "sent on the request")
                if plural != "events" and ("", ns) not in self._objects["namespaces"]:
                    raise not_found("namespaces", ns)
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            if not meta.get("name"):
                if meta.get("generateName"):
                    # Five characters of the apiserver's own alphabet (no vowels, no look-alikes),
                    # drawn again while the name is taken, as the apiserver retries a generated name
                    # that collides (KEP-4420, https://github.com/kubernetes/enhancements/issues/4420).
                    for _ in range(8):
                        meta["name"] = meta["generateName"] + "".join(
                            secrets.choice(NAME_ALPHABET) for _ in range(5))
                        if self._key(res, meta.get("namespace"), meta["name"]) not in self._objects[plural]:
                            break
                else:
                    raise invalid(res.kind, "", "metadata.name: Required value: name or generateName is required")
            key = self._key(res, meta.get("namespace"), meta["name"])
            if key in self._objects[plural]:
                raise already_exists(plural, meta["name"])
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = meta.get("creationTimestamp") or iso(self.clock.now())
            meta.setdefault("generation", 1)
            obj["apiVersion"] = res.api_version
            obj["kind"] = res.kind
            if dry_run:
                meta.pop("resourceVersion", None)
                return obj
            meta["resourceVersion"] = self.next_rv()
            self._objects[plural][key] = obj
            self._sorted.pop(plural, None)
            self._record("ADDED", plural, obj)
            return _copy(obj)

    def update(self, plural: str, namespace: str | None, name: str, obj: dict[str, Any],
               *, check_rv: bool = True, dry_run: bool = False) -> dict[str, Any]:
        res = RESOURCES[plural]
        with self.lock:
            key = self._key(res, namespace, name)
            current = self._objects[plural].get(key)
            if current is None:
                raise not_found(plural, name, res.group)
            obj = _copy(obj)
            meta = obj.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise bad_request("the name of the object does not match the name on the URL")
            sent_rv = meta.get("resourceVersion")
            if check_rv and sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                raise conflict(plural, name)
            for fixed in ("uid", "creationTimestamp", "namespace", "name"):
                if fixed in current["metadata"]:
                    meta[fixed] = current["metadata"][fixed]
            if "deletionTimestamp" in current["metadata"]:
                meta["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
            if obj.get("spec") != current.get("spec"):
                meta["generation"] = current["metadata"].get("generation", 1) + 1
            obj["apiVersion"] = res.api_version
            obj["kind"] = res.kind
            if dry_run:
                meta["resourceVersion"] = current["metadata"]["resourceVersion"]
                return obj
            meta["resourceVersion"] = self.next_rv()
            self._objects[plural][key] = obj
            self._record("MODIFIED", plural, obj, json.dumps(current))
            return _copy(obj)

    def mutate(self, plural: str, namespace: str | None, name: str,
               fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change a stored object in place under the lock (controllers) and bump its version."""
        res = RESOURCES[plural]
        with self.lock:
            obj = self._objects[plural].get(self._key(res, namespace, name))
            if obj is None:
                raise not_found(plural, name, res.group)
            old = json.dumps(obj)
            fn(obj)
            obj["metadata"]["resourceVersion"] = self.next_rv()
            self._record("MODIFIED", plural, obj, old)
            return obj

    def delete(self, plural: str, namespace: str | None, name: str,
               precondition_uid: str | None = None, precondition_rv: str | None = None,
               *, dry_run: bool = False) -> dict[str, Any]:
        res = RESOURCES[plural]
        with self.lock:
            key = self._key(res, namespace, name)
            obj = self._objects[plural].get(key)
            if obj is None:
                raise not_found(plural, name, res.group)
            if precondition_uid and obj["metadata"]["uid"] != precondition_uid:
                raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: {precondition_uid}, '
                               f'UID in object meta: {obj["metadata"]["uid"]}', kind=plural, name=name)
            if precondition_rv and obj["metadata"]["resourceVersion"] != precondition_rv:
                raise conflict(plural, name)
            if dry_run:
                return _copy(obj)
            del self._objects[plural][key]
            self._sorted.pop(plural, None)
            obj["metadata"]["resourceVersion"] = self.next_rv()
            self._record("DELETED", plural, obj)
            for hook in self.on_delete:
                hook(plural, obj)
            return _copy(obj)

    def list(self, plural: str, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> dict[str, Any]:
        res = RESOURCES[plural]
        reqs = parse_label_selector(label_selector)
        fmatch = parse_field_selector(field_selector, plural)
        start: tuple[str, str] | None = None
        list_rv = None
        if continue_token:
            try:
                state = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                start = (state["ns"], state["name"])
                list_rv = state["rv"]
            except (ValueError, KeyError, TypeError) as exc:
                raise bad_request("continue key is not valid: " + str(exc)) from exc
        with self.lock:
            keys = self._sorted.get(plural)
            if keys is None:
                keys = self._sorted[plural] = sorted(self._objects[plural])
            if start is not None:
                keys = keys[bisect.bisect_right(keys, start):]
            items: list[dict[str, Any]] = []
            next_token = None
            remaining = 0
            selective = bool(reqs or field_selector or (namespace and res.namespaced))
            for i, key in enumerate(keys):
                if namespace and res.namespaced and key[0] != namespace:
                    continue
                obj = self._objects[plural][key]
                if not labels_match(reqs, obj["metadata"].get("labels")) or not fmatch(obj):
                    continue
                if limit and len(items) >= limit:
                    last = items[-1]["metadata"]
                    next_token = base64.urlsafe_b64encode(json.dumps(
                        {"ns": last.get("namespace", "") if res.namespaced else "", "name": last["name"],
                         "rv": list_rv or self.resource_version}).encode()).decode()
                    # Like the apiserver, count what is left only when no selector makes that costly.
                    remaining = len(keys) - i
                    break
                items.append(_copy(obj))
            meta: dict[str, Any] = {"resourceVersion": list_rv or self.resource_version}
            if next_token:
                meta["continue"] = next_token
                if not selective:
                    meta["remainingItemCount"] = remaining
            return {"kind": res.kind + "List", "apiVersion": res.api_version, "metadata": meta, "items": items}
