"""The simulated cluster's HTTP API server: the REST paths Sweeper and kubectl use.

Why it is long: this is the apiserver. One router (`ApiServer.handle`) takes every verb and path
(create, apply, the three patch types, delete with propagation, evictions under PDBs, logs,
discovery, admission, watches) to one store; a path's whole handling reads top to bottom in one
place, and the pieces that stand alone (store, patch, selectors, RBAC, admission, tables,
OpenAPI) are modules beside it."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import yaml

from sweeper.clock import iso
from sweeper.sim import openapi
from sweeper.sim.admission import Policies
from sweeper.sim.cluster import TERMINAL, SimCluster
from sweeper.sim.errors import ApiError, bad_request, not_found
from sweeper.sim.patch import STRATEGIC, apply_patch
from sweeper.sim.rbac import (
    ADMIN_RULES,
    REVIEWS,
    Rule,
    access_review,
    allowed,
    attributes,
    object_name,
    rules_review,
)
from sweeper.sim.selectors import labels_match, parse_field_selector, parse_label_selector
from sweeper.sim.store import RESOURCES, Change, Resource
from sweeper.sim.tables import table

GROUPS = {r.group: r.version for r in RESOURCES.values() if r.group}
APPLY = "application/apply-patch+yaml"
# The checks a real apiserver lists under /healthz, /livez and /readyz?verbose
# (https://kubernetes.io/docs/reference/using-api/health-checks/).
HEALTH_CHECKS = ("ping", "log", "etcd", "poststarthook/start-apiextensions-controllers")
# A watch sends a BOOKMARK after this many simulated seconds without an event, when the client
# allows bookmarks (the apiserver sends them about once a minute).
BOOKMARK_EVERY = 60.0
SHUTDOWN_POLL = 0.02  # seconds of real time between serve_forever's looks for a shutdown request
# The writes admission reviews, by the operation an admission policy names.
ADMITTED = {"POST": "CREATE", "PATCH": "UPDATE", "PUT": "UPDATE", "DELETE": "DELETE"}
_VERSIONED = re.compile(r"^/(?:api/(?P<core>v1)|apis/[^/]+/(?P<version>[^/]+))/")
# The API server's proxy to a Service: /api/v1/namespaces/NS/services/[SCHEME:]NAME[:PORT]/proxy/PATH.
_PROXY = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/services/(?P<svc>[^/]+)/proxy(?P<rest>/.*)?$")
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
        # ValidatingAdmissionPolicies with Deny bindings (sweeper.sim.admission), when set: every write
        # is reviewed after RBAC, as the apiserver's admission chain does. Their denials, in order.
        self.admission: Policies | None = None
        self.admission_denied: list[str] = []
        self.scheme = "http"
        self.watch_drops = 0  # drop_watches() bumps it: every stream opened before hangs up
        self.stopping = threading.Event()

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
        # serve_forever looks for a shutdown request once a poll_interval (0.5 s by default): every stop()
        # would wait that long, which a test suite starting hundreds of simulated clusters pays in full.
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL},
                                        name="sim-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self.cluster.store.lock:
            self.cluster.store.changed.notify_all()
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
        # Written whole or not at all: a reader waits for the file to appear as the sign that the server listens.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
        os.replace(tmp, path)
        return path

    # -- dispatch ----------------------------------------------------------------
    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, str]:
        url = urlparse(raw_path)
        path = url.path
        # A watch is a GET that RBAC, the request log and the hooks see as the verb `watch`.
        if method == "GET" and _watching(url.query):
            method = "WATCH"
        scheme, _, token = headers.get("authorization", "").partition(" ")
        rules: list[Rule] = ADMIN_RULES
        user = "kubernetes-admin"
        if scheme.lower() == "bearer" and token.strip() in self.service_accounts:
            user, rules = self.service_accounts[token.strip()]
            attrs = attributes(method, path)
            # Anyone may ask what they may do (the system:basic-user ClusterRole).
            if attrs is not None and attrs[1] not in REVIEWS and allowed(rules, *attrs, object_name(path)) is None:
                group, resource, verb, ns = attrs
                self.denied.append((user, method, path))
                res = f"{resource}.{group}" if group else resource
                where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
                raise ApiError(403, "Forbidden", f'{res} is forbidden: User "{user}" cannot {verb} resource '
                                                 f'"{resource}" in API group "{group}"{where}')
        if method == "POST":
            self._pod_security(path, body)
        if self.admission is not None and method in ADMITTED:
            self._admit(method, path, headers, body, user)
        for hook in self.hooks:
            hook("before", method, path)
        answer = self._handle(method, raw_path, headers, body, rules)
        for hook in self.hooks:
            hook("after", method, path)
        if (self.lost_reply_rate and method not in ("GET", "WATCH") and not self._discovery(path)
                and self.fault_rng.random() < self.lost_reply_rate):
            # The write happened, but the client hears a 503: a retry must cope with its own success.
            raise ApiError(503, "ServiceUnavailable", "simulated lost reply (the write was applied)")
        return answer

    def _pod_security(self, path: str, body: bytes) -> None:
        """Pod Security Admission of a pod created through the API, as of one a Job's controller makes:
        the namespace's enforce level (https://kubernetes.io/docs/concepts/security/pod-security-admission/)."""
        attrs = attributes("POST", path)
        if attrs is None or attrs[:2] != ("", "pods") or attrs[3] is None:
            return
        pod = json.loads(body or b"{}")
        pod.setdefault("metadata", {})
        pod.setdefault("spec", {})
        with self.cluster.store.lock:
            refused = self.cluster.admit_pod(attrs[3], pod)
        if refused:
            raise ApiError(403, "Forbidden", refused)

    def _admit(self, method: str, path: str, headers: dict[str, str], body: bytes, user: str) -> None:
        """The admission policies' review of a write: the object as it would be stored, and as it is."""
        assert self.admission is not None
        attrs = attributes(method, path)
        m = _VERSIONED.match(path)
        if attrs is None or m is None:
            return
        group, resource, _verb, ns = attrs
        plural, name = resource.split("/")[0], object_name(path) or ""
        store = self.cluster.store
        obj: dict[str, Any] | None = None
        old: dict[str, Any] | None = None
        if method == "POST" and "/" not in resource:
            obj = json.loads(body or b"{}")
            meta = obj.setdefault("metadata", {})
            name = meta.get("name") or meta.get("generateName", "")
            if ns is not None:
                meta.setdefault("namespace", ns)
        elif method in ("PATCH", "PUT", "DELETE"):
            try:
                with store.lock:
                    current = store.peek(plural, ns, name)
                    old = copy.deepcopy(current) if current is not None else None
            except KeyError:
                return
            if old is None:
                return  # the request itself answers 404
            if method == "PATCH":
                obj = apply_patch(headers.get("content-type", ""), copy.deepcopy(old), body)
            elif method == "PUT":
                obj = json.loads(body or b"{}")
        else:
            obj = json.loads(body or b"{}")
        operation = ADMITTED[method]
        version = m.group("core") or m.group("version")
        denial = self.admission.review(operation, group, version, resource, ns, name, user, obj, old)
        if denial is not None:
            self.admission_denied.append(denial.message)
            raise ApiError(denial.code, denial.reason, denial.message)

    def _handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes,
                rules: list[Rule] | None = None) -> tuple[int, Any, str]:
        url = urlparse(raw_path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path
        store = self.cluster.store
        with store.lock:
            store.requests.append((method, path))  # a watch as ("WATCH", path)
            if q.get("fieldSelector"):
                store.field_selectors.append((path, q["fieldSelector"]))
        health = _health(path, "verbose" in parse_qs(url.query, keep_blank_values=True))
        if health is not None:
            return 200, health, "text/plain; charset=utf-8"
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
        proxied = _PROXY.match(path)
        if proxied:
            return self._proxy(method, unquote(proxied.group("ns")), unquote(proxied.group("svc")),
                               proxied.group("rest") or "/", url.query, headers, body)
        m = _PATH.match(path)
        if not m:
            raise not_found("path", path)
        # Each segment of the path is percent-decoded on its own, after the path is split, so that an
        # escaped "/" stays inside its segment (as the apiserver's request info resolver does).
        group = unquote(m.group("group") or "")
        plural = unquote(m.group("plural"))
        res = RESOURCES.get(plural)
        if res is None or res.group != group or (m.group("version") or "v1") != res.version \
                or not self._served(res):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns, name, sub = (unquote(x) if x is not None else None for x in (m.group("ns"), m.group("name"),
                                                                          m.group("sub")))
        if res.namespaced is False and ns:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        dry_run = _dry_run(parse_qs(url.query).get("dryRun"))
        if method == "GET" and name and sub == "log":
            return 200, self._log(ns or "default", name, q), "text/plain"
        if method == "POST" and name and sub == "eviction":
            return self._evict(ns or "default", name, dry_run or _dry_run(
                (_json(body).get("deleteOptions") or {}).get("dryRun") if body.strip() else None))
        if method == "POST" and plural in REVIEWS:
            review = _json(body)
            spec = review.get("spec") or {}
            review["status"] = rules_review(rules if rules is not None else ADMIN_RULES, spec.get("namespace")) \
                if plural == "selfsubjectrulesreviews" else \
                access_review(rules if rules is not None else ADMIN_RULES, spec)
            review.update({"apiVersion": res.api_version, "kind": res.kind})
            review.setdefault("metadata", {}).setdefault("creationTimestamp", None)
            return 201, review, "application/json"
        if method == "WATCH" and not name:
            return 200, self._watch(res, ns if res.namespaced else None, q, headers), "application/json"
        if method == "GET":
            if name:
                obj = store.get(plural, ns, name)
                if "as=Table" in headers.get("accept", ""):
                    return 200, table(plural, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]},
                                      self.cluster.clock.now(), q.get("includeObject", "Metadata")), \
                        "application/json"
                return 200, obj, "application/json"
            listed = store.list(plural, ns if res.namespaced else None, label_selector=q.get("labelSelector"),
                                field_selector=q.get("fieldSelector"),
                                limit=int(q["limit"]) if q.get("limit") else None, continue_token=q.get("continue"))
            if "as=Table" in headers.get("accept", ""):
                return 200, table(plural, listed["items"], listed["metadata"], self.cluster.clock.now(),
                                  q.get("includeObject", "Metadata")), "application/json"
            return 200, listed, "application/json"
        if method == "POST" and not name:
            obj = _json(body)
            openapi.check_fields(res, obj, q.get("fieldValidation"))
            return 201, self._create(res, ns, obj, dry_run), "application/json"
        if method == "PATCH" and name and sub is None and headers.get("content-type", "").startswith(APPLY):
            return self._apply(res, ns, name, q, body, dry_run)
        if method in ("PUT", "PATCH") and name:
            return 200, self._write(method, res, ns, name, sub, headers, body, dry_run,
                                    q.get("fieldValidation")), "application/json"
        if method == "DELETE" and name:
            return 200, self._delete(res, ns, name, q, body, dry_run), "application/json"
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _proxy(self, method: str, ns: str, target: str, rest: str, query: str, headers: dict[str, str],
               body: bytes) -> tuple[int, Any, str]:
        """The API server's proxy to a Service: `[scheme:]NAME[:PORT]`, the port by name or number
        (optional for a Service of one port), resolved through the Service's Endpoints, the request
        passed on and the answer returned as it came. No Service is 404; no ready address is 503, and
        so is an address that refuses the connection
        (https://kubernetes.io/docs/tasks/access-application-cluster/access-cluster-services/
        #manually-constructing-apiserver-proxy-urls). RBAC has already checked `services/proxy`."""
        import http.client

        parts = target.split(":")
        if len(parts) == 3 or parts[0] in ("http", "https") and len(parts) > 1:
            parts = parts[1:]
        name, port = parts[0], (parts[1] if len(parts) > 1 else "")
        store = self.cluster.store
        with store.lock:
            svc = copy.deepcopy(store.get("services", ns, name))  # 404 when there is none
            eps = store.peek("endpoints", ns, name)
            eps = copy.deepcopy(eps) if eps is not None else None
        ports = (svc.get("spec") or {}).get("ports") or []
        chosen = [p for p in ports if port in (str(p.get("name") or ""), str(p.get("port")))] if port else ports
        if len(chosen) != 1:
            raise ApiError(503, "ServiceUnavailable", f'no service port "{port}" found for service "{name}"')
        port_name = chosen[0].get("name") or ""
        for subset in (eps or {}).get("subsets") or []:
            addresses = subset.get("addresses") or []
            target_port = next((p.get("port") for p in subset.get("ports") or [] if (p.get("name") or "") == port_name),
                               None)
            if addresses and target_port:
                host = addresses[0]["ip"]
                break
        else:
            raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
        conn = http.client.HTTPConnection(host, int(target_port), timeout=30)
        try:
            conn.request(method, rest + (f"?{query}" if query else ""), body=body or None,
                         headers={k: v for k, v in headers.items() if k in ("accept", "content-type")})
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: {exc}") from exc
        finally:
            conn.close()
        return resp.status, data, resp.getheader("Content-Type") or "application/octet-stream"

    def _served(self, res: Resource) -> bool:
        """A custom resource is served only where its CRD is installed (the MPI Operator's MPIJob:
        the fleet's `mpi_operator`; Kueue's Workload: `kueue`), and resource.k8s.io where DRA is in
        use (a node group's `dra`); a cluster without it answers 404 on the resource's path."""
        return res.group not in self._unserved_groups()

    def _unserved_groups(self) -> tuple[str, ...]:
        fleet = self.cluster.fleet
        return tuple(g for g, on in (("kubeflow.org", fleet.mpi_operator), ("resource.k8s.io", fleet.dra),
                                     ("kueue.x-k8s.io", fleet.kueue)) if not on)

    def _watch(self, res: Resource, ns: str | None, q: dict[str, str], headers: dict[str, str]) -> WatchStream:
        """A watch of a collection, checked before its stream starts: selectors parse, the
        resourceVersion is a number."""
        rv = q.get("resourceVersion") or None
        if rv is not None and not rv.isdigit():
            raise ApiError(400, "BadRequest", f"resourceVersion: Invalid value: {rv!r}: must be a number")
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        accept = headers.get("accept", "")
        return WatchStream(self, res, ns, parse_label_selector(q.get("labelSelector")),
                           parse_field_selector(q.get("fieldSelector"), res.plural),
                           None if rv in (None, "0") else int(rv), _true(q.get("allowWatchBookmarks", "")), timeout,
                           q.get("includeObject", "Metadata") if "as=Table" in accept else None,
                           bool((q.get("fieldSelector") or "").strip()))

    def drop_watches(self) -> None:
        """Hang up every open watch stream without ending it (a load balancer or an apiserver
        restart does this): clients must notice and start again."""
        with self.cluster.store.lock:
            self.watch_drops += 1
            self.cluster.store.changed.notify_all()

    def _create(self, res: Resource, ns: str | None, obj: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        """POST: what the apiserver's defaulting and the controllers' admission add, then the store."""
        store = self.cluster.store
        plural = res.plural
        if plural == "pods":
            obj.setdefault("status", {})["phase"] = "Pending"
            # The admission plugins (RuntimeClass, Pod Security) answer a refused pod with a 403.
            refused = self.cluster.admit_pod(ns or "default", obj)
            if refused:
                raise ApiError(403, "Forbidden", refused, kind="pods", name=obj["metadata"].get("name", ""))
        if plural == "events":
            obj.setdefault("firstTimestamp", iso(self.cluster.clock.now()))
            obj.setdefault("lastTimestamp", obj["firstTimestamp"])
            obj.setdefault("count", 1)
        if plural != "jobs":
            return store.create(plural, ns, obj, dry_run=dry_run)
        _default_job(obj)
        with store.lock:
            created = store.create(plural, ns, obj, dry_run=dry_run)
            if dry_run:
                _job_selector(created)
                return created
            return store.mutate("jobs", ns, created["metadata"]["name"], _job_selector)

    def _apply(self, res: Resource, ns: str | None, name: str, q: dict[str, str], body: bytes,
               dry_run: bool) -> tuple[int, Any, str]:
        """Server-side apply (PATCH with application/apply-patch+yaml,
        https://kubernetes.io/docs/reference/using-api/server-side-apply/): create the object when it
        is absent, else merge the applied configuration into it. A simplification: fields are merged
        as a strategic merge patch would merge them; there is no managedFields ownership, so no
        conflicts between managers and no removal of fields a manager stops applying."""
        if not q.get("fieldManager"):
            raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                           "is required for apply patch")
        try:
            applied = yaml.safe_load(body.decode() or "{}")
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise bad_request(f"error decoding YAML: {exc}") from exc
        if not isinstance(applied, dict):
            raise bad_request("the applied configuration must be an object")
        meta = applied.get("metadata") or {}
        if meta.get("name", name) != name:
            raise bad_request("the name of the object does not match the name on the URL")
        if applied.get("kind", res.kind) != res.kind or applied.get("apiVersion", res.api_version) != res.api_version:
            raise bad_request(f"the applied configuration is a {applied.get('apiVersion')}/{applied.get('kind')}, "
                              f"not a {res.api_version}/{res.kind}")
        openapi.check_fields(res, applied, q.get("fieldValidation"))
        store = self.cluster.store
        with store.lock:
            if store.peek(res.plural, ns, name) is None:
                applied.setdefault("metadata", {})["name"] = name
                return 201, self._create(res, ns, applied, dry_run), "application/json"
            merged = json.dumps(applied).encode()
            return 200, self._write("PATCH", res, ns, name, None, {"content-type": STRATEGIC}, merged,
                                    dry_run, None), "application/json"

    def _write(self, method: str, res: Resource, ns: str | None, name: str, sub: str | None,
               headers: dict[str, str], body: bytes, dry_run: bool = False,
               field_validation: str | None = None) -> dict[str, Any]:
        store = self.cluster.store
        ctype = headers.get("content-type", "")
        if method == "PUT":
            openapi.check_fields(res, _json(body), field_validation)
        elif ctype.startswith((STRATEGIC, "application/merge-patch+json")):
            openapi.check_fields(res, _json(body), field_validation)
        with store.lock:
            current = store.get(res.plural, ns, name)
            if method == "PUT":
                new = _json(body)
            else:
                new = apply_patch(ctype, current, body)
            if sub == "status":
                new = {**current, "status": new.get("status", current.get("status"))}
            elif sub is None and res.plural != "events" and "status" in current:
                new["status"] = current["status"]  # the main resource ignores status changes
            meta = new.get("metadata") or {}
            for fixed in ("name", "uid"):
                if meta.get(fixed, current["metadata"][fixed]) != current["metadata"][fixed]:
                    raise ApiError(422, "Invalid", f'{res.kind} "{name}" is invalid: metadata.{fixed}: '
                                   "Invalid value: field is immutable")
            if dry_run:
                return store.update(res.plural, ns, name, new, dry_run=True)
            if res.plural == "nodes":
                self.cluster.before_node_write(name, current, new)
            return store.update(res.plural, ns, name, new)

    def _delete(self, res: Resource, ns: str | None, name: str, q: dict[str, str], body: bytes,
                dry_run: bool = False) -> dict[str, Any]:
        store = self.cluster.store
        opts = _json(body) if body.strip() else {}
        policy = q.get("propagationPolicy") or opts.get("propagationPolicy")
        pre = opts.get("preconditions") or {}
        dry_run = dry_run or _dry_run(opts.get("dryRun"))
        with store.lock:
            obj = store.delete(res.plural, ns, name, pre.get("uid"), pre.get("resourceVersion"), dry_run=dry_run)
            uid = obj["metadata"]["uid"]
            if dry_run:
                if res.plural in ("pods", "nodes", "jobs"):
                    obj["metadata"]["deletionTimestamp"] = iso(self.cluster.clock.now())
                    return obj
                return _deleted(res, name, uid)
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
        return _deleted(res, name, uid)

    def _evict(self, ns: str, name: str, dry_run: bool = False) -> tuple[int, Any, str]:
        store = self.cluster.store
        with store.lock:
            pod = store.get("pods", ns, name)
            for pdb in store.iter("poddisruptionbudgets"):
                if pdb["metadata"]["namespace"] == ns and _pdb_blocks(store, pdb, pod):
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   retry_after=None)
            store.delete("pods", ns, name, dry_run=dry_run)
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
        off = self._unserved_groups()
        unserved = tuple(f"apis/{g}/{GROUPS[g]}" for g in off)
        if path == "/openapi/v3":
            found = openapi.discovery()
            return {**found, "paths": {gv: v for gv, v in found["paths"].items() if gv not in unserved}}
        if path.startswith("/openapi/v3/"):
            doc = None if path[len("/openapi/v3/"):] in unserved else openapi.document(path[len("/openapi/v3/"):])
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return doc
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
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in GROUPS.items()
                if g not in off]}
        if path == "/api/v1":
            return _resource_list("v1", "")
        m = re.match(r"^/apis/([^/]+)/([^/]+)$", path)
        if m and GROUPS.get(m.group(1)) == m.group(2) and m.group(1) not in off:
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


