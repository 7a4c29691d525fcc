"""Playing a playbook on a held node and reading its verdict: the variables a play sees, the
results and notes it records on the node's sweep row, and the verdict, reasons and decision it
leaves (`inconclusive` when stopped, `error` when it ended without one)."""

from __future__ import annotations

from typing import Any

from sweeper import profiles
from sweeper.actions import ActionContext
from sweeper.actions import node as node_actions
from sweeper.actions.decide import verdict_of_results
from sweeper.cohorts import label_facts
from sweeper.errors import KubeError, PlaybookError
from sweeper.fleet import NodeView
from sweeper.playbook.executor import Executor, TaskOutcome
from sweeper.playbook.model import Playbook
from sweeper.result import BOOT_TIME, Metric, Result, tool_cause
from sweeper.sweep.gates import dismissal
from sweeper.sweep.state import Run

PLAY_FAULTS = (PlaybookError, KubeError)  # what ends a play without a verdict of the node's


def play_fault(exc: Exception) -> tuple[str, list[str]]:
    """The verdict and reason of a play a PLAY_FAULTS exception ended: `error`, the tool's, never the node's."""
    if isinstance(exc, PlaybookError):
        return "error", [f"playbook error: {exc}"]
    return "error", [f"cluster error during checks: {exc}"]


def node_vars(node: NodeView, profile: profiles.Profile) -> dict[str, Any]:
    """What playbooks and job templates see as `node`; its profile with the fabric the node advertises."""
    return {"name": node.name, "labels": node.labels, "annotations": node.annotations, "gpus": node.gpus,
            "gpu_resources": node.gpu_vars(), "fabric": dict(node.fabric),
            "profile": profile.on_node(node.fabric, node.labels, node.annotations).as_vars()}


def play_vars(run: Run, node: NodeView, profile: profiles.Profile) -> dict[str, Any]:
    """A held node's `node` variables: node_vars plus what its history knows (dismissed findings,
    XIDs cleared, the driver version last seen)."""
    dismissed = (dismissal(run, node.name) or {}).get("keys", [])
    return {**node_vars(node, profile), "dismissed": dismissed,
            "xids_cleared": run.rec.xids_cleared(node.name), "driver_version": run.rec.driver_version(node.name)}


def context(run: Run, sweep_id: int, name: str, vars_: dict[str, Any], **kw: Any) -> ActionContext:
    """The actions' view of the run for one play on node `name` (its results on sweep row `sweep_id`)."""
    return ActionContext(
        config=run.cfg, clock=run.clock, kube=run.kube, node=vars_, run_id=run.id,
        on_result=lambda r: run.rec.result(sweep_id, r),
        intent=lambda op, phase, detail: run.rec.intent(run.id, name, run.clock.now(), op, phase, detail),
        log=lambda msg: run.log(name, msg), cancelled=run.cancelled,
        on_record=lambda kind, data: record(run, sweep_id, name, kind, data), past=run.rec,
        jobwatch=run.jobwatch, seen=run.seen.get(name, {}), **kw)


def extra_vars(run: Run, vars_: dict[str, Any], level: int | None = None) -> dict[str, Any]:
    """`level`: the DCGM level of the depth the node got (sweeper.sweep.depth), over the config's."""
    return {"node": vars_, "run_id": run.id, "check_timeout": run.cfg.check_timeout,
            "taint_key": run.cfg.taint_key, "prefix": run.cfg.prefix,
            "default_dcgm_level": level or run.cfg.dcgm_level_for(vars_)}


def on_task(run: Run, name: str) -> Any:
    def emit(o: TaskOutcome) -> None:
        run.emit("task", {"node": name, "task": o.name, "status": o.status, "msg": o.msg})
    return emit


def play(run: Run, sweep_id: int, node: NodeView, profile: profiles.Profile,
         playbook: Playbook | None = None, level: int | None = None) -> tuple[str, list[str], str, dict[str, Any] | None]:
    """Play `playbook` (the sweep's own by default) on a node; its verdict, reasons, what its
    `always` did with the node (`handed_back`) and its decision."""
    vars_ = play_vars(run, node, profile)
    run.rec.facts(sweep_id, node.name, run.clock.now(), label_facts(node.labels))  # the check's own readings follow
    ctx = context(run, sweep_id, node.name, vars_)
    registered: list[Result] = []  # what the play's checks reported: its verdict when no `decide` ran

    def on_result(r: Result) -> None:
        registered.append(r)
        result(run, sweep_id, node.name, r)
    ctx.on_result = on_result
    done = Executor(run.sweep.actions, ctx, on_task(run, node.name)).run(playbook or run.sweep.playbook,
                                                                         extra_vars(run, vars_, level))
    if done.vars.get("verdict") is None and registered and not done.cancelled:
        done.vars.update(verdict_of_results(ctx, registered))  # no `decide`: the findings' verdict
    verdict, reasons, decision = verdict_of(done, "the sweep was stopped before the checks finished")
    return verdict, reasons, str(done.vars.get("handed_back", "")), decision


def verdict_of(done: Any, stopped: str) -> tuple[str, list[str], dict[str, Any] | None]:
    """The verdict, reasons and decision a finished play left: `inconclusive` when it was
    stopped, `error` when it ended without a verdict (with no `decide` and no result registered)."""
    verdict = done.vars.get("verdict")
    if done.cancelled:
        return "inconclusive", [stopped], None
    if verdict is None:
        return "error", ["the playbook ended without a `decide` task" if not done.failed
                         else "the playbook failed before its verdict"], None
    decision = done.vars.get("decision")
    return str(verdict), [str(r) for r in done.vars.get("reasons", [])], \
        decision if isinstance(decision, dict) else None


def result(run: Run, sweep_id: int, node: str, r: Result) -> None:
    """Record a check's result; tally its failed checks, and a fault of the check itself."""
    run.rec.result(sweep_id, r)
    cause = tool_cause([c.to_dict() for c in r.checks])
    with run.mutex:
        run.checks.setdefault(node, []).extend({"name": c.name, "status": c.status, "message": c.message}
                                               for c in r.checks)
        run.boots.update((node, m.value) for m in r.metrics if m.name == BOOT_TIME)
        failed = run.sweep.failed_checks
        failed[node] = failed.get(node, 0) + sum(1 for c in r.checks if c.status == "fail")
        if cause:
            run.tool_faults.setdefault(node, cause)


def record(run: Run, sweep_id: int, node: str, kind: str, data: dict[str, Any]) -> None:
    """A playbook's `record` task: a metric on the sweep row, or a note."""
    if kind == "metric":
        run.rec.result(sweep_id, Result(node=node, source="playbook", started=run.clock.now(),
                                        finished=run.clock.now(), checks=(), status="pass",
                                        metrics=(Metric(data["name"], float(data["value"]), data["unit"],
                                                        data["gpu"]),)))
    else:
        run.rec.action(run.id, node, run.clock.now(), "note", f"{data['name']}: {data['message']}")


def event(run: Run, node: NodeView, reason: str, msg: str, kind: str) -> None:
    """An Event on the node; one that cannot be written is logged."""
    try:
        node_actions.node_event(run.kube, node.name, node.uid or node.name, reason, msg, kind, run.cfg.lock_name,
                                run.clock.now())
    except KubeError as exc:
        run.log(node.name, f"could not record an event: {exc}")
