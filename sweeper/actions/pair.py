"""`run_pair_job`: a two-node NCCL all-reduce and path-MTU probes between the play's node (A) and
its partner (B). Renders a headless Service and an Indexed Job of two pods (one per node, through
the scheduler), follows the Job with the run's watch as `run_job` does, reads both pods' logs, and
always deletes the Job and the Service.

Kubernetes' pattern for pods of one Job that talk to each other (an Indexed Job whose pods get
stable names from a headless Service): https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from pathlib import Path
from typing import Any

from sweeper.actions import ActionContext, Arg, action, ok
from sweeper.actions.jobs import (
    CLIENT_GRACE,
    DEMAND_EVERY,
    MAX_POLL,
    POD_LAG,
    SCHEDULE_TIMEOUT,
    TOOL_EXIT,
    TOOL_FAULT_GRACE,
    _condition,
    _container_ran,
    _Fault,
    _finished,
    _hung,
    _never_ran,
    _node_gone,
    _unscheduled,
    _watch_for,
    gpu_stack_words,
    image_vars,
    job_rules,
    load_rendered,
    refuse_unsafe,
    runtime_result,
    sweeper_tolerations,
    template_of,
)
from sweeper.actions.jobwatch import RunWatch
from sweeper.actions.safety import protected
from sweeper.clock import parse_duration
from sweeper.errors import KubeError, NotFound, NotServed, PlaybookError
from sweeper.fleet import pending_gpu_pods
from sweeper.parsers import pair as pair_parser
from sweeper.result import CheckResult, Result, tool_result
from sweeper.templating import render_template

INDEX = "batch.kubernetes.io/job-completion-index"
MPIJOB_API = "kubeflow.org/v2beta1"


def pair_job_name(node: str, partner: str, run_id: str, template: str) -> str:
    """`sweep-pair-<A>-<6 hex>`; short enough that `<name>-1` is a DNS label (63) for the pod's hostname."""
    digest = hashlib.sha1(f"{run_id}/{node}/{partner}/{template}".encode()).hexdigest()[:6]
    base = re.sub(r"[^a-z0-9-]", "-", node.lower())[:40].strip("-")
    return f"sweep-pair-{base}-{digest}"


def _hostname(node: dict[str, Any]) -> str:
    return str((node.get("labels") or {}).get("kubernetes.io/hostname", node.get("name", "")))


def pair_fabric(node: dict[str, Any], partner: dict[str, Any]) -> dict[str, int]:
    """The fabric devices each pod of a pair requests: those both nodes' profiles name, as many as
    the one with fewer advertises (its profile is read against the node: profiles.Profile.on_node)."""
    mine = dict((node.get("profile") or {}).get("fabric_resources") or {})
    theirs = dict((partner.get("profile") or {}).get("fabric_resources") or {})
    return {k: min(int(v), int(theirs[k])) for k, v in mine.items() if k in theirs and min(int(v), int(theirs[k])) > 0}


def pair_floor(ctx: ActionContext, parser_args: dict[str, Any]) -> tuple[float | None, str]:
    """The bus bandwidth floor of this pair, and why there is none: a floor is a figure of the
    platform's fast transport (EFA, InfiniBand, GPUDirect-TCPX), which NCCL reaches only through the
    fabric devices the pods request; a pair that requests none runs on the primary interface's TCP
    (a few GB/s), and a floor would fail every such pair on nodes that are fine. An explicit
    `parser_args.min_busbw` is taken as given."""
    if parser_args.get("min_busbw") not in (None, ""):
        return float(parser_args["min_busbw"]), ""
    node = ctx.node or {}
    floor = (node.get("profile") or {}).get("nccl_pair_busbw_min")
    if floor in (None, ""):
        return None, "no floor for this profile (nccl_pair_busbw_min)"
    if not pair_fabric(node, ctx.partner or {}):
        return None, ("no floor: the pair requests no fabric device (the profile names none, or a node advertises "
                      "none), so NCCL cannot use the platform's fast transport")
    return float(floor), ""


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
        "all_gpus": {"nvidia.com/gpu": str(node.get("gpus", 0))},
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
    docs = load_rendered(render_template(found, variables), path, many=True)
    kinds = [d.get("kind") if isinstance(d, dict) else None for d in docs]
    # Sweeper's own values, not the variables: the workers go to the two held nodes, the launcher
    # (no GPU) to either of them.
    own = variables["pair_affinity"]  # Sweeper's: `protected` kept the playbook's vars off it
    rules = dataclasses.replace(job_rules(ctx, found, (own, {"nodeAffinity": own["nodeAffinity"]}), remediation=False),
                                pods=2)
    if kinds == ["MPIJob"]:
        check_mpijob(docs[0], variables, path)
        refuse_unsafe(docs, rules, path)
        return None, docs[0], variables
    if len(docs) != 2 or kinds[0] != "Service" or kinds[1] != "Job":
        raise PlaybookError(f"{path}: a pair template renders two documents, a Service then a Job, or one MPIJob; "
                            f"got {kinds}")
    service, job = docs
    _check_service(service, variables, path)
    _check_pair_job(job, variables, path)
    refuse_unsafe(docs, rules, path)
    return service, job, variables


