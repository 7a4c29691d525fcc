"""The objects of the deployable manifests: the controller's pod, the CronJob, the serve Deployment
and what sits beside them, and the one images list they are filled from."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sweeper.clock import parse_duration
from sweeper.config import Config, home, manifest_config
from sweeper.errors import ConfigError
from sweeper.playbook.model import Playbook, Task
from sweeper.templating import render as render_template

DIRECTORIES = {"playbooks": "sweeper-playbooks", "job-templates": "sweeper-job-templates",
               "profiles": "sweeper-profiles", "policies": "sweeper-policies"}
NAMESPACE = "sweeper"
IMAGE = "ghcr.io/sweeper-dev/sweeper:0.1.0"  # the controller's repository and tag; its digest: the images list
# The config keys that name an image; each is filled from the entry of deploy/base/kustomization.yaml's
# `images:` whose name is the repository of the key's default (the controller runs check_image's).
IMAGE_KEYS = ("check_image", "nccl_image", "pair_image", "dcgm_image", "reboot_image")
# The history's volume per controller: different names, so a CronJob and a Deployment never write one file.
STATE_CLAIMS = {"cronjob": "sweeper-state", "serve": "sweeper-serve-state"}
# The storage class each platform's own CSI driver serves. EKS: no class is the default since 1.30;
# deploy/eks/storageclass-gp3.yaml makes `gp3` for the EBS CSI driver
# (https://docs.aws.amazon.com/eks/latest/userguide/ebs-csi.html). AKS: `managed-csi`, Azure Disk CSI
# (https://learn.microsoft.com/azure/aks/azure-disk-csi). GKE: `standard-rwo`, Compute Engine PD CSI
# (https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/gce-pd-csi-driver).
PLATFORMS = {"eks": "gp3", "aks": "managed-csi", "gke": "standard-rwo"}
GP3 = "eks/storageclass-gp3.yaml"
# Where system pods run: AKS system node pools and many EKS add-on node groups carry
# CriticalAddonsOnly=true:NoSchedule (https://learn.microsoft.com/azure/aks/use-system-pools).
# Tolerating it lets the controller run there; it does not keep it off other nodes.
SYSTEM_TOLERATIONS = ({"key": "CriticalAddonsOnly", "operator": "Exists"},)
MARGIN = 900.0  # API work, scheduling and image pulls around the Jobs of one run
# Node labels that mark a GPU node before any pod looks at its capacity: the GPU Operator's feature
# discovery (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-feature-discovery.html),
# Karpenter on AWS, set only on instance types with GPUs (karpenter-provider-aws,
# pkg/providers/instancetype: the instance-gpu-count requirement is added where the type has GPUs),
# GKE (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus) and AKS
# (https://learn.microsoft.com/azure/aks/gpu-cluster). On EKS managed node groups none of these need
# be present, so the instance types of profiles/ are kept out by name too.
GPU_NODE_LABELS = ("nvidia.com/gpu.present", "karpenter.k8s.aws/instance-gpu-count",
                   "cloud.google.com/gke-accelerator", "kubernetes.azure.com/accelerator")
# Where the metrics scraper runs: the only namespace the NetworkPolicy lets reach `sweeper serve`.
METRICS_NAMESPACE = "monitoring"
WEBHOOK_SECRET = "sweeper-webhook"  # optional Secret, key `url`, read as $SWEEPER_WEBHOOK_URL


@dataclass(frozen=True)
class Options:
    """What differs between clusters: the history's storage class and where the controller runs."""

    storage_class: str = ""  # none: the cluster's default StorageClass
    tolerations: tuple[dict[str, str], ...] = SYSTEM_TOLERATIONS
    node_selector: dict[str, str] = field(default_factory=dict)
    image: str = ""  # the controller's and the checks' image; "": the images list's
    metrics_namespace: str = METRICS_NAMESPACE
    platform: str = ""  # written into the config's `platform` when named (else it stays `auto`)


# -- the CronJob's deadline -------------------------------------------------------------------------------
def _resolved_vars(playbook: Playbook, config: Config, level: int = 2) -> dict[str, Any]:
    """The playbook's vars, each templated with the others (a var may name another, as dcgm_timeout
    names dcgm_level), with `default_dcgm_level` as a run would give it."""
    scope: dict[str, Any] = {"check_timeout": config.check_timeout, "default_dcgm_level": level, **playbook.vars}
    for _ in range(5):  # in order, each var rendered with those already rendered before it
        for k, v in list(scope.items()):
            if isinstance(v, str) and "{" in v:
                scope[k] = render_template(v, scope, playbook.source)
    return scope


