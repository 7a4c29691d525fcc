"""The ValidatingAdmissionPolicies that bound what Sweeper's own service account may write, generated
from the job templates and the deployed configuration:

    python -m sweeper.admission > deploy/admission-policy.yaml

RBAC grants verbs on resources, never on shapes or labels
(https://kubernetes.io/docs/reference/access-authn-authz/rbac/#referring-to-resources), so an account
that may create a Job may create any Job and one that may patch nodes may patch any node. These
policies (admissionregistration.k8s.io/v1, GA in Kubernetes 1.30:
https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/) match only
requests of Sweeper's account (`matchConditions` on request.userInfo.username) and refuse:
- a Job that is not one of its templates' shapes: outside the check and remediation namespaces,
  with an image, host path, capability or host namespace no template of that namespace uses, a
  privileged container among the checks, a service account or a mounted token it should not have,
  or no node affinity;
- a node write on a control-plane node, or one that changes anything but Sweeper's own taint,
  labels and annotations (and the GPU Operator's deploy labels a GPU reset pauses), Karpenter's
  do-not-disrupt annotation, the cordon, and the GpuSweepHealthy condition;
- a NodeClaim delete outside the NodePools the configuration sends to Karpenter.

Each binding denies (`validationActions: [Deny]`). The expressions use only standard CEL (macros,
`in`, `startsWith`, `has`), so the tests evaluate them with a CEL implementation as they stand."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sweeper import profiles as prof
from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.actions.pair import render_pair
from sweeper.config import PLATFORMS, Config, home, manifest_config
from sweeper.drivers import CUDA_LABELS
from sweeper.schema import own_load_all

ACCOUNT = "system:serviceaccount:sweeper:sweeper"
MANAGED = "app.kubernetes.io/managed-by"
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
# Node labels and annotations of others that Sweeper's own code writes: the GPU Operator's per-operand
# deploy labels, which a GPU reset sets to "false" and puts back (sweeper/remedy.py), and Karpenter's
# do-not-disrupt annotation on a held node (https://karpenter.sh/docs/concepts/disruption/).
FOREIGN_LABEL_PREFIXES = ("nvidia.com/gpu.deploy.",)
FOREIGN_ANNOTATIONS = ("karpenter.sh/do-not-disrupt",)
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
CONDITION = "GpuSweepHealthy"
POD = "object.spec.template.spec"
CONTAINERS = f"((has({POD}.initContainers) ? {POD}.initContainers : []) + {POD}.containers)"


@dataclass
class Shape:
    """What the Jobs of one namespace use, over every template, platform and profile."""

    images: set[str] = field(default_factory=set)
    host_paths: set[str] = field(default_factory=set)
    capabilities: set[str] = field(default_factory=set)
    host_namespaces: set[str] = field(default_factory=set)
    privileged: bool = False

    def add(self, job: dict[str, Any]) -> None:
        pod = job["spec"]["template"]["spec"]
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            self.images.add(c["image"])
            sc = c.get("securityContext") or {}
            self.privileged |= bool(sc.get("privileged"))
            self.capabilities.update((sc.get("capabilities") or {}).get("add") or [])
        self.host_paths.update(v["hostPath"]["path"] for v in pod.get("volumes") or [] if "hostPath" in v)
        self.host_namespaces.update(k for k in HOST_NAMESPACES if pod.get(k))


def _nodes(root: Path, config: Config) -> list[dict[str, Any]]:
    """One sample node per profile, of the profile's first instance type; and one more per CUDA major
    of `dcgm_images`, whose driver runs it (GPU feature discovery's label), so each DCGM build is rendered."""
    out = []
    for p in prof.load_profiles(root / "profiles").values():
        itype = (p.instance_types or ("unknown",))[0]
        labels = {"kubernetes.io/hostname": "ip-10-0-0-1", "node.kubernetes.io/instance-type": itype}
        for cuda in (None, *sorted(config.dcgm_images)):
            out.append({"name": "ip-10-0-0-1.ec2.internal", "gpus": p.gpus or 8, "annotations": {},
                        "labels": {**labels, **({CUDA_LABELS[0]: str(cuda)} if cuda else {})},
                        "profile": p.as_vars()})
    return out


def shapes(root: Path, config: Config) -> tuple[Shape, Shape]:
    """The shapes of the check Jobs and of the remediation Jobs, as the templates render them on each
    platform and profile."""
    checks, remediation = Shape(), Shape()
    special = {config.reboot_template: {}, config.gpu_reset_template: {"gpu_ids": "0"}}
    templates = sorted(p.name for p in (root / "job-templates").glob("*.j2"))
    nodes = _nodes(root, config)  # the profiles read once, not once per platform
    for platform in PLATFORMS:
        cfg = replace(config, platform=platform, template_dir=str(root / "job-templates"))
        for node in nodes:
            partner = {**node, "name": "ip-10-0-0-2.ec2.internal",
                       "labels": {**node["labels"], "kubernetes.io/hostname": "ip-10-0-0-2"}}
            ctx = ActionContext(config=cfg, node=node, partner=partner, run_id="sw-policy-0000")
            for name in templates:
                if name in special:
                    remediation.add(render_job(ctx, name, 600, special[name], remediation=True,
                                                bound=name == config.gpu_reset_template))
                elif "pair_affinity" in (root / "job-templates" / name).read_text():
                    _, job, _ = render_pair(ctx, name, 900, {})
                    if job.get("kind") == "Job":  # the MPIJob form is no Job (see docs/security.md)
                        checks.add(job)
                else:
                    checks.add(render_job(ctx, name, 900, {}))
    return checks, remediation


def _list(values: set[str] | tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in sorted(values)) + "]"


def _quote(v: str) -> str:
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _shape_rules(shape: Shape) -> dict[str, str]:
    """The expressions one namespace's Jobs must satisfy, by what they check."""
    flag = "(!has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged)"
    caps = ("(!has(c.securityContext) || !has(c.securityContext.capabilities) || "
            f"!has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(a, a in "
            f"{_list(shape.capabilities)}))")
    hosts = [f"(!has({POD}.{k}) || !{POD}.{k})" for k in HOST_NAMESPACES if k not in shape.host_namespaces]
    return {
        "images": f"{CONTAINERS}.all(c, c.image in {_list(shape.images)})",
        "host paths": f"!has({POD}.volumes) || {POD}.volumes.all(v, !has(v.hostPath) || "
                      f"v.hostPath.path in {_list(shape.host_paths)})",
        "capabilities": f"{CONTAINERS}.all(c, {caps})",
        "privileged": "true" if shape.privileged else f"{CONTAINERS}.all(c, {flag})",
        "host namespaces": " && ".join(hosts) or "true",
    }


def _validation(expression: str, message: str) -> dict[str, str]:
    return {"expression": expression, "message": message, "reason": "Forbidden"}


def _policy(name: str, rules: list[dict[str, Any]], validations: list[dict[str, str]], what: str) -> list[Any]:
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "sweeper"}},
              "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
                       "matchConditions": [{"name": "sweepers-account",
                                            "expression": f"request.userInfo.username == {_quote(ACCOUNT)}"}],
                       "validations": validations}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "sweeper"}},
               "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return [(what, policy), (f"{name} denies what its policy refuses.", binding)]


