"""What a run's check Jobs and their pods look like now, for every `run_job` of the run at once.

A run lists its Jobs and their pods once, by the run's label, and then follows each list with
one watch from the list's resourceVersion, as client-go's reflector does
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
a watch that ends (timeoutSeconds) starts again from the last resourceVersion it saw, a BOOKMARK
moves that version on, and a 410 Gone or a dropped connection means listing again. So the API
server answers two lists and two long-lived requests per run however many nodes it sweeps,
instead of one GET of each Job every few seconds. Where a watch is refused (an RBAC without
`watch`, a proxy that cuts streams), the run lists its Jobs and pods every `poll_interval`
instead: still one pair of requests per run, not per node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sweeper.clock import Clock
from sweeper.demand import Arbiter
from sweeper.errors import KubeError, Transient

# Seconds a watch request asks to last before it is started again (timeoutSeconds). The client waits
# that long plus its read timeout for the next bytes: a stream silent for longer is cut and listed again.
WATCH_TIMEOUT = 300
JOB_NAME = ("batch.kubernetes.io/job-name", "job-name")


def _job_of(pod: dict[str, Any]) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return next((str(labels[k]) for k in JOB_NAME if labels.get(k)), "")


class RunWatch:
    """The Jobs and pods of one run (label selector `selector` in `namespace`), kept current by
    a watch on each; `changed(job)` is an event set whenever that Job or one of its pods changes.
    Threads start on first use, so a run without checks costs no request."""

    def __init__(self, kube: Any, namespace: str, selector: str, clock: Clock, poll_interval: float,
                 log: Callable[[str], None] = lambda msg: None, watch_timeout: int = WATCH_TIMEOUT) -> None:
        self.kube = kube
        self.watch_timeout = watch_timeout
        self.namespace = namespace
        self.selector = selector
        self.clock = clock
        self.poll_interval = poll_interval
        self.log = log
        self.arbiter = Arbiter()  # which of the run's abortable checks pending work stops (sweeper.demand)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {"jobs": {}, "pods": {}}
        self._synced = {"jobs": threading.Event(), "pods": threading.Event()}
        self._changed: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._streams: dict[str, Any] = {}
        self.polling = ""  # why the run polls instead of watching, once a watch was refused
        self.relists = 0  # lists after the first (410 Gone, a dropped watch, or polling)
        self._pending: tuple[float, list[dict[str, Any]]] | None = None
        self._pending_lock = threading.Lock()

    # -- what run_job reads -------------------------------------------------------------
    def changed(self, job: str) -> threading.Event:
        """The event set on each change of `job` or its pods (and on every relist)."""
        self._start()
        with self._lock:
            return self._changed.setdefault(job, threading.Event())

    def state(self, job: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The Job as last seen (None until the watch has seen it) and its pods."""
        with self._lock:
            pods = [p for p in self._objects["pods"].values() if _job_of(p) == job]
            return self._objects["jobs"].get(job), pods

    def refresh(self, job: str) -> None:
        """Read one Job and its pods afresh into what the run has seen: before a verdict that the
        watch's (or the poll's) view alone would give, such as a check past its deadline, which
        a stream that lags behind, or a poll that has not come round, would make look hung."""
        try:
            fresh = self.kube.get_job(self.namespace, job)
        except KubeError:
            fresh = None
        pods = self.kube.namespaced_pods(self.namespace, f"job-name={job}")
        with self._lock:
            if fresh is not None:
                self._objects["jobs"][job] = fresh
            for pod in pods:
                self._objects["pods"][pod["metadata"]["name"]] = pod
        self._wake({job})

    def forget(self, job: str) -> None:
        with self._lock:
            self._changed.pop(job, None)

    def pending_pods(self, max_age: float) -> list[dict[str, Any]]:
        """Pods waiting to be scheduled across the cluster, listed at most once per `max_age`
        seconds for the whole run (the demand that aborts abortable checks)."""
        with self._pending_lock:
            now = self.clock.now()
            if self._pending is None or now - self._pending[0] >= max_age:
                self._pending = (now, self.kube.pending_pods())
            return self._pending[1]

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.close()

    # -- following ----------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self._threads or self._stop.is_set():
                return
            for plural in ("jobs", "pods"):
                t = threading.Thread(target=self._follow, args=(plural,), name=f"run-watch-{plural}", daemon=True)
                self._threads.append(t)
                t.start()

    def _wake(self, jobs: set[str] | None = None) -> None:
        with self._lock:
            for name, ev in self._changed.items():
                if jobs is None or name in jobs:
                    ev.set()

    def _replace(self, plural: str, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._objects[plural] = {o["metadata"]["name"]: o for o in items}
        self._synced[plural].set()
        self._wake()

    def _apply(self, plural: str, type_: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            if type_ == "DELETED":
                self._objects[plural].pop(name, None)
            else:
                self._objects[plural][name] = obj
        self._wake({name if plural == "jobs" else _job_of(obj)})

    def _follow(self, plural: str) -> None:
        rv = ""
        listed = False
        while not self._stop.is_set():
            if not rv:
                try:
                    items, rv = self.kube.list_at(plural, self.namespace, self.selector)
                except KubeError as exc:
                    self.log(f"cannot list the run's {plural}: {exc}")
                    self.clock.wait(self._stop, self.poll_interval)
                    continue
                self.relists += listed
                listed = True
                self._replace(plural, items)
            if self.polling:
                self.clock.wait(self._stop, self.poll_interval)
                rv = ""
                continue
            try:
                stream = self.kube.watch(plural, self.namespace, self.selector, rv, self.watch_timeout)
            except Transient as exc:
                self.log(f"cannot watch the run's {plural}, listing again: {exc}")
                rv = ""
                self.clock.wait(self._stop, self.poll_interval)
                continue
            except KubeError as exc:  # refused (403 without `watch`, 405 from a proxy): poll instead
                self.polling = f"the watch of {plural} was refused ({exc}); listing every {self.poll_interval:g}s"
                self.log(self.polling)
                continue
            with self._lock:
                self._streams[plural] = stream
            try:
                for type_, obj in stream:
                    if self._stop.is_set():
                        return
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if type_ != "BOOKMARK":
                        self._apply(plural, type_, obj)
            except Transient as exc:  # 410 Expired, or the stream was cut: what was missed is listed
                if not self._stop.is_set():
                    self.log(f"the watch of the run's {plural} ended ({exc}); listing again")
                rv = ""
            finally:
                with self._lock:
                    self._streams.pop(plural, None)
