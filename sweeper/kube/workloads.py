"""The calls on what a sweep starts: Jobs, the headless Services of pair sweeps, MPIJobs, and
the list-then-watch that follows Jobs and pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sweeper.errors import AlreadyExists, NotFound
from sweeper.kube.adapter import _Adapter
from sweeper.kube.retry import MPIJOB
from sweeper.kube.watch import WatchStream


class WorkloadCalls(_Adapter):
    """Jobs, Services, MPIJobs, and the watches that follow Jobs and pods."""

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

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and its pods (Background propagation; the REST default would orphan them)."""
        return self._delete(f"delete job {namespace}/{name}", lambda: self.batch.delete_namespaced_job(
                name, namespace, propagation_policy="Background", _preload_content=False))

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
        return self._delete(f"delete service {namespace}/{name}", lambda: self.core.delete_namespaced_service(
                name, namespace, _preload_content=False))

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
        return self._delete(f"delete mpijob {namespace}/{name}", lambda: self.custom.delete_namespaced_custom_object(
            *MPIJOB[:2], namespace, MPIJOB[2], name, propagation_policy="Background", _preload_content=False))

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
        a 410 (Expired), is the caller's to handle by listing again. The server may send nothing
        until it ends the stream, so the client waits `timeout_seconds` plus the policy's read
        timeout between reads: a stream silent for longer is cut (Transient), not waited on."""
        fn = self._collection(plural, namespace)
        what = f"watch {plural}"
        connect, read = self.retry.request_timeout
        timeout = (connect, timeout_seconds + read)
        resp = self._call(what, lambda: fn(watch=True, label_selector=label_selector,
                                           resource_version=resource_version, allow_watch_bookmarks=True,
                                           timeout_seconds=timeout_seconds, _preload_content=False,
                                           _request_timeout=timeout),
                          raw=False, timeout=timeout)
        return WatchStream(what, resp, timeout[1])
