"""The MPIJob form of a pair (`run_pair_job` with an MPIJob template): create the MPIJob, follow it
and its pods by polling with the one Job-following loop (sweeper.actions.follow), read the launcher's
log as the pair's result, and always delete it."""

from __future__ import annotations

import dataclasses
from typing import Any

from sweeper.actions import ActionContext
from sweeper.actions.follow import MPIShape, Outcome, PollSource, follow
from sweeper.actions.pairspec import pair_answer, pair_floor
from sweeper.actions.podstate import LOG_LIMIT, finished, log_cut, start_failure
from sweeper.errors import KubeError, NotServed
from sweeper.parsers import pair as pair_parser
from sweeper.result import CheckResult, Result, tool_result

# -- the MPIJob form ----------------------------------------------------------------------------------
# The MPI Operator (https://github.com/kubeflow/mpi-operator, v2beta1) makes, for an MPIJob <name>,
# worker pods <name>-worker-<i> and a launcher Job <name>-launcher, their pods labelled
# training.kubeflow.org/job-name and job-role; it reports the MPIJob's conditions Created, Running,
# Succeeded and Failed (with the launcher Job's reason: DeadlineExceeded, BackoffLimitExceeded), and
# deleting the MPIJob deletes what it made. A cluster without the operator's CRD answers 404 on the
# mpijobs resource itself.
MPI_JOB_NAME = "training.kubeflow.org/job-name"
MPI_ROLE = "training.kubeflow.org/job-role"
NO_OPERATOR = ("the MPI Operator is not installed: this cluster does not serve kubeflow.org/v2beta1 mpijobs "
               "(install github.com/kubeflow/mpi-operator, or run the pair with nccl-pair.yaml.j2)")


def run_mpijob(ctx: ActionContext, args: dict[str, Any], job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Create the MPIJob, follow its conditions by polling, read the launcher's log, and always delete it."""
    assert ctx.kube is not None
    kube = ctx.kube
    namespace = ctx.config.check_namespace  # the rendered MPIJob's own, which the safety check holds to this
    name = job["metadata"]["name"]
    a = str((ctx.node or {}).get("name", ""))
    b = str((ctx.partner or {}).get("name", ""))

    def read(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        launchers = [p for p in pods if _role(p) == "launcher"]
        return read_launcher(ctx, namespace, launchers, a, b, args["parser_args"] or {}, cond)

    source = PollSource(
        ctx, lambda: kube.get_mpijob(namespace, name),  # type: ignore[no-any-return]
        lambda: kube.namespaced_pods(namespace, f"{MPI_JOB_NAME}={name}"),  # type: ignore[no-any-return]
        _finished_condition,
        lambda node, now: tool_result(node, now, "MPIJobGone", f"the MPIJob {namespace}/{name} was deleted before "
                                      "it finished"))
    ctx.intent("create-mpijob", "before", f"{namespace}/{name}")
    try:
        try:
            kube.create_mpijob(namespace, job)
        except NotServed as exc:
            outcome = Outcome(tool_result(a, ctx.clock.now(), "NoMPIOperator", NO_OPERATOR, str(exc)))
        else:
            ctx.intent("create-mpijob", "after", f"{namespace}/{name}")
            outcome = follow(ctx, source, MPIShape(a, b, role=_role), timeout, args["abortable"], read)
    finally:
        ctx.intent("delete-mpijob", "before", f"{namespace}/{name}")
        try:
            kube.delete_mpijob(namespace, name)
        finally:
            ctx.intent("delete-mpijob", "after", f"{namespace}/{name}")
    return pair_answer(ctx, name, outcome)


def _role(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(MPI_ROLE, ""))


def _finished_condition(mpijob: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (mpijob.get("status") or {}).get("conditions") or []
                 if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"), None)


def read_launcher(ctx: ActionContext, namespace: str, launchers: list[dict[str, Any]], a: str, b: str,
                  parser_args: dict[str, Any], cond: dict[str, Any]) -> Result:
    """The launcher pod's log (mpirun's output: rank 0's table) read as the pair's result. The
    MPIJob form runs no path-MTU probe: `pair.mtu` says so as `skip` rather than pass."""
    now = ctx.clock.now()
    done = [p for p in launchers if finished(p)]
    if not done:
        return tool_result(a, now, "NoPods", f"the MPIJob {cond.get('type', '').lower()} ({cond.get('reason', '')}) "
                           "but its launcher pod is not left to read", str(cond.get("message") or ""))
    pod = max(done, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    code = term.get("exitCode")
    try:
        log = ctx.kube.pod_log(namespace, pod["metadata"]["name"], limit_bytes=LOG_LIMIT)
    except KubeError as exc:
        ctx.log(f"cannot read the log of {pod['metadata']['name']}: {exc}")
        log = term.get("message") or ""
    # The launcher runs only mpirun, with no GPU: its start is never the node's GPU stack's to fail.
    failure = start_failure(a, now, statuses, (log.strip().splitlines() or [""])[-1],
                            "the launcher container could not start", gpu_stack=False) or log_cut(a, now, log)
    if failure is not None:
        return failure
    floor, no_floor = pair_floor(ctx, parser_args)
    result = pair_parser.parse([log, ""], a, now, partner=b, min_busbw=floor, no_floor=no_floor,
                               mtu=None, ifaces=[], exit_codes=[code, None])
    skip = CheckResult("pair.mtu", "skip", "no path-MTU probe in the MPIJob form (nccl-pair.yaml.j2 runs them)")
    # mpirun relays both ranks' output into the one launcher log: no finding here is one rank's own,
    # so none names a host, and each stays the pair's (docs/security.md).
    own = tuple(dataclasses.replace(c, host=None) for c in result.checks)
    return dataclasses.replace(result, checks=(*own, skip), status="")
