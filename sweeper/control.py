"""The switches people flip: pause, the circuit breaker, and dismissals of a node's findings.

They live in one ConfigMap in Sweeper's namespace (`control_name`, default `sweeper-control`),
not in the history file, so that an operator's `sweeper pause` from a laptop stops the
CronJob's sweeps, and a breaker a run opened can be read and reset from any machine with the
kubeconfig. Each switch is one data key (`pause`, `breaker`, `dismissed.<node>`) holding a JSON
object. A run reads them all with one GET; writes are JSON patches guarded by the
resourceVersion read (a `test` op), retried on a conflict, and the ConfigMap is created by the
first write. ConfigMap data keys allow `[-._a-zA-Z0-9]+`
(https://kubernetes.io/docs/concepts/configuration/configmap/#configmap-object), which fits node
names (DNS subdomains).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from sweeper.errors import AlreadyExists, Conflict, KubeError, NotFound

KEYS = ("pause", "breaker")  # the fleet-wide switches; a node's dismissal is `dismissed.<node>`
DISMISSED = "dismissed."


def dismissal_key(node: str) -> str:
    return DISMISSED + node


def _pointer(key: str) -> str:
    """The JSON pointer (RFC 6901) of a data key."""
    return "/data/" + key.replace("~", "~0").replace("/", "~1")


class Controls:
    """The control ConfigMap: read once per run (`refresh`), written key by key."""

    def __init__(self, kube: Any, namespace: str, name: str, attempts: int = 5) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.attempts = attempts
        self._obj: dict[str, Any] | None = None  # the ConfigMap as last read or written; {} when absent
        self._lock = threading.Lock()

    def refresh(self) -> dict[str, dict[str, Any]]:
        """Read the ConfigMap (one GET); every switch by key."""
        try:
            obj = self.kube.get_configmap(self.namespace, self.name)
        except NotFound:
            obj = {}
        with self._lock:
            self._obj = obj
        return self.all()

    def all(self) -> dict[str, dict[str, Any]]:
        """Every switch as last read (reading it first if it never was)."""
        if self._obj is None:
            self.refresh()
        data = (self._obj or {}).get("data") or {}
        out = {}
        for key, text in data.items():
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                value = {"unreadable": text[:200]}  # a hand edit gone wrong: shown, never a crash
            out[key] = value if isinstance(value, dict) else {"value": value}
        return out

    def get(self, key: str) -> dict[str, Any] | None:
        return self.all().get(key)

    def set(self, key: str, value: dict[str, Any] | None, ts: float) -> None:
        """Write one switch (None removes it), stamped with `ts`, without losing a concurrent
        write to another key: the patch is conditional on the version read, re-read on conflict."""
        text = json.dumps({**value, "ts": ts}, sort_keys=True) if value is not None else None
        if self._obj is None:
            self.refresh()
        for _ in range(self.attempts):
            current = self._obj or {}
            if not current:
                if text is None:
                    return
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": self.name, "namespace": self.namespace,
                                     "labels": {"app.kubernetes.io/managed-by": "sweeper"}},
                        "data": {key: text}}
                try:
                    self._store(self.kube.create_configmap(self.namespace, body))
                    return
                except AlreadyExists:
                    self.refresh()
                    continue
            data = current.get("data")
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                          "value": current["metadata"]["resourceVersion"]}]
            if text is None:
                if key not in (data or {}):
                    return
                ops.append({"op": "remove", "path": _pointer(key)})
            elif data is None:
                ops.append({"op": "add", "path": "/data", "value": {key: text}})
            else:
                ops.append({"op": "add", "path": _pointer(key), "value": text})
            try:
                self._store(self.kube.patch_configmap(self.namespace, self.name, ops))
                return
            except (Conflict, NotFound):
                self.refresh()
        raise KubeError(f"could not write {key} to configmap {self.namespace}/{self.name}: "
                        f"{self.attempts} conflicting writes in a row")

    def _store(self, obj: dict[str, Any]) -> None:
        with self._lock:
            self._obj = obj
