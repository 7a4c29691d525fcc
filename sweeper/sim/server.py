"""The simulated cluster's HTTP API server: the REST paths Sweeper and kubectl use."""

from __future__ import annotations

import json
import random
import re
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from sweeper.clock import iso
from sweeper.sim.cluster import TERMINAL, SimCluster
from sweeper.sim.errors import ApiError, bad_request, not_found
from sweeper.sim.patch import apply_patch
from sweeper.sim.rbac import Rule, allowed, attributes
from sweeper.sim.store import RESOURCES, Resource
from sweeper.sim.tables import table

GROUPS = {"batch": "v1", "coordination.k8s.io": "v1", "karpenter.sh": "v1", "policy": "v1", "node.k8s.io": "v1"}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?"
    r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$")


class ApiServer:
    """Serves a SimCluster over HTTP on a loopback port."""

    def __init__(self, cluster: SimCluster, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cluster = cluster
        self.fault_rng = random.Random(cluster.fleet.seed + 1)
        self.fault_rate = cluster.fleet.api_fault_rate
        self.lost_reply_rate = cluster.fleet.api_lost_reply_rate
        handler = type("Handler", (_Handler,), {"api": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        # Observers of every request, before it is served and after it succeeded: (stage, method, path).
        # Tests use them to stop a client at an exact step.
        self.hooks: list[Callable[[str, str, str], None]] = []
        # Service accounts: bearer token -> (user name, RBAC rules). A request with one of these tokens
        # is authorized against its rules (403 when denied); any other request is the admin's.
        self.service_accounts: dict[str, tuple[str, list[Rule]]] = {}
        self.denied: list[tuple[str, str, str]] = []  # (user, method, path) of every 403
        self.scheme = "http"

    def enable_tls(self, certfile: str, keyfile: str) -> None:
        """Serve HTTPS with this certificate (as an in-cluster client expects)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certfile, keyfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https"

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{self.scheme}://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self, controllers: bool = True) -> ApiServer:
        if controllers:
            self.cluster.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="sim-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.cluster.stop()

    def __enter__(self) -> ApiServer:
        return self if self._thread else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sim",
               "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
               "users": [{"name": "sim", "user": {"token": "sim-token"}}],
               "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}],
               "preferences": {}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    # -- dispatch ----------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, str]:
        path = urlparse(raw_path).path
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip() in self.service_accounts:
            user, rules = self.service_accounts[token.strip()]
            attrs = attributes(method, path)
            if attrs is not None and allowed(rules, *attrs) is None:
                group, resource, verb, ns = attrs
                self.denied.append((user, method, path))
                res = f"{resource}.{group}" if group else resource
                where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
                raise ApiError(403, "Forbidden", f'{res} is forbidden: User "{user}" cannot {verb} resource '
                                                 f'"{resource}" in API group "{group}"{where}')
        for hook in self.hooks:
            hook("before", method, path)
        answer = self._handle(method, raw_path, headers, body)
        for hook in self.hooks:
            hook("after", method, path)
        if (self.lost_reply_rate and method != "GET" and not self._discovery(path)
                and self.fault_rng.random() < self.lost_reply_rate):
            # The write happened, but the client hears a 503: a retry must cope with its own success.
            raise ApiError(503, "ServiceUnavailable", "simulated lost reply (the write was applied)")
        return answer

    def _handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, str]:
        url = urlparse(raw_path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path
        store = self.cluster.store
        with store.lock:
            store.requests.append((method, path))
        discovery = self._discovery(path)
        if discovery is not None:
            return 200, discovery, "application/json"
        fleet = self.cluster.fleet
        if fleet.api_slow_rate and self.fault_rng.random() < fleet.api_slow_rate:
            time.sleep(fleet.api_latency)  # a slow apiserver, in real time
        if fleet.api_drop_rate and self.fault_rng.random() < fleet.api_drop_rate:
            raise DroppedConnection()
        if self.fault_rate and self.fault_rng.random() < self.fault_rate:
            code = self.fault_rng.choice([500, 503, 429])
            reason = {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}[code]
            raise ApiError(code, reason, f"simulated API fault ({code})", retry_after=1 if code == 429 else None)
        m = _PATH.match(path)
        if not m:
            raise not_found("path", path)
        group = m.group("group") or ""
        plural = m.group("plural")
        res = RESOURCES.get(plural)
        if res is None or res.group != group:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns, name, sub = m.group("ns"), m.group("name"), m.group("sub")
        if plural == "namespaces" and name and sub is None and ns is None:
            pass
        if res.namespaced is False and ns:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET" and name and sub == "log":
            return 200, self._log(ns or "default", name, q), "text/plain"
        if method == "POST" and name and sub == "eviction":
            return self._evict(ns or "default", name)
        if method == "GET":
            if name:
                return 200, store.get(plural, ns, name), "application/json"
            listed = store.list(plural, ns if res.namespaced else None, label_selector=q.get("labelSelector"),
                                field_selector=q.get("fieldSelector"),
                                limit=int(q["limit"]) if q.get("limit") else None, continue_token=q.get("continue"))
            if "as=Table" in headers.get("accept", ""):
                return 200, table(plural, listed["items"], listed["metadata"], self.cluster.clock.now(),
                                  q.get("includeObject", "Metadata")), "application/json"
            return 200, listed, "application/json"
        if method == "POST" and not name:
            obj = _json(body)
            if plural == "pods":
                obj.setdefault("status", {})["phase"] = "Pending"
            if plural == "jobs":
                _default_job(obj)
                created = store.create(plural, ns, obj)
                return 201, store.mutate("jobs", ns, created["metadata"]["name"], _job_selector), "application/json"
            if plural == "events":
                obj.setdefault("firstTimestamp", iso(self.cluster.clock.now()))
                obj.setdefault("lastTimestamp", obj["firstTimestamp"])
                obj.setdefault("count", 1)
            return 201, store.create(plural, ns, obj), "application/json"
        if method in ("PUT", "PATCH") and name:
            return 200, self._write(method, res, ns, name, sub, headers, body), "application/json"
        if method == "DELETE" and name:
            return 200, self._delete(res, ns, name, q, body), "application/json"
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _write(self, method: str, res: Resource, ns: str | None, name: str, sub: str | None,
               headers: dict[str, str], body: bytes) -> dict[str, Any]:
        store = self.cluster.store
        with store.lock:
            current = store.get(res.plural, ns, name)
            if method == "PUT":
                new = _json(body)
            else:
                new = apply_patch(headers.get("content-type", ""), current, body)
            if sub == "status":
                new = {**current, "status": new.get("status", current.get("status"))}
            elif sub is None and res.plural != "events" and "status" in current:
                new["status"] = current["status"]  # the main resource ignores status changes
            meta = new.get("metadata") or {}
            for fixed in ("name", "uid"):
                if meta.get(fixed, current["metadata"][fixed]) != current["metadata"][fixed]:
                    raise ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: metadata.{fixed}: '
                                   "Invalid value: field is immutable")
            if res.plural == "nodes":
                self.cluster.before_node_write(name, current, new)
            return store.update(res.plural, ns, name, new)

    def _delete(self, res: Resource, ns: str | None, name: str, q: dict[str, str], body: bytes) -> dict[str, Any]:
        store = self.cluster.store
        opts = _json(body) if body.strip() else {}
        policy = q.get("propagationPolicy") or opts.get("propagationPolicy")
        pre = opts.get("preconditions") or {}
        with store.lock:
            obj = store.delete(res.plural, ns, name, pre.get("uid"), pre.get("resourceVersion"))
            uid = obj["metadata"]["uid"]
            if res.plural == "jobs" and policy is None:
                policy = "Orphan"  # the batch/v1 REST default, kept for backwards compatibility
            for pod in list(store.iter("pods")):
                owners = pod["metadata"].get("ownerReferences") or []
                if not any(o.get("uid") == uid for o in owners):
                    continue
                if policy == "Orphan":
                    kept = [o for o in owners if o.get("uid") != uid]

                    def orphan(p: dict[str, Any], kept: list[dict[str, Any]] = kept) -> None:
                        p["metadata"]["ownerReferences"] = kept
                    store.mutate("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], orphan)
                else:
                    store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
            if res.plural == "nodes":
                for pod in list(store.iter("pods")):
                    if pod["spec"].get("nodeName") == name:
                        store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        if res.plural in ("pods", "nodes", "jobs"):
            obj["metadata"]["deletionTimestamp"] = iso(self.cluster.clock.now())
            return obj
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "kind": res.plural, "uid": uid}}

    def _evict(self, ns: str, name: str) -> tuple[int, Any, str]:
        store = self.cluster.store
        with store.lock:
            pod = store.get("pods", ns, name)
            for pdb in store.iter("poddisruptionbudgets"):
                if pdb["metadata"]["namespace"] == ns and _pdb_blocks(store, pdb, pod):
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   retry_after=None)
            store.delete("pods", ns, name)
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, \
            "application/json"

    def _log(self, ns: str, name: str, q: dict[str, str]) -> str:
        store = self.cluster.store
        with store.lock:
            pod = store.get("pods", ns, name)
            if not pod["spec"].get("nodeName") or pod["status"].get("phase") == "Pending":
                raise bad_request(f'container "{_container(pod)}" in pod "{name}" is waiting to start: '
                                  "ContainerCreating")
            text = self.cluster.logs.get((ns, name), "")
        if q.get("tailLines"):
            text = "".join(text.splitlines(keepends=True)[-int(q["tailLines"]):])
        return text

    def _discovery(self, path: str) -> dict[str, Any] | None:
        path = path.rstrip("/") or "/"
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.4-sweeper-sim", "platform": "linux/amd64",
                    "goVersion": "go1.22", "compiler": "gc", "gitCommit": "", "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in GROUPS.items()]}
        if path == "/api/v1":
            return _resource_list("v1", "")
        m = re.match(r"^/apis/([^/]+)/([^/]+)$", path)
        if m and GROUPS.get(m.group(1)) == m.group(2):
            return _resource_list(f"{m.group(1)}/{m.group(2)}", m.group(1))
        return None


def _resource_list(group_version: str, group: str) -> dict[str, Any]:
    resources = []
    for r in RESOURCES.values():
        if r.group != group:
            continue
        resources.append({"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                          "kind": r.kind, "verbs": list(r.verbs), "shortNames": list(r.short_names)})
        if r.plural == "pods":
            resources += [{"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
                          {"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                           "version": "v1", "kind": "Eviction", "verbs": ["create"]}]
        if r.plural in ("nodes", "pods", "jobs"):
            resources.append({"name": f"{r.plural}/status", "singularName": "", "namespaced": r.namespaced,
                              "kind": r.kind, "verbs": ["get", "patch", "update"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


def _container(pod: dict[str, Any]) -> str:
    return ((pod["spec"].get("containers") or [{}])[0]).get("name", "")


def _json(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body or b"{}")
    except ValueError as exc:
        raise bad_request(f"unable to decode the request body: {exc}") from exc
    if not isinstance(obj, dict):
        raise bad_request("the request body must be an object")
    return obj


def _default_job(job: dict[str, Any]) -> None:
    spec = job.setdefault("spec", {})
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    tmpl = spec.setdefault("template", {})
    tmpl.setdefault("spec", {}).setdefault("restartPolicy", "Never")
    if tmpl["spec"]["restartPolicy"] not in ("Never", "OnFailure"):
        raise ApiError(422, "Invalid", f'Job.batch "{job.get("metadata", {}).get("name", "")}" is invalid: '
                       'spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"')
    job["status"] = {}


def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        has, val, vals = e["key"] in labels, labels.get(e["key"]), e.get("values") or []
        ok = {"In": has and val in vals, "NotIn": not has or val not in vals, "Exists": has,
              "DoesNotExist": not has}.get(e.get("operator", ""), False)
        if not ok:
            return False
    return True


def _pdb_blocks(store: Any, pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    """True when evicting the pod would take its PodDisruptionBudget below what it allows."""
    spec = pdb.get("spec") or {}
    selector = spec.get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    if not _selector_matches(selector, labels):
        return False
    ns = pdb["metadata"]["namespace"]
    matching = [p for p in store.iter("pods") if p["metadata"]["namespace"] == ns
                and _selector_matches(selector, p["metadata"].get("labels") or {})
                and p["status"].get("phase") not in TERMINAL]
    healthy = sum(1 for p in matching if p["status"].get("phase") == "Running")
    expected = len(matching)

    def amount(value: Any) -> int:
        if isinstance(value, str) and value.endswith("%"):
            return -(-expected * int(value[:-1]) // 100)
        return int(value)

    if "minAvailable" in spec:
        allowed = healthy - amount(spec["minAvailable"])
    elif "maxUnavailable" in spec:
        allowed = amount(spec["maxUnavailable"]) - (expected - healthy)
    else:
        return False
    return allowed < 1


class DroppedConnection(Exception):
    """The simulated apiserver hangs up without answering."""


def _job_selector(job: dict[str, Any]) -> None:
    """The selector and pod labels the apiserver generates for a Job."""
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    job["spec"].setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    labels = job["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
    labels.update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                   "batch.kubernetes.io/job-name": name, "job-name": name})


class _Handler(BaseHTTPRequestHandler):
    api: ApiServer
    protocol_version = "HTTP/1.1"
    server_version = "sweeper-sim/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logs
        return None

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        extra: dict[str, str] = {}
        try:
            code, payload, ctype = self.api.handle(method, self.path, headers, body)
        except DroppedConnection:
            self.close_connection = True
            self.connection.shutdown(2)  # no status line, no body: the client sees the connection drop
            return
        except ApiError as exc:
            code, payload, ctype = exc.code, exc.status(), "application/json"
            if exc.retry_after is not None:
                extra["Retry-After"] = str(exc.retry_after)
        except Exception as exc:  # noqa: BLE001 - a simulated apiserver answers 500, like a real one
            code, payload, ctype = 500, ApiError(500, "InternalError", f"internal error: {exc!r}").status(), \
                "application/json"
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._serve("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")


def running_pods_on(cluster: SimCluster, node: str) -> list[dict[str, Any]]:
    """Pods bound to a node that have not finished (for tests)."""
    with cluster.store.lock:
        return [p for p in cluster.store.iter("pods")
                if p["spec"].get("nodeName") == node and p["status"].get("phase") not in TERMINAL]