def _check_service(svc: dict[str, Any], variables: dict[str, Any], path: Path) -> None:
    meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
    if meta.get("name") != variables["service_name"]:
        raise PlaybookError(f"{path}: the Service must be named {{{{ service_name | tojson }}}}")
    if spec.get("clusterIP") != "None":
        raise PlaybookError(f"{path}: the Service must be headless (clusterIP: None): its pods' names are what it is for")


def _pod_problems(pod: dict[str, Any], variables: dict[str, Any], what: str) -> str:
    """Why a pair pod would not be safe: it must go through the scheduler to one of the two held nodes
    with all their GPUs and fabric devices, and only there."""
    if "nodeName" in pod:
        return f"{what}: nodeName bypasses taints and GPU accounting; use affinity: {{{{ pair_affinity | tojson }}}}"
    if pod.get("affinity") != variables["pair_affinity"]:
        return f"{what}: the pod must carry Sweeper's pair affinity: affinity: {{{{ pair_affinity | tojson }}}}"
    if not any(t.get("key") == variables["taint_key"] for t in pod.get("tolerations") or []):
        return f"{what}: the pod must tolerate {variables['taint_key']}"
    wanted = {**variables["all_gpus"], **{k: str(v) for k, v in variables["fabric_resources"].items()}}
    containers = pod.get("containers") or []
    got: dict[str, str] = {}
    for c in containers:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            got[k] = str(v)
    missing = [f"{k}: {v}" for k, v in sorted(wanted.items()) if got.get(k) != v]
    if missing:
        return (f"{what}: each pod must request all of its node's GPUs and the profile's fabric devices "
                f"({', '.join(missing)}); use all_gpus and fabric_resources")
    return ""


def _check_pair_job(job: dict[str, Any], variables: dict[str, Any], path: Path) -> None:
    spec = job.get("spec") or {}
    if (job.get("metadata") or {}).get("name") != variables["job_name"]:
        raise PlaybookError(f"{path}: the Job must be named {{{{ job_name | tojson }}}}")
    if spec.get("completionMode") != "Indexed" or spec.get("completions") != 2 or spec.get("parallelism") != 2:
        raise PlaybookError(f"{path}: the pair Job must be Indexed with completions: 2 and parallelism: 2")
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    if pod.get("subdomain") != variables["service_name"]:
        raise PlaybookError(f"{path}: the pods' subdomain must be the Service: subdomain: {{{{ service_name | tojson }}}}")
    labels = (template.get("metadata") or {}).get("labels") or {}
    key = f"{variables['prefix']}/pair"
    if labels.get(key) != variables["job_name"]:
        raise PlaybookError(f"{path}: the pods must carry the label {key} (labels: {{{{ labels | tojson }}}}), "
                            "which the pair's anti-affinity and Service select")
    problem = _pod_problems(pod, variables, "the Job's pods")
    if problem:
        raise PlaybookError(f"{path}: {problem}")


