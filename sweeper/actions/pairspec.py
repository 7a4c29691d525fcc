"""What a pair is and what its answer says: the fabric devices both pods request, the bus bandwidth
floor it is held to, what a rendered pair template (a headless Service and an Indexed Job, or one
MPIJob) must hold, and the `busbw` a pair's registered result carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sweeper.actions import ActionContext
from sweeper.actions.follow import Outcome, answer
from sweeper.errors import PlaybookError
from sweeper.parsers import pair as pair_parser

MPIJOB_API = "kubeflow.org/v2beta1"


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
    if variables.get("gpu_claims"):  # a DRA node's GPUs: the pod claims them, and a container uses the claim
        used = {str(u.get("name")) for c in containers for u in (c.get("resources") or {}).get("claims") or []
                if isinstance(u, dict)}
        if pod.get("resourceClaims") != variables["gpu_claims"] or not {c["name"] for c in variables["gpu_claims"]} <= used:
            return (f"{what}: on DRA nodes each pod claims all of its node's GPUs: resourceClaims: "
                    "{{ gpu_claims | tojson }}, and the container's resources.claims names them")
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
                  for k in ((c.get("resources") or {}).get(part) or {}) if k in variables["all_gpus"] or k == "nvidia.com/gpu"
                  or k in variables["fabric_resources"]})
    if launcher.get("resourceClaims"):
        gpu.append("resourceClaims")
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


def pair_answer(ctx: ActionContext, name: str, outcome: Outcome) -> dict[str, Any]:
    """A pair's registered result: the task's (follow.answer), with the pair's bus bandwidth."""
    if outcome.result is None:
        return answer(ctx, name, outcome, result=None, busbw=None)
    return answer(ctx, name, outcome, busbw=pair_parser.busbw(outcome.result))
