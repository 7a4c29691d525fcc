"""`run_job`: render a Job template, run it on the node through the scheduler, follow it with the
one Job-following loop (sweeper.actions.follow), read and parse its result, and always delete the Job."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from sweeper.actions import ActionContext, Arg, action
from sweeper.actions.follow import (  # noqa: F401  (re-exported: their old home)
    CLIENT_GRACE,
    DEMAND_EVERY,
    MAX_POLL,
    POD_LAG,
    SCHEDULE_TIMEOUT,
    TOOL_FAULT_GRACE,
    Shape,
    answer,
    follow,
    job_created,
    watched,
)
from sweeper.actions.podstate import (  # noqa: F401  (re-exported: their old home)
    GPU_STACK,
    LOG_LIMIT,
    NOT_GPU_STACK,
    PULL_WAITING,
    RUNTIME_CHECK,
    RUNTIME_CODE,
    TOOL_EXIT,
    TOOL_WAITING,
    finished,
    gpu_stack_words,
    log_cut,
    runtime_result,
    start_failure,
)
from sweeper.actions.podstate import Fault as _Fault  # noqa: F401  (its old name)
from sweeper.actions.safety import (
    EVIDENCE_PATHS,
    HOST_PATHS,
    REMEDIATION_TEMPLATES,
    Rules,
    problems,
    protected,
)
from sweeper.actions.structure import PARSED, render_checked, rendered_docs
from sweeper.clock import parse_duration
from sweeper.config import home
from sweeper.demand import holds_gpus
from sweeper.errors import ConfigError, KubeError, PlaybookError
from sweeper.formats import FORMATS, detect, read
from sweeper.parsers import sweeper_result
from sweeper.result import Result, error_result
from sweeper.schema import safe_load
from sweeper.templating import JobTemplate, resolve_template


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


# The ResourceClaimTemplate a check Job on a DRA node claims its GPUs through: every device of the
# driver's DeviceClass on the node (allocationMode All fails while any is allocated elsewhere, so the
# scheduler itself keeps the check off a node whose GPUs are in use), as a device plugin node's Job
# requests all its nvidia.com/gpu. https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/
DRA_TEMPLATE = "sweeper-gpus"


def dra_of(ctx: ActionContext, node: dict[str, Any] | None = None) -> dict[str, Any]:
    """A held node's DRA GPUs (the context's node unless another is named): from the node's variables
    where discovery saw them, else (a node with no GPU resource in capacity) from its own ResourceSlices,
    asked by field selector (spec.nodeName, spec.driver), never a cluster-wide list. {} on a device
    plugin node."""
    node = (ctx.node or {}) if node is None else node
    found = (node.get("gpu_resources") or {}).get("dra") or {}
    if found or not ctx.config.dra_driver or (node.get("gpu_resources") or {}).get("capacity") or ctx.kube is None:
        return dict(found)
    for s in ctx.kube.list_resource_slices(node=str(node.get("name", "")), driver=ctx.config.dra_driver):
        spec = s.get("spec") or {}
        if spec.get("nodeName") == node.get("name") and spec.get("driver") == ctx.config.dra_driver \
                and spec.get("devices"):
            return {"driver": spec["driver"], "pool": (spec.get("pool") or {}).get("name", ""),
                    "devices": len(spec["devices"])}
    return {}


def ensure_claims(ctx: ActionContext, dra: dict[str, Any]) -> None:
    """The ResourceClaimTemplate the Jobs' pods claim a DRA node's GPUs through, once a run."""
    if dra and ctx.kube is not None:
        ns = job_namespace(ctx)
        ctx.kube.ensure_claim_template(ns, claim_template(ns, dra["driver"]), once_per=ctx.run_id)


def gpu_claims(dra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "gpus", "resourceClaimTemplateName": DRA_TEMPLATE}] if dra else []


def claim_template(namespace: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": DRA_TEMPLATE, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "sweeper"}},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": device_class, "allocationMode": "All"}}]}}}}


def job_rules(ctx: ActionContext, found: JobTemplate, affinities: tuple[dict[str, Any], ...],
              remediation: bool, bound: bool = False, claims: tuple[dict[str, Any], ...] = ()) -> Rules:
    """What the rendered Job is held to: Sweeper's own values, not the template's variables."""
    key = REMEDIATION_TEMPLATES.get(found.name) if remediation and found.shipped else None
    return Rules(namespace=job_namespace(ctx, remediation), affinities=affinities,
                 tolerations=tuple(sweeper_tolerations(ctx)), taint_key=ctx.config.taint_key,
                 images=ctx.config.job_images, runtime_class=ctx.config.runtime_class_name,
                 priority_class=ctx.config.check_priority_class,
                 privileged_image=getattr(ctx.config, key) if key else "", host_pid=found.name == "reboot.yaml.j2",
                 bound_node=str((ctx.node or {}).get("name", "")) if bound else "",
                 gpu_resources=(*ctx.config.gpu_resources, *ctx.config.gpu_resource_prefixes),
                 claims=() if bound else claims,
                 host_paths=EVIDENCE_PATHS if found.shipped and found.name == EVIDENCE_TEMPLATE else HOST_PATHS)


EVIDENCE_TEMPLATE = "sweeper-evidence.yaml.j2"  # the one template that may mount the host's /var/log


def job_namespace(ctx: ActionContext, remediation: bool = False) -> str:
    """Where Sweeper runs a Job: check Jobs in check_namespace, reboot and reset Jobs in
    remediation_namespace, both apart from the controller's own."""
    return ctx.config.remediation_namespace if remediation else ctx.config.check_namespace


