"""The sweep lock: a coordination.k8s.io Lease, renewed while a sweep runs, so that two
sweepers (two CronJob runs, or a CronJob and `serve`) never sweep at once."""

from __future__ import annotations

import threading
from typing import Any

from sweeper.clock import Clock, iso_micro, parse_iso
from sweeper.errors import AlreadyExists, Conflict, KubeError, LockHeld, NotFound


class SweepLock:
    def __init__(self, kube: Any, namespace: str, name: str, holder: str, ttl: float, clock: Clock) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.clock = clock
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease: dict[str, Any] | None = None

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        now = iso_micro(self.clock.now())
        return {"holderIdentity": self.holder, "leaseDurationSeconds": max(1, int(self.ttl)),
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def acquire(self) -> None:
        """Take the lock or raise LockHeld naming who has it."""
        try:
            current = self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            try:
                self._lease = self.kube.create_lease(self.namespace, {
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(0)})
            except AlreadyExists as exc:
                if not self._mine():
                    raise LockHeld("another sweeper took the lock at the same moment") from exc
            self._start()
            return
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.holder and not self._expired(spec):
            raise LockHeld(f"another sweep holds the lock: {holder} (renewed {spec.get('renewTime')}, "
                           f"expires after {spec.get('leaseDurationSeconds')}s without renewal)", holder)
        transitions = int(spec.get("leaseTransitions") or 0) + (1 if holder != self.holder else 0)
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": self._spec(transitions)}
        try:
            self._lease = self.kube.replace_lease(self.namespace, self.name, body)
        except Conflict as exc:
            if not self._mine():  # a write whose reply was lost looks like a conflict on the retry
                raise LockHeld("another sweeper took the lock at the same moment") from exc
        self._start()

    def _mine(self) -> bool:
        try:
            current = self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            return False
        if (current.get("spec") or {}).get("holderIdentity") == self.holder:
            self._lease = current
            return True
        return False

    def _expired(self, spec: dict[str, Any]) -> bool:
        renew = spec.get("renewTime") or spec.get("acquireTime")
        if not renew:
            return True
        return parse_iso(renew) + float(spec.get("leaseDurationSeconds") or 0) < self.clock.now()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="sweep-lock", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        interval = max(0.001, self.ttl / 3)
        while not self._stop.is_set():
            self.clock.sleep(interval)
            if self._stop.is_set():
                return
            try:
                self.renew()
            except (LockHeld, KubeError):
                self.lost.set()
                return

    def renew(self) -> None:
        assert self._lease is not None
        spec = dict(self._lease.get("spec") or {})
        spec["renewTime"] = iso_micro(self.clock.now())
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": self._lease["metadata"]["resourceVersion"]}, "spec": spec}
        try:
            self._lease = self.kube.replace_lease(self.namespace, self.name, body)
        except Conflict as exc:
            if not self._mine():
                raise LockHeld("the lock was taken by another sweeper") from exc

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self._lease is None or self.lost.is_set():
            return
        try:
            current = self.kube.get_lease(self.namespace, self.name)
            if (current.get("spec") or {}).get("holderIdentity") != self.holder:
                return
            spec = dict(current["spec"])
            spec["holderIdentity"] = ""
            spec["renewTime"] = iso_micro(self.clock.now())
            self.kube.replace_lease(self.namespace, self.name, {
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": current["metadata"]["resourceVersion"]}, "spec": spec})
        except KubeError:
            pass  # an unreleased lock simply expires after its TTL