def check_mpijob(job: dict[str, Any], variables: dict[str, Any], path: Path) -> None:
    """The MPI Operator's MPIJob, v2beta1: a Launcher (1 replica) and Workers (2, one per node, each
    with the GPUs and fabric devices), `slotsPerWorker` ranks per worker, `sshAuthMountPath`.
    https://github.com/kubeflow/mpi-operator (pkg/apis/kubeflow/v2beta1/types.go)"""
    if job.get("apiVersion") != MPIJOB_API:
        raise PlaybookError(f"{path}: an MPIJob must be {MPIJOB_API}")
    spec = job.get("spec") or {}
    unknown = set(spec) - {"slotsPerWorker", "runPolicy", "mpiReplicaSpecs", "sshAuthMountPath", "launcherCreationPolicy",
                           "mpiImplementation", "runLauncherAsWorker"}
    if unknown:
        raise PlaybookError(f"{path}: MPIJob spec: unknown field(s) {sorted(unknown)}")
    if not isinstance(spec.get("slotsPerWorker"), int) or spec["slotsPerWorker"] < 1:
        raise PlaybookError(f"{path}: MPIJob spec.slotsPerWorker must be a positive integer (ranks per worker)")
    replicas = spec.get("mpiReplicaSpecs") or {}
    if set(replicas) != {"Launcher", "Worker"}:
        raise PlaybookError(f"{path}: MPIJob spec.mpiReplicaSpecs must hold Launcher and Worker, got {sorted(replicas)}")
    if (replicas["Launcher"] or {}).get("replicas", 1) != 1 or (replicas["Worker"] or {}).get("replicas") != 2:
        raise PlaybookError(f"{path}: an MPIJob pair has one Launcher and two Workers")
    for role in ("Launcher", "Worker"):
        template = (replicas[role] or {}).get("template") or {}
        pod = template.get("spec") or {}
        if "nodeName" in pod:
            raise PlaybookError(f"{path}: MPIJob {role}: nodeName bypasses taints and GPU accounting")
        if not any(t.get("key") == variables["taint_key"] for t in pod.get("tolerations") or []):
            raise PlaybookError(f"{path}: MPIJob {role}: the pod must tolerate {variables['taint_key']}")
    worker = ((replicas["Worker"] or {}).get("template") or {})
    problem = _pod_problems(worker.get("spec") or {}, variables, "MPIJob Worker")
    if problem:
        raise PlaybookError(f"{path}: {problem}")
    key = f"{variables['prefix']}/pair"
    if ((worker.get("metadata") or {}).get("labels") or {}).get(key) != variables["job_name"]:
        raise PlaybookError(f"{path}: MPIJob Worker: the pods must carry the label {key} "
                            "(labels: {{ labels | tojson }}), which the pair's anti-affinity selects")
    if not ((job.get("metadata") or {}).get("labels") or {}).get(f"{variables['prefix']}/run-id"):
        raise PlaybookError(f"{path}: the MPIJob must carry Sweeper's labels (labels: {{{{ labels | tojson }}}}): "
                            "the next run's reconcile finds a dead run's MPIJob by them")
    launcher = (((replicas["Launcher"] or {}).get("template") or {}).get("spec") or {})
    gpu = sorted({k for c in launcher.get("containers") or [] for part in ("requests", "limits")
                  for k in ((c.get("resources") or {}).get(part) or {}) if k in variables["all_gpus"]
                  or k in variables["fabric_resources"]})
    if gpu:
        raise PlaybookError(f"{path}: MPIJob Launcher: the launcher only runs mpirun; it must request no GPU or "
                            f"fabric device ({', '.join(gpu)}), which belong to the Workers")


def mpijob_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The MPIJob's pod templates as Pods (Launcher then Worker), for the Kubernetes schema."""
    out = []
    for role in ("Launcher", "Worker"):
        template = ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).get(role, {}).get("template") or {}
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}",
                                 **(template.get("metadata") or {})},
                    "spec": template.get("spec") or {}})
    return out


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
    watch, own = _watch_for(ctx, namespace)
    changed = watch.changed(name)  # before the create: no change of the Job can be missed
    try:
        return _follow(ctx, args, service, job, namespace, timeout, watch, changed)
    finally:
        watch.forget(name)
        if own:
            watch.close()


