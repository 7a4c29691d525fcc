"""`run_job`: render a Job template, run it on the node through the scheduler, wait with a
deadline, read and parse its result, and always delete the Job."""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any

import yaml

from sweeper.actions import ActionContext, Arg, action, ok
from sweeper.actions.jobwatch import RunWatch
from sweeper.actions.safety import REMEDIATION_TEMPLATES, Rules, problems, protected
from sweeper.clock import parse_duration
from sweeper.config import home
from sweeper.errors import ConfigError, KubeError, NotFound, PlaybookError
from sweeper.fleet import pending_gpu_pods
from sweeper.formats import FORMATS, detect, read
from sweeper.parsers import dcgm, nccl, sweeper_result
from sweeper.result import CheckResult, Result, error_result, tool_result
from sweeper.schema import safe_load, safe_load_all
from sweeper.templating import JobTemplate, render_template, resolve_template

SCHEDULE_TIMEOUT = 300.0
MAX_POLL = 30.0
CLIENT_GRACE = 60.0
# How long a finished Job waits for its pod's last state to come through the pod watch before
# listing the pods (the pod may be gone): the wait ends at the pod's event, so it is this long only
# when the pod was deleted.
POD_LAG = 60.0
DEMAND_EVERY = 6  # pending pods (abort_on_demand) are listed once per this many poll intervals, per run
TOOL_FAULT_GRACE = 120.0  # a container that cannot start for this long is given up on (the kubelet retries)
# Why a container waits without ever having run; each is a fault of the check (its image, its
# spec, the cluster's config), not of the node's hardware.
# https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting
PULL_WAITING = ("ErrImagePull", "ImagePullBackOff")
TOOL_WAITING = (*PULL_WAITING, "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                "CreateContainerError", "RunContainerError")
# The shell's "command not found" and "not executable", and a container runtime that cannot exec the
# entrypoint at all (containerd reports StartError with 128).
TOOL_EXIT = {126: "a program the check calls is not executable in its image",
             127: "a program the check calls is not in its image (command not found)"}
# The node's own GPU stack refusing to start a container: NVIDIA's container hook (nvidia-container-cli:
# "initialization error: nvml error: driver/library version mismatch", "detection error: nvml error: ...",
# "GPU is lost"), NVML itself, or CDI device injection ("unresolvable CDI devices"). containerd reports
# them as StartError, exit 128, or the kubelet's CreateContainerError/RunContainerError, with the hook's
# words in the message (NVIDIA/gpu-operator#898, NVIDIA/k8s-device-plugin#1431,
# NVIDIA/nvidia-container-toolkit#416 and #1239). These are faults of the node, never of the check.
GPU_STACK = re.compile(r"nvidia-container-cli|nvidia-container-runtime|\bnvml\b|driver/library version mismatch|"
                       r"GPU is lost|CDI devices?\b|CDI device injection", re.IGNORECASE)
# ...except the hook's requirement check: the check image asks for a newer CUDA than the node's driver
# ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4"): the image's to fix.
NOT_GPU_STACK = re.compile(r"requirement error", re.IGNORECASE)
RUNTIME_CHECK, RUNTIME_CODE = "gpu.runtime", "GPU_RUNTIME"


def gpu_stack_words(text: str) -> str:
    """The runtime's words when a container could not start because of the node's GPU stack (the
    line that names it, at most 300 characters), else ''."""
    if not text or NOT_GPU_STACK.search(text):
        return ""
    for line in text.splitlines():
        if GPU_STACK.search(line):
            return line.strip()[-300:]
    return ""


def runtime_result(node: str, now: float, reason: str, words: str, on: str = "") -> Result:
    """A node finding: the container runtime could not start the check because of the node's GPU stack
    (`on`: the node whose runtime said so, where it is not `node`, as in a pair)."""
    where = f" on {on}" if on and on != node else ""
    return Result(node=node, source="container-runtime", started=now, finished=now, checks=(CheckResult(
        RUNTIME_CHECK, "fail", f"the container runtime{where} could not start the check ({reason}): {words}; the node's "
        "GPU stack (driver, NVML, NVIDIA container toolkit or CDI) is broken, not the check", "critical",
        code=RUNTIME_CODE),))


def job_name(node: str, run_id: str, template: str) -> str:
    digest = hashlib.sha1(f"{run_id}/{node}/{template}".encode()).hexdigest()[:6]
    base = re.sub(r"[^a-z0-9-]", "-", node.lower())[:40].strip("-")
    return f"sweep-{base}-{digest}"


def template_of(ctx: ActionContext, template: str) -> JobTemplate:
    """A job template by name: the config's template_dir first, then the shipped job-templates/."""
    author = Path(ctx.config.template_dir) if ctx.config.template_dir else None
    return resolve_template(template, home() / "job-templates", author)


def image_vars(ctx: ActionContext) -> dict[str, Any]:
    """The images a template names, each from the config (pinned by digest), never from a playbook;
    DCGM's is the build for the CUDA major of the node's driver (config `dcgm_images`)."""
    cfg = ctx.config
    return {"image": cfg.check_image, "dcgm_image": cfg.dcgm_image_for(ctx.node), "nccl_image": cfg.nccl_image,
            "pair_image": cfg.pair_image, "mpi_image": cfg.pair_image, "reboot_image": cfg.reboot_image}


def job_rules(ctx: ActionContext, found: JobTemplate, affinities: tuple[dict[str, Any], ...],
              remediation: bool, bound: bool = False) -> Rules:
    """What the rendered Job is held to: Sweeper's own values, not the template's variables."""
    key = REMEDIATION_TEMPLATES.get(found.name) if remediation and found.shipped else None
    return Rules(namespace=job_namespace(ctx, remediation), affinities=affinities,
                 tolerations=tuple(sweeper_tolerations(ctx)), taint_key=ctx.config.taint_key,
                 images=ctx.config.job_images, runtime_class=ctx.config.runtime_class_name,
                 priority_class=ctx.config.check_priority_class,
                 privileged_image=getattr(ctx.config, key) if key else "", host_pid=found.name == "reboot.yaml.j2",
                 bound_node=str((ctx.node or {}).get("name", "")) if bound else "",
                 gpu_resources=(*ctx.config.gpu_resources, *ctx.config.gpu_resource_prefixes))


def job_namespace(ctx: ActionContext, remediation: bool = False) -> str:
    """Where Sweeper runs a Job: check Jobs in check_namespace, reboot and reset Jobs in
    remediation_namespace, both apart from the controller's own."""
    return ctx.config.remediation_namespace if remediation else ctx.config.check_namespace


def sweeper_tolerations(ctx: ActionContext) -> list[dict[str, Any]]:
    """Sweeper's own taint, and the GPU pools' taints that leave a node sweepable (allowed_taint_keys:
    GKE's nvidia.com/gpu=present, AKS's sku=gpu when listed), so the check lands where it was sent."""
    return ([{"key": ctx.config.taint_key, "operator": "Exists", "effect": "NoSchedule"}]
            + [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k in ctx.config.allowed_taint_keys])


def render_job(ctx: ActionContext, template: str, timeout: float, extra: dict[str, Any],
               remediation: bool = False, bound: bool = False) -> dict[str, Any]:
    """The template rendered and checked. Sweeper's variables are set after the playbook's `vars`
    (which may not name them), and the Job is then held to Sweeper's own values (sweeper.actions.safety);
    only a shipped remediation template rendered by the remediation (`remediation=True`) may be privileged.
    `bound`: a remediation Job bound to the held node by `nodeName` that requests no GPU (the GPU
    reset, while the device plugin is paused), not a Job that goes through the scheduler."""
    found = template_of(ctx, template)
    path = found.path
    node = ctx.node or {}
    name = job_name(node.get("name", "none"), ctx.run_id, template)
    hostname = (node.get("labels") or {}).get("kubernetes.io/hostname", node.get("name", ""))
    labels = {"app.kubernetes.io/managed-by": "sweeper", "app.kubernetes.io/component": "check",
              f"{ctx.config.prefix}/run-id": ctx.run_id, f"{ctx.config.prefix}/node": node.get("name", "")}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}]}]}}}
    own = {
        "node": node, "run_id": ctx.run_id, "job_name": name, "namespace": job_namespace(ctx, remediation),
        "taint_key": ctx.config.taint_key, "prefix": ctx.config.prefix,
        "timeout": int(timeout), "ttl": int(ctx.config.job_ttl), "labels": labels,
        # The parts that keep a check Job safe are built here, not left to each template.
        "affinity": affinity, "tolerations": sweeper_tolerations(ctx),
        "all_gpus": {"nvidia.com/gpu": str(node.get("gpus", 0))},
        "priority_class": ctx.config.check_priority_class,
        # Where the GPU libraries come from (README "Running on EKS / AKS / GKE"): the runtime class,
        # GKE's driver directory, and the node's DCGM host engine.
        "platform": ctx.config.platform_name, "runtime_class": ctx.config.runtime_class_name,
        "dcgm_hostengine": ctx.config.hostengine, "default_dcgm_level": ctx.config.dcgm_level_for(node),
        **image_vars(ctx)}
    protected(extra, own, "run_job")
    variables = {**extra, **own}  # Sweeper's values last: nothing a playbook passes replaces them
    rendered = render_template(found, variables)
    job = load_rendered(rendered, path)
    if not isinstance(job, dict) or job.get("kind") != "Job":
        raise PlaybookError(f"{path}: the template must render a batch/v1 Job")
    refuse_unsafe([job], job_rules(ctx, found, (affinity,), remediation, bound), path)
    if remediation:  # its own account, which has no RBAC and mounts no token (docs/security.md)
        job["spec"]["template"]["spec"]["serviceAccountName"] = ctx.config.remediation_service_account
    _second_engine(ctx, job, node)
    return job