def sweeper_tolerations(ctx: ActionContext) -> list[dict[str, Any]]:
    """Sweeper's own taint and its gate's, and the GPU pools' taints that leave a node sweepable (allowed_taint_keys:
    GKE's nvidia.com/gpu=present, AKS's sku=gpu when listed), so the check lands where it was sent."""
    gate = [ctx.config.gate_taint] if ctx.config.gate_taint else []  # a gated node's checks land on it too
    return ([{"key": ctx.config.taint_key, "operator": "Exists", "effect": "NoSchedule"}]
            + [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k in (*gate, *ctx.config.allowed_taint_keys)])


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
    dra = {} if bound else dra_of(ctx)
    claims = gpu_claims(dra)
    own = {
        "node": node, "run_id": ctx.run_id, "job_name": name, "namespace": job_namespace(ctx, remediation),
        "taint_key": ctx.config.taint_key, "prefix": ctx.config.prefix,
        "timeout": int(timeout), "ttl": int(ctx.config.job_ttl), "labels": labels,
        # The parts that keep a check Job safe are built here, not left to each template.
        "affinity": affinity, "tolerations": sweeper_tolerations(ctx),
        # a device plugin node's GPUs as a resource request; a DRA node's through Sweeper's claim
        "all_gpus": {} if dra else {"nvidia.com/gpu": str(node.get("gpus", 0))}, "gpu_claims": claims,
        "priority_class": ctx.config.check_priority_class,
        # Where the GPU libraries come from (README "Running on EKS / AKS / GKE"): the runtime class,
        # GKE's driver directory, and the node's DCGM host engine.
        "platform": ctx.config.platform_name, "runtime_class": ctx.config.runtime_class_name,
        "dcgm_hostengine": ctx.config.hostengine, "default_dcgm_level": ctx.config.dcgm_level_for(node),
        **image_vars(ctx)}
    protected(extra, own, "run_job")
    variables = {**extra, **own}  # Sweeper's values last: nothing a playbook passes replaces them
    rendered = render_checked(found, variables)  # cluster data fills values, never shapes the Job
    job = load_rendered(rendered, path)
    if not isinstance(job, dict) or job.get("kind") != "Job":
        raise PlaybookError(f"{path}: the template must render a batch/v1 Job")
    refuse_unsafe([job], job_rules(ctx, found, (affinity,), remediation, bound, tuple(claims)), path)
    if claims and not remediation:
        ensure_claims(ctx, dra)
    if remediation:  # its own account, which has no RBAC and mounts no token (docs/security.md)
        job["spec"]["template"]["spec"]["serviceAccountName"] = ctx.config.remediation_service_account
    _second_engine(ctx, job, node)
    return job


def _copy(value: Any) -> Any:
    """A copy of parsed YAML, whose containers are dicts, lists and sets (the rest is immutable)."""
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v) for v in value]
    if type(value) is set:
        return set(value)
    return value


