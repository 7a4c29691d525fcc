"""What the simulated control plane reads in a pod's spec: whether its images parse, what the Pod
Security Standard says of it, the GPUs and other extended resources it asks for, an Indexed Job's
index, and whether its selectors, affinities and tolerations let it on a node. Pure functions of
the objects, shared by the scheduler, the kubelet and admission."""

from __future__ import annotations

import re
from typing import Any

GPU = "nvidia.com/gpu"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# A reference's repository path: lowercase components (the registry host may differ), then a tag or digest.
# https://github.com/distribution/reference/blob/main/regexp.go
_PATH_PART = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def valid_image(ref: str) -> bool:
    """Whether an image reference parses (else the kubelet's InvalidImageName)."""
    name, _, digest = ref.partition("@")
    if not name or any(ch.isspace() for ch in ref) or (digest and ":" not in digest):
        return False
    head, _, last = name.rpartition("/")
    repo_last, _, tag = last.partition(":")
    if ":" in last and not _TAG.match(tag):
        return False
    parts = (head.split("/") if head else []) + [repo_last]
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # the registry host
    return all(_PATH_PART.match(p) for p in parts)


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def pod_security_violations(pod: dict[str, Any], level: str = "baseline") -> list[str]:
    """The Pod Security Standard's checks that a pod violates at `level`, in the apiserver's words
    and order: the baseline's host namespaces, hostPath volumes and privileged containers, then, at
    restricted, its volume types, privilege escalation, capabilities, non-root and seccomp checks.
    The baseline's other checks (capabilities beyond its default set, host ports, AppArmor, SELinux,
    /proc mount, sysctls) are not simulated.
    https://kubernetes.io/docs/concepts/security/pod-security-standards/"""
    spec = pod.get("spec") or {}
    out = []
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")
    paths = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    if paths:
        out.append(f"hostPath volumes ({'volume' if len(paths) == 1 else 'volumes'} {_quoted(paths)})")
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    priv = [c.get("name", "") for c in containers if ((c.get("securityContext") or {}).get("privileged"))]
    if priv:
        out.append(f"privileged ({'container' if len(priv) == 1 else 'containers'} {_quoted(priv)} "
                   "must not set securityContext.privileged=true)")
    if level == "restricted":
        out += _restricted_violations(spec, containers)
    return out


RESTRICTED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret")


def _restricted_violations(spec: dict[str, Any], containers: list[dict[str, Any]]) -> list[str]:
    """The restricted level's own checks (pod-security-admission's restricted policy: volume types,
    allowPrivilegeEscalation, capabilities drop ALL, runAsNonRoot, seccompProfile)."""
    def plural(names: list[str], prefix: str = "") -> str:
        return f"{prefix}{'container' if len(names) == 1 else 'containers'} {_quoted(names)}"
    out = []
    bad_vols = [(v.get("name", ""), next(k for k in v if k != "name")) for v in spec.get("volumes") or []
                if len(v) > 1 and not any(k in v for k in RESTRICTED_VOLUMES)]
    if bad_vols:
        out.append("restricted volume types (" + ", ".join(f'volume "{n}" uses restricted volume type "{t}"'
                                                          for n, t in bad_vols) + ")")
    psc = spec.get("securityContext") or {}
    esc = [c.get("name", "") for c in containers if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if esc:
        out.append(f"allowPrivilegeEscalation != false ({plural(esc)} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    caps = [c.get("name", "") for c in containers
            if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])]
    if caps:
        out.append(f'unrestricted capabilities ({plural(caps)} must set securityContext.capabilities.drop=["ALL"])')
    root = [c.get("name", "") for c in containers
            if (c.get("securityContext") or {}).get("runAsNonRoot", psc.get("runAsNonRoot")) is not True]
    if root:
        out.append(f"runAsNonRoot != true ({plural(root, 'pod or ')} must set securityContext.runAsNonRoot=true)")
    seccomp = [c.get("name", "") for c in containers
               if (((c.get("securityContext") or {}).get("seccompProfile") or psc.get("seccompProfile") or {})
                   .get("type")) not in ("RuntimeDefault", "Localhost")]
    if seccomp:
        out.append(f"seccompProfile ({plural(seccomp, 'pod or ')} must set securityContext.seccompProfile.type "
                   'to "RuntimeDefault" or "Localhost")')
    return out


