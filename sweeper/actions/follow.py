"""One loop follows every Job Sweeper waits on: a node's check Job, a pair's Indexed Job, an MPIJob
with its launcher, and a remedy's GPU reset or reboot Job. Its rules are written here once: the Job's
own deadline and the client's, a stopped sweep, pending GPU work that aborts an abortable check, a pod
that never lands, and a container that cannot start (a fault of the tool, or of the node's GPU stack,
never taken for the other).

What differs between Jobs is said by two small objects, not by the rules:
- a `Shape`: what the Job's pods are (one check pod; two pair pods that wait for each other; an
  MPIJob's launcher and workers), the words its outcomes use, and whether a container that ran
  decides the outcome (a reboot's: its node goes down under the pod, which then fails);
- a source: how the Job is seen and how the loop waits (`WatchSource`, the run's watch of its Jobs,
  which wakes the wait on each change; `PollSource`, a read every `poll_interval`, whose `condition`
  may read more than the Job: a reboot's reads the node, down or with a new boot id).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from sweeper.actions import ActionContext, ok
from sweeper.actions.jobwatch import RunWatch
from sweeper.actions.podstate import (
    Fault,
    container_ran,
    finished,
    hung_result,
    job_condition,
    node_gone,
    unscheduled,
)
from sweeper.demand import Arbiter
from sweeper.errors import NotFound
from sweeper.result import Result

SCHEDULE_TIMEOUT = 300.0
MAX_POLL = 30.0
CLIENT_GRACE = 60.0
# How long a finished Job waits for its pod's last state from the pod watch before listing the pods
# (the pod may be gone): the wait ends at the pod's event, so it is this long only if it was deleted.
POD_LAG = 60.0
DEMAND_EVERY = 6  # pending pods (abort_on_demand) are listed once per this many poll intervals, per run
TOOL_FAULT_GRACE = 120.0  # a container that cannot start for this long is given up on (the kubelet retries)
EVENTS_EVERY = 6  # polls between looks at the Job's FailedCreate Events while it has no pod
DEADLINE = "DeadlineExceeded"

Pods = list[dict[str, Any]]


@dataclass(frozen=True)
class Outcome:
    """How a followed Job ended: a result on the node, or `inconclusive` (why there is none)."""

    result: Result | None = None
    inconclusive: str = ""


class Shape:
    """A check Job: one pod on the node (`nodes[0]`, whom results name)."""

    need = 1  # the pods that must have finished before the Job's result is read
    # The pods wait for each other (a pair): a pod that cannot land decides the outcome, whatever the
    # Job's condition says, since the other may have given up on the rendezvous.
    rendezvous = False
    decided_by_run = False  # a container that ran decides: `read` then gets the Job's condition or {}
    what = "the check"
    part = "check"  # what a fault of the tool names: "the check image ...", "a fault of the check"

    def __init__(self, *nodes: str) -> None:
        self.nodes = nodes

    @property
    def node(self) -> str:
        return self.nodes[0]

    def started(self, pods: Pods) -> bool:
        """The kubelet accepted a pod (status.startTime: set before any image is pulled)."""
        return any((p.get("status") or {}).get("startTime") for p in pods)

    def ran(self, pods: Pods) -> bool:
        """A container did run: only then is a deadline a hung check, a fault of the node."""
        return any(container_ran(p) for p in pods)

    def why(self, pods: Pods, started: bool, last: str) -> str:
        """The scheduler's word on a pod that cannot land, from the last time there were pods."""
        return last if not pods else "" if started else unscheduled(pods) or last

    def ask_events(self, pods: Pods, started: bool) -> bool:
        """Whether the Job's lack of pods is worth asking its Events about (admission refused them)."""
        return not pods and not started

    def never_scheduled(self, ctx: ActionContext, why: str) -> str:
        return f"the check pod never scheduled ({why})" + (node_gone(ctx, self.node) or
                                                          "; someone or something else has the node")

    def never_started(self, ctx: ActionContext) -> str:
        return "the check pod never started before its deadline" + node_gone(ctx, self.node)


