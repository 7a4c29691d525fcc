"""The Kubernetes API, behind one module: the only importer of the `kubernetes` client.

Objects cross this boundary as plain dicts (the API's JSON), read without the client's
model classes, which is several times faster on lists of tens of thousands of pods.
Errors become the `KubeError` family; one retry policy covers every call.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config
from kubernetes.config.config_exception import ConfigException

from sweeper.clock import Clock, WallClock
from sweeper.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    NotServed,
    Transient,
)

T = TypeVar("T")
# The apiserver's 404 for a path it does not serve (a custom resource whose CRD is not installed);
# a missing object's 404 names it in `details` instead.
# https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris
UNSERVED = "the server could not find the requested resource"
# The MPI Operator's MPIJob: https://github.com/kubeflow/mpi-operator (pkg/apis/kubeflow/v2beta1)
MPIJOB = ("kubeflow.org", "v2beta1", "mpijobs")
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff with full jitter; Retry-After wins on 429; only transient errors are retried."""

    attempts: int = 6
    base: float = 0.5
    cap: float = 20.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(self.cap, retry_after)
        return rng.uniform(0, min(self.cap, self.base * 2 ** attempt))


def _truncate(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[:n] + "..."


def translate(exc: ApiException, what: str) -> KubeError:
    """An ApiException as one of ours, with the Status message and a bounded payload."""
    status = exc.status or 0
    reason, message, named = exc.reason or "", "", True
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message", "")
        reason = body.get("reason", reason)
        named = bool((body.get("details") or {}).get("name"))
    except (ValueError, TypeError, AttributeError):
        message = _truncate(str(exc.body or ""))
    text = f"{what}: {status} {reason}: {_truncate(message)}"
    if status == 404 and not named and message == UNSERVED:
        return NotServed(text, status, reason)
    if status == 404:
        return NotFound(text, status, reason)
    if status == 409:
        return (AlreadyExists if reason == "AlreadyExists" else Conflict)(text, status, reason)
    if status == 422 and "Testing value" in message:
        return Conflict(text, status, "TestFailed")  # a JSON patch `test` on resourceVersion failed
    if status == 422:
        return Invalid(text, status, reason)
    if status in (401, 403):
        return Forbidden(text, status, reason)
    if status == 429 or status >= 500:
        err = Transient(text, status, reason)
        ra = (exc.headers or {}).get("Retry-After") if exc.headers else None
        err.retry_after = float(ra) if ra and str(ra).isdigit() else None  # type: ignore[attr-defined]
        return err
    return KubeError(text, status, reason)


class Expired(Transient):
    """A watch's resourceVersion is older than the history the apiserver keeps (410 Gone): list
    again, then watch from the list's resourceVersion."""


class WatchStream:
    """The events of one watch request, as (type, object) pairs, until the server ends the
    stream. `close()` from another thread ends it early."""

    def __init__(self, what: str, resp: Any) -> None:
        self.what = what
        self._resp = resp

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buf = b""
        ended = False
        try:
            for chunk in self._resp.stream(amt=None, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield self._event(line)
            ended = True
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, OSError, AttributeError,
                ValueError) as exc:  # the last two: a response closed under the read by close()
            raise Transient(f"{self.what}: the watch was cut: {exc.__class__.__name__}: {_truncate(str(exc))}") \
                from exc
        finally:
            if ended:
                self._resp.release_conn()  # read to its end: the connection may carry the next request
            else:
                self.close()
        if buf.strip():
            yield self._event(buf)

    def _event(self, line: bytes) -> tuple[str, dict[str, Any]]:
        try:
            ev = json.loads(line)
            type_, obj = str(ev["type"]), ev["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise Transient(f"{self.what}: an unreadable watch event: {_truncate(line.decode(errors='replace'))}") \
                from exc
        if type_ == "ERROR":
            code, message = int(obj.get("code") or 0), str(obj.get("message") or "")
            if code == 410:
                raise Expired(f"{self.what}: 410 {obj.get('reason', 'Expired')}: {_truncate(message)}", 410,
                              str(obj.get("reason") or "Expired"))
            raise Transient(f"{self.what}: watch error {code}: {_truncate(message)}", code, str(obj.get("reason") or ""))
        return type_, obj

    def close(self) -> None:
        """End the stream, from any thread; its connection is closed, never reused mid-body."""
        try:
            shutdown = getattr(self._resp, "shutdown", None)
            if shutdown is not None:
                shutdown()  # wakes a read blocked on the socket in another thread
            self._resp.close()
            self._resp.release_conn()
        except Exception:  # noqa: BLE001 - closing a stream that is already gone
            pass


@dataclass
class _Tally:
    requests: int = 0
    errors: int = 0


class Kube:
    """The calls Sweeper makes, each retried under one policy and counted.

    `fence`, when set, is called before every attempt of a write (except the Lease's own): a
    sweep sets it, on its own view of the adapter (`fenced`), to the lock's check, so that a
    run that no longer holds the sweep lock stops writing at once."""

    def __init__(self, api_client: client.ApiClient, clock: Clock | None = None,
                 retry: RetryPolicy | None = None, seed: int | None = None) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.coord = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.clock = clock or WallClock()
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._tally = _Tally()
        self.fence: Callable[[], None] | None = None

    @property
    def requests(self) -> int:
        return self._tally.requests

    @property
    def errors(self) -> int:
        return self._tally.errors

    def fenced(self, fence: Callable[[], None]) -> Kube:
        """A view of this adapter (same connection, same counters) whose writes call `fence` first."""
        view = copy.copy(self)
        view.fence = fence
        return view

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    clock: Clock | None = None) -> Kube:
        cfg = client.Configuration()
        try:
            if kubeconfig or not _in_cluster():
                config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
            else:
                # The service account's token and CA, where the pod has them mounted (overridable for a
                # pod that mounts them elsewhere).
                sa = os.environ.get("SWEEPER_SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
                incluster_config.InClusterConfigLoader(token_filename=f"{sa}/token",
                                                       cert_filename=f"{sa}/ca.crt").load_and_set(cfg)
        except (ConfigException, OSError, TypeError) as exc:
            raise ConfigError(f"cannot load the Kubernetes configuration: {exc}") from exc
        cfg.retries = False  # our policy retries, not urllib3's
        cfg.connection_pool_maxsize = 64  # nodes are swept in parallel
        return cls(client.ApiClient(cfg), clock=clock)

    def close(self) -> None:
        self.api_client.close()

    # -- the one retry loop ------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], Any], *, raw: bool = True, attempts: int | None = None,
              write: bool = False) -> Any:
        limit = attempts or self.retry.attempts
        attempt = 0
        while True:
            if write and self.fence is not None:
                self.fence()  # LockLost: this run no longer holds the sweep lock
            self._tally.requests += 1
            try:
                resp = fn()
                if not raw:
                    return resp
                data = resp.data
                return json.loads(data) if data else {}
            except ApiException as exc:
                err = translate(exc, what)
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
                err = Transient(f"{what}: connection failed: {exc.__class__.__name__}: {_truncate(str(exc))}")
                err.retry_after = None  # type: ignore[attr-defined]
            self._tally.errors += 1
            if not isinstance(err, Transient) or attempt + 1 >= limit:
                raise err
            self.clock.sleep(self.retry.delay(attempt, getattr(err, "retry_after", None), self._rng))
            attempt += 1

    def _pages(self, what: str, fn: Callable[..., Any], page_size: int,
               keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None, **kw: Any) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            def fetch(t: str | None = token) -> Any:
                return fn(limit=page_size, _continue=t, _preload_content=False, **kw)
            page = self._call(what, fetch)
            items = page.get("items") or []
            yield from (map(keep, items) if keep else items)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # -- nodes -------------------------------------------------------------------
    def list_nodes(self, label_selector: str = "", page_size: int = 500) -> list[dict[str, Any]]:
        return list(self._pages("list nodes", self.core.list_node, page_size, label_selector=label_selector))

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
        try:
            self._call(f"delete nodeclaim {name}", lambda: self.custom.delete_cluster_custom_object(
                "karpenter.sh", "v1", "nodeclaims", name, _preload_content=False), write=True)
        except NotFound:
            return False
        return True

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
        return list(self._pages("list pods", self.core.list_pod_for_all_namespaces, page_size, keep=slim_pod,
                                field_selector=sel))

    def pending_pods(self) -> list[dict[str, Any]]:
        """Pods waiting to be scheduled, across the cluster (trimmed like active_pods)."""
        return list(self._pages("list pods", self.core.list_pod_for_all_namespaces, 500, keep=slim_pod,
                                field_selector="status.phase=Pending,spec.nodeName="))

    def namespaced_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return list(self._pages("list pods", lambda **kw: self.core.list_namespaced_pod(namespace, **kw), 500,
                                label_selector=label_selector))

    def pod_log(self, namespace: str, name: str, limit_bytes: int = 8 * 1024 * 1024) -> str:
        resp = self._call(f"read log of pod {namespace}/{name}", lambda: self.core.read_namespaced_pod_log(
            name, namespace, limit_bytes=limit_bytes, _preload_content=False), raw=False)
        return resp.data.decode("utf-8", errors="replace")

    def evict_pod(self, namespace: str, name: str) -> None:
        """One eviction through the Eviction API; a 429 (a PodDisruptionBudget says no) is
        raised to the caller, which waits on its own deadline, not retried here."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        self._call(f"evict pod {namespace}/{name}", lambda: self.core.create_namespaced_pod_eviction(
            name, namespace, body, _preload_content=False), attempts=1, write=True)

    # -- jobs --------------------------------------------------------------------
    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name", "")
        try:
            return self._call(f"create job {namespace}/{name}", lambda: self.batch.create_namespaced_job(
                namespace, body, _preload_content=False), write=True)
        except AlreadyExists:
            # A retried create whose first attempt went through: the Job is ours.
            return self.get_job(namespace, name)

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        """One Job, read with a list by its name: the runs follow their Jobs with a watch, so a
        sweeper needs no `get` on Jobs, only `list` and `watch`."""
        found = self._call(f"get job {namespace}/{name}", lambda: self.batch.list_namespaced_job(
            namespace, field_selector=f"metadata.name={name}", _preload_content=False)).get("items") or []
        if not found:
            raise NotFound(f"get job {namespace}/{name}: 404 NotFound: jobs.batch \"{name}\" not found", 404, "NotFound")
        return dict(found[0])

    def list_jobs(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        if namespace:
            fn = lambda **kw: self.batch.list_namespaced_job(namespace, **kw)  # noqa: E731
        else:
            fn = self.batch.list_job_for_all_namespaces
        return list(self._pages("list jobs", fn, 500, label_selector=label_selector))

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete one pod (its DaemonSet starts a new one); False when already gone."""
        try:
            self._call(f"delete pod {namespace}/{name}", lambda: self.core.delete_namespaced_pod(
                name, namespace, _preload_content=False), write=True)
            return True
        except NotFound:
            return False

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and its pods (Background propagation; the REST default would orphan them)."""
        try:
            self._call(f"delete job {namespace}/{name}", lambda: self.batch.delete_namespaced_job(
                name, namespace, propagation_policy="Background", _preload_content=False), write=True)
            return True
        except NotFound:
            return False

    # -- services ----------------------------------------------------------------
    # A pair sweep's headless Service gives its two pods stable DNS names
    # (https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/).
    def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name", "")
        try:
            return self._call(f"create service {namespace}/{name}", lambda: self.core.create_namespaced_service(
                namespace, body, _preload_content=False), write=True)
        except AlreadyExists:
            # A retried create whose first attempt went through: the Service is ours.
            return self._call(f"get service {namespace}/{name}", lambda: self.core.read_namespaced_service(
                name, namespace, _preload_content=False))

    def list_services(self, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        if namespace:
            fn = lambda **kw: self.core.list_namespaced_service(namespace, **kw)  # noqa: E731
        else:
            fn = self.core.list_service_for_all_namespaces
        return list(self._pages("list services", fn, 500, label_selector=label_selector))

    def delete_service(self, namespace: str, name: str) -> bool:
        """Delete a Service; False when it was already gone."""
        try:
            self._call(f"delete service {namespace}/{name}", lambda: self.core.delete_namespaced_service(
                name, namespace, _preload_content=False), write=True)
            return True
        except NotFound:
            return False

    # -- MPIJobs (the MPI Operator's custom resource) -------------------------------------------
    # A cluster without the operator answers 404 on the resource itself: NotServed, a NotFound.
    def create_mpijob(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name", "")
        try:
            return self._call(f"create mpijob {namespace}/{name}", lambda: self.custom.create_namespaced_custom_object(
                *MPIJOB[:2], namespace, MPIJOB[2], body, _preload_content=False), write=True)
        except AlreadyExists:
            return self.get_mpijob(namespace, name)  # a retried create whose first attempt went through

    def get_mpijob(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"get mpijob {namespace}/{name}", lambda: self.custom.get_namespaced_custom_object(
            *MPIJOB[:2], namespace, MPIJOB[2], name, _preload_content=False))

    def list_mpijobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return list(self._pages("list mpijobs", lambda **kw: self.custom.list_namespaced_custom_object(
            *MPIJOB[:2], namespace, MPIJOB[2], **kw), 500, label_selector=label_selector))

    def delete_mpijob(self, namespace: str, name: str) -> bool:
        """Delete an MPIJob and what the operator made for it (Background propagation); False when
        it was already gone or the resource is not served."""
        try:
            self._call(f"delete mpijob {namespace}/{name}", lambda: self.custom.delete_namespaced_custom_object(
                *MPIJOB[:2], namespace, MPIJOB[2], name, propagation_policy="Background", _preload_content=False),
                write=True)
            return True
        except NotFound:
            return False

    # -- watches -----------------------------------------------------------------
    def _collection(self, plural: str, namespace: str | None) -> Callable[..., Any]:
        if plural == "jobs":
            return (lambda **kw: self.batch.list_namespaced_job(namespace, **kw)) if namespace \
                else self.batch.list_job_for_all_namespaces
        if plural == "pods":
            return (lambda **kw: self.core.list_namespaced_pod(namespace, **kw)) if namespace \
                else self.core.list_pod_for_all_namespaces
        raise ValueError(f"no watch of {plural}")

    def list_at(self, plural: str, namespace: str | None, label_selector: str,
                page_size: int = 500) -> tuple[list[dict[str, Any]], str]:
        """A paged list and the resourceVersion to watch it from (the first page's: later pages
        are read at the same version)."""
        fn = self._collection(plural, namespace)
        items: list[dict[str, Any]] = []
        rv, token = "", None
        while True:
            def fetch(t: str | None = token) -> Any:
                return fn(limit=page_size, _continue=t, label_selector=label_selector, _preload_content=False)
            page = self._call(f"list {plural}", fetch)
            items += page.get("items") or []
            rv = rv or str((page.get("metadata") or {}).get("resourceVersion") or "")
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, rv

    def watch(self, plural: str, namespace: str | None, label_selector: str, resource_version: str,
              timeout_seconds: int) -> WatchStream:
        """One watch request from `resource_version`, with bookmarks; it ends after
        `timeout_seconds`. Starting it is retried like any call; a stream cut once started, or
        a 410 (Expired), is the caller's to handle by listing again."""
        fn = self._collection(plural, namespace)
        what = f"watch {plural}"
        resp = self._call(what, lambda: fn(watch=True, label_selector=label_selector,
                                           resource_version=resource_version, allow_watch_bookmarks=True,
                                           timeout_seconds=timeout_seconds, _preload_content=False),
                          raw=False)
        return WatchStream(what, resp)

    # -- leases ------------------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"get lease {namespace}/{name}", lambda: self.coord.read_namespaced_lease(
            name, namespace, _preload_content=False))

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create lease", lambda: self.coord.create_namespaced_lease(
            namespace, body, _preload_content=False))

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Conditional on body.metadata.resourceVersion: a 409 means someone else wrote first."""
        return self._call(f"update lease {namespace}/{name}", lambda: self.coord.replace_namespaced_lease(
            name, namespace, body, _preload_content=False))

    # -- configmaps --------------------------------------------------------------
    def get_configmap(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(f"get configmap {namespace}/{name}", lambda: self.core.read_namespaced_config_map(
            name, namespace, _preload_content=False))

    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name", "")
        return self._call(f"create configmap {namespace}/{name}", lambda: self.core.create_namespaced_config_map(
            namespace, body, _preload_content=False), write=True)

    def patch_configmap(self, namespace: str, name: str, body: Any, content_type: str = JSON_PATCH) -> dict[str, Any]:
        return self._call(f"patch configmap {namespace}/{name}", lambda: self.core.patch_namespaced_config_map(
            name, namespace, body, _content_type=content_type, _preload_content=False), write=True)

    # -- events ------------------------------------------------------------------
    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("create event", lambda: self.core.create_namespaced_event(
            namespace, body, _preload_content=False), write=True)

    def list_events(self, namespace: str, field_selector: str = "") -> list[dict[str, Any]]:
        return list(self._pages("list events", lambda **kw: self.core.list_namespaced_event(namespace, **kw), 500,
                                field_selector=field_selector))


    # -- a Service, through the API server's proxy --------------------------------
    def service_get(self, namespace: str, service: str, path: str, query: dict[str, str] | None = None,
                    timeout: float = 30.0) -> bytes:
        """GET `path` of a Service through the API server's service proxy, with this client's own
        credentials, so RBAC applies (`get` on `services/proxy`). `service`: NAME or NAME:PORT
        (https://kubernetes.io/docs/tasks/access-application-cluster/access-cluster-services/
        #manually-constructing-apiserver-proxy-urls)."""
        from urllib.parse import quote

        resource = (f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{quote(service, safe=':')}/proxy/"
                    + "/".join(quote(p, safe="") for p in path.strip("/").split("/")))

        def fetch() -> Any:
            return self.api_client.call_api(
                resource, "GET", {}, list((query or {}).items()), {"Accept": "application/json, text/html"},
                response_types_map={200: "str"}, auth_settings=["BearerToken"], _preload_content=False,
                _return_http_data_only=True, _request_timeout=timeout)
        return bytes(self._call(f"get service {namespace}/{service}/proxy/{path.strip('/')}", fetch, raw=False).data)


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return {
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "labels": meta.get("labels") or {},
                     "ownerReferences": [{"kind": o.get("kind"), "name": o.get("name")}
                                         for o in meta.get("ownerReferences") or []]},
        "spec": {"nodeName": spec.get("nodeName"),
                 "containers": [{"name": c.get("name"), "resources": c.get("resources") or {}}
                                for c in spec.get("containers") or []]},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")