def gpu_request(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []) or []:
        res = c.get("resources") or {}
        val = (res.get("requests") or {}).get(GPU) or (res.get("limits") or {}).get(GPU) or 0
        total += int(val)
    return total


def completion_index(pod: dict[str, Any]) -> int | None:
    """An Indexed Job's pod's index (its annotation), or None."""
    value = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
    return int(value) if value is not None and str(value).isdigit() else None


def index_ranges(indexes: set[int]) -> str:
    """Indexes as the Job's status.completedIndexes writes them: sorted intervals, "0-2,4,6-7"."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indexes):
        if run and i != run[-1] + 1:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        run.append(i)
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def extended_requests(pod: dict[str, Any]) -> dict[str, int]:
    """The extended resources (a domain-prefixed name: nvidia.com/gpu, vpc.amazonaws.com/efa,
    rdma/ib) the pod's containers request; a limit alone stands for the request, as the apiserver
    defaults it. https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources"""
    total: dict[str, int] = {}
    for c in pod.get("spec", {}).get("containers", []) or []:
        res = c.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, val in asked.items():
            if "/" in name and not name.startswith("kubernetes.io/") and str(val or 0).isdigit():
                total[name] = total.get(name, 0) + int(val or 0)  # the apiserver admits only integers here
    return {k: v for k, v in sorted(total.items(), key=lambda kv: (kv[0] != GPU, kv[0])) if v}


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector object (matchLabels, matchExpressions) against labels; a null selector
    matches nothing, an empty one everything, as for inter-pod affinity terms."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        op, key, vals = e.get("operator"), e.get("key"), e.get("values") or []
        ok = {"In": key in labels and labels.get(key) in vals, "NotIn": labels.get(key) not in vals,
              "Exists": key in labels, "DoesNotExist": key not in labels}.get(op, False)
        if not ok:
            return False
    return True


def anti_affinity_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list((((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def _term_selects(term: dict[str, Any], owner: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether an affinity term of `owner` selects the pod `other` (its namespaces, then its labels)."""
    namespaces = term.get("namespaces") or []
    ns_sel = term.get("namespaceSelector")
    other_ns = other["metadata"].get("namespace")
    if namespaces or ns_sel is not None:
        if other_ns not in namespaces and ns_sel != {}:
            return False
    elif other_ns != owner["metadata"].get("namespace"):
        return False
    return selector_matches(term.get("labelSelector"), other["metadata"].get("labels") or {})


def anti_affinity_rules(pod: dict[str, Any], placed: list[tuple[dict[str, Any], str]]) -> list[tuple[str, str, str]]:
    """The scheduler's InterPodAffinity filter for required anti-affinity, both ways, as
    (reason, topology key, node of a placed pod): the pod's own terms that select a placed pod,
    and placed pods' terms that select the pod. A node in the same topology domain as such a node
    is refused with that reason. Worked out once per pod, so a large fleet is not walked per node.
    https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity"""
    rules = []
    own = anti_affinity_terms(pod)
    for other, where in placed:
        if other is pod:
            continue
        for term in own:
            if _term_selects(term, pod, other):
                rules.append(("node(s) didn't match pod anti-affinity rules", term.get("topologyKey", ""), where))
        for term in anti_affinity_terms(other):
            if _term_selects(term, other, pod):
                rules.append(("node(s) didn't satisfy existing pods anti-affinity rules", term.get("topologyKey", ""),
                              where))
    return rules


def tolerates(tolerations: list[dict[str, Any]] | None, taint: dict[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if not t.get("key") and op == "Exists":
            return True
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expr_matches(expr: dict[str, Any], value: str | None) -> bool:
    op, vals = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return value is not None and value in vals
    if op == "NotIn":
        return value is None or value not in vals
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and vals:
        try:
            return int(value) > int(vals[0]) if op == "Gt" else int(value) < int(vals[0])
        except ValueError:
            return False
    return False


def node_affinity_matches(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    for k, v in (pod["spec"].get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_expr_matches(e, labels.get(e.get("key"))) for e in exprs) and all(
                _expr_matches(f, node["metadata"]["name"] if f.get("key") == "metadata.name" else None)
                for f in fields):
            return True
    return False
