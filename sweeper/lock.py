"""The sweep lock: a coordination.k8s.io Lease, renewed while a sweep runs, so that two
sweepers (two CronJob runs, or a CronJob and `serve`) never sweep at once.

The lock also fences the run's writes: `fence()` is called before each of them and raises
`LockLost` once the Lease may be another run's. A sweeper that was stopped (a frozen VM, a
long pause, a partition) longer than the lease duration cannot know whether another took
over, so before writing again it must renew the Lease conditionally on the version it last
wrote: success proves that nobody took it in between; a conflict, that somebody did.
"""

from __future__ import annotations

import threading
from typing import Any

from sweeper.clock import Clock, iso_micro, parse_iso
from sweeper.errors import AlreadyExists, Conflict, KubeError, LockHeld, LockLost, NotFound, Transient


class SweepLock:
    def __init__(self, kube: Any, namespace: str, name: str, holder: str, ttl: float, clock: Clock) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.clock = clock
        self.lost = threading.Event()
        self.why_lost = ""
        self._stop = threading.Event()
        self._renewing = threading.Lock()  # one renewal at a time: the loop's, or a stale fence's
        self._thread: threading.Thread | None = None
        self._lease: dict[str, Any] | None = None
        self._renewed_at: float | None = None  # the renewTime of the last write known to have landed

    @property
    def duration(self) -> float:
        """The leaseDurationSeconds written: how long after a renewal others may take the Lease."""
        return float(max(1, int(self.ttl)))

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        now = iso_micro(self.clock.now())
        return {"holderIdentity": self.holder, "leaseDurationSeconds": int(self.duration),
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def _took(self, lease: dict[str, Any]) -> None:
        self._lease = lease
        renew = (lease.get("spec") or {}).get("renewTime")
        self._renewed_at = parse_iso(renew) if renew else self.clock.now()

    def acquire(self) -> None:
        """Take the lock or raise LockHeld naming who has it."""
        try:
            current = self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            try:
                self._took(self.kube.create_lease(self.namespace, {
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(0)}))
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
            self._took(self.kube.replace_lease(self.namespace, self.name, body))
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
            self._took(current)
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
        while not self.clock.wait(self._stop, interval):
            with self._renewing:
                if self._stop.is_set() or self.lost.is_set():
                    return
                try:
                    self.renew()
                except Transient:
                    continue  # not lost yet: fence() refuses writes once the Lease may have expired
                except (LockHeld, KubeError) as exc:
                    self._lose(f"renewing it failed: {exc}")
                    return

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.why_lost = why
            self.lost.set()

    def _fresh(self) -> bool:
        return self._renewed_at is not None and self.clock.now() - self._renewed_at < self.duration

    def fence(self) -> None:
        """Raise LockLost unless this run still holds the Lease. Called before every write of the
        run; cheap while renewals land, one conditional renewal when the last is too old."""
        if not self.lost.is_set() and self._fresh():
            return
        with self._renewing:
            if not self.lost.is_set() and not self._fresh():
                age = self.clock.now() - (self._renewed_at or 0.0)
                try:
                    self.renew()
                except (LockHeld, KubeError) as exc:
                    self._lose(f"not renewed for {age:.1f}s (lease duration {self.duration:g}s), and then: {exc}")
        if self.lost.is_set():
            raise LockLost(f"the sweep lock {self.namespace}/{self.name} is no longer held by run {self.holder} "
                           f"({self.why_lost}); the run stopped writing to the cluster and the history")

    def holds(self) -> bool:
        """fence() as a question."""
        try:
            self.fence()
        except LockLost:
            return False
        return True

    def renew(self) -> None:
        assert self._lease is not None
        spec = dict(self._lease.get("spec") or {})
        spec["renewTime"] = iso_micro(self.clock.now())
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": self._lease["metadata"]["resourceVersion"]}, "spec": spec}
        try:
            self._took(self.kube.replace_lease(self.namespace, self.name, body))
        except Conflict as exc:
            if not self._mine():
                raise LockHeld("the lock was taken by another sweeper") from exc

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)  # at once, unless a renewal is on the wire
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