def load_rendered(rendered: str, path: Path, many: bool = False) -> Any:
    """The rendered YAML; an error names the line and column, never the text there."""
    try:
        return [d for d in safe_load_all(rendered) if d is not None] if many else safe_load(rendered)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1} of the rendered text" if mark is not None else ""
        raise PlaybookError(f"{path}: the rendered template is not YAML{at}: "
                            f"{getattr(exc, 'problem', None) or type(exc).__name__}") from None


def refuse_unsafe(docs: list[dict[str, Any]], rules: Rules, path: Path) -> None:
    found = problems(docs, rules)
    if found:
        raise PlaybookError(f"{path}: unsafe Job: " + "; ".join(found[:6]) + (" ..." if len(found) > 6 else ""))


def _second_engine(ctx: ActionContext, job: dict[str, Any], node: dict[str, Any]) -> None:
    """Say so when a Job starts its own DCGM host engine on a node where the GPU Operator runs
    dcgm-exporter, whose embedded engine (or the operator's nvidia-dcgm) already watches the GPUs:
    two engines on one node, which `dcgm_hostengine: node` avoids."""
    labels = node.get("labels") or {}
    if labels.get("nvidia.com/gpu.deploy.dcgm-exporter", "false") == "false":
        return
    pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    if any("nv-hostengine" in " ".join(map(str, (c.get("command") or []) + (c.get("args") or [])))
           for c in pod.get("containers") or []):
        ctx.log(f"{node.get('name', '')}: {job['metadata']['name']} starts a second DCGM host engine beside "
                "dcgm-exporter's on this node (set dcgm_hostengine: node to use the node's own)")


