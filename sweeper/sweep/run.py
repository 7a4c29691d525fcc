"""The run: take the sweep lock, fence every write of the run with it, reconcile the runs that
died, discover and plan, roll the queue, and record the run (its row, its report, why it stopped
taking nodes). `Sweep` is the long-lived object the CLI, `serve` and the tests hold; each of its
runs keeps its own state in a `Run`."""

from __future__ import annotations

from typing import Any, cast

from sweeper.actions.jobwatch import RunWatch
from sweeper.errors import LockLost
from sweeper.fleet import Gates, Plan
from sweeper.lock import SweepLock
from sweeper.platforms import Found
from sweeper.sweep import depth, faults, gates, play, queue
from sweeper.sweep.reconcile import reconcile
from sweeper.sweep.record import FencedRecorder, NodeOutcome, Recorder, RunReport, new_run_id
from sweeper.sweep.state import Run, SweepBase


class Sweep(SweepBase):
    """One rolling pass a call of `run()`, against one cluster and one history."""

    _node_vars = staticmethod(play.node_vars)  # what playbooks see as `node` (sweeper.runner builds on it)

    def run(self) -> RunReport:
        """One pass. While it holds the lock, every write of the run, to the cluster and to the
        history, is fenced by it: a run that lost the lock stops and raises LockLost."""
        self.remediator.preflight()  # a provider that cannot act stops the run before it takes a node
        start = self.clock.now()
        requests_before = self.kube.requests
        run_id = new_run_id(start)
        kube, rec, controls_kube = self.kube, self.rec, self.controls.kube
        run = Run(self, run_id, start)
        if not self.dry_run:
            lock = run.lock = SweepLock(kube, self.cfg.namespace, self.cfg.lock_name, run_id, self.cfg.lock_ttl,
                                        self.clock)
            lock.acquire()  # LockHeld: another sweep is running
            run.kube = self.remediator.kube = kube.fenced(lock.fence)
            self.controls.kube = controls_kube.fenced(lock.fence)  # the switches it writes are fenced too
            run.rec = cast(Recorder, FencedRecorder(rec, lock.fence))
        self.remediator.cancelled = run.cancelled
        # The run's check Jobs and their pods, listed once and then watched, for every run_job of the run.
        run.jobwatch = RunWatch(run.kube, self.cfg.check_namespace, f"{self.cfg.prefix}/run-id={run_id}", self.clock,
                                self.cfg.poll_interval, log=lambda m: run.log("-", m))
        try:
            return self._run(run, requests_before, rec)
        finally:
            run.jobwatch.close()
            run.jobwatch = None
            run.seen.clear()
            self.remediator.kube = kube
            self.remediator.cancelled = self.stop.is_set
            self.controls.kube = controls_kube
            if run.lock is not None:
                run.lock.release()

    def _run(self, run: Run, requests_before: int, own: Recorder) -> RunReport:
        """`own`: the history unfenced, for the run's own row (a fenced run says so there)."""
        run.rec.run_started(run.id, run.start, "dry-run" if self.dry_run else self.mode)
        status = "done"
        report = RunReport(run.id, run.start, run.start, Plan(), dry_run=self.dry_run)
        try:
            self.controls.refresh()
            if not self.dry_run:
                gates.see_controls(run)
                report.reconciled = reconcile(run)
            p = report.plan = gates.discover(run)
            self.emit("plan", {"run_id": run.id, "take": [d.node.name for d in p.take], "gpu_nodes": p.gpu_nodes,
                               "held": p.held, "budget": p.budget,
                               "recheck": [d.node.name for d in p.take if d.reason == "recheck"],
                               "gate": [f"{d.node.name} ({d.reason})" for d in p.gate if d.take]})
            if self.dry_run:
                for d in p.take:
                    run.rec.action(run.id, d.node.name, self.clock.now(), "would-sweep", d.detail, dry_run=True)
                    report.outcomes.append(NodeOutcome(d.node.name, "", [d.detail], "would-take"))
                for d in [d for d in p.gate if d.take]:
                    run.rec.action(run.id, d.node.name, self.clock.now(), "would-gate", d.detail, dry_run=True)
                    report.outcomes.append(NodeOutcome(d.node.name, "", [d.detail], "would-gate"))
            else:
                self._roll(run, report)
        except LockLost as exc:
            status = "fenced"
            self.emit("fenced", {"run_id": run.id, "msg": str(exc)})
            raise
        except BaseException:
            status = "failed"
            raise
        finally:
            report.finished = self.clock.now()
            report.api_requests = run.kube.requests - requests_before
            taken = sum(1 for o in report.outcomes if o.action in ("released", "held"))
            own.run_finished(run.id, report.finished, status, taken, report.to_dict())
        return report

    def _roll(self, run: Run, report: RunReport) -> None:
        """Roll the queue, then say whether and why the run stopped taking nodes: a fault of the
        check that repeated (or ended every node swept) stops this run and makes the next probe first."""
        probe_failed = queue.roll(run, report)
        run.tool_stop = run.tool_stop or faults.one_cause(run, report)
        if report.outcomes:
            gates.trip_breaker(run, report.plan.gpu_nodes)
        report.tool_errors = dict(run.tool_errors)
        if run.tool_stop:
            report.tool_stop = faults.stop_reason(run, run.tool_stop, probe_failed)
            faults.announce_stop(run, report)
        elif run.probe_waits:  # the stop stands until a node that is not a suspect passes
            report.tool_stop = faults.last_stop(run)

    # -- looks at the cluster outside a run (`sweeper plan`, `serve`, the metrics) -------------
    def _outside(self) -> Run:
        return Run(self, "", self.clock.now())

    def discover(self, refill: bool = False) -> Plan:
        """The plan a run would start from now (its marks of suspects included, unless dry)."""
        return gates.discover(self._outside(), refill)

    def resolve_platform(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Found | None:
        """Settle `platform: auto` from these nodes and pods; `cfg` is then the settled config."""
        return gates.resolve_platform(self._outside(), nodes, pods)

    def gates(self) -> Gates:
        return gates.gates(self._outside())

    def depth(self, view: Any, now: float, cache: dict[str, Any]) -> Any:
        """The depth a run would give node `view` now (sweeper.window.Choice)."""
        return depth.choose(self.rec, self.cfg, self.rungs, view, now, cache)

    def partners(self, p: Plan) -> dict[str, str]:
        """For a pair playbook: the pairs a run would take first from plan `p` (each node to its partner)."""
        return queue.partners(self._outside(), p)

    def observe(self, metrics: Any, report: RunReport, mode: str = "sweep") -> None:
        """Feed a finished run into the Prometheus metrics."""
        found = self.gates()
        metrics.observe_run(report, mode, api_errors=getattr(self.kube, "errors", 0), breaker_open=bool(found.breaker),
                            paused=bool(found.paused), failed_checks=self.failed_checks, remedies=self.remedies,
                            tool_errors=report.tool_errors, tool_stop=bool(report.tool_stop))
