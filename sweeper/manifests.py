"""The deployable manifests, generated so that what runs in the cluster is what the repository holds:

    python -m sweeper.manifests > deploy/cronjob.yaml              # the CronJob (`sweeper sweep`)
    python -m sweeper.manifests serve > deploy/serve/serve.yaml    # or a Deployment (`sweeper serve`)
    python -m sweeper.admission > deploy/admission-policy.yaml        # what Sweeper's account may write
    python -m sweeper.manifests overlays                           # deploy/eks, aks, gke, gpu-operator

Each is the hand-written `deploy/base.yaml` (namespace, RBAC, configuration), the history's volume,
the controller, and one ConfigMap per directory Sweeper reads (playbooks, job templates, profiles,
policies). Every image comes from one list, `images:` in deploy/base/kustomization.yaml (the Kustomize
base), and is written into the config's image keys as well as the controller's pod. Options name the
storage class of the history's volume (`--platform`, `--storage-class`) and where the controller pod
may run (`--toleration`, `--node-selector`).

The overlays (`kubectl apply -k deploy/eks`) are that base plus, per platform, a config that names
the platform and remediation provider, the history's storage class, and the RBAC and admission policy
that provider needs. They are generated here too, so that the platform is set in one place.

The history has one writer. The two controllers use volumes of different names, so they never share
one, and each manifest carries the other controller switched off (the CronJob suspended, the
Deployment at zero replicas): applying one after the other leaves exactly one of them sweeping.

The CronJob's `activeDeadlineSeconds` is derived from the configuration: the longest playbook it or
a schedule runs (the sum of its Jobs' timeouts, templated with the playbook's vars), the light
checks beside it, the wait for a replaced node, and a margin."""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sweeper.clock import parse_duration
from sweeper.config import Config, home, manifest_config
from sweeper.errors import ConfigError, SweeperError
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
@dataclass(frozen=True)
class Overlay:
    """One `kubectl apply -k deploy/NAME`: the base with the platform's config, storage class and the
    RBAC its remediation provider needs. `copies`: files of deploy/ the overlay holds a copy of
    (Kustomize reads no file outside an overlay's folder), by the name they get there."""

    name: str
    platform: str
    storage_class: str
    remediation: str
    says: str
    resources: tuple[str, ...] = ()
    copies: tuple[tuple[str, str], ...] = ()


OVERLAYS = (
    # EKS: the EBS CSI driver's gp3 (made by the overlay: no class is the default since 1.30), and a
    # replace verdict deletes the node's NodeClaim (Karpenter); a node that no NodeClaim names (a
    # managed node group) is held for a person. No AWS credentials are needed for that; the asg
    # provider needs an IAM role (docs/deploy.md: irsa.yaml, or a Pod Identity association).
    Overlay("eks", "eks", PLATFORMS["eks"], "karpenter",
            "Sweeper on Amazon EKS: gp3 volume, replacement through Karpenter",
            resources=("storageclass-gp3.yaml",), copies=(("rbac-karpenter.yaml", "rbac-karpenter.yaml"),)),
    Overlay("aks", "aks", PLATFORMS["aks"], "manual", "Sweeper on Azure AKS: managed-csi volume, a person replaces"),
    Overlay("gke", "gke", PLATFORMS["gke"], "manual", "Sweeper on Google GKE: standard-rwo volume, a person replaces"),
    # Any cluster whose GPUs the NVIDIA GPU Operator runs: RuntimeClass `nvidia` (platform generic), the
    # cluster's default StorageClass, and leave to restart the Operator's device plugin.
    Overlay("gpu-operator", "generic", "", "manual",
            "Sweeper on a cluster with the NVIDIA GPU Operator: RuntimeClass nvidia, the default storage class",
            copies=(("device-plugin/gpu-operator.yaml", "device-plugin.yaml"),)),
)
CONFIG_NAME = "sweeper-config"
IRSA = """# Optional, for the asg provider with IAM roles for service accounts (IRSA,
# https://docs.aws.amazon.com/eks/latest/userguide/associate-service-account-role.html): put your role's
# ARN here and list this file under `patches:` in kustomization.yaml. With EKS Pod Identity
# (https://docs.aws.amazon.com/eks/latest/userguide/pod-id-association.html) no annotation is needed:
# associate the role with service account sweeper/sweeper instead. deploy/eks/iam-policy.json is the
# role's policy.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: sweeper
  namespace: sweeper
  annotations:
    eks.amazonaws.com/role-arn: arn:aws:iam::111122223333:role/sweeper
"""


def _policy_patches(root: Path, config: Config) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """JSON patches (RFC 6902) that turn the base's admission policies into those of `config` (the
    NodeClaim policy follows `remediation`), by the policy's kind and name."""
    from sweeper.admission import render_policies

    def by_name(text: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}

    base = by_name((root / "deploy" / "admission-policy.yaml").read_text())
    out = {}
    for key, doc in by_name(render_policies(root, config)).items():
        ops = [{"op": "replace", "path": f"/{part}", "value": doc[part]} for part in ("metadata", "spec")
               if (base.get(key) or {}).get(part) != doc[part]]
        if ops:
            out[key] = ops
    return out