def job_policy(config: Config, checks: Shape, remediation: Shape) -> list[Any]:
    chk, rem = config.check_namespace, config.remediation_namespace
    by_ns = {k: f"request.namespace == {_quote(rem)} ? ({v}) : ({_shape_rules(checks)[k]})"
             for k, v in _shape_rules(remediation).items()}
    account = config.remediation_service_account
    validations = [
        _validation(f"request.namespace in {_list([chk, rem])}", f"Sweeper's Jobs run in {chk} or {rem} only"),
        _validation(f"has(object.metadata.labels) && '{MANAGED}' in object.metadata.labels && "
                    f"object.metadata.labels['{MANAGED}'] == 'sweeper'", f"Sweeper's Jobs carry {MANAGED}=sweeper"),
        _validation(f"request.namespace == {_quote(rem)} ? (has({POD}.serviceAccountName) && "
                    f"{POD}.serviceAccountName == {_quote(account)}) : (!has({POD}.serviceAccountName) || "
                    f"{POD}.serviceAccountName == 'default')",
                    f"a check runs as the namespace's default account, a remediation as {account}"),
        _validation(f"has({POD}.automountServiceAccountToken) && !{POD}.automountServiceAccountToken",
                    "no Job of Sweeper's mounts a service account token"),
        # The GPU reset alone is bound by nodeName: it runs while the device plugin is paused, when
        # no GPU is allocatable and the scheduler would place nothing that asks for one.
        _validation(f"request.namespace == {_quote(rem)} || !has({POD}.nodeName)",
                    "Sweeper's check Jobs go through the scheduler (no nodeName)"),
        _validation(f"(request.namespace == {_quote(rem)} && has({POD}.nodeName)) || (has({POD}.affinity) && "
                    f"has({POD}.affinity.nodeAffinity) && "
                    f"has({POD}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution))",
                    "Sweeper's Jobs are bound to their node by affinity (a remediation Job: or by nodeName)"),
        *(_validation(expr, f"{what}: only those of Sweeper's job templates for this namespace")
          for what, expr in by_ns.items())]
    rules = [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
              "resources": ["jobs"]}]
    return _policy("sweeper-jobs", rules, validations,
                   "Sweeper's account creates only Jobs of its templates' shapes, in its Job namespaces.")


def _keys_changed_only(field_name: str, allowed: str) -> str:
    """Every key of metadata.<field> added, removed or changed satisfies `allowed` (over k)."""
    new, old = f"object.metadata.{field_name}", f"oldObject.metadata.{field_name}"
    return (f"(!has({new}) || {new}.all(k, {allowed} || (has({old}) && k in {old} && {old}[k] == {new}[k]))) && "
            f"(!has({old}) || {old}.all(k, {allowed} || (has({new}) && k in {new})))")


