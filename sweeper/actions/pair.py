"""`run_pair_job`: a two-node NCCL all-reduce and path-MTU probes between the play's node (A) and
its partner (B). Renders a headless Service and an Indexed Job of two pods (one per node, through
the scheduler), follows the Job with the one Job-following loop (sweeper.actions.follow) as
`run_job` does, reads both pods' logs, and always deletes the Job and the Service. An MPIJob
template runs in its own form (sweeper.actions.mpijob).

Kubernetes' pattern for pods of one Job that talk to each other (an Indexed Job whose pods get
stable names from a headless Service): https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sweeper.actions import ActionContext, Arg, action
from sweeper.actions.follow import PairShape, follow, job_created, watched
from sweeper.actions.jobs import (
    dra_of,
    ensure_claims,
    gpu_claims,
    image_vars,
    job_rules,
    load_rendered,
    refuse_unsafe,
    sweeper_tolerations,
    template_of,
)
from sweeper.actions.mpijob import (  # noqa: F401  (re-exported: their old home)
    MPI_JOB_NAME,
    MPI_ROLE,
    NO_OPERATOR,
    read_launcher,
    run_mpijob,
)
from sweeper.actions.pairspec import (  # noqa: F401  (re-exported: their old home)
    MPIJOB_API,
    _check_pair_job,
    _check_service,
    check_mpijob,
    mpijob_pods,
    pair_answer,
    pair_fabric,
    pair_floor,
)
from sweeper.actions.podstate import LOG_LIMIT, finished, log_cut, start_failure
from sweeper.actions.safety import protected
from sweeper.actions.structure import render_checked
from sweeper.clock import parse_duration
from sweeper.errors import KubeError, PlaybookError
from sweeper.parsers import pair as pair_parser
from sweeper.result import Result, tool_result

INDEX = "batch.kubernetes.io/job-completion-index"


def pair_job_name(node: str, partner: str, run_id: str, template: str) -> str:
    """`sweep-pair-<A>-<6 hex>`; short enough that `<name>-1` is a DNS label (63) for the pod's hostname."""
    digest = hashlib.sha1(f"{run_id}/{node}/{partner}/{template}".encode()).hexdigest()[:6]
    base = re.sub(r"[^a-z0-9-]", "-", node.lower())[:40].strip("-")
    return f"sweep-pair-{base}-{digest}"


def _hostname(node: dict[str, Any]) -> str:
    return str((node.get("labels") or {}).get("kubernetes.io/hostname", node.get("name", "")))


def pair_variables(ctx: ActionContext, template: str, timeout: float, extra: dict[str, Any]) -> dict[str, Any]:
    """What a pair template sees: run_job's variables, plus `partner`, `service_name`,
    `pair_affinity` and `fabric_resources`."""
    node, partner = ctx.node or {}, ctx.partner
    if not partner:
        raise PlaybookError("run_pair_job needs a partner node (a pair playbook, or sweeper run --partner)")
    a, b = str(node.get("name", "")), str(partner.get("name", ""))
    if a == b:
        raise PlaybookError(f"run_pair_job: the partner is the node itself ({a})")
    name = pair_job_name(a, b, ctx.run_id, template)
    dra, dra_partner = dra_of(ctx, node), dra_of(ctx, partner)
    if bool(dra) != bool(dra_partner):
        raise PlaybookError(f"run_pair_job: {a if dra else b} publishes its GPUs through DRA and "
                            f"{b if dra else a} through the device plugin; one pod template cannot claim both")
    claims = gpu_claims(dra)
    prefix = ctx.config.prefix
    labels = {"app.kubernetes.io/managed-by": "sweeper", "app.kubernetes.io/component": "pair",
              f"{prefix}/run-id": ctx.run_id, f"{prefix}/node": a, f"{prefix}/partner": b, f"{prefix}/pair": name}
    own = {
        "node": node, "partner": partner, "run_id": ctx.run_id, "job_name": name, "service_name": name,
        "namespace": ctx.config.check_namespace, "taint_key": ctx.config.taint_key,
        "prefix": prefix, "timeout": int(timeout), "ttl": int(ctx.config.job_ttl), "labels": labels,
        # One pod on each of the two nodes, through the scheduler: node affinity on both hostnames,
        # and a required anti-affinity against the other pod of this pair on the same hostname.
        # https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity
        "pair_affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                       "values": [_hostname(node), _hostname(partner)]}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {f"{prefix}/pair": name}},
                 "topologyKey": "kubernetes.io/hostname"}]}},
        "tolerations": sweeper_tolerations(ctx),
        # a device plugin node's GPUs as a resource request; a DRA node's through Sweeper's claim, one
        # claim for each pod from the template, so each pod holds every GPU of the node it lands on
        "all_gpus": {} if claims else {"nvidia.com/gpu": str(node.get("gpus", 0))}, "gpu_claims": claims,
        "fabric_resources": pair_fabric(node, partner),
        "priority_class": ctx.config.check_priority_class,
        "platform": ctx.config.platform_name, "runtime_class": ctx.config.runtime_class_name,
        **image_vars(ctx)}
    protected(extra, own, "run_pair_job")
    return {**extra, **own}  # Sweeper's values last: nothing a playbook passes replaces them