def overlay_files(root: Path | None = None) -> dict[str, str]:
    """Every file of the overlays, by its path under deploy/."""
    root = root or home()
    deploy = root / "deploy"
    out: dict[str, str] = {}
    for name in ("cronjob.yaml", "admission-policy.yaml"):
        out[f"base/{name}"] = (f"# A copy of deploy/{name}, written by `python -m sweeper.manifests overlays`: the "
                               f"Kustomize base reads it here.\n" + (deploy / name).read_text())
    for ov in OVERLAYS:
        opts = Options(storage_class=ov.storage_class, platform=ov.platform)
        base = base_text(root, opts, ov.remediation)
        cm = next(d for d in yaml.safe_load_all(base) if d and d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == CONFIG_NAME)
        config_yaml = cm["data"]["config.yaml"]
        config = replace(_config_of(base), playbook_dir=str(root / "playbooks"))
        out[f"{ov.name}/config.yaml"] = (
            f"# The config of `kubectl apply -k deploy/{ov.name}`, the ConfigMap {CONFIG_NAME}: deploy/base.yaml's "
            f"with\n# platform: {ov.platform}, remediation {ov.remediation} and deploy/base/kustomization.yaml's images. "
            f"Generated by\n# `python -m sweeper.manifests overlays`; in a copy of this overlay, edit it freely.\n"
            + config_yaml)
        for source, name in ov.copies:
            out[f"{ov.name}/{name}"] = (f"# A copy of deploy/{source}, written by `python -m sweeper.manifests "
                                        f"overlays` (Kustomize reads no file outside an overlay's folder).\n"
                                        + (deploy / source).read_text())
        patches: list[dict[str, Any]] = []
        if ov.storage_class:
            out[f"{ov.name}/storage-class.yaml"] = _dump(
                f"The history's volume on {ov.storage_class}.", [  # type: ignore[arg-type]
                    {"op": "add", "path": "/spec/storageClassName", "value": ov.storage_class}]) + "\n"
            patches.append({"path": "storage-class.yaml",
                            "target": {"kind": "PersistentVolumeClaim", "name": STATE_CLAIMS["cronjob"]}})
        for (kind, name), ops in _policy_patches(root, config).items():
            out[f"{ov.name}/{name}.yaml"] = _dump(f"{kind} {name} as `remediation` here needs it (python -m "
                                                  f"sweeper.admission, with this config).", ops) + "\n"
            patches.append({"path": f"{name}.yaml", "target": {"kind": kind, "name": name}})
        kust: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["../base", *ov.resources, *(name for _, name in ov.copies)],
            "configMapGenerator": [{"name": CONFIG_NAME, "namespace": NAMESPACE, "behavior": "replace",
                                    "files": ["config.yaml"], "options": {"disableNameSuffixHash": True}}]}
        if patches:
            kust["patches"] = patches
        head = (f"# {ov.says}.\n#   kubectl apply -k deploy/{ov.name}\n# The base (deploy/base/kustomization.yaml, "
                f"its images list included) with config.yaml here as the ConfigMap\n# {CONFIG_NAME}. Generated "
                f"by `python -m sweeper.manifests overlays`: a test fails when it is stale. To change\n# it for "
                f"your cluster, make an overlay of your own over this one (docs/deploy.md).\n")
        if ov.name == "eks":
            out["eks/irsa.yaml"] = IRSA
            head += "# The asg provider with IRSA: add `- path: irsa.yaml` under patches (irsa.yaml says how).\n"
        out[f"{ov.name}/kustomization.yaml"] = head + yaml.safe_dump(kust, sort_keys=False, width=120)
    return out