def _job_seconds(tasks: tuple[Task, ...], scope: dict[str, Any]) -> float:
    total = 0.0
    for t in tasks:
        total += _job_seconds(t.block, scope) + _job_seconds(t.rescue, scope) + _job_seconds(t.always, scope)
        if t.action in ("run_job", "run_pair_job"):
            fallback = "30m" if t.action == "run_pair_job" else scope.get("check_timeout")  # run_pair_job's default
            raw = t.args.get("timeout", t.timeout if t.timeout is not None else fallback)
            total += parse_duration(render_template(raw, scope, t.where))
    return total


def playbook_seconds(config: Config, name: str, level: int = 2) -> float:
    """The longest one node can spend in a playbook at DCGM level `level`: the sum of its Jobs' timeouts."""
    from sweeper.actions import load_all
    from sweeper.playbook.executor import load

    book = load(str(config.path("playbooks") / name), load_all())
    return _job_seconds(book.tasks, _resolved_vars(book, config, level))


def _highest_level(config: Config) -> int:
    """The highest DCGM level a run without a level of its own may use: the config's, else the
    highest a profile names, else 2 (`Config.dcgm_level_for`)."""
    if config.dcgm_level:
        return int(config.dcgm_level)
    from sweeper import profiles as prof

    try:
        levels = [p.dcgm_level for p in prof.load_profiles(config.path("profiles")).values() if p.dcgm_level]
    except (OSError, ValueError):
        levels = []
    return max([2, *levels])


def deadline_seconds(config: Config) -> int:
    """activeDeadlineSeconds of a CronJob run: longer than the longest playbook it (`playbook`) or any
    of the config's `schedules` runs, beside the light checks, plus the wait for a replaced node and a
    margin; rounded up to whole minutes."""
    level = _highest_level(config)
    runs = [(config.playbook, level)] + [(str(s.get("playbook") or config.playbook), int(s.get("dcgm_level") or level))
                                         for s in config.schedules]
    longest = max(playbook_seconds(config, n, lv) for n, lv in runs)
    light = playbook_seconds(config, config.light_playbook, level) if config.light_playbook else 0.0
    # A run that keeps taking nodes until a deadline of its own (`run_deadline`, where the config has
    # it) may start its longest playbook just before that deadline.
    rolling = float(getattr(config, "run_deadline", 0) or 0)
    total = rolling + max(longest, light) + config.replacement_wait + MARGIN
    return int(math.ceil(total / 60.0) * 60)


# -- the documents ----------------------------------------------------------------------------------------
def configmaps(root: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for directory, name in DIRECTORIES.items():
        files = sorted(p for p in (root / directory).iterdir() if p.is_file() and not p.name.startswith("."))
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NAMESPACE,
                                 "labels": {"app.kubernetes.io/name": "sweeper"}},
                    "data": {p.name: p.read_text() for p in files}})
    return out


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sweeper", "app.kubernetes.io/component": component}


def state_claim(mode: str, opts: Options) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}}
    if opts.storage_class:  # else the cluster's default class (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#class-1)
        spec["storageClassName"] = opts.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": STATE_CLAIMS[mode], "namespace": NAMESPACE, "labels": _labels(mode)},
            "spec": spec}


def gpu_instance_types(root: Path) -> list[str]:
    """The instance types that profiles/ names: GPU nodes, whatever their labels."""
    from sweeper import profiles as prof

    return sorted({t for p in prof.load_profiles(root / "profiles").values() for t in p.instance_types})


def off_gpu_nodes(root: Path) -> dict[str, Any]:
    """Node affinity that keeps the controller off the GPU nodes it may reboot: no GPU label of any
    platform, and not one of the profiles' instance types (expressions of one term are ANDed; an absent
    label satisfies DoesNotExist and NotIn:
    https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#node-affinity)."""
    exprs: list[dict[str, Any]] = [{"key": k, "operator": "DoesNotExist"} for k in GPU_NODE_LABELS]
    exprs.append({"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": gpu_instance_types(root)})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": exprs}]}}}


