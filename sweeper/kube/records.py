"""The calls on where a run keeps its lock and says what it did (Leases, ConfigMaps, Events), and a
read of a Service through the API server's proxy."""

from __future__ import annotations

from typing import Any

from sweeper.kube.adapter import _Adapter
from sweeper.kube.retry import JSON_PATCH


class RecordCalls(_Adapter):
    """Leases, ConfigMaps and Events."""

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

    # -- a Service, through the API server's proxy -------------------------------
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