def _follow(ctx: ActionContext, args: dict[str, Any], service: dict[str, Any], job: dict[str, Any], namespace: str,
            timeout: float, watch: RunWatch, changed: threading.Event) -> dict[str, Any]:
    name = job["metadata"]["name"]
    a = str((ctx.node or {}).get("name", ""))
    b = str((ctx.partner or {}).get("name", ""))
    result: Result | None = None
    inconclusive = ""
    svc_name = service["metadata"]["name"]
    ctx.intent("create-service", "before", f"{namespace}/{svc_name}")
    try:
        ctx.kube.create_service(namespace, service)
        ctx.intent("create-service", "after", f"{namespace}/{svc_name}")
        ctx.intent("create-job", "before", f"{namespace}/{name}")
        ctx.kube.create_job(namespace, job)
        ctx.intent("create-job", "after", f"{namespace}/{name}")
        start = ctx.clock.now()
        polls = 0
        started = False  # both pods accepted by a kubelet
        ran = False  # a pair container did run
        fault = _Fault()
        why = ""  # the scheduler's word on a pod that cannot land
        confirmed = False
        while True:
            polls += 1
            changed.clear()
            current, pods = watch.state(name)
            cond = _condition(current) if current is not None else None
            if cond is not None and cond.get("reason") != "DeadlineExceeded" and sum(map(_finished, pods)) < 2:
                pods = _finished_pods(ctx, watch, changed, namespace, name)
            started = started or (len(pods) >= 2 and all((p.get("status") or {}).get("startTime") for p in pods))
            ran = ran or any(_container_ran(p) for p in pods)
            pending = _unscheduled(pods)
            if pending:
                why = pending
            elif started:
                why = ""
            if not ran:
                fault.see(pods, ctx.clock.now())
                if not pods and polls % 6 == 0:
                    fault.see_events(ctx, namespace, name, ctx.clock.now())
            now = ctx.clock.now()
            if cond is not None:
                deadline = cond.get("reason") == "DeadlineExceeded"
                if deadline and fault.code and not ran:
                    result = fault.result(a, now)
                elif why:  # one pod never landed; the other may have given up on the rendezvous
                    inconclusive = _never_scheduled(ctx, a, b, why)
                elif deadline and not started:
                    inconclusive = "the pair's pods never started before their deadline" + _gone(ctx, a, b)
                elif deadline and not ran:
                    result = _never_ran(a, now, pods)
                elif deadline:
                    result = _hung(a, now, timeout)
                else:
                    result = read_pair(ctx, namespace, pods, a, b, args["parser_args"] or {})
                break
            elapsed = now - start
            if fault.code and not ran and now - fault.since > min(TOOL_FAULT_GRACE, timeout * 0.5):
                result = fault.result(a, now)
                break
            if ctx.cancelled():
                inconclusive = "the sweep was stopped before the pair finished"
                break
            if args["abortable"] and ctx.config.abort_on_demand:
                waiting = pending_gpu_pods(watch.pending_pods(DEMAND_EVERY * ctx.config.poll_interval), ctx.config)
                if waiting:
                    inconclusive = (f"aborted to make room for {len(waiting)} pending GPU pod(s) "
                                    f"({', '.join(waiting[:3])})")
                    break
            schedule_deadline = min(SCHEDULE_TIMEOUT, timeout * 0.9)
            if why and elapsed > schedule_deadline:
                inconclusive = _never_scheduled(ctx, a, b, why)
                break
            if elapsed > timeout + CLIENT_GRACE and not confirmed:
                confirmed = True
                watch.refresh(name)
                continue
            if elapsed > timeout + CLIENT_GRACE:
                result = _hung(a, now, timeout) if ran else \
                    fault.result(a, now) if fault.code else _never_ran(a, now, pods)
                break
            pause = max(ctx.config.poll_interval, min(MAX_POLL, elapsed / 10))
            if why and elapsed < schedule_deadline:
                pause = max(ctx.config.poll_interval, min(pause, schedule_deadline - elapsed + 1))
            ctx.clock.wait(changed, pause)
    finally:
        ctx.intent("delete-job", "before", f"{namespace}/{name}")
        try:
            ctx.kube.delete_job(namespace, name)
        except NotFound:
            pass
        finally:
            ctx.intent("delete-job", "after", f"{namespace}/{name}")
            ctx.intent("delete-service", "before", f"{namespace}/{svc_name}")
            ctx.kube.delete_service(namespace, svc_name)
            ctx.intent("delete-service", "after", f"{namespace}/{svc_name}")
    return _answer(ctx, name, result, inconclusive)


def _answer(ctx: ActionContext, name: str, result: Result | None, inconclusive: str) -> dict[str, Any]:
    if inconclusive:
        return {"changed": True, "failed": True, "status": "inconclusive", "msg": inconclusive, "job": name,
                "result": None, "busbw": None}
    assert result is not None
    ctx.on_result(result)
    bad = [f"{c.name}: {c.message}" for c in result.failed_checks][:5]
    return ok(f"{result.status}" + (f": {'; '.join(bad)}" if bad else ""), changed=True, job=name,
              status=result.status, result=result.to_dict(), busbw=pair_parser.busbw(result)) \
        | {"failed": result.status in ("fail", "error")}


