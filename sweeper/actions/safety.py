"""What a rendered Job (or pair Service, or MPIJob) may hold: one rule set, used by `run_job`,
`run_pair_job`, the remediation Jobs and `sweeper lint`. A playbook's variables cannot change
what these rules compare against: every value below is Sweeper's own (its config, the held
node), never a template variable.

- placement: node affinity to exactly the held node(s), no nodeName, no nodeSelector;
- tolerations: Sweeper's taint and the config's `allowed_taint_keys`, nothing else;
- namespace: the one Sweeper chose;
- images: pinned by digest and in the config's images or `allowed_images`;
- host paths: only those the checks read, each mounted `readOnly` with `recursiveReadOnly:
  Enabled`, so a submount under it (a runtime's socket under /run, say) is read-only too, and
  none of a type that creates what is missing (`DirectoryOrCreate`, `FileOrCreate`);
  https://kubernetes.io/docs/concepts/storage/volumes/#read-only-mounts
- no privilege, host namespace, added capability beyond the checks' own, or service account
  token, except for the shipped remediation templates run by the remediation itself, and then
  only with the image the config names for them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sweeper.errors import PlaybookError

# What the checks read from the host, one path each (the kernel ring buffer comes through syslog(2),
# with CAP_SYSLOG, not through a mount):
#   /sys                         the fabric's sysfs (/sys/class/infiniband, /sys/class/net), the
#                                GPUs' PCI devices (/sys/bus/pci), the loaded modules (/sys/module)
#   /var/log/journal             journald's persistent and volatile journal files: the kernel's lines
#   /run/log/journal             the ring buffer lost, read by the image's journalctl (--root)
#   /home/kubernetes/bin/nvidia  GKE's driver libraries and nvidia-smi (the light check)
HOST_PATHS = frozenset({"/sys", "/var/log/journal", "/run/log/journal", "/home/kubernetes/bin/nvidia"})
# The shipped evidence Job alone also mounts /var/log, read-only, for two files it names (DCGM's and the
# fabric manager's logs): a hostPath of one file that is absent is made a directory by the runtime.
EVIDENCE_PATHS = HOST_PATHS | {"/var/log"}
# Where container runtimes keep their sockets and state: never reachable from a check pod. The one
# path under /run a check may mount is exactly /run/log/journal (journal files, no socket: journald's
# sockets are under /run/systemd/journal); nothing above, beside or below it.
# https://kubernetes.io/docs/concepts/storage/volumes/#hostpath (the warning on hostPath)
RUNTIME_PATHS = ("/run", "/var/run", "/var/lib/containerd", "/var/lib/docker", "/var/lib/kubelet",
                 "/var/lib/crio", "/run/containerd", "/run/crio", "/var/run/docker.sock")
# hostPath types that make the kubelet create what is missing on the host: a check creates nothing there.
# https://kubernetes.io/docs/concepts/storage/volumes/#hostpath-volume-types
CREATING_TYPES = frozenset({"DirectoryOrCreate", "FileOrCreate"})
# Capabilities a check may add: SYSLOG (dmesg under kernel.dmesg_restrict) and SYS_ADMIN (DCGM's
# diagnostics), the latter never beside a host path (it could remount it writable).
CAPABILITIES = frozenset({"SYSLOG", "SYS_ADMIN"})
VOLUME_TYPES = frozenset({"emptyDir", "hostPath", "configMap", "downwardAPI"})
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class Rules:
    """Sweeper's own values a rendered Job is held to."""

    namespace: str
    affinities: tuple[dict[str, Any], ...]  # the pod affinities allowed (exactly one of these)
    tolerations: tuple[dict[str, Any], ...]
    taint_key: str
    images: frozenset[str]
    pods: int = 1  # pods a Job runs at once and in all: one per held node
    runtime_class: str = ""  # the config's (empty: none); a template names no other
    priority_class: str = ""  # the config's check_priority_class (empty: none)
    privileged_image: str = ""  # a shipped remediation template run by the remediation: its image
    host_pid: bool = False  # the reboot Job enters PID 1's namespaces
    bound_node: str = ""  # the GPU reset Job: bound to this node by nodeName (the plugin is paused)
    gpu_resources: tuple[str, ...] = ()  # the config's GPU resource names and prefixes: a bound Job asks none
    # The pod's DRA claims, Sweeper's own (the held node's GPUs through its ResourceClaimTemplate): a
    # template names no other claim, and a bound Job none
    claims: tuple[dict[str, Any], ...] = ()
    host_paths: frozenset[str] = HOST_PATHS  # the evidence Job also reads /var/log (EVIDENCE_PATHS)