def _condition(job: dict[str, Any]) -> dict[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c
    return None


def _unscheduled(pods: list[dict[str, Any]]) -> str:
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return c.get("message", "unschedulable")
    return ""


def _read_result(ctx: ActionContext, namespace: str, pods: list[dict[str, Any]], node: str, parser: str,
                 parser_args: dict[str, Any]) -> Result:
    now = ctx.clock.now()
    done = [p for p in pods if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")]
    if not done:
        return error_result(node, "sweeper", "the check Job finished but none of its pods is left to read", now)
    pod = max(done, key=lambda p: p["metadata"].get("creationTimestamp", ""))
    statuses = pod["status"].get("containerStatuses") or []
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    exit_code = term.get("exitCode")
    try:
        log = ctx.kube.pod_log(namespace, pod["metadata"]["name"])
    except KubeError as exc:
        log = ""
        ctx.log(f"cannot read the log of {pod['metadata']['name']}: {exc}")
    message = term.get("message") or ""
    words = gpu_stack_words(message) if term.get("reason") == "StartError" else ""
    if words:
        return runtime_result(node, now, f"StartError, exit {exit_code}", words)
    if term.get("reason") == "StartError" or exit_code in TOOL_EXIT:
        image = statuses[0].get("image", "") if statuses else ""
        what = TOOL_EXIT.get(exit_code) or "the check container could not start"  # type: ignore[arg-type]
        tail = (log.strip().splitlines() or [""])[-1] if log.strip() else message.strip()
        return tool_result(node, now, "StartError" if term.get("reason") == "StartError" else f"exit {exit_code}",
                           f"{what} (image {image}, exit {exit_code})", tail[:500])
    if parser == "auto":
        try:
            parser = detect(log or message)
        except ConfigError as exc:
            return error_result(node, "sweeper", f"the check's output is in no format Sweeper reads: {exc}", now,
                                code="UNKNOWN_FORMAT")
    if parser not in ("sweeper", "dcgm", "nccl"):
        return _read_other(log or message, node, now, parser, exit_code, parser_args)
    if parser == "dcgm":
        expect = parser_args.get("expect_gpus")
        return dcgm.parse(log or message, node, now, exit_code=exit_code,
                          expect_gpus=None if expect in (None, "") else int(expect))
    if parser == "nccl":
        floor = parser_args.get("min_busbw")
        return nccl.parse(log or message, node, now, min_busbw=None if floor in (None, "") else float(floor),
                          exit_code=exit_code)
    result = sweeper_result.parse(log, node, now)
    if result.status == "error" and message.strip() and message.strip() not in log:
        result = sweeper_result.parse_summary(message, node, now)  # no readable log: the short form
    crashed = exit_code not in (None, 0, 1)  # 1 is the check's own "findings"
    if crashed and result.status == "error":
        return error_result(node, "sweeper", f"the check exited {exit_code} ({term.get('reason', '')}): "
                            f"{result.checks[0].message}", now, code=f"exit {exit_code}")
    if exit_code not in (None, 0) and result.status in ("pass", "warn", "skip"):
        return error_result(node, "sweeper", f"the check exited {exit_code} but reported {result.status}", now,
                            code=f"exit {exit_code}")
    return result


READ_OPTIONS = {"expect_gpus": int, "gpu_model": str, "expect_nics": int, "nic": str, "mtu": int, "nvlinks": int,
                "nic_affinity": str}  # what `parser_args` may give a format read by `sweeper.formats`


def _read_other(text: str, node: str, now: float, parser: str, exit_code: int | None,
                parser_args: dict[str, Any]) -> Result:
    """An author's command's output read as `parser`, as `sweeper ingest` reads it; a command that
    exited non-zero yet reads as healthy is an error, not a pass."""
    options = {k: READ_OPTIONS[k](v) for k, v in parser_args.items() if k in READ_OPTIONS and v not in (None, "")}
    _, result = read(text, node, parser, now, exit_code=exit_code, **options)
    if exit_code not in (None, 0) and result.status in ("pass", "warn", "skip"):
        return error_result(node, parser, f"the command exited {exit_code} but its output reads {result.status}",
                            now, code=f"exit {exit_code}")
    return result


@action("run_job",
        Arg("template", str, required=True, help="a template's name (.j2): in the config's template_dir, else the shipped job-templates/"),
        Arg("timeout", (int, float, str), default="15m", help="activeDeadlineSeconds, and the client deadline"),
        Arg("vars", dict, default=None, help="extra variables for the template"),
        Arg("parser", str, default="sweeper", choices=FORMATS,
            help="how to read the pod's output: any format `sweeper ingest` reads (Sweeper's result document, "
                 "dcgmi diag JSON, nccl-tests, nvidia-smi, ...), or auto to detect it"),
        Arg("parser_args", dict, default=None,
            help="for dcgm: expect_gpus; for nccl: min_busbw (GB/s at the largest message); for the others, "
                 "what `sweeper ingest` takes: expect_gpus, gpu_model, expect_nics, nic, mtu, nvlinks, nic_affinity"),
        Arg("abortable", bool, default=True,
            help="may be stopped to make room for pending GPU work (with abort_on_demand); the result is inconclusive"),
        help="Run a check Job on the node (affinity plus a toleration for Sweeper's taint, all its GPUs), "
             "wait for it, parse its result document, and delete it.", needs_node=True)
def run_job(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    if ctx.kube is None or ctx.node is None:
        raise PlaybookError("run_job needs a cluster and a target node (--node)")
    timeout = parse_duration(args["timeout"])
    job = render_job(ctx, args["template"], timeout, args["vars"] or {})
    namespace = ctx.config.check_namespace  # the rendered Job's own, which the safety check holds to this
    name = job["metadata"]["name"]
    watch, own = _watch_for(ctx, namespace)
    changed = watch.changed(name)  # before the create: no change of the Job can be missed
    try:
        return _follow(ctx, args, job, namespace, timeout, watch, changed)
    finally:
        watch.forget(name)
        if own:
            watch.close()


def _watch_for(ctx: ActionContext, namespace: str) -> tuple[RunWatch, bool]:
    """The run's shared watch of its Jobs, or one of this task's own (`sweeper run`, or a Job in
    another namespace); True when it is this task's own, to close."""
    shared = ctx.jobwatch
    if shared is not None and shared.namespace == namespace:
        return shared, False
    return RunWatch(ctx.kube, namespace, f"{ctx.config.prefix}/run-id={ctx.run_id}", ctx.clock,
                    ctx.config.poll_interval, log=ctx.log), True


def _follow(ctx: ActionContext, args: dict[str, Any], job: dict[str, Any], namespace: str, timeout: float,
            watch: RunWatch, changed: threading.Event) -> dict[str, Any]:
    name = job["metadata"]["name"]
    node = ctx.node["name"] if ctx.node else ""
    ctx.intent("create-job", "before", f"{namespace}/{name}")
    ctx.kube.create_job(namespace, job)
    ctx.intent("create-job", "after", f"{namespace}/{name}")
    start = ctx.clock.now()
    result: Result | None = None
    inconclusive = ""
    polls = 0
    started = False  # the kubelet accepted a pod (status.startTime: set before any image is pulled)
    ran = False  # a check container did run: only then is a deadline a hung check, a fault of the node
    fault = _Fault()  # why the container cannot start, or why the pod is not even created
    why = ""  # the scheduler's word on the pod, from the last time the pods were read
    confirmed = False  # the Job was read afresh once past its deadline
    try:
        while True:
            polls += 1
            changed.clear()  # before reading: a change from here on wakes the wait below
            current, pods = watch.state(name)
            cond = _condition(current) if current is not None else None
            if cond is not None and cond.get("reason") != "DeadlineExceeded" and not any(_finished(p) for p in pods):
                pods = _finished_pods(ctx, watch, changed, namespace, name)  # its result is read from the pod
            started = started or any((p.get("status") or {}).get("startTime") for p in pods)
            ran = ran or any(_container_ran(p) for p in pods)
            if pods:
                why = "" if started else _unscheduled(pods) or why
            if not ran:
                fault.see(pods, ctx.clock.now())
                if not pods and not started and polls % 6 == 0:  # no pod yet after a while: refused?
                    fault.see_events(ctx, namespace, name, ctx.clock.now())
            if cond is not None:
                if cond.get("reason") == "DeadlineExceeded" and fault.code and not ran:
                    result = fault.result(node, ctx.clock.now())
                elif cond.get("reason") == "DeadlineExceeded" and not started:
                    inconclusive = _never_scheduled(ctx, node, why) if why else \
                        "the check pod never started before its deadline" + _node_gone(ctx, node)
                elif cond.get("reason") == "DeadlineExceeded" and not ran:
                    result = _never_ran(node, ctx.clock.now(), pods)
                elif cond.get("reason") == "DeadlineExceeded":
                    result = _hung(node, ctx.clock.now(), timeout)
                else:
                    result = _read_result(ctx, namespace, pods, node, args["parser"], args["parser_args"] or {})
                break
            elapsed = ctx.clock.now() - start
            if fault.code and not ran and ctx.clock.now() - fault.since > min(TOOL_FAULT_GRACE, timeout * 0.5):
                result = fault.result(node, ctx.clock.now())
                break
            if ctx.cancelled():
                inconclusive = "the sweep was stopped before the check finished"
                break
            if args["abortable"] and ctx.config.abort_on_demand:
                waiting = pending_gpu_pods(watch.pending_pods(DEMAND_EVERY * ctx.config.poll_interval), ctx.config)
                if waiting:
                    inconclusive = (f"aborted to make room for {len(waiting)} pending GPU pod(s) "
                                    f"({', '.join(waiting[:3])})")
                    break
            schedule_deadline = min(SCHEDULE_TIMEOUT, timeout * 0.9)
            if why and elapsed > schedule_deadline:
                inconclusive = _never_scheduled(ctx, node, why)
                break
            if elapsed > timeout + CLIENT_GRACE and not confirmed:
                # Past the deadline by what we have seen: read the Job once afresh before calling
                # it hung (a fault of the node), since a lagging stream or poll may not have it yet.
                confirmed = True
                watch.refresh(name)
                continue
            if elapsed > timeout + CLIENT_GRACE:
                result = _hung(node, ctx.clock.now(), timeout) if ran else \
                    fault.result(node, ctx.clock.now()) if fault.code else _never_ran(node, ctx.clock.now(), pods)
                break
            # The watch wakes this wait on every change of the Job or its pods; the pause only
            # bounds how late a deadline, a stop or a pod that cannot land is noticed.
            pause = max(ctx.config.poll_interval, min(MAX_POLL, elapsed / 10))
            if why and elapsed < schedule_deadline:  # wake in time to give up on a pod that cannot land
                pause = max(ctx.config.poll_interval, min(pause, schedule_deadline - elapsed + 1))
            ctx.clock.wait(changed, pause)
    finally:
        ctx.intent("delete-job", "before", f"{namespace}/{name}")
        try:
            ctx.kube.delete_job(namespace, name)
        except NotFound:
            pass
        ctx.intent("delete-job", "after", f"{namespace}/{name}")
    if inconclusive:
        return {"changed": True, "failed": True, "status": "inconclusive", "msg": inconclusive, "job": name}
    assert result is not None
    ctx.on_result(result)
    bad = [f"{c.name}: {c.message}" for c in result.failed_checks][:5]
    return ok(f"{result.status}" + (f": {'; '.join(bad)}" if bad else ""), changed=True, job=name,
              status=result.status, result=result.to_dict()) | {"failed": result.status in ("fail", "error")}


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _finished_pods(ctx: ActionContext, watch: RunWatch, changed: threading.Event, namespace: str,
                   name: str) -> list[dict[str, Any]]:
    """The Job is finished but the pod watch has not yet brought its pod's last state (the two
    watches are separate streams): wait for it a moment, then list the pods once."""
    until = ctx.clock.now() + POD_LAG
    while True:
        changed.clear()
        _, pods = watch.state(name)
        if any(_finished(p) for p in pods):
            return pods
        left = until - ctx.clock.now()
        if left <= 0 or ctx.cancelled():
            return list(ctx.kube.namespaced_pods(namespace, f"job-name={name}"))
        ctx.clock.wait(changed, left)


def _never_scheduled(ctx: ActionContext, node: str, why: str) -> str:
    return f"the check pod never scheduled ({why})" + (_node_gone(ctx, node) or
                                                      "; someone or something else has the node")


def _node_gone(ctx: ActionContext, node: str) -> str:
    try:
        ctx.kube.get_node(node)
    except NotFound:
        return "; the node is gone (deleted while under test)"
    return ""


def _hung(node: str, now: float, timeout: float) -> Result:
    return Result(node=node, source="sweeper", started=now, finished=now, checks=(CheckResult(
        "check.deadline", "fail", f"the check did not finish within {int(timeout)}s: a hung check is a node fault",
        "critical", code="DeadlineExceeded"),))


def _container_ran(pod: dict[str, Any]) -> bool:
    """A container of the pod is running or has run (a start that failed is not running)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state or ("terminated" in state and state["terminated"].get("reason") != "StartError"):
            return True
    return False


class _Fault:
    """What keeps a check from running, as first seen: a container's waiting reason and message
    from the pod's status, or the Job controller's FailedCreate Event (admission refused the pod)."""

    def __init__(self) -> None:
        self.code = ""
        self.summary = ""
        self.detail = ""
        self.since = 0.0
        self.node_words = ""  # the runtime's words when the node's GPU stack is what fails the start
        self.on = ""  # the node of the pod whose start failed so

    def _set(self, code: str, summary: str, detail: str, now: float, node_words: str = "") -> None:
        if code != self.code:
            self.since = now
        self.code, self.summary, self.detail, self.node_words = code, summary, detail, node_words

    def see(self, pods: list[dict[str, Any]], now: float) -> None:
        for p in pods:
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                w = (cs.get("state") or {}).get("waiting") or {}
                reason, msg = w.get("reason", ""), w.get("message", "")
                if reason in PULL_WAITING:
                    # ErrImagePull carries the registry's answer; ImagePullBackOff only says it waits.
                    detail = f"{reason}: {msg}" if reason == "ErrImagePull" or not self.detail else self.detail
                    self._set("ErrImagePull", f'the check image "{cs.get("image", "")}" cannot be pulled', detail, now)
                    return
                last = (cs.get("lastState") or {}).get("terminated") or {}
                words = gpu_stack_words(msg) if reason in TOOL_WAITING else \
                    gpu_stack_words(last.get("message", "")) if last.get("reason") == "StartError" else ""
                if words:  # the node's GPU stack, however the kubelet words the wait
                    self._set(reason or "StartError", "", "", now, words)
                    self.on = str((p.get("spec") or {}).get("nodeName") or "")
                    return
                if reason in TOOL_WAITING:
                    self._set(reason, f"the check container cannot start: {reason}: {msg}", "", now)
                    return
        if pods and self.code and self.code != "FailedCreate":
            self.code, self.node_words = "", ""  # the container got past it

    def see_events(self, ctx: ActionContext, namespace: str, job: str, now: float) -> None:
        """Admission (Pod Security, a missing RuntimeClass, a policy webhook) refuses the pod: the Job
        has no pod at all, only the job controller's FailedCreate Event with the apiserver's 403."""
        try:
            events = ctx.kube.list_events(namespace, f"involvedObject.kind=Job,involvedObject.name={job},"
                                                     "reason=FailedCreate")
        except KubeError as exc:
            ctx.log(f"cannot read the events of Job {job}: {exc}")
            return
        if not events:
            return
        last = max(events, key=lambda e: e.get("lastTimestamp") or "")
        text = str(last.get("message") or "")
        words = re.sub(r'^(?:Error creating: )?pods "[^"]*" is forbidden: ', "", text)
        self._set("FailedCreate", f"the check pod was refused at creation: {words}", text, now)

    def result(self, node: str, now: float) -> Result:
        if self.node_words:
            return runtime_result(node, now, self.code, self.node_words, self.on)
        return tool_result(node, now, self.code, self.summary + "; a fault of the check, not of the node",
                           self.detail)


def _never_ran(node: str, now: float, pods: list[dict[str, Any]]) -> Result:
    """The pod was accepted by the kubelet but its container never ran before the deadline (for
    instance a volume that never mounted): the check's fault, not a hung check."""
    waiting = [((cs.get("state") or {}).get("waiting") or {}) for p in pods
               for cs in (p.get("status") or {}).get("containerStatuses") or []]
    reason = next((w.get("reason") for w in waiting if w.get("reason")), "ContainerCreating")
    msg = next((w.get("message") for w in waiting if w.get("message")), "")
    return tool_result(node, now, str(reason), f"the check container never started before its deadline ({reason}); "
                       "a fault of the check, not of the node", str(msg))