def load_rendered(rendered: str, path: Path, many: bool = False) -> Any:
    """The rendered YAML; an error names the line and column, never the text there."""
    try:
        if many:
            return _copy(rendered_docs(rendered))
        known = PARSED.get((rendered, False))
        if known is None:
            known = safe_load(rendered)
            if known is not None:
                PARSED.put((rendered, False), known)
        return _copy(known)
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


def _read_result(ctx: ActionContext, namespace: str, pods: list[dict[str, Any]], node: str, parser: str,
                 parser_args: dict[str, Any]) -> Result:
    now = ctx.clock.now()
    done = [p for p in pods if finished(p)]
    if not done:
        return error_result(node, "sweeper", "the check Job finished but none of its pods is left to read", now)
    pod = max(done, key=lambda p: p["metadata"].get("creationTimestamp", ""))
    statuses = pod["status"].get("containerStatuses") or []
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    exit_code = term.get("exitCode")
    try:
        log = ctx.kube.pod_log(namespace, pod["metadata"]["name"], limit_bytes=LOG_LIMIT)
    except KubeError as exc:
        log = ""
        ctx.log(f"cannot read the log of {pod['metadata']['name']}: {exc}")
    message = term.get("message") or ""
    tail = (log.strip().splitlines() or [""])[-1] if log.strip() else message.strip()
    failure = start_failure(node, now, statuses, tail, "the check container could not start") or \
        log_cut(node, now, log)
    if failure is not None:
        return failure
    if parser == "auto":
        try:
            parser = detect(log or message)
        except ConfigError as exc:
            return error_result(node, "sweeper", f"the check's output is in no format Sweeper reads: {exc}", now,
                                code="UNKNOWN_FORMAT")
    if parser not in ("sweeper", "dcgm", "nccl"):
        return _read_other(log or message, node, now, parser, exit_code, parser_args)
    if parser == "dcgm":  # the readers of other tools' output are imported by the checks that use them
        from sweeper.parsers import dcgm

        expect = parser_args.get("expect_gpus")
        return dcgm.parse(log or message, node, now, exit_code=exit_code,
                          expect_gpus=None if expect in (None, "") else int(expect))
    if parser == "nccl":
        from sweeper.parsers import nccl

        floor = parser_args.get("min_busbw")
        return nccl.parse(log or message, node, now, min_busbw=None if floor in (None, "") else float(floor),
                          exit_code=exit_code)
    result = sweeper_result.parse(log, node, now)
    if result.status == "error" and result.checks[0].code != sweeper_result.OVERSIZE and message.strip() \
            and message.strip() not in log:
        result = _summary(result, log, message, node, now)
    crashed = exit_code not in (None, 0, 1)  # 1 is the check's own "findings"
    if crashed and result.status == "error":
        return error_result(node, "sweeper", f"the check exited {exit_code} ({term.get('reason', '')}): "
                            f"{result.checks[0].message}", now, code=f"exit {exit_code}")
    if exit_code not in (None, 0) and result.status in ("pass", "warn", "skip"):
        return error_result(node, "sweeper", f"the check exited {exit_code} but reported {result.status}", now,
                            code=f"exit {exit_code}")
    return result


def _summary(unread: Result, log: str, message: str, node: str, now: float) -> Result:
    """The check's short form, its termination message, when its log cannot be read. Where there is
    no log (gone with its node's log files) the summary is the result. Where there is one and it is
    unreadable, the summary may say the node failed, never that it passed: a log no reader
    recognises is `error`, and a pass written beside it is no proof of one."""
    summary = sweeper_result.parse_summary(message, node, now)
    if not log.strip() or summary.status == "fail":
        return summary
    if summary.status == "error":
        return unread
    first = unread.checks[0]
    return error_result(node, "sweeper", f"{first.message}; its termination message says {summary.status}, "
                        "which an unreadable log does not bear out", now, code=first.code)


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
    node = str(ctx.node.get("name", ""))

    def result(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        return _read_result(ctx, namespace, pods, node, args["parser"], args["parser_args"] or {})

    with watched(ctx, namespace, name) as source, job_created(ctx, namespace, job):
        outcome = follow(ctx, source, Shape(node), timeout, args["abortable"] and holds_gpus(job, ctx.config), result)
    return answer(ctx, name, outcome)
