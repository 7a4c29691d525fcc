"""Sweeper's configuration: one YAML file, strict keys, every safety limit with a default.

Each key is declared once below, with `setting()`: type, default, range, unit and help. That one
declaration drives the loader, the `file:line` messages, `sweeper lint --config` and
docs/configuration.md. The checking is pydantic v2's (see sweeper/schema/ for why pydantic), on a model derived
from the dataclass; the dataclass stays the object the code passes around.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from sweeper import resources
from sweeper.drivers import node_cuda_major
from sweeper.errors import ConfigError
from sweeper.schema import (
    Deferred,
    check,
    model_of,
    read_yaml,
    reference_table,
    runtime_values,
    setting,
)
from sweeper.schema.configshapes import PINNED as _PINNED
from sweeper.schema.configshapes import PINNED_WORDS as _PINNED_WORDS
from sweeper.schema.configshapes import config_shapes as _shapes

if TYPE_CHECKING:
    from pydantic import BaseModel


def home() -> Path:
    """Where playbooks/, job-templates/, profiles/ and policies/ live (see sweeper.resources)."""
    return resources.home()


PROVIDERS = ("karpenter", "asg", "manual")
PLATFORMS = ("auto", "generic", "eks", "aks", "gke")
# The runtime class a platform's GPU nodes need, unless `runtime_class` names one: the GPU Operator
# creates RuntimeClass `nvidia` (generic clusters); EKS's and AKS's GPU node images make NVIDIA's
# runtime containerd's default, and GKE's device plugin mounts the driver itself, so none is named there.
# https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html
# https://docs.aws.amazon.com/eks/latest/userguide/ml-eks-optimized-ami.html
# https://cloud.google.com/kubernetes-engine/docs/how-to/gpus#cuda
PLATFORM_RUNTIME_CLASS = {"generic": "nvidia", "eks": "", "aks": "", "gke": ""}
# `dcgm_hostengine`: auto (found with the platform), empty (the Job starts its own), `node` or
# `node:PORT` (the engine on the node's own address), or HOST:PORT.
_HOSTENGINE = r"^$|^auto$|^node(:[0-9]{1,5})?$|^[A-Za-z0-9.-]+:[0-9]{1,5}$"
_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a Kubernetes DNS-1123 label (namespaces, Lease names)
_NAME_WORDS = "a DNS-1123 label: lowercase letters, digits and '-'"
WEBHOOK_ENV = "SWEEPER_WEBHOOK_URL"  # the deploy sets it from the optional Secret sweeper-webhook
# Every image a Job runs is pinned by digest (a tag can be moved to other content after review):
# `name[:tag]@sha256:<64 hex>`. https://kubernetes.io/docs/concepts/containers/images/#image-names
# The digest of an image this project builds but has not published yet: no registry serves it, so a
# pull fails (a fault of the tool, never of the node) until the release or the deployment puts the
# pushed image's digest in its place; `sweeper lint --config` names every image that still carries it.
UNPUBLISHED = "sha256:" + "0" * 64
MiB = 1024 * 1024


@dataclass(frozen=True)
class Config:
    """Every key of the config file: its type, default, range and meaning (docs/configuration.md is made
    from this). Bounds: durations a sweep waits on must be > 0 (a zero timeout ends every check before
    it starts); windows and ages may be 0 where 0 means "none"; percents are 0..100."""

    namespace: str = setting("sweeper", "the controller's namespace: its Lease, control ConfigMap and Events",
                             pattern=_NAME, allowed=_NAME_WORDS)
    check_namespace: str = setting("sweeper-checks", "namespace of the check Jobs (and a pair's Service), at the Pod "
                                   "Security level they need (docs/security.md)", pattern=_NAME, allowed=_NAME_WORDS)
    remediation_namespace: str = setting("sweeper-remediation", "namespace of the reboot and GPU reset Jobs",
                                         pattern=_NAME, allowed=_NAME_WORDS)
    remediation_service_account: str = setting("sweeper-remediation", "service account of the reboot and GPU reset "
                                               "Jobs (no RBAC, no token mounted)", pattern=_NAME, allowed=_NAME_WORDS)
    prefix: str = setting("sweeper.dev", "prefix of Sweeper's taint, labels and annotations", min_length=1)
    cluster_name: str = setting("", "the name on every history row, so several clusters share one PostgreSQL "
                                "history (\"\": $SWEEPER_CLUSTER, else the kubeconfig context, else `default`)")
    state: str = setting("", "the history: a SQLite path or a postgresql:// URL, as --state (which wins, then "
                         "$SWEEPER_STATE, then this; \"\": state/<kubeconfig context>.db). Prefer $SWEEPER_STATE "
                         "from a Secret for a URL with a password")
    gpu_node_selector: str = setting("", "optional label selector narrowing the GPU nodes, which are found by capacity")
    gpu_resources: tuple[str, ...] = setting(("nvidia.com/gpu", "amd.com/gpu"), "resources that make a pod a GPU pod")
    gpu_resource_prefixes: tuple[str, ...] = setting(("nvidia.com/mig-",), "resource name prefixes that do too")
    dra_driver: str = setting("gpu.nvidia.com", "the DRA driver (and its DeviceClass) whose ResourceSlices make a node "
                              "a GPU node and whose claims make a pod a GPU pod; '' ignores DRA")
    allowed_taint_keys: tuple[str, ...] = setting(("nvidia.com/gpu", "amd.com/gpu"),
                                                  "taints that do not mean someone else has the node")
    opt_out_label: str = setting("sweeper.dev/opt-out", "a node with this label is never taken")
    max_nodes: int = setting(4, "nodes under sweep at once, counting those already held", ge=0)
    max_percent: float = setting(10.0, "share of GPU nodes under sweep at once", ge=0, le=100)
    run_deadline: float = setting(3600.0, "a run takes no new node after this long; nodes under test finish (0: none)",
                                  duration=True, ge=0)
    min_node_age: float = setting(600.0, "a younger node is left alone", duration=True, ge=0)
    interval: float = setting(86400.0, "a node is due again after this long", duration=True, gt=0)
    playbook: str = setting("sweep-light.yaml", "the full sweep of an idle node (in playbooks/)", min_length=1)
    pair_labels: tuple[str, ...] = setting(
        ("topology.kubernetes.io/zone", "topology.k8s.aws/network-node-layer-1",
         "topology.k8s.aws/network-node-layer-2", "topology.k8s.aws/network-node-layer-3"),
        "a pair playbook pairs nodes of one profile with equal values of these labels (absent on both: equal)")
    pair_known_good_window: float = setting(7 * 86400.0, "a node whose latest pair passed within this long is a "
                                            "known-good partner for re-pairing", duration=True, gt=0)
    check_image: str = setting(f"ghcr.io/sweeper-dev/sweeper:0.1.0@{UNPUBLISHED}",
                               "image of the check Jobs and the GPU reset", pattern=_PINNED, allowed=_PINNED_WORDS)
    dcgm_image: str = setting(f"nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04@{UNPUBLISHED}",
                              "image of dcgm-diag.yaml.j2 on a node whose driver's CUDA major dcgm_images does "
                              "not name, or cannot be told", pattern=_PINNED, allowed=_PINNED_WORDS)
    dcgm_images: dict[int, str] = setting(
        help="the DCGM image by the CUDA major the node's driver runs (GPU feature discovery's "
        "nvidia.com/cuda.runtime-version.major, else its driver branch: >= 580 is 13, >= 525 is 12, else the driver "
        "version Sweeper's node check last recorded): DCGM loads the build of that major only",
        factory=dict, annotation=Deferred(lambda: _shapes()["dcgm_images"]),
        allowed="{CUDA major: image pinned by digest}, e.g. {12: ...@sha256:..., 13: ...@sha256:...}")
    nccl_image: str = setting(f"ghcr.io/sweeper-dev/nccl-tests:2.19.6-cuda12.8@{UNPUBLISHED}",
                              "image of nccl-allreduce.yaml.j2", pattern=_PINNED, allowed=_PINNED_WORDS)
    pair_image: str = setting(f"ghcr.io/sweeper-dev/nccl-pair:25.01-py3@{UNPUBLISHED}",
                              "image of the pair templates (nccl-pair, nccl-pair-mpijob)", pattern=_PINNED,
                              allowed=_PINNED_WORDS)
    # Docker's official busybox 1.36 (the same manifest list on ECR Public's mirror of the official images).
    reboot_image: str = setting("public.ecr.aws/docker/library/busybox:1.36@sha256:"
                                "73aaf090f3d85aa34ee199857f03fa3a95c8ede2ffd4cc2cdb5b94e566b11662",
                                "image of the reboot Job (privileged, in the host's PID namespace)", pattern=_PINNED,
                                allowed=_PINNED_WORDS)
    allowed_images: tuple[str, ...] = setting((), "further images a job template may name (each pinned by digest); "
                                              "the images above (dcgm_images' too) are always allowed")
    check_timeout: float = setting(900.0, "deadline of a check Job", duration=True, gt=0)
    poll_interval: float = setting(5.0, "how often a running check is looked at when nothing changes (its watch "
                                        "wakes it at once); Jobs are listed this often where a watch is refused",
                                   duration=True, gt=0)
    job_ttl: float = setting(3600.0, "finished Jobs are deleted after this long", duration=True, ge=0)
    page_size: int = setting(500, "items per LIST page", ge=1)
    api_attempts: int = setting(6, "tries of one API call on 429, 5xx and dropped connections", ge=1)
    api_timeout: float = setting(70.0, "how long one API call waits on a silent apiserver", duration=True, gt=0)
    min_healthy_nodes: int = setting(0, "never take a node if fewer schedulable healthy GPU nodes would remain",
                                     ge=0)
    min_healthy_percent: float = setting(0.0, "the same floor as a share of GPU nodes", ge=0, le=100)
    max_attempts: int = setting(3, "a node that failed this often within attempt_window waits for a person", ge=1)
    attempt_window: float = setting(7 * 86400.0, "the window of max_attempts", duration=True, gt=0)
    breaker_failures: int = setting(5, "this many nodes with failing verdicts within breaker_window...", ge=1)
    breaker_percent: float = setting(20.0, "...or this share of GPU nodes, whichever is larger, opens the breaker",
                                     ge=0, le=100)
    breaker_window: float = setting(3600.0, "the window of the breaker", duration=True, gt=0)
    breaker_cooldown: float = setting(3600.0, "after a reset, one node at a time for this long", duration=True,
                                      ge=0)
    tool_error_limit: int = setting(3, "the same fault of the check on this many nodes stops the run (0: never)",
                                    ge=0)
    policy: str = setting("default.yaml", "how findings and history become a verdict (in policies/)", min_length=1)
    light_playbook: str = setting("light-busy.yaml", "the light check of busy nodes: read-only, never holds a node (\"\" to turn off)")
    light_interval: float = setting(6 * 3600.0, "how often a busy node gets the light check", duration=True, gt=0)
    light_max: int = setting(20, "light checks running at once (each busy node once a run)", ge=0)
    yield_to_pending: bool = setting(True, "take no node while GPU pods wait for capacity")
    abort_on_demand: bool = setting(False, "also stop running (abortable) checks then, only as many as the pending "
                                    "work needs (least progress first), and hand their nodes back")
    depth_ladder: tuple[dict[str, Any], ...] = setting(
        (), "playbooks from light to deep, each with how long it holds a node (soak included): a node gets the "
        "deepest that fits its pool's idle window (docs/how-it-works.md); empty: `playbook` always (and a `serve` "
        "schedule that names its own playbook or dcgm_level runs that)",
        annotation=Deferred(lambda: _shapes()["depth_ladder"]), allowed="list of {name, playbook, duration, dcgm_level}")
    depth_quantile: float = setting(0.2, "the idle window is this quantile of the pool's past idle spells", gt=0, lt=1)
    depth_margin: float = setting(0.25, "a rung fits when its duration times 1 + this fits the window", ge=0)
    depth_min_samples: int = setting(8, "fewer past idle spells at this hour: `playbook`, not the ladder", ge=1)
    depth_lookback: float = setting(28 * 86400.0, "the idle spells read for the estimate", duration=True, gt=0)
    depth_by_week: bool = setting(False, "estimate by hour of the week, not of the day")
    depth_deep_after: float = setting(14 * 86400.0, "a node with no deep test for this long gets the deepest rung "
                                      "when it fits the median window (0: never)", duration=True, ge=0)
    pool_labels: tuple[str, ...] = setting(
        ("karpenter.sh/nodepool", "eks.amazonaws.com/nodegroup", "cloud.google.com/gke-nodepool",
         "kubernetes.azure.com/agentpool", "node.kubernetes.io/instance-type"),
        "a node's pool for its idle window: the first of these labels it carries")
    max_replacements_per_hour: int = setting(2, "beyond this, a replace verdict becomes quarantine", ge=0)
    check_priority_class: str = setting("", "a low PriorityClass for check pods")
    platform: str = setting("auto", "where the GPU nodes run: sets the runtime class and GKE's driver mount; "
                            "auto reads it from the cluster (node labels, RuntimeClass nvidia, the GPU Operator)",
                            choices=PLATFORMS)
    runtime_class: str = setting("auto", "runtimeClassName of check Jobs: auto (RuntimeClass `nvidia` where it "
                                 "exists, else none; with a named platform: `nvidia` on generic, none on eks, aks, "
                                 "gke), a name, or \"\" for none",
                                 pattern=r"^(auto|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
                                 allowed="auto, a RuntimeClass name, or \"\"")
    dcgm_hostengine: str = setting("auto", "the node's DCGM host engine: auto (node where the GPU Operator's "
                                   "nvidia-dcgm runs on every GPU node, else \"\"), \"\" (the Job runs its own), "
                                   "node, node:PORT (the node's own address) or HOST:PORT", pattern=_HOSTENGINE,
                                   allowed="auto, \"\", node, node:PORT or HOST:PORT")
    dcgm_level: int | None = setting(None, "DCGM diagnostic level (-r) of every DCGM playbook run, over the "
                                     "profile's (empty: the profile's, else 2); a schedule may set its own",
                                     ge=1, le=4)
    device_plugin_pods: tuple[str, ...] = setting(
        ("gpu-operator/app=nvidia-device-plugin-daemonset",
         "kube-system/app.kubernetes.io/name=nvidia-device-plugin",
         "nvidia-device-plugin/app.kubernetes.io/name=nvidia-device-plugin"),
        "the device plugin's pods, as NAMESPACE/LABEL-SELECTOR (the GPU Operator's, the standalone chart's): "
        "deleted to restart the plugin on a node whose GPUs it holds back while Sweeper's own readings are clean",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/\S+$", allowed="NAMESPACE/LABEL-SELECTOR")
    suspect_conditions: tuple[str, ...] = setting(("GpuXid", "GpuEcc", "GpuNvlink", "GpuCount"),
                                                  "node conditions that make an idle node swept first")
    handled_conditions: tuple[str, ...] = setting((), "another remediator owns a node with one of these set")
    claims_test: bool = setting(True, "test the claims other tools make (conditions, taints, DRA device taints "
                                "in the claims catalogue): an idle node carrying an untested one is swept first, "
                                "and each claim is recorded confirmed, refuted or inconclusive")
    claims_catalog: str = setting("", "the claims catalogue to read (empty: the shipped one, "
                                  "sweeper/data/claims-catalog.yaml)")
    claims_clear: tuple[str, ...] = setting(
        (), "the sources (claims catalogue) whose claims a test refuted Sweeper clears through the mechanism "
        "their owner documents (the catalogue's `clear`; only nvidia-dra-driver documents one: a restart "
        "of its kubelet plugin on the node); empty: none, every claim stays its owner's")
    claims_dra_plugin_pods: tuple[str, ...] = setting(
        ("dra-driver-nvidia-gpu/dra-driver-nvidia-gpu-component=kubelet-plugin",),
        "NVIDIA's DRA driver's kubelet plugin pods, as NAMESPACE/LABEL-SELECTOR: deleted on a node to clear "
        "a device taint its test refuted (with `claims_clear`)",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/\S+$", allowed="NAMESPACE/LABEL-SELECTOR")
    claims_pair_playbook: str = setting(
        "auto", "the pair playbook that also tests an NVLink or fabric claim (a catalogue test with `pair: true`): "
        "after the node's own checks, the node is paired with an idle known-good partner, and the claim is "
        "refuted only when both passed. `auto`: the pair playbook of a `schedules` entry, if one is; "
        "empty: none (the node's own checks alone settle such a claim)")
    suspect_sources: tuple[dict[str, Any], ...] = setting(
        (), "outside signals: Prometheus or Loki queries", annotation=Deferred(lambda: _shapes()["suspect_sources"]),
        allowed="list of {type: prometheus|loki, url, query, node_label, window, timeout}")
    remediation: dict[str, Any] = setting(
        help="provider of replace by node pool, then by profile, then the default",
        factory=lambda: {"default": "manual"}, annotation=Deferred(lambda: _shapes()["remediation"]),
        allowed="{default, by_pool: {POOL: P}, by_profile: {PROFILE: P}}, P one of karpenter, asg, manual")
    remediate_reboots: bool = setting(False, "run the reboot (or GPU reset) Job for a reboot verdict")
    gpu_reset: bool = setting(True, "a reset-able cause resets GPUs, not the node")
    reboot_template: str = setting("reboot.yaml.j2", "job template of a reboot", min_length=1)
    gpu_reset_template: str = setting("gpu-reset.yaml.j2", "job template of a GPU reset", min_length=1)
    remediation_timeout: float = setting(1800.0, "a rebooted node not Ready again by then waits for a person",
                                         duration=True, gt=0)
    gate_taint: str = setting("sweeper.dev/unvalidated", "the startup taint a new node joins with (a Karpenter "
                              "NodePool's startupTaints, a node group's taints): Sweeper sweeps such a node with "
                              "gate_playbook and removes this taint, and no other, once a pass is in the history; "
                              "it also puts it on a node before its reboot or GPU reset (\"\": no gate)",
                              pattern=r"^$|^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                              allowed="a taint key, or \"\"")
    gate_playbook: str = setting("quarantine-deep.yaml", "the deep sweep of a gated new node", min_length=1)
    soak_playbook: str = setting("soak.yaml", "the sweep under load of a gated node back from Sweeper's reboot or "
                                 "GPU reset, before it is handed back", min_length=1)
    gate_max_nodes: int = setting(2, "gated nodes under test at once: a budget of their own, apart from max_nodes "
                                  "and the floor (new nodes serve no work yet)", ge=0)
    gate_deadline: float = setting(1800.0, "a gated node not Ready, or with no GPU advertised, this long after it "
                                   "joined (or came back, or a run first saw its taint) fails the gate", duration=True, gt=0)
    replacement_wait: float = setting(900.0, "how long to follow Karpenter's termination of a replaced node",
                                      duration=True, ge=0)
    asg_action: str = setting("set-unhealthy", "what the asg provider does", choices=("set-unhealthy", "terminate"))
    aws_region: str = setting("", "else from the node's providerID zone")
    evidence: bool = setting(True, "keep a held node's logs and GPU state in a Job before its remedy (docs/evidence.md)")
    evidence_max_bytes: int = setting(2 * MiB, "cap of one compressed evidence bundle (containerLogMaxSize is 10 MiB)",
                                      ge=64 * 1024, le=6 * MiB)
    evidence_timeout: float = setting(300.0, "deadline of the evidence Job", duration=True, gt=0)
    evidence_keep_bytes: int = setting(1024 * MiB, "bundles kept in the history; past it the oldest go (0: no cap)", ge=0)
    evidence_bucket: str = setting("", "an S3 bucket for the bundles instead of the history (which keeps their address)")
    evidence_bucket_prefix: str = setting("sweeper-evidence/", "key prefix of the bundles in evidence_bucket")
    webhook_url: str = setting("", "Slack-compatible JSON on holds and replacements; a credential: prefer "
                               "webhook_url_file or $SWEEPER_WEBHOOK_URL, from a Secret")
    webhook_url_file: str = setting("", "a file holding the webhook URL (a mounted Secret's key); "
                                    "$SWEEPER_WEBHOOK_URL wins over it, and it over webhook_url")
    webhook_attempts: int = setting(4, "tries of one webhook post", ge=1)
    pushgateway_url: str = setting("", "`sweeper sweep` pushes its metrics here when set")
    node_condition: bool = setting(False, "set the GpuSweepHealthy node condition")
    schedules: tuple[dict[str, Any], ...] = setting(
        (), "`sweeper serve`: cron schedules", annotation=Deferred(lambda: _shapes()["schedules"]),
        allowed="list of {name, cron, playbook, max_nodes, interval, dcgm_level}")
    lock_name: str = setting("sweeper-lock", "name of the Lease that keeps two sweeps apart", pattern=_NAME,
                                allowed=_NAME_WORDS)
    control_name: str = setting("sweeper-control", "the ConfigMap of pause, breaker and dismissals", pattern=_NAME,
                                allowed=_NAME_WORDS)
    # 1 s: a Lease counts whole seconds (leaseDurationSeconds), so less cannot be written; it is
    # renewed every third of it.
    lock_ttl: float = setting(300.0, "a dead sweeper's lock may be taken after this long without renewal",
                              duration=True, ge=1)
    orphan_grace: float = setting(3600.0, "Sweeper's taint with no record in history is removed after this long",
                                  duration=True, ge=0)
    playbook_dir: str = setting("", "the author's playbooks, looked up first (then the shipped ones)")
    template_dir: str = setting("", "the author's job templates, looked up first (then the shipped ones)")
    profile_dir: str = setting("", "where profiles are")
    policy_dir: str = setting("", "where policies are")
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def taint_key(self) -> str:
        return f"{self.prefix}/sweep"

    @property
    def runtime_class_name(self) -> str:
        """The runtimeClassName check Jobs carry ("" for none). An unresolved `platform: auto` (no
        cluster was read) is taken as generic."""
        if self.runtime_class != "auto":
            return self.runtime_class
        return PLATFORM_RUNTIME_CLASS["generic" if self.platform == "auto" else self.platform]

    @property
    def platform_name(self) -> str:
        """The platform the templates see; an unresolved `auto` is generic."""
        return "generic" if self.platform == "auto" else self.platform

    @property
    def hostengine(self) -> str:
        """The dcgm_hostengine check Jobs use; an unresolved `auto` is the Job's own engine."""
        return "" if self.dcgm_hostengine == "auto" else self.dcgm_hostengine

    def webhook(self, environ: Mapping[str, str] | None = None) -> str:
        """The webhook URL: $SWEEPER_WEBHOOK_URL, else webhook_url_file's content, else webhook_url. A
        named file that cannot be read is a ConfigError, never a silent "no webhook"."""
        env = os.environ if environ is None else environ
        if env.get(WEBHOOK_ENV, "").strip():
            return env[WEBHOOK_ENV].strip()
        if self.webhook_url_file:
            try:
                return Path(self.webhook_url_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"webhook_url_file: cannot read {self.webhook_url_file}: {exc.strerror}") from exc
        return self.webhook_url
    @property
    def job_images(self) -> frozenset[str]:
        """Every image a rendered Job may run: the configured ones and `allowed_images`."""
        return frozenset((self.check_image, self.dcgm_image, *self.dcgm_images.values(), self.nccl_image,
                          self.pair_image, self.reboot_image, *self.allowed_images))

    def dcgm_image_for(self, node: Mapping[str, Any] | None) -> str:
        """The DCGM image of a node: dcgm_images' entry for the CUDA major its driver runs (its GPU
        feature discovery labels, else `driver_version`, the one its node check last recorded), else
        dcgm_image. Node data only picks among the config's images; it never names one."""
        if not self.dcgm_images:
            return self.dcgm_image
        node = node or {}
        cuda, _ = node_cuda_major(node.get("labels") or {}, node.get("driver_version"))
        return self.dcgm_images.get(cuda, self.dcgm_image) if cuda is not None else self.dcgm_image

    def dcgm_level_for(self, node: dict[str, Any] | None) -> int:
        """The DCGM level of a node's runs: the config's (or its schedule's), else its profile's, else 2."""
        profile = (node or {}).get("profile") or {}
        return int(self.dcgm_level or profile.get("dcgm_level") or 2)

    def path(self, kind: str) -> Path:
        explicit = {"playbooks": self.playbook_dir, "job-templates": self.template_dir,
                    "profiles": self.profile_dir, "policies": self.policy_dir}[kind]
        return Path(explicit) if explicit else home() / kind

    def playbook_file(self, name: str) -> Path:
        """A playbook by name: in the author's `playbook_dir` first, then among the shipped ones
        (`$SWEEPER_HOME/playbooks`, else the package's). As a job template's: an absolute path, a `..`,
        or a file whose real path (symlinks followed) leaves its folder is refused."""
        parts = PurePosixPath(name)
        if not name or "\x00" in name or "\\" in name or parts.is_absolute() or name.startswith("~") \
                or ".." in parts.parts:
            raise ConfigError(f"playbook {name!r}: not a playbook name; name a file of playbook_dir or of the "
                              "shipped playbooks/ (no absolute path, no '..')")
        folders = [Path(self.playbook_dir)] * bool(self.playbook_dir) + [home() / "playbooks"]
        folder = next((f for f in folders if (f / name).is_file()), folders[-1])
        if (folder / name).exists() and not (folder / name).resolve().is_relative_to(folder.resolve()):
            raise ConfigError(f"playbook {name!r}: {folder / name} leaves its folder {folder} (it points at another "
                              "place); a playbook must be a file inside the folder")
        return folder / name

    def with_overrides(self, **kw: Any) -> Config:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


@functools.cache
def file_model() -> type[BaseModel]:
    """The pydantic model of the config file, derived from Config's declaration."""
    return model_of(Config, "ConfigFile")


def load_config(path: str | Path | None) -> Config:
    """The config file, checked key by key; every problem as `file:line: key: what; allowed: ...`."""
    if path is None:
        return Config()
    p = Path(path)
    data, node = read_yaml(p, "config")
    model = check(file_model(), data, str(p), node, Config, "mapping of config keys")
    return Config(**runtime_values(Config, model))


def manifest_config(manifest: str, name: str = "sweeper-config") -> Config:
    """The config that a manifest's ConfigMap `name` holds (deploy/base.yaml's), checked as a file is."""
    import tempfile

    from sweeper.schema import safe_load_all

    cm = next(d for d in safe_load_all(manifest) if isinstance(d, dict) and d.get("kind") == "ConfigMap"
              and d["metadata"]["name"] == name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        return load_config(path)


def config_table() -> str:
    """The table of config keys (docs/configuration.md)."""
    return reference_table(Config)


if __name__ == "__main__":
    print(config_table(), end="")
