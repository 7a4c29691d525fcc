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

from sweeper.manifests.command import _toleration, main, options
from sweeper.manifests.objects import (
    DIRECTORIES,
    GP3,
    GPU_NODE_LABELS,
    IMAGE,
    IMAGE_KEYS,
    MARGIN,
    METRICS_NAMESPACE,
    NAMESPACE,
    PLATFORMS,
    STATE_CLAIMS,
    SYSTEM_TOLERATIONS,
    WEBHOOK_SECRET,
    Options,
    _config_of,
    _dump,
    _highest_level,
    _job_seconds,
    _labels,
    _resolved_vars,
    base_text,
    configmaps,
    cronjob,
    deadline_seconds,
    deployment,
    gpu_instance_types,
    history_reader_role,
    image_ref,
    images,
    network_policy,
    off_gpu_nodes,
    playbook_seconds,
    pod_template,
    render,
    repository,
    service,
    set_key,
    state_claim,
)
from sweeper.manifests.overlays import (
    CONFIG_NAME,
    IRSA,
    OVERLAYS,
    Overlay,
    _policy_patches,
    _write,
    _yaml_scalar,
    overlay_files,
    set_images,
    write_deploy,
)

__all__ = ["CONFIG_NAME", "DIRECTORIES", "GP3", "GPU_NODE_LABELS", "IMAGE", "IMAGE_KEYS", "IRSA", "MARGIN", "METRICS_NAMESPACE", "NAMESPACE", "OVERLAYS", "Options", "Overlay", "PLATFORMS", "STATE_CLAIMS", "SYSTEM_TOLERATIONS", "WEBHOOK_SECRET", "_config_of", "_dump", "_highest_level", "_job_seconds", "_labels", "_policy_patches", "_resolved_vars", "_toleration", "_write", "_yaml_scalar", "base_text", "configmaps", "cronjob", "deadline_seconds", "deployment", "gpu_instance_types", "history_reader_role", "image_ref", "images", "main", "network_policy", "off_gpu_nodes", "options", "overlay_files", "playbook_seconds", "pod_template", "render", "repository", "service", "set_images", "set_key", "state_claim", "write_deploy"]