def _finished_pods(ctx: ActionContext, watch: RunWatch, changed: threading.Event, namespace: str,
                   name: str) -> list[dict[str, Any]]:
    """The Job is finished but the pod watch has not brought both pods' last state yet: wait for it
    a moment, then list the pods once."""
    until = ctx.clock.now() + POD_LAG
    while True:
        changed.clear()
        _, pods = watch.state(name)
        if sum(map(_finished, pods)) >= 2:
            return pods
        left = until - ctx.clock.now()
        if left <= 0 or ctx.cancelled():
            return list(ctx.kube.namespaced_pods(namespace, f"job-name={name}"))
        ctx.clock.wait(changed, left)


def _never_scheduled(ctx: ActionContext, a: str, b: str, why: str) -> str:
    return f"a pod of the pair never scheduled ({why})" + (_gone(ctx, a, b) or
                                                          "; someone or something else has one of the nodes")


def _gone(ctx: ActionContext, a: str, b: str) -> str:
    return "".join(_node_gone(ctx, n).replace("the node", f"node {n}") for n in (a, b))


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
        if i in (0, 1) and _finished(p):
            by_index[i] = p
    logs: list[str] = ["", ""]
    codes: list[int | None] = [None, None]
    for i, pod in sorted(by_index.items()):
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
        codes[i] = term.get("exitCode")
        try:
            logs[i] = ctx.kube.pod_log(namespace, pod["metadata"]["name"])
        except KubeError as exc:
            ctx.log(f"cannot read the log of {pod['metadata']['name']}: {exc}")
            logs[i] = term.get("message") or ""
        words = gpu_stack_words(term.get("message") or "") if term.get("reason") == "StartError" else ""
        if words:  # the GPU stack of the node this pod ran on: a finding, which re-pairing pins on it
            return runtime_result(a, now, f"StartError, exit {codes[i]}", words,
                                  str((pod.get("spec") or {}).get("nodeName") or ""))
        if term.get("reason") == "StartError" or codes[i] in TOOL_EXIT:
            image = statuses[0].get("image", "") if statuses else ""
            what = TOOL_EXIT.get(codes[i]) or "the pair container could not start"  # type: ignore[arg-type]
            tail = (logs[i].strip().splitlines() or [""])[-1]
            return tool_result(a, now, "StartError" if term.get("reason") == "StartError" else f"exit {codes[i]}",
                               f"{what} (image {image}, exit {codes[i]})", tail[:500])
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
    namespace = ctx.config.check_namespace  # the rendered MPIJob's own, which the safety check holds to this
    name = job["metadata"]["name"]
    a = str((ctx.node or {}).get("name", ""))
    result: Result | None = None
    inconclusive = ""
    ctx.intent("create-mpijob", "before", f"{namespace}/{name}")
    try:
        try:
            ctx.kube.create_mpijob(namespace, job)
        except NotServed as exc:
            result = tool_result(a, ctx.clock.now(), "NoMPIOperator", NO_OPERATOR, str(exc))
        else:
            ctx.intent("create-mpijob", "after", f"{namespace}/{name}")
            result, inconclusive = _follow_mpijob(ctx, args, namespace, name, timeout)
    finally:
        ctx.intent("delete-mpijob", "before", f"{namespace}/{name}")
        try:
            ctx.kube.delete_mpijob(namespace, name)
        finally:
            ctx.intent("delete-mpijob", "after", f"{namespace}/{name}")
    return _answer(ctx, name, result, inconclusive)