def pod_template(mode: str, opts: Options, root: Path | None = None) -> dict[str, Any]:
    """The controller's pod: non-root, read-only root, requests and limits, admitted at the `restricted`
    Pod Security level, off the GPU nodes, never disrupted by Karpenter while it holds nodes
    (https://karpenter.sh/docs/concepts/disruption/#pod-level-controls), tolerating the system pools'
    taint and no GPU taint."""
    serve = mode == "serve"
    # serve listens on loopback unless told: the kubelet's probes and the Service reach the pod's IP, so it
    # listens there (the downward API's status.podIP, expanded in the command), never on 0.0.0.0
    command = ["sweeper", "serve", "--address", "$(POD_IP)", "--port", "8080"] if serve else ["sweeper", "sweep"]
    command += ["--config", "/etc/sweeper/config.yaml", "--state", "/var/lib/sweeper/history.db"]
    container: dict[str, Any] = {
        "name": "sweeper", "image": opts.image, "command": command,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "env": [{"name": "HOME", "value": "/tmp"},
                # the webhook URL is a credential: from a Secret, never the ConfigMap (optional: none, no webhook)
                {"name": "SWEEPER_WEBHOOK_URL", "valueFrom": {"secretKeyRef": {
                    "name": WEBHOOK_SECRET, "key": "url", "optional": True}}}],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/sweeper/config.yaml", "subPath": "config.yaml", "readOnly": True},
            *({"name": d, "mountPath": f"/etc/sweeper/{d}", "readOnly": True} for d in DIRECTORIES),
            {"name": "state", "mountPath": "/var/lib/sweeper"},
            {"name": "tmp", "mountPath": "/tmp"}]}
    if serve:
        container["env"].append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        container["ports"] = [{"name": "http", "containerPort": 8080}]
        probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 30}
        container["readinessProbe"] = probe
        container["livenessProbe"] = {**probe, "failureThreshold": 4}
    spec: dict[str, Any] = {
        "serviceAccountName": "sweeper",
        "restartPolicy": "Always" if serve else "Never",
        "terminationGracePeriodSeconds": 120,  # time to hand held nodes back on SIGTERM
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "affinity": off_gpu_nodes(root or home()),
        "tolerations": [dict(t) for t in opts.tolerations],
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": "sweeper-config"}},
                    *({"name": d, "configMap": {"name": n}} for d, n in DIRECTORIES.items()),
                    {"name": "state", "persistentVolumeClaim": {"claimName": STATE_CLAIMS[mode]}},
                    {"name": "tmp", "emptyDir": {}}]}
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if not spec["tolerations"]:
        del spec["tolerations"]
    return {"metadata": {"labels": _labels("serve" if serve else "controller"),
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": spec}


def cronjob(config: Config, opts: Options, suspend: bool = False, root: Path | None = None) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "sweeper", "namespace": NAMESPACE, "labels": _labels("controller")},
            "spec": {"schedule": "*/30 * * * *", "suspend": suspend,
                     "concurrencyPolicy": "Forbid",  # never two sweeps at once
                     "startingDeadlineSeconds": 600, "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 5,
                     "jobTemplate": {"spec": {
                         "backoffLimit": 0,  # a failed run is picked up by the next one, not retried blindly
                         "activeDeadlineSeconds": deadline_seconds(config),
                         "template": pod_template("cronjob", opts, root)}}}}


def deployment(opts: Options, replicas: int = 1, root: Path | None = None) -> dict[str, Any]:
    """`sweeper serve`: one replica, and Recreate, so the old pod has stopped before the new one opens
    the history (https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#recreate-deployment)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "sweeper", "namespace": NAMESPACE, "labels": _labels("serve")},
            "spec": {"replicas": replicas, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": _labels("serve")},
                     "template": pod_template("serve", opts, root)}}


def service() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "sweeper", "namespace": NAMESPACE, "labels": _labels("serve")},
            "spec": {"selector": _labels("serve"), "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]}}


def history_reader_role() -> dict[str, Any]:
    """Who may read the history `sweeper serve` keeps, from a laptop (`sweeper nodes`, `history`,
    `report` through the API server's service proxy; sweeper.remote). Bound by the cluster's admin."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "sweeper-history-reader", "namespace": NAMESPACE, "labels": _labels("serve")},
            "rules": [{"apiGroups": [""], "resources": ["services/proxy"], "resourceNames": ["sweeper", "sweeper:http"],
                       "verbs": ["get"]}]}


def network_policy(opts: Options) -> dict[str, Any]:
    """Sweeper's pods accept connections only from the metrics namespace, on the http port. The
    kubelet's probes come from the node, which a NetworkPolicy always lets through
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "sweeper", "namespace": NAMESPACE, "labels": _labels("serve")},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "sweeper"}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                         "kubernetes.io/metadata.name": opts.metrics_namespace}}}],
                                  "ports": [{"protocol": "TCP", "port": "http"}]}]}}


def _config_of(base: str) -> Config:
    """The configuration the base's ConfigMap holds, with the repository's playbooks."""
    return manifest_config(base)


def _dump(comment: str, doc: Any) -> str:
    return f"# {comment}\n" + yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True).rstrip("\n")


# -- the images and the config ------------------------------------------------------------------------------
def repository(ref: str) -> str:
    """An image reference without its digest and tag: `ghcr.io/a/b:1@sha256:..` is `ghcr.io/a/b`."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def image_ref(entry: dict[str, Any]) -> str:
    """What Kustomize writes for one `images:` entry (newName, then :newTag, then @digest:
    https://kubectl.docs.kubernetes.io/references/kustomize/kustomization/images/)."""
    ref = str(entry.get("newName") or entry["name"])
    if entry.get("newTag"):
        ref += f":{entry['newTag']}"
    if entry.get("digest"):
        ref += f"@{entry['digest']}"
    return ref


