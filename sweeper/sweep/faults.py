"""Faults of the check itself: a node whose sweep ended `error` because its check never ran
counts against the check, not the node; the same fault on tool_error_limit nodes (or on every
node a run swept) stops the run from taking more, and the next run tries one node first."""

from __future__ import annotations

from sweeper.actions.jobs import gpu_stack_words
from sweeper.clock import iso
from sweeper.errors import KubeError
from sweeper.notify import message
from sweeper.sweep.record import EVERY_PAIR_FAILED, RunReport
from sweeper.sweep.state import Run


def last_stop(run: Run) -> str:
    """Why the last run stopped taking nodes, if it did: this run then tries one node first."""
    last = run.rec.last_run()
    return str(((last or {}).get("summary") or {}).get("tool_stop") or "")


def count_tool_error(run: Run, node: str, verdict: str) -> None:
    """A node whose sweep ended `error` because its check never ran; the same cause on
    tool_error_limit nodes stops the run from taking more."""
    cause = run.tool_faults.get(node, "")
    if verdict != "error" or not cause or gpu_stack_words(cause):
        return  # a cause that names the node's GPU stack (driver, NVML, toolkit, CDI) is the node's
    with run.mutex:
        run.tool_errors[node] = cause
        same = sum(1 for c in run.tool_errors.values() if c == cause)
        if run.cfg.tool_error_limit > 0 and same >= run.cfg.tool_error_limit and not run.tool_stop:
            run.tool_stop = cause


def one_cause(run: Run, report: RunReport) -> str:
    """The fault of the check that ended every node this run swept, when there is one: no check
    could run anywhere (a RuntimeClass admission refused, an image that is not there), so the
    run stops as a tool fault however few nodes it took, never a quiet exit 0."""
    swept = [o.node for o in report.outcomes if o.verdict and o.action != "light"]
    causes = {run.tool_errors.get(n, "") for n in swept}
    if run.cfg.tool_error_limit == 0 or not swept or len(causes) != 1:
        return ""
    return causes.pop()


def stop_reason(run: Run, cause: str, probe: bool) -> str:
    if cause.startswith(EVERY_PAIR_FAILED):
        return f"run stopped: {cause}. Fix the pair check, then sweep again: the next run tries one pair first"
    if probe:
        return (f"run stopped: the last run stopped on a fault of the check and this run's first node ended "
                f"with one too ({cause}); no more nodes were taken. Fix the check, then sweep again")
    nodes = sorted(n for n, c in run.tool_errors.items() if c == cause)
    return (f"run stopped: the same fault of the check ended {len(nodes)} nodes ({cause}); no more nodes were "
            f"taken. It says nothing about the nodes ({', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''}), "
            "which were handed back. Fix the check, then sweep again: the next run tries one node first")


def announce_stop(run: Run, report: RunReport) -> None:
    """Say why the run stopped: its output, an Event on the lock's Lease, the webhook."""
    why, cfg, webhook = report.tool_stop, run.cfg, run.sweep.webhook
    run.emit("tool-stop", {"reason": why, "nodes": sorted(run.tool_errors)})
    run.rec.action(run.id, "-", run.clock.now(), "tool-stop", why[:1000])
    ts = iso(run.clock.now())
    try:
        run.kube.create_event(cfg.namespace, {
            "metadata": {"generateName": f"{cfg.lock_name}.", "namespace": cfg.namespace},
            "involvedObject": {"kind": "Lease", "namespace": cfg.namespace, "name": cfg.lock_name,
                               "apiVersion": "coordination.k8s.io/v1"},
            "reason": "SweepStoppedToolErrors", "message": why[:1024], "type": "Warning",
            "source": {"component": "sweeper"}, "reportingComponent": "sweeper", "reportingInstance": run.id,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1})
    except KubeError as exc:
        run.log("-", f"could not record an event: {exc}")
    if webhook:
        _, what = webhook.send(message(f"run {run.id}", "stopped", [why], f"{len(run.tool_errors)} tool errors"))
        run.rec.action(run.id, "-", run.clock.now(), "notify", what)