def _finished_condition(mpijob: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (mpijob.get("status") or {}).get("conditions") or []
                 if c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"), None)


def _follow_mpijob(ctx: ActionContext, args: dict[str, Any], namespace: str, name: str,
                   timeout: float) -> tuple[Result | None, str]:
    """Poll the MPIJob and its pods every poll_interval (on the run's clock) until it finishes, its
    Workers are given up on, the deadline passes, or the sweep stops."""
    assert ctx.kube is not None
    a = str((ctx.node or {}).get("name", ""))
    b = str((ctx.partner or {}).get("name", ""))
    start = ctx.clock.now()
    fault = _Fault()
    ran = False  # the launcher's container ran
    polls = 0
    while True:
        polls += 1
        try:
            current: dict[str, Any] | None = ctx.kube.get_mpijob(namespace, name)
        except NotFound:
            current = None  # deleted under the run (by a person, or its TTL)
        pods = ctx.kube.namespaced_pods(namespace, f"{MPI_JOB_NAME}={name}")
        roles: dict[str, list[dict[str, Any]]] = {"worker": [], "launcher": []}
        for p in pods:
            roles.setdefault(((p.get("metadata") or {}).get("labels") or {}).get(MPI_ROLE, ""), []).append(p)
        ran = ran or any(_container_ran(p) for p in roles["launcher"])
        why = _unscheduled(roles["worker"])
        now = ctx.clock.now()
        if not ran:
            fault.see(pods, now)
        if current is None:
            return tool_result(a, now, "MPIJobGone", f"the MPIJob {namespace}/{name} was deleted before it finished"), ""
        cond = _finished_condition(current)
        if cond is not None:
            if cond.get("reason") == "DeadlineExceeded":
                return (_hung(a, now, timeout) if ran else fault.result(a, now) if fault.code
                        else _never_ran(a, now, pods)), ""
            return read_launcher(ctx, namespace, roles["launcher"], a, b, args["parser_args"] or {}, cond), ""
        elapsed = now - start
        if fault.code and not ran and now - fault.since > min(TOOL_FAULT_GRACE, timeout * 0.5):
            return fault.result(a, now), ""
        if ctx.cancelled():
            return None, "the sweep was stopped before the pair finished"
        if args["abortable"] and ctx.config.abort_on_demand and polls % DEMAND_EVERY == 0:
            waiting = pending_gpu_pods(ctx.kube.pending_pods(), ctx.config)
            if waiting:
                return None, f"aborted to make room for {len(waiting)} pending GPU pod(s) ({', '.join(waiting[:3])})"
        if why and elapsed > min(SCHEDULE_TIMEOUT, timeout * 0.9):
            return None, _never_scheduled(ctx, a, b, why)
        if elapsed > timeout + CLIENT_GRACE:
            return (_hung(a, now, timeout) if ran else fault.result(a, now) if fault.code
                    else _never_ran(a, now, pods)), ""
        ctx.clock.sleep(ctx.config.poll_interval)


def read_launcher(ctx: ActionContext, namespace: str, launchers: list[dict[str, Any]], a: str, b: str,
                  parser_args: dict[str, Any], cond: dict[str, Any]) -> Result:
    """The launcher pod's log (mpirun's output: rank 0's table) read as the pair's result. The
    MPIJob form runs no path-MTU probe: `pair.mtu` says so as `skip` rather than pass."""
    now = ctx.clock.now()
    done = [p for p in launchers if _finished(p)]
    if not done:
        return tool_result(a, now, "NoPods", f"the MPIJob {cond.get('type', '').lower()} ({cond.get('reason', '')}) "
                           "but its launcher pod is not left to read", str(cond.get("message") or ""))
    pod = max(done, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    code = term.get("exitCode")
    try:
        log = ctx.kube.pod_log(namespace, pod["metadata"]["name"])
    except KubeError as exc:
        ctx.log(f"cannot read the log of {pod['metadata']['name']}: {exc}")
        log = term.get("message") or ""
    if term.get("reason") == "StartError" or code in TOOL_EXIT:
        image = statuses[0].get("image", "") if statuses else ""
        what = TOOL_EXIT.get(code) or "the launcher container could not start"  # type: ignore[arg-type]
        tail = (log.strip().splitlines() or [""])[-1]
        return tool_result(a, now, "StartError" if term.get("reason") == "StartError" else f"exit {code}",
                           f"{what} (image {image}, exit {code})", tail[:500])
    floor, no_floor = pair_floor(ctx, parser_args)
    result = pair_parser.parse([log, ""], a, now, partner=b, min_busbw=floor, no_floor=no_floor,
                               mtu=None, ifaces=[], exit_codes=[code, None])
    skip = CheckResult("pair.mtu", "skip", "no path-MTU probe in the MPIJob form (nccl-pair.yaml.j2 runs them)")
    return dataclasses.replace(result, checks=(*result.checks, skip), status="")