def images(root: Path | None = None) -> dict[str, str]:
    """Each image key of the config to its reference in deploy/base/kustomization.yaml's `images:` list."""
    path = (root or home()) / "deploy" / "base" / "kustomization.yaml"
    try:
        listed = yaml.safe_load(path.read_text()).get("images") or []
    except (OSError, yaml.YAMLError, AttributeError) as exc:
        raise ConfigError(f"{path}: the Kustomize base with the `images:` list cannot be read: {exc}") from exc
    by_name = {str(e["name"]): image_ref(e) for e in listed}
    defaults = Config()
    out = {}
    for key in IMAGE_KEYS:
        name = repository(getattr(defaults, key))
        if name not in by_name:
            raise ConfigError(f"{path}: `images:` has no {name} (the config's {key})")
        out[key] = by_name[name]
    return out


def set_key(text: str, key: str, value: str, indent: int = 4) -> str:
    """`key: value` in the config block of a manifest, keeping what follows the value on its line."""
    text, n = re.subn(rf"(?m)^({' ' * indent}{re.escape(key)}: )\S+", lambda m: m.group(1) + value, text)
    if n != 1:
        raise ConfigError(f"deploy/base.yaml: the config has no single `{key}:` line to set")
    return text


def base_text(root: Path, opts: Options, remediation: str = "") -> str:
    """deploy/base.yaml with the images list, and the platform and remediation provider if named,
    written into its config."""
    base = (root / "deploy" / "base.yaml").read_text()
    pinned = images(root)
    if opts.image:
        pinned["check_image"] = opts.image
    for key, ref in pinned.items():
        base = set_key(base, key, ref)
    if opts.platform:
        base = set_key(base, "platform", opts.platform)
    if remediation:
        base = set_key(base, "default", remediation, indent=6)
    return base


def render(root: Path | None = None, mode: str = "cronjob", opts: Options | None = None) -> str:
    root = root or home()
    opts = opts or Options()
    base = base_text(root, opts)
    config = _config_of(base)
    opts = replace(opts, image=config.check_image)  # the controller runs the checks' image
    config = replace(config, playbook_dir=str(root / "playbooks"))
    other = "deploy/cronjob.yaml" if mode == "serve" else "deploy/serve/serve.yaml"
    parts = [base.rstrip("\n"),
             _dump(f"The history (SQLite) of the {mode} controller, on the storage class's volume; its own "
                   f"name, so the other controller never writes it.", state_claim(mode, opts))]
    if mode == "serve":
        parts += [_dump("`sweeper serve`: the one writer of its history, sweeping on the config's schedules.",
                        deployment(opts, root=root)),
                  _dump("/metrics, /healthz, the fleet report, and the history read-only under /api/v1/.", service()),
                  _dump("Read the history from a laptop (get services/proxy on this Service only); bind it to "
                        "your readers: kubectl create rolebinding sweeper-history-readers -n sweeper "
                        "--role sweeper-history-reader --group GROUP", history_reader_role()),
                  _dump(f"Switched off here, so that applying this file over {other} leaves one controller.",
                        cronjob(config, opts, suspend=True, root=root))]
    else:
        parts += [_dump("One sweep every 30 minutes; the deadline is derived from the config (python -m "
                        "sweeper.manifests).", cronjob(config, opts, root=root)),
                  _dump(f"Switched off here, so that applying this file over {other} leaves one controller.",
                        deployment(opts, replicas=0, root=root))]
    parts.append(_dump(f"Only the {opts.metrics_namespace} namespace reaches Sweeper's pods, on the http port.",
                       network_policy(opts)))
    for cm in configmaps(root):
        parts.append(_dump(f"{cm['metadata']['name']}: generated from "  # type: ignore[index]
                           f"{cm['metadata']['name'].split('-', 1)[1]}/", cm))  # type: ignore[index]
    return "\n---\n".join(parts) + "\n"


# -- the overlays -------------------------------------------------------------------------------------------