def node_policy(config: Config) -> list[Any]:
    prefix = config.prefix + "/"
    labels = " || ".join(f"k.startsWith({_quote(p)})" for p in (prefix, *FOREIGN_LABEL_PREFIXES))
    annotations = f"k.startsWith({_quote(prefix)}) || k in {_list(FOREIGN_ANNOTATIONS)}"
    ours = [config.taint_key] + ([config.gate_taint] if config.gate_taint else [])  # its taint, and its gate's
    keep = " && ".join(f"t.key != {_quote(k)}" for k in ours)

    def others(obj: str) -> str:
        return f"(has({obj}.spec.taints) ? {obj}.spec.taints.filter(t, {keep}) : [])"

    def conditions(obj: str) -> str:
        return (f"(has({obj}.status) && has({obj}.status.conditions) ? "
                f"{obj}.status.conditions.filter(c, c.type != '{CONDITION}') : [])")
    validations = [
        _validation(f"!has(oldObject.metadata.labels) || !('{CONTROL_PLANE}' in oldObject.metadata.labels)",
                    "Sweeper never writes a control-plane node"),
        _validation(others("object") + " == " + others("oldObject"), f"Sweeper changes no taint but {' and '.join(ours)}"),
        _validation(_keys_changed_only("labels", labels), f"Sweeper changes no node label but {prefix}*"),
        _validation(_keys_changed_only("annotations", annotations),
                    f"Sweeper changes no node annotation but {prefix}* and karpenter.sh/do-not-disrupt"),
        _validation(conditions("object") + " == " + conditions("oldObject"),
                    f"Sweeper sets no node condition but {CONDITION}"),
    ]
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes", "nodes/status"]}]
    return _policy("sweeper-node-writes", rules, validations,
                   "Sweeper's account writes only its own taint, labels, annotations and condition, never on a "
                   "control-plane node (RBAC cannot narrow nodes by label).")


def karpenter_pools(config: Config) -> list[str] | None:
    """The NodePools whose nodes `remediation` replaces through Karpenter; None when the default does
    (every pool)."""
    rem = config.remediation or {}
    if rem.get("default") == "karpenter":
        return None
    return sorted(p for p, provider in (rem.get("by_pool") or {}).items() if provider == "karpenter")


def nodeclaim_policy(config: Config) -> list[Any]:
    pools = karpenter_pools(config)
    label = "oldObject.metadata.labels['karpenter.sh/nodepool']"
    has = "has(oldObject.metadata.labels) && 'karpenter.sh/nodepool' in oldObject.metadata.labels"
    expr = has if pools is None else f"{has} && {label} in {_list(pools)}"
    which = "any NodePool's" if pools is None else f"the NodePools {', '.join(pools) or '(none)'}"
    rules = [{"apiGroups": ["karpenter.sh"], "apiVersions": ["*"], "operations": ["DELETE"],
              "resources": ["nodeclaims"]}]
    return _policy("sweeper-nodeclaims", rules,
                   [_validation(expr, f"Sweeper deletes only NodeClaims of {which} (remediation: karpenter)")],
                   f"Sweeper's account deletes only NodeClaims of the configured NodePools ({which}).")


def deployed_config(root: Path) -> Config:
    """The configuration deploy/cronjob.yaml's ConfigMap holds: deploy/base.yaml's, with the images of
    deploy/base/kustomization.yaml (python -m sweeper.manifests writes them there first)."""
    docs = own_load_all((root / "deploy" / "cronjob.yaml").read_text())
    cm = next(d for d in docs if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sweeper-config")
    return manifest_config(yaml.safe_dump(cm))


def render_policies(root: Path | None = None, config: Config | None = None,
                    memo: dict[str, tuple[Shape, Shape]] | None = None) -> str:
    """`memo`: shapes already rendered from this root's templates, by config (`shapes` renders each
    platform whatever the config's own; the overlays' configs differ mostly by platform)."""
    root = root or home()
    config = config or deployed_config(root)
    key = repr(replace(config, platform=""))
    if memo is None or key not in memo:
        found = shapes(root, config)
        if memo is None:
            memo = {}
        memo[key] = found
    checks, remediation = memo[key]
    parts = ["# Generated by `python -m sweeper.admission` from job-templates/ and deploy/cronjob.yaml's config;\n"
             "# a test fails when it is stale. Kubernetes 1.30+. docs/security.md says what each refuses."]
    for comment, doc in job_policy(config, checks, remediation) + node_policy(config) + nodeclaim_policy(config):
        parts.append(f"# {comment}\n" + yaml.safe_dump(doc, sort_keys=False, width=120).rstrip("\n"))
    return "\n---\n".join(parts) + "\n"


def main() -> int:
    print(render_policies(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
