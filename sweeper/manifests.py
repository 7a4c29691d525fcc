"""`python -m sweeper.manifests > deploy/cronjob.yaml`: the deployable manifest, the
hand-written `deploy/base.yaml` followed by one ConfigMap per directory Sweeper reads
(playbooks, job templates, profiles, policies), so that what runs in the cluster is what
the repository holds."""

from __future__ import annotations

from pathlib import Path

import yaml

from sweeper.config import home

DIRECTORIES = {"playbooks": "sweeper-playbooks", "job-templates": "sweeper-job-templates",
               "profiles": "sweeper-profiles", "policies": "sweeper-policies"}
NAMESPACE = "sweeper"


def configmaps(root: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for directory, name in DIRECTORIES.items():
        files = sorted(p for p in (root / directory).iterdir() if p.is_file() and not p.name.startswith("."))
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NAMESPACE,
                                 "labels": {"app.kubernetes.io/name": "sweeper"}},
                    "data": {p.name: p.read_text() for p in files}})
    return out


def render(root: Path | None = None) -> str:
    root = root or home()
    base = (root / "deploy" / "base.yaml").read_text()
    parts = [base.rstrip("\n")]
    for cm in configmaps(root):
        parts.append(f"# {cm['metadata']['name']}: generated from {cm['metadata']['name'].split('-', 1)[1]}/"  # type: ignore[index]
                     "\n" + yaml.safe_dump(cm, sort_keys=False, width=120, allow_unicode=True).rstrip("\n"))
    return "\n---\n".join(parts) + "\n"


if __name__ == "__main__":
    print(render(), end="")