def problems(docs: list[dict[str, Any]], rules: Rules) -> list[str]:
    """Every way the rendered documents break the rules (empty: safe). A document not shaped like
    the Kubernetes object it names is refused too, never waved through."""
    try:
        return _problems(docs, rules)
    except (AttributeError, TypeError, ValueError) as exc:
        return [f"the rendered documents are not shaped like Kubernetes objects ({type(exc).__name__})"]


def _problems(docs: list[dict[str, Any]], rules: Rules) -> list[str]:
    out: list[str] = []
    for doc in docs:
        kind = str(doc.get("kind"))
        ns = (doc.get("metadata") or {}).get("namespace")
        if ns != rules.namespace:
            out.append(f"{kind}: metadata.namespace must be Sweeper's namespace {rules.namespace!r} "
                       f"(namespace: {{{{ namespace | tojson }}}}), not {ns!r}")
        if kind == "Service":
            out += [f"Service: {p}" for p in _service(doc.get("spec") or {})]
        if kind == "Job":
            spec = doc.get("spec") or {}
            retries = spec.get("backoffLimit", 0)
            if any(spec.get(k, rules.pods) != rules.pods for k in ("parallelism", "completions")) \
                    or not isinstance(retries, int) or not 0 <= retries <= 1:
                out.append(f"Job: parallelism and completions must be {rules.pods} (one pod per held node) "
                           "and backoffLimit 0 or 1")
        for what, pod in pod_specs(doc):
            out += pod_problems(pod, rules, f"{kind} {what}")
        for what, notes in _pod_annotations(doc):
            out += [f"{kind} {what}: {p}" for p in _annotations(notes)]
    return out


def _service(spec: dict[str, Any]) -> Iterator[str]:
    """The pair's Service names its two pods inside the cluster; nothing reaches them from outside."""
    if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("externalIPs") or spec.get("externalName"):
        yield "only a ClusterIP Service (headless) with no external IPs or name"