def _write(path: Path, text: str) -> Path:
    """Through a temporary file, so that a failure leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def _yaml_scalar(value: str) -> str:
    return yaml.safe_dump(value, width=1000).splitlines()[0]


def set_images(root: Path, assignments: list[str]) -> None:
    """`NAME=NEWNAME[:TAG][@DIGEST]` into the images list, as `kustomize edit set image` writes it
    (https://kubectl.docs.kubernetes.io/references/kustomize/cmd/edit/): newName where it differs from
    the name, newTag, digest. The comments above the list are kept."""
    path = root / "deploy" / "base" / "kustomization.yaml"
    text = path.read_text()
    head, sep, _ = text.partition("\nimages:\n")
    listed = yaml.safe_load(text).get("images") or []
    if not sep:
        raise ConfigError(f"{path}: no `images:` list")
    for assignment in assignments:
        name, eq, ref = assignment.partition("=")
        entry = next((e for e in listed if e["name"] == name), None)
        if not eq or entry is None:
            raise ConfigError(f"--set-image {assignment!r}: NAME=NEWNAME[:TAG]@DIGEST, NAME one of "
                              f"{', '.join(e['name'] for e in listed)}")
        image, _, digest = ref.partition("@")
        repo = repository(image)
        entry.clear()
        entry["name"] = name
        if repo != name:
            entry["newName"] = repo
        if image[len(repo) + 1:]:
            entry["newTag"] = image[len(repo) + 1:]
        if digest:
            entry["digest"] = digest
    lines = []
    for e in listed:
        lines += [f"  - name: {_yaml_scalar(e['name'])}"]
        lines += [f"    {k}: {_yaml_scalar(str(v))}" for k, v in e.items() if k != "name"]
    _write(path, head + "\nimages:\n" + "\n".join(lines) + "\n")


def write_deploy(root: Path | None = None) -> list[Path]:
    """Every generated file of deploy/, in the order they read each other: the two controllers'
    manifests, the admission policy (from the CronJob's config), then the base's copies and the
    overlays."""
    from sweeper.admission import render_policies

    root = root or home()
    deploy = root / "deploy"
    written = [_write(deploy / "cronjob.yaml", render(root, "cronjob")),
               _write(deploy / "serve" / "serve.yaml", render(root, "serve")),
               _write(deploy / "admission-policy.yaml", render_policies(root))]
    files = overlay_files(root)  # all rendered before any is written
    return written + [_write(deploy / rel, text) for rel, text in files.items()]


# -- the command ----------------------------------------------------------------------------------------
def _toleration(spec: str) -> dict[str, str]:
    """KEY, KEY=VALUE, KEY:EFFECT or KEY=VALUE:EFFECT, as in `kubectl taint`."""
    head, _, effect = spec.partition(":")
    key, eq, value = head.partition("=")
    if not key:
        raise ConfigError(f"--toleration {spec!r}: KEY[=VALUE][:EFFECT]")
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if effect:
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ConfigError(f"--toleration {spec!r}: the effect is NoSchedule, PreferNoSchedule or NoExecute")
        tol["effect"] = effect
    return tol


def options(argv: list[str]) -> tuple[str, Options]:
    ap = argparse.ArgumentParser(prog="python -m sweeper.manifests", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", choices=("cronjob", "serve", "overlays"), default="cronjob",
                    help="print the CronJob's or the serve Deployment's manifest, or write every generated file "
                         "of deploy/ (both manifests, the admission policy, deploy/base and the overlays "
                         "deploy/<platform>; the options below but --set-image do not apply to it)")
    ap.add_argument("--platform", choices=sorted(PLATFORMS),
                    help="the config's `platform` (default: auto, read from the cluster) and the storage class "
                         "of the platform's own CSI driver (eks: gp3; aks: managed-csi; gke: standard-rwo; "
                         "default: the cluster's default class)")
    ap.add_argument("--storage-class", help="the history volume's storage class, whatever the platform")
    ap.add_argument("--toleration", action="append", metavar="KEY[=VALUE][:EFFECT]",
                    help="a taint the controller tolerates (repeatable; default: CriticalAddonsOnly)")
    ap.add_argument("--node-selector", action="append", metavar="KEY=VALUE", default=[],
                    help="a label the controller's node must carry (repeatable)")
    ap.add_argument("--image", default="", help="the controller's and the check Jobs' image, pinned by digest "
                                                "(default: deploy/base/kustomization.yaml's images list)")
    ap.add_argument("--metrics-namespace", default=METRICS_NAMESPACE,
                    help="the one namespace whose pods may reach `sweeper serve` (default: monitoring)")
    ap.add_argument("--set-image", action="append", default=[], metavar="NAME=NEWNAME[:TAG]@DIGEST",
                    help="overlays: first set an entry of deploy/base/kustomization.yaml's images list, as "
                         "`kustomize edit set image` does (repeatable)")
    a = ap.parse_args(argv)
    selector = {}
    for s in a.node_selector:
        k, eq, v = s.partition("=")
        if not k or not eq:
            raise ConfigError(f"--node-selector {s!r}: KEY=VALUE")
        selector[k] = v
    tolerations = tuple(_toleration(t) for t in a.toleration) if a.toleration else SYSTEM_TOLERATIONS
    return a.mode, Options(storage_class=a.storage_class or PLATFORMS.get(a.platform or "", ""), tolerations=tolerations,
                           node_selector=selector, image=a.image, metrics_namespace=a.metrics_namespace,
                           platform=a.platform or "")


def main(argv: list[str] | None = None) -> int:
    try:
        args = sys.argv[1:] if argv is None else argv
        mode, opts = options(args)
        pre = argparse.ArgumentParser(add_help=False)
        pre.add_argument("--set-image", action="append", default=[])
        set_image: list[str] = pre.parse_known_args(args)[0].set_image
        if mode == "overlays":
            if set_image:
                set_images(home(), set_image)
            for path in write_deploy():
                print(f"wrote {path}")
        else:
            print(render(mode=mode, opts=opts), end="")
    except SweeperError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
