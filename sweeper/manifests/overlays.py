"""The Kustomize base and per-platform overlays of deploy/, written from the same objects, and the
images list edited as `kustomize edit set image` edits it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from sweeper.config import Config, home
from sweeper.errors import ConfigError
from sweeper.files import write_atomic
from sweeper.manifests.objects import (
    NAMESPACE,
    PLATFORMS,
    STATE_CLAIMS,
    Options,
    _config_of,
    _dump,
    base_text,
    render,
    repository,
)
from sweeper.schema import own_load_all


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


def _policy_patches(root: Path, config: Config, memo: dict[str, Any] | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """JSON patches (RFC 6902) that turn the base's admission policies into those of `config` (the
    NodeClaim policy follows `remediation`), by the policy's kind and name. `memo`: render_policies'."""
    from sweeper.admission import render_policies

    def by_name(text: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {(d["kind"], d["metadata"]["name"]): d for d in own_load_all(text) if d}

    base = by_name((root / "deploy" / "admission-policy.yaml").read_text())
    out = {}
    for key, doc in by_name(render_policies(root, config, memo)).items():
        ops = [{"op": "replace", "path": f"/{part}", "value": doc[part]} for part in ("metadata", "spec")
               if (base.get(key) or {}).get(part) != doc[part]]
        if ops:
            out[key] = ops
    return out


def overlay_files(root: Path | None = None, memo: dict[str, Any] | None = None) -> dict[str, str]:
    """Every file of the overlays, by its path under deploy/. `memo`: the Job shapes rendered from this
    root's templates so far (each overlay's policies need them; they differ by config, not by platform)."""
    root = root or home()
    deploy = root / "deploy"
    memo = {} if memo is None else memo
    out: dict[str, str] = {}
    for name in ("cronjob.yaml", "admission-policy.yaml"):
        out[f"base/{name}"] = (f"# A copy of deploy/{name}, written by `python -m sweeper.manifests overlays`: the "
                               f"Kustomize base reads it here.\n" + (deploy / name).read_text())
    for ov in OVERLAYS:
        opts = Options(storage_class=ov.storage_class, platform=ov.platform)
        base = base_text(root, opts, ov.remediation)
        cm = next(d for d in own_load_all(base) if d and d["kind"] == "ConfigMap"
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
        for (kind, name), ops in _policy_patches(root, config, memo).items():
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
    """Through a temporary file (sweeper.files), so that a failure leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)


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
    memo: dict[str, Any] = {}  # the templates do not change while this runs: each config's shapes once
    written = [_write(deploy / "cronjob.yaml", render(root, "cronjob")),
               _write(deploy / "serve" / "serve.yaml", render(root, "serve")),
               _write(deploy / "admission-policy.yaml", render_policies(root, memo=memo))]
    files = overlay_files(root, memo)  # all rendered before any is written
    return written + [_write(deploy / rel, text) for rel, text in files.items()]


# -- the command ----------------------------------------------------------------------------------------
