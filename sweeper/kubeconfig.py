"""The kubeconfig context a command talks to, read as YAML without the Kubernetes client (a
reading command starts fast), so that each cluster's history gets a file of its own."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml


def current_context(kubeconfig: str | None) -> str | None:
    """The `current-context` of the kubeconfig files (':'-separated, like KUBECONFIG; the first file
    that sets it wins, as kubectl merges them), or None: in a pod with no kubeconfig, none set,
    or none readable (https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/)."""
    paths = [p for p in (kubeconfig or "").split(os.pathsep) if p]
    if not paths:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None  # in a pod: the service account, no context
        paths = ["~/.kube/config"]
    for p in paths:
        try:
            doc = yaml.safe_load(Path(p).expanduser().read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        name = doc.get("current-context") if isinstance(doc, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def state_name(context: str) -> str:
    """A context name made a file name: `arn:aws:eks:us-west-2:1:cluster/prod` ->
    `arn_aws_eks_us-west-2_1_cluster_prod` (no path separator, no leading dot)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", context).strip("._") or "context"


def default_state(kubeconfig: str | None, context: str | None,
                  configured: str | None = None) -> tuple[str, str | None]:
    """The history when --state is not given: $SWEEPER_STATE, else the config's `state` (`configured`),
    else `state/<context>.db` for the context named or current, else `state/sweeper.db` (in a pod).
    Returns the path or URL and the context it is named for (None when it is not)."""
    env = os.environ.get("SWEEPER_STATE") or configured
    if env:
        return env, None
    name = context or current_context(kubeconfig)
    if not name:
        return str(Path("state") / "sweeper.db"), None
    return str(Path("state") / f"{state_name(name)}.db"), name


def missing(kubeconfig: str | None) -> str | None:
    """Why no kubeconfig can be read, naming the path, or None. Like kubectl, KUBECONFIG may list
    several files (':'-separated, missing ones skipped); with none given, ~/.kube/config is read
    outside a pod (https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/)."""
    if kubeconfig:
        paths = [p for p in kubeconfig.split(os.pathsep) if p]
        if paths and not any(Path(p).expanduser().is_file() for p in paths):
            return f"no kubeconfig at {', '.join(paths)} (from --kubeconfig or KUBECONFIG)"
        return None
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None  # in a pod: the service account
    default = Path("~/.kube/config").expanduser()
    if not default.is_file():
        return (f"no kubeconfig: {default} does not exist and this is not a pod; "
                "pass --kubeconfig or set KUBECONFIG")
    return None