class PairShape(Shape):
    """A pair's Indexed Job: one pod on each of the two nodes, which meet to run NCCL."""

    need = 2
    rendezvous = True
    what = "the pair"

    def started(self, pods: Pods) -> bool:
        return len(pods) >= 2 and all((p.get("status") or {}).get("startTime") for p in pods)

    def why(self, pods: Pods, started: bool, last: str) -> str:
        return unscheduled(pods) or ("" if started else last)

    def ask_events(self, pods: Pods, started: bool) -> bool:
        return not pods

    def never_scheduled(self, ctx: ActionContext, why: str) -> str:
        return f"a pod of the pair never scheduled ({why})" + (self._gone(ctx) or
                                                              "; someone or something else has one of the nodes")

    def never_started(self, ctx: ActionContext) -> str:
        return "the pair's pods never started before their deadline" + self._gone(ctx)

    def _gone(self, ctx: ActionContext) -> str:
        return "".join(node_gone(ctx, n).replace("the node", f"node {n}") for n in self.nodes)


class MPIShape(PairShape):
    """An MPIJob of the MPI Operator: the work runs when the launcher's container runs; a worker that
    cannot land is what keeps it from starting (the launcher waits for the workers)."""

    need = 0  # the launcher's log is read from what the poll saw
    rendezvous = False

    def __init__(self, *nodes: str, role: Callable[[dict[str, Any]], str]) -> None:
        super().__init__(*nodes)
        self.role = role

    def started(self, pods: Pods) -> bool:
        return True  # the operator creates the pods in its own time: no "never started" of its own

    def ran(self, pods: Pods) -> bool:
        return any(container_ran(p) for p in pods if self.role(p) == "launcher")

    def why(self, pods: Pods, started: bool, last: str) -> str:
        return unscheduled([p for p in pods if self.role(p) == "worker"])