def _pod_annotations(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = doc.get("spec") or {}
    templates = [(role, (r or {}).get("template") or {}) for role, r in (spec.get("mpiReplicaSpecs") or {}).items()] \
        if doc.get("kind") == "MPIJob" else [("pod", spec.get("template") or {})]
    for what, template in templates:
        yield what, (template.get("metadata") or {}).get("annotations") or {}


def _annotations(annotations: dict[str, Any]) -> Iterator[str]:
    """The annotations that loosen a container's confinement (AppArmor's and seccomp's older forms)."""
    for key, value in annotations.items():
        if str(key).startswith(("container.apparmor.security.beta.kubernetes.io/", "seccomp.security.alpha.kubernetes.io/")) \
                and str(value).lower() != "runtime/default":
            yield f"annotation {key}: {value} is not allowed (only runtime/default)"


def pod_specs(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The pod specs of a Job or an MPIJob (a Service has none)."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "MPIJob":
        for role, replica in (spec.get("mpiReplicaSpecs") or {}).items():
            yield role, ((replica or {}).get("template") or {}).get("spec") or {}
    elif doc.get("kind") != "Service":
        yield "pod", (spec.get("template") or {}).get("spec") or {}


def pod_problems(pod: dict[str, Any], rules: Rules, what: str) -> list[str]:
    out = [f"{what}: {p}" for p in _placement(pod, rules)]
    host_paths = _host_path_volumes(pod, out, what, rules.host_paths)
    privileged = False
    for c in _containers(pod):
        name = f"{what} container {c.get('name', '?')}"
        image = str(c.get("image", ""))
        if not _DIGEST.search(image):
            out.append(f"{name}: image {image!r} is not pinned by digest (name@sha256:...)")
        elif image not in rules.images:
            out.append(f"{name}: image {image!r} is not one of the config's images or allowed_images")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            privileged = True
            if not rules.privileged_image:
                out.append(f"{name}: privileged: only the shipped remediation templates, run by the remediation, "
                           "may be privileged")
            elif image != rules.privileged_image:
                out.append(f"{name}: a privileged container runs only the config's image {rules.privileged_image!r}")
        else:
            if sc.get("allowPrivilegeEscalation") is not False:
                out.append(f"{name}: securityContext.allowPrivilegeEscalation must be false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                out.append(f"{name}: securityContext.capabilities.drop must hold ALL")
        added = {str(x) for x in ((sc.get("capabilities") or {}).get("add") or [])}
        extra = sorted(a for a in added if a.upper().removeprefix("CAP_") not in CAPABILITIES)
        if extra and not sc.get("privileged"):
            out.append(f"{name}: capabilities {extra} are not ones a check needs ({sorted(CAPABILITIES)})")
        if host_paths and any(a.upper().removeprefix("CAP_") == "SYS_ADMIN" for a in added):
            out.append(f"{name}: SYS_ADMIN beside a host path could remount it writable")
        out += [f"{name}: {p}" for p in _unconfined(sc)]
        out += [f"{name}: {p}" for p in _mounts(c, host_paths)]
        out += [f"{name}: {p}" for p in _env_and_ports(c)]
    if pod.get("hostPID") and not (privileged and rules.host_pid and rules.privileged_image):
        out.append(f"{what}: hostPID is for the shipped reboot Job only")
    for key in ("hostNetwork", "hostIPC"):
        if pod.get(key):
            out.append(f"{what}: {key} is not allowed in a Sweeper Job")
    out += [f"{what}: {p}" for p in _unconfined(pod.get("securityContext") or {})]
    return out


def _placement(pod: dict[str, Any], rules: Rules) -> Iterator[str]:
    if rules.bound_node:
        # A GPU reset runs while the device plugin is paused, when the node's allocatable GPUs are 0
        # and a pod that requests one fits nowhere (the kubelet marks a stopped plugin's devices
        # unhealthy: kubernetes/kubernetes, pkg/kubelet/cm/devicemanager/manager.go). So it is bound
        # to the held node by nodeName and requests no GPU.
        if pod.get("nodeName") != rules.bound_node:
            yield "a remediation Job is bound to its node: nodeName: {{ node.name | tojson }}"
        if pod.get("affinity") not in (None, *rules.affinities):
            yield "the pod must carry no affinity but Sweeper's to the held node"
        asked = sorted({k for c in pod.get("containers") or [] for part in ("requests", "limits")
                        for k in ((c.get("resources") or {}).get(part) or {})
                        if k.startswith(rules.gpu_resources) or "gpu" in k})
        if asked:
            yield (f"a remediation Job requests no GPU ({', '.join(asked)}): with the device plugin paused "
                   "the node has none allocatable, and the pod would never start")
    elif "nodeName" in pod:
        yield "nodeName bypasses taints and GPU accounting; use affinity: {{ affinity | tojson }}"
    # DRA: a claim holds devices the scheduler gives it; only Sweeper's claim for the held node's GPUs
    # (https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/)
    if [c for c in pod.get("resourceClaims") or [] if c not in rules.claims]:
        yield ("resourceClaims are Sweeper's own (the held node's GPUs through its ResourceClaimTemplate): "
               "resourceClaims: {{ gpu_claims | tojson }}" if not rules.bound_node else
               "a remediation Job bound to its node claims no device")
    if pod.get("nodeSelector"):
        yield "nodeSelector is not allowed: Sweeper's affinity alone places the pod"
    if not rules.bound_node and pod.get("affinity") not in rules.affinities:
        yield "the pod must carry Sweeper's node affinity to the held node(s), unchanged: affinity: {{ affinity | tojson }}"
    tolerations = pod.get("tolerations") or []
    if not any(isinstance(t, dict) and t.get("key") == rules.taint_key for t in tolerations):
        yield f"the pod must tolerate {rules.taint_key}"
    stray = [t for t in tolerations if t not in rules.tolerations]
    if stray:
        yield (f"tolerations {stray} are not Sweeper's (its taint and allowed_taint_keys): "
               "tolerations: {{ tolerations | tojson }}")
    if pod.get("automountServiceAccountToken") is not False:
        yield "automountServiceAccountToken must be false: no check talks to the API server"
    if pod.get("serviceAccountName") or pod.get("serviceAccount"):
        yield "serviceAccountName is not allowed: a check needs no identity in the cluster"
    if pod.get("runtimeClassName", rules.runtime_class or None) != (rules.runtime_class or None):
        yield f"runtimeClassName must be the config's ({rules.runtime_class or 'none'}): {{{{ runtime_class }}}}"
    if pod.get("priorityClassName", rules.priority_class or None) != (rules.priority_class or None):
        yield f"priorityClassName must be the config's check_priority_class ({rules.priority_class or 'none'})"


def _host_path_volumes(pod: dict[str, Any], out: list[str], what: str,
                       allowed: frozenset[str] = HOST_PATHS) -> set[str]:
    """The names of the pod's hostPath volumes; what is wrong with its volumes goes into `out`."""
    names: set[str] = set()
    for v in pod.get("volumes") or []:
        kinds = sorted(set(v) - {"name"})
        bad = [k for k in kinds if k not in VOLUME_TYPES]
        if bad:
            out.append(f"{what}: volume {v.get('name')!r}: {', '.join(bad)} volumes are not allowed "
                       f"({sorted(VOLUME_TYPES)})")
        if "hostPath" not in v:
            continue
        names.add(str(v.get("name")))
        raw = str((v.get("hostPath") or {}).get("path", ""))
        path = posixpath.normpath(raw) if raw.startswith("/") else raw
        exact = path in allowed and raw.rstrip("/") == path
        if not exact and any(path == p or path.startswith(p.rstrip("/") + "/") for p in RUNTIME_PATHS):
            out.append(f"{what}: volume {v.get('name')!r}: host path {raw!r} holds container runtime state or sockets")
        elif not exact:
            out.append(f"{what}: volume {v.get('name')!r}: host path {raw!r} is not one the checks read "
                       f"({', '.join(sorted(allowed))})")
        if (v.get("hostPath") or {}).get("type") in CREATING_TYPES:
            out.append(f"{what}: volume {v.get('name')!r}: hostPath type {v['hostPath']['type']} creates what is "
                       "missing on the host; a check creates nothing there")
    return names


def _mounts(c: dict[str, Any], host_paths: set[str]) -> Iterator[str]:
    for m in c.get("volumeMounts") or []:
        if m.get("name") not in host_paths:
            continue
        if m.get("readOnly") is not True or m.get("recursiveReadOnly") != "Enabled":
            yield (f"the host path mount {m.get('mountPath')!r} must be readOnly: true with recursiveReadOnly: "
                   "Enabled (its submounts read-only too)")
        if m.get("mountPropagation") not in (None, "None"):
            yield f"the host path mount {m.get('mountPath')!r} must not propagate mounts (mountPropagation: None)"
    if c.get("volumeDevices"):
        yield "volumeDevices are not allowed"


def _env_and_ports(c: dict[str, Any]) -> Iterator[str]:
    """No Secret of Sweeper's namespace in a check's environment, and no port on the node's own address."""
    if any(((e.get("valueFrom") or {}).get("secretKeyRef")) for e in c.get("env") or []) \
            or any("secretRef" in e for e in c.get("envFrom") or []):
        yield "a Secret in the environment is not allowed: a check reads nothing of the cluster's"
    if any(p.get("hostPort") or p.get("hostIP") for p in c.get("ports") or []):
        yield "hostPort is not allowed: a check listens on no port of the node"


def _unconfined(sc: dict[str, Any]) -> Iterator[str]:
    if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
        yield "seccompProfile Unconfined is not allowed"
    if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        yield "appArmorProfile Unconfined is not allowed"
    if sc.get("procMount") == "Unmasked":
        yield "procMount Unmasked is not allowed"


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(key) or []:
            if isinstance(c, dict):
                yield c


# The remediation templates Sweeper ships, and the config key of the one image each may run
# privileged; a template of the same name in the author's folder gets no privilege.
REMEDIATION_TEMPLATES = {"reboot.yaml.j2": "reboot_image", "gpu-reset.yaml.j2": "check_image"}


# The template variables Sweeper sets (run_job's and run_pair_job's); `sweeper lint` refuses a
# playbook whose `vars` names one, as the runtime does.
SWEEPER_VARS = frozenset({
    "node", "partner", "run_id", "job_name", "service_name", "namespace", "taint_key", "prefix", "timeout", "ttl",
    "labels", "affinity", "pair_affinity", "tolerations", "all_gpus", "gpu_claims", "fabric_resources", "priority_class",
    "platform", "runtime_class", "dcgm_hostengine", "default_dcgm_level", "image", "dcgm_image", "nccl_image",
    "pair_image", "mpi_image", "reboot_image"})


def protected(extra: dict[str, Any], sweeper_vars: dict[str, Any], action: str) -> None:
    """A playbook's `vars` may add template variables, never replace one Sweeper sets."""
    clash = sorted(k for k in extra if k in sweeper_vars or k in SWEEPER_VARS)
    if clash:
        raise PlaybookError(f"{action}: vars may not set {', '.join(clash)}: Sweeper sets "
                            f"{'it' if len(clash) == 1 else 'them'} (placement, tolerations, namespace, images "
                            "and labels come from the config and the held node, never from a playbook)")