def _deleted(res: Resource, name: str, uid: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "kind": res.plural, "uid": uid}}


def _dry_run(values: Any) -> bool:
    """`dryRun=All` (query or DeleteOptions): validate and answer, persist nothing. Any other value is
    refused, as the apiserver refuses it
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run)."""
    if not values:
        return False
    values = [values] if isinstance(values, str) else list(values)
    if any(v != "All" for v in values):
        raise bad_request(f'Invalid dry run value: {values!r}; the only valid value is "All"')
    return True


def _health(path: str, verbose: bool) -> str | None:
    """/healthz, /livez and /readyz (and each check under them) answer `ok`."""
    parts = path.strip("/").split("/")
    if parts[0] not in ("healthz", "livez", "readyz") or len(parts) > 2 + (parts[1:2] == ["poststarthook"]):
        return None
    if len(parts) > 1:
        return "ok" if "/".join(parts[1:]) in HEALTH_CHECKS else None
    if not verbose:
        return "ok"
    return "".join(f"[+]{c} ok\n" for c in HEALTH_CHECKS) + f"{parts[0]} check passed\n"


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


def _true(value: str) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (the Python client sends "True")."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _watching(query: str) -> bool:
    return any(_true(v) for v in parse_qs(query).get("watch", []))


class WatchStream:
    """The events of one watch, as the apiserver sends them
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
    from a resourceVersion on, or, without one (or with "0"), ADDED for what exists now and the
    changes after it; an object that starts or stops matching the selectors comes as ADDED or
    DELETED; BOOKMARK events when allowed; a resourceVersion older than the history the store
    keeps is an ERROR event carrying a 410 Expired Status, after which the client must list
    again. `timeoutSeconds` runs on the simulated clock; without it the stream lasts until one
    side hangs up."""

    def __init__(self, api: ApiServer, res: Resource, ns: str | None, labels: Any,
                 fields: Callable[[dict[str, Any]], bool], since: int | None, bookmarks: bool,
                 timeout: float | None, table_of: str | None, has_fields: bool) -> None:
        self.api, self.res, self.ns, self.labels, self.fields = api, res, ns, labels, fields
        self.since, self.bookmarks, self.timeout, self.table_of = since, bookmarks, timeout, table_of
        self.selective = bool(labels) or has_fields or ns is not None
        self.drops = api.watch_drops  # a drop_watches() from here on, even before the stream starts, ends it

    def _match(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.ns is not None and meta.get("namespace") != self.ns:
            return False
        return labels_match(self.labels, meta.get("labels")) and self.fields(obj)

    def _line(self, type_: str, obj: dict[str, Any] | None, raw: str | None = None) -> str:
        if self.table_of is not None and obj is not None:
            obj = table(self.res.plural, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]},
                        self.api.cluster.clock.now(), self.table_of)
            raw = None
        return '{"type":"' + type_ + '","object":' + (raw if raw is not None else json.dumps(obj)) + "}\n"

    def _event(self, c: Change) -> str | None:
        if c.plural != self.res.plural:
            return None
        if not self.selective:
            return self._line(c.type, c.new if self.table_of is not None else None, c.raw)
        now, before = self._match(c.new), self._match(c.old) if c.type == "MODIFIED" else None
        if c.type == "MODIFIED":
            type_ = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else ""
        else:
            type_ = c.type if now else ""
        return self._line(type_, c.new, c.raw) if type_ else None

    def _bookmark(self, rv: int) -> str:
        return self._line("BOOKMARK", None, json.dumps({"kind": self.res.kind, "apiVersion": self.res.api_version,
                                                        "metadata": {"resourceVersion": str(rv)}}))

    def events(self) -> Iterator[list[str]]:
        """Batches of event lines, each sent as one chunk."""
        store, clock, api = self.api.cluster.store, self.api.cluster.clock, self.api
        end = clock.now() + self.timeout if self.timeout else None
        drops = self.drops
        with store.lock:
            if self.since is None:
                pos = int(store.resource_version)
                first = [self._line("ADDED", o) for o in store.iter(self.res.plural) if self._match(o)]
            elif self.since < store.oldest_watchable():
                yield [self._line("ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                            "message": f"too old resource version: {self.since} "
                                                       f"({store.oldest_watchable() + 1})",
                                            "reason": "Expired", "code": 410})]
                return
            else:
                pos, first = self.since, []
        if first:
            yield first
        quiet_since = clock.now()
        fleet = api.cluster.fleet
        while not api.stopping.is_set():
            with store.lock:
                if api.watch_drops != drops:
                    raise DroppedConnection()
                if store.changes and store.changes[-1].rv <= pos or not store.changes:
                    store.changed.wait(0.05)
                batch: list[Change] = []
                for c in reversed(store.changes):
                    if c.rv <= pos:
                        break
                    batch.append(c)
                if batch and batch[-1].rv > pos + 1 and pos < store.oldest_watchable():
                    expired = True
                else:
                    expired = False
                lines = [line for c in reversed(batch) if (line := self._event(c)) is not None]
                if batch:
                    pos = batch[0].rv
            if expired:
                yield [self._line("ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                            "message": f"too old resource version: {pos}", "reason": "Expired",
                                            "code": 410})]
                return
            now = clock.now()
            if lines:
                if fleet.api_drop_rate and api.fault_rng.random() < fleet.api_drop_rate:
                    raise DroppedConnection()
                yield lines
                quiet_since = now
            elif self.bookmarks and now - quiet_since >= BOOKMARK_EVERY:
                yield [self._bookmark(pos)]
                quiet_since = now
            if end is not None and now >= end:
                if self.bookmarks:
                    yield [self._bookmark(pos)]
                return



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
    # Headers and body go out in two writes on a kept-alive connection: with Nagle's algorithm the body
    # waits for the client's delayed ACK of the headers, some 40 ms a request on Linux, which real
    # apiservers (Go's net/http sets TCP_NODELAY) never add.
    disable_nagle_algorithm = True

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
            self._hang_up()
            return
        except ApiError as exc:
            code, payload, ctype = exc.code, exc.status(), "application/json"
            if exc.retry_after is not None:
                extra["Retry-After"] = str(exc.retry_after)
        except Exception as exc:  # noqa: BLE001 - a simulated apiserver answers 500, like a real one
            code, payload, ctype = 500, ApiError(500, "InternalError", f"internal error: {exc!r}").status(), \
                "application/json"
        if isinstance(payload, WatchStream):
            self._stream(payload)
            return
        data = payload if isinstance(payload, bytes) else \
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def _hang_up(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(2)  # no status line, or no end of the body: the client sees the connection drop
        except OSError:
            pass

    def _stream(self, watch: WatchStream) -> None:
        """A watch as the apiserver serves it: 200, then one JSON event per line in a chunked
        body, until timeoutSeconds or until the client or the server hangs up."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(lines: list[str]) -> None:
            data = "".join(lines).encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            for lines in watch.events():
                send(lines)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except DroppedConnection:
            self._hang_up()
        except OSError:
            return  # the client went away

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