class Source(Protocol):
    """How the loop sees one Job and waits for its next change."""

    def look(self) -> tuple[dict[str, Any] | None, Pods, bool]:
        """The Job as now seen (None: not seen yet, or gone), its pods, and whether it is gone."""

    def condition(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """The condition that says the Job is finished, once it has one."""

    def settle(self, need: int) -> Pods:
        """The pods of a finished Job, once `need` of them are seen finished (or after a while)."""

    def refused(self, fault: Fault, now: float) -> None:
        """Tell `fault` when admission refused the Job's pods."""

    def demand(self, polls: int) -> Pods:
        """Pods pending across the cluster, as often as this source lists them."""

    def refresh(self) -> bool:
        """Read the Job afresh before a deadline verdict; False where each look is fresh already."""

    def gone(self, node: str, now: float) -> Result:
        """The result when the Job was deleted under the run."""

    def wait(self, pause: float) -> None:
        """Wait for a change, at most `pause` seconds."""


def follow(ctx: ActionContext, source: Source, shape: Shape, timeout: float, abortable: bool,
           read: Callable[[dict[str, Any], Pods], Result]) -> Outcome:
    """Follow one Job until it finishes (`read` turns its finished condition and pods into a result),
    its deadline passes, the sweep stops, pending GPU work aborts it (with abort_on_demand: when the
    run's arbiter picks its node, sweeper.demand), or its pods are given up on."""
    # The run's arbiter decides for all its checks at once; `sweeper run` has one of its own.
    arbiter = (getattr(ctx.jobwatch, "arbiter", None) or Arbiter()) if abortable and ctx.config.abort_on_demand \
        else None
    if arbiter is None:
        return _follow(ctx, source, shape, timeout, None, read)
    with arbiter.running([v for v in (ctx.node, ctx.partner) if v and v.get("name") in shape.nodes],
                         ctx.clock.now(), timeout):
        return _follow(ctx, source, shape, timeout, arbiter, read)


def _follow(ctx: ActionContext, source: Source, shape: Shape, timeout: float, arbiter: Arbiter | None,
            read: Callable[[dict[str, Any], Pods], Result]) -> Outcome:
    node = shape.node
    start = ctx.clock.now()
    fault = Fault(shape.part)  # why the container cannot start, or why the pod is not even created
    polls = 0
    started = ran = False
    why = ""  # the scheduler's word on a pod that cannot land
    confirmed = False  # the Job was read afresh once past its deadline
    while True:
        polls += 1
        job, pods, gone = source.look()
        cond = source.condition(job) if job is not None else None
        if cond is not None and cond.get("reason") != DEADLINE and sum(map(finished, pods)) < shape.need:
            pods = source.settle(shape.need)  # its result is read from the pods
        started = started or shape.started(pods)
        ran = ran or shape.ran(pods)
        why = shape.why(pods, started, why)
        now = ctx.clock.now()
        if not ran:
            fault.see(pods, now)
            if shape.ask_events(pods, started) and polls % EVENTS_EVERY == 0:  # no pod after a while: refused?
                source.refused(fault, now)
        if ran and shape.decided_by_run:
            return Outcome(read(cond or {}, pods))
        if gone:
            return Outcome(source.gone(node, now))
        if cond is not None:
            deadline = cond.get("reason") == DEADLINE
            if deadline and fault.code and not ran:
                return Outcome(fault.result(node, now))
            if why and (shape.rendezvous or deadline and not started):
                return Outcome(inconclusive=shape.never_scheduled(ctx, why))
            if deadline and not started:
                return Outcome(inconclusive=shape.never_started(ctx))
            if deadline:
                return Outcome(hung_result(node, now, timeout) if ran else fault.never_ran(node, now, pods))
            return Outcome(read(cond, pods))
        elapsed = now - start
        if fault.code and not ran and now - fault.since > min(TOOL_FAULT_GRACE, timeout * 0.5):
            return Outcome(fault.result(node, now))
        if ctx.cancelled():
            return Outcome(inconclusive=f"the sweep was stopped before {shape.what} finished")
        if arbiter is not None:
            pending = source.demand(polls)
            freed = next((w for w in (arbiter.abort(n, pending, ctx.config, now) for n in shape.nodes) if w), "")
            if freed:
                return Outcome(inconclusive=f"aborted to make room for pending GPU pod(s) ({freed})")
        schedule_deadline = min(SCHEDULE_TIMEOUT, timeout * 0.9)
        if why and elapsed > schedule_deadline:
            return Outcome(inconclusive=shape.never_scheduled(ctx, why))
        if elapsed > timeout + CLIENT_GRACE and not confirmed:
            # Past the deadline by what we have seen: read the Job once afresh before calling it
            # hung (a fault of the node), since a lagging stream or poll may not have it yet.
            confirmed = True
            if source.refresh():
                continue
        if elapsed > timeout + CLIENT_GRACE:
            return Outcome(hung_result(node, now, timeout) if ran else fault.result(node, now) if fault.code
                           else fault.never_ran(node, now, pods))
        # A watch wakes this wait on every change of the Job or its pods; the pause only bounds how
        # late a deadline, a stop or a pod that cannot land is noticed.
        pause = max(ctx.config.poll_interval, min(MAX_POLL, elapsed / 10))
        if why and elapsed < schedule_deadline:  # wake in time to give up on a pod that cannot land
            pause = max(ctx.config.poll_interval, min(pause, schedule_deadline - elapsed + 1))
        source.wait(pause)


class WatchSource:
    """A Job seen through the run's watch of its Jobs and pods (`sweeper.actions.jobwatch`)."""

    def __init__(self, ctx: ActionContext, watch: RunWatch, changed: threading.Event, namespace: str,
                 name: str) -> None:
        self.ctx, self.watch, self.changed, self.namespace, self.name = ctx, watch, changed, namespace, name

    def look(self) -> tuple[dict[str, Any] | None, Pods, bool]:
        self.changed.clear()  # before reading: a change from here on wakes the wait
        job, pods = self.watch.state(self.name)
        return job, pods, False  # not seen yet, or deleted: the deadline decides

    def condition(self, job: dict[str, Any]) -> dict[str, Any] | None:
        return job_condition(job)

    def settle(self, need: int) -> Pods:
        """The Job is finished but the pod watch has not yet brought its pods' last state (the two
        watches are separate streams): wait for it a moment, then list the pods once."""
        ctx = self.ctx
        until = ctx.clock.now() + POD_LAG
        while True:
            self.changed.clear()
            _, pods = self.watch.state(self.name)
            if sum(map(finished, pods)) >= need:
                return pods
            left = until - ctx.clock.now()
            if left <= 0 or ctx.cancelled():
                return list(ctx.kube.namespaced_pods(self.namespace, f"job-name={self.name}"))
            ctx.clock.wait(self.changed, left)

    def refused(self, fault: Fault, now: float) -> None:
        fault.see_events(self.ctx, self.namespace, self.name, now)

    def demand(self, polls: int) -> Pods:
        return self.watch.pending_pods(DEMAND_EVERY * self.ctx.config.poll_interval)

    def refresh(self) -> bool:
        self.watch.refresh(self.name)
        return True

    def gone(self, node: str, now: float) -> Result:
        raise AssertionError("a watched Job is never reported gone")

    def wait(self, pause: float) -> None:
        self.ctx.clock.wait(self.changed, pause)


class PollSource:
    """A Job read by polling, every `poll_interval` on the run's clock: `get` reads it (NotFound: gone),
    `pods` lists its pods, `condition` says when it is finished, `gone` words its loss, `refused`
    tells a Fault of the Job's FailedCreate Events (by default none are read: the pods say it)."""

    def __init__(self, ctx: ActionContext, get: Callable[[], dict[str, Any]], pods: Callable[[], Pods],
                 condition: Callable[[dict[str, Any]], dict[str, Any] | None], gone: Callable[[str, float], Result],
                 refused: Callable[[Fault, float], None] = lambda fault, now: None) -> None:
        self.ctx, self._get, self._pods, self._condition, self._gone = ctx, get, pods, condition, gone
        self.refused = refused

    def look(self) -> tuple[dict[str, Any] | None, Pods, bool]:
        try:
            job: dict[str, Any] | None = self._get()
        except NotFound:
            job = None  # deleted under the run (by a person, or its TTL)
        return job, self._pods(), job is None

    def condition(self, job: dict[str, Any]) -> dict[str, Any] | None:
        return self._condition(job)

    def settle(self, need: int) -> Pods:
        return self._pods()

    def demand(self, polls: int) -> Pods:
        return self.ctx.kube.pending_pods() if polls % DEMAND_EVERY == 0 else []  # type: ignore[no-any-return]

    def refresh(self) -> bool:
        return False

    def gone(self, node: str, now: float) -> Result:
        return self._gone(node, now)

    def wait(self, pause: float) -> None:
        self.ctx.clock.sleep(self.ctx.config.poll_interval)


def watch_for(ctx: ActionContext, namespace: str) -> tuple[RunWatch, bool]:
    """The run's shared watch of its Jobs, or one of this task's own (`sweeper run`, or a Job in
    another namespace); True when it is this task's own, to close."""
    shared = ctx.jobwatch
    if shared is not None and shared.namespace == namespace:
        return shared, False
    return RunWatch(ctx.kube, namespace, f"{ctx.config.prefix}/run-id={ctx.run_id}", ctx.clock,
                    ctx.config.poll_interval, log=ctx.log), True


@contextmanager
def watched(ctx: ActionContext, namespace: str, name: str) -> Iterator[WatchSource]:
    """Job `name` as the run's watch sees it, followed from before its create (no change of it can
    be missed) until the block ends."""
    watch, own = watch_for(ctx, namespace)
    changed = watch.changed(name)
    try:
        yield WatchSource(ctx, watch, changed, namespace, name)
    finally:
        watch.forget(name)
        if own:
            watch.close()


@contextmanager
def job_created(ctx: ActionContext, namespace: str, job: dict[str, Any]) -> Iterator[None]:
    """Create the Job, and delete it when the block ends, however it ends; each write is written
    to the intent log before and after it happens."""
    ref = f"{namespace}/{job['metadata']['name']}"
    ctx.intent("create-job", "before", ref)
    ctx.kube.create_job(namespace, job)
    ctx.intent("create-job", "after", ref)
    try:
        yield
    finally:
        ctx.intent("delete-job", "before", ref)
        ctx.kube.delete_job(namespace, job["metadata"]["name"])  # False, not NotFound, when it is gone already
        ctx.intent("delete-job", "after", ref)


def answer(ctx: ActionContext, name: str, outcome: Outcome, **extra: Any) -> dict[str, Any]:
    """The task's registered result: inconclusive (no result, `failed`), or the result, handed to
    the sweep (`on_result`), failed when it is `fail` or `error`. `extra`: what the caller adds."""
    if outcome.inconclusive:
        return {"changed": True, "failed": True, "status": "inconclusive", "msg": outcome.inconclusive, "job": name,
                **extra}
    result = outcome.result
    assert result is not None
    ctx.on_result(result)
    bad = [f"{c.name}: {c.message}" for c in result.failed_checks][:5]
    return ok(f"{result.status}" + (f": {'; '.join(bad)}" if bad else ""), changed=True, job=name,
              status=result.status, result=result.to_dict(), **extra) | {"failed": result.status in ("fail", "error")}