def render_pair(ctx: ActionContext, template: str, timeout: float,
                extra: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
    """The template's Service and its Job, or its one MPIJob (no Service: the operator makes the
    workers' own), checked; and the variables they saw."""
    found = template_of(ctx, template)
    path = found.path
    variables = pair_variables(ctx, template, timeout, extra)
    docs = load_rendered(render_checked(found, variables), path, many=True)
    kinds = [d.get("kind") if isinstance(d, dict) else None for d in docs]
    # Sweeper's own values, not the variables: the workers go to the two held nodes, the launcher
    # (no GPU) to either of them.
    own = variables["pair_affinity"]  # Sweeper's: `protected` kept the playbook's vars off it
    rules = dataclasses.replace(job_rules(ctx, found, (own, {"nodeAffinity": own["nodeAffinity"]}), remediation=False,
                                          claims=tuple(variables["gpu_claims"])), pods=2)
    if kinds == ["MPIJob"]:
        check_mpijob(docs[0], variables, path)
        refuse_unsafe(docs, rules, path)
        if variables["gpu_claims"]:
            ensure_claims(ctx, dra_of(ctx))
        return None, docs[0], variables
    if len(docs) != 2 or kinds[0] != "Service" or kinds[1] != "Job":
        raise PlaybookError(f"{path}: a pair template renders two documents, a Service then a Job, or one MPIJob; "
                            f"got {kinds}")
    service, job = docs
    _check_service(service, variables, path)
    _check_pair_job(job, variables, path)
    refuse_unsafe(docs, rules, path)
    if variables["gpu_claims"]:
        ensure_claims(ctx, dra_of(ctx))
    return service, job, variables


@action("run_pair_job",
        Arg("template", str, default="nccl-pair.yaml.j2", help="a template's name, found as run_job finds it (a Service and an "
            "Indexed Job of two pods)"),
        Arg("timeout", (int, float, str), default="30m", help="activeDeadlineSeconds, and the client deadline"),
        Arg("vars", dict, default=None, help="extra variables for the template"),
        Arg("parser_args", dict, default=None,
            help="min_busbw (GB/s at the largest message), mtu, ifaces; by default the profile's "
                 "nccl_pair_busbw_min, mtu and fabric_ifaces"),
        Arg("abortable", bool, default=True,
            help="may be stopped to make room for pending GPU work (with abort_on_demand); the result is inconclusive"),
        help="Run a two-node NCCL all-reduce and path-MTU probes between the node and its partner (a Service and "
             "an Indexed Job, one pod on each node with all its GPUs and fabric devices), wait for it, read both "
             "pods' logs, and delete both.", needs_node=True)
def run_pair_job(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    if ctx.kube is None or ctx.node is None:
        raise PlaybookError("run_pair_job needs a cluster and a target node (--node)")
    timeout = parse_duration(args["timeout"])
    service, job, _ = render_pair(ctx, args["template"], timeout, args["vars"] or {})
    if service is None:
        return run_mpijob(ctx, args, job, timeout)
    namespace = ctx.config.check_namespace  # the rendered Job's own, which the safety check holds to this
    name = job["metadata"]["name"]
    a = str((ctx.node or {}).get("name", ""))
    b = str((ctx.partner or {}).get("name", ""))

    def result(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        return read_pair(ctx, namespace, pods, a, b, args["parser_args"] or {})

    with watched(ctx, namespace, name) as source, service_created(ctx, namespace, service), \
            job_created(ctx, namespace, job):
        outcome = follow(ctx, source, PairShape(a, b), timeout, args["abortable"], result)
    return pair_answer(ctx, name, outcome)


@contextmanager
def service_created(ctx: ActionContext, namespace: str, service: dict[str, Any]) -> Iterator[None]:
    """Create the pair's Service, and delete it when the block ends, however it ends (a create that
    failed included); each write in the intent log before and after."""
    ref = f"{namespace}/{service['metadata']['name']}"
    ctx.intent("create-service", "before", ref)
    try:
        ctx.kube.create_service(namespace, service)
        ctx.intent("create-service", "after", ref)
        yield
    finally:
        ctx.intent("delete-service", "before", ref)
        ctx.kube.delete_service(namespace, service["metadata"]["name"])
        ctx.intent("delete-service", "after", ref)


def _index(pod: dict[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(INDEX) or (meta.get("labels") or {}).get(INDEX)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def read_pair(ctx: ActionContext, namespace: str, pods: list[dict[str, Any]], a: str, b: str,
              parser_args: dict[str, Any]) -> Result:
    """Both pods' logs and exit codes, by completion index, read as one pair result."""
    now = ctx.clock.now()
    by_index: dict[int, dict[str, Any]] = {}
    for p in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or ""):
        i = _index(p)
        if i in (0, 1) and finished(p):
            by_index[i] = p
    logs: list[str] = ["", ""]
    codes: list[int | None] = [None, None]
    for i, pod in sorted(by_index.items()):
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
        codes[i] = term.get("exitCode")
        try:
            logs[i] = ctx.kube.pod_log(namespace, pod["metadata"]["name"], limit_bytes=LOG_LIMIT)
        except KubeError as exc:
            ctx.log(f"cannot read the log of {pod['metadata']['name']}: {exc}")
            logs[i] = term.get("message") or ""
        # The GPU stack of the node this pod ran on: a finding, which re-pairing pins on it.
        failure = start_failure(a, now, statuses, (logs[i].strip().splitlines() or [""])[-1],
                                "the pair container could not start", on=str((pod.get("spec") or {}).get("nodeName") or "")) \
            or log_cut(a, now, logs[i])
        if failure is not None:
            return failure
    if not by_index:
        return tool_result(a, now, "NoPods", "the pair Job finished but none of its pods is left to read")
    node = ctx.node or {}
    profile = node.get("profile") or {}
    floor, no_floor = pair_floor(ctx, parser_args)
    mtu = parser_args.get("mtu", profile.get("mtu"))
    ifaces = parser_args.get("ifaces", profile.get("fabric_ifaces") or [])
    if isinstance(ifaces, str):
        ifaces = ifaces.split()
    if mtu in (None, ""):
        ifaces = []  # no MTU to probe for: pair-allreduce probes nothing, and nothing is expected
    return pair_parser.parse(logs, a, now, partner=b, min_busbw=floor, no_floor=no_floor,
                             mtu=None if mtu in (None, "") else int(mtu), ifaces=list(ifaces), exit_codes=codes)
