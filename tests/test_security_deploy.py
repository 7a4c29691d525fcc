"""The deployment's boundaries (docs/security.md): each attack on the shipped manifests is refused.

The Pod Security levels are checked with the simulator's admission (sweeper/sim/podspec.py, which
sweeper/sim/cluster.py applies), the RBAC with the simulator's evaluator (sweeper/sim/rbac.py), and
the ValidatingAdmissionPolicies with a real CEL implementation (cel-python) through
sweeper/sim/admission.py."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.actions.pair import render_pair
from sweeper.admission import ACCOUNT, deployed_config, render_policies, shapes
from sweeper.config import Config
from sweeper.errors import ConfigError
from sweeper.manifests import GPU_NODE_LABELS, Options, render
from sweeper.profiles import load_profile
from sweeper.remedy import Remediator
from sweeper.sim.admission import Policies
from sweeper.sim.cluster import node_affinity_matches, pod_security_violations, tolerates
from sweeper.sim.rbac import allowed, rules_from_manifests

ROOT = Path(__file__).resolve().parent.parent
P5 = load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()
LEVELS = ("restricted", "baseline", "privileged")


def docs_of(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def controller_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["jobTemplate"]["spec"]["template"] if d["kind"] == "CronJob" else d["spec"]["template"]
            for d in docs if d["kind"] in ("CronJob", "Deployment")]


def node_ctx(cfg: Config | None = None) -> ActionContext:
    return ActionContext(config=cfg or Config(), run_id="sw-1", node={
        "name": "ip-10-0-1-2.ec2.internal", "gpus": 8, "labels": {"kubernetes.io/hostname": "ip-10-0-1-2"},
        "annotations": {}, "profile": P5})


def test_the_deploy_files_are_what_the_generators_print() -> None:
    """deploy/ is generated: a change to the base, the templates or the generators shows here."""
    assert (ROOT / "deploy" / "cronjob.yaml").read_text() == render(ROOT, "cronjob", Options())
    assert (ROOT / "deploy" / "serve" / "serve.yaml").read_text() == render(ROOT, "serve", Options())
    assert (ROOT / "deploy" / "admission-policy.yaml").read_text() == render_policies(ROOT)


# -- Pod Security ------------------------------------------------------------------------------------------
def lowest_level(pods: list[dict[str, Any]]) -> str:
    """The lowest Pod Security level that admits every pod (https://kubernetes.io/docs/concepts/security/pod-security-standards/)."""
    return next(lv for lv in LEVELS if lv == "privileged" or not any(pod_security_violations(p, lv) for p in pods))


@pytest.mark.parametrize("name", ["cronjob.yaml", "serve/serve.yaml"])
def test_the_controller_namespace_is_restricted_and_admits_the_controller(name: str) -> None:
    """The pod that holds the API token and serves HTTP runs at `restricted`, which its own pod spec
    satisfies (non-root, no escalation, every capability dropped, RuntimeDefault seccomp). On main the
    namespace was `privileged`, shared with the check Jobs."""
    docs = docs_of(name)
    levels = {d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for d in docs if d["kind"] == "Namespace"}
    assert levels["sweeper"] == "restricted"
    for template in controller_pods(docs):
        assert pod_security_violations(template, "restricted") == []


def test_the_job_namespaces_are_at_the_lowest_level_their_jobs_need() -> None:
    """Each Job namespace is labelled with the lowest level that admits every Job rendered for it; if
    the templates one day need no host path, the test asks for `baseline` (baseline forbids hostPath
    volumes and privileged containers: https://kubernetes.io/docs/concepts/security/pod-security-standards/#baseline)."""
    cfg = deployed_config(ROOT)
    ctx = node_ctx(replace(cfg, template_dir=str(ROOT / "job-templates")))
    checks = [render_job(ctx, t, 900, {})["spec"]["template"] for t in
              ("sweeper-check.yaml.j2", "sweeper-light.yaml.j2", "dcgm-diag.yaml.j2", "nccl-allreduce.yaml.j2")]
    remediation = [render_job(ctx, "reboot.yaml.j2", 600, {}, remediation=True)["spec"]["template"],
                   render_job(ctx, "gpu-reset.yaml.j2", 600, {"gpu_ids": "0"}, remediation=True,
                              bound=True)["spec"]["template"]]
    levels = {d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
              for d in docs_of("cronjob.yaml") if d["kind"] == "Namespace"}
    assert levels[cfg.check_namespace] == lowest_level(checks)
    assert levels[cfg.remediation_namespace] == lowest_level(remediation)
    assert any("hostPath volumes" in v for p in checks for v in pod_security_violations(p, "baseline")), \
        "the node check's host paths are why the check namespace is privileged"


# -- RBAC ----------------------------------------------------------------------------------------------------
def test_the_controllers_account_creates_no_job_beside_itself() -> None:
    """Sweeper's account may create Jobs only in the check and remediation namespaces, never in its own,
    where its token lives (on main: a Job in `sweeper`, at `privileged`, could mount anything). The
    remediation Jobs' account is bound to no role and mounts no token."""
    docs = docs_of("cronjob.yaml")
    rules = rules_from_manifests(docs, "sweeper", "sweeper")
    assert allowed(rules, "batch", "jobs", "create", "sweeper") is None
    assert allowed(rules, "", "pods", "create", "sweeper") is None
    assert allowed(rules, "batch", "jobs", "create", "sweeper-checks") is not None
    assert allowed(rules, "batch", "jobs", "create", "sweeper-remediation") is not None
    assert allowed(rules, "batch", "jobs", "create", "kube-system") is None
    assert rules_from_manifests(docs, "sweeper-remediation", "sweeper-remediation") == []
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "sweeper-remediation")
    assert sa["metadata"]["namespace"] == "sweeper-remediation" and sa["automountServiceAccountToken"] is False


def test_remediation_jobs_run_apart_under_their_own_account() -> None:
    cfg = replace(Config(), template_dir=str(ROOT / "job-templates"))
    job = Remediator(None, cfg, None)._remediation_job("sw-1", node_ctx().node or {}, cfg.reboot_template, {})
    assert job["metadata"]["namespace"] == "sweeper-remediation"
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "sweeper-remediation"
    assert render_job(node_ctx(cfg), "sweeper-check.yaml.j2", 900, {})["metadata"]["namespace"] == "sweeper-checks"


# -- the controller's placement and network -------------------------------------------------------------------
NODES = {  # labels of nodes on each platform; True: a GPU node the controller must keep off
    "gpu-operator": ({"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "x"}, True),
    "eks-karpenter": ({"karpenter.k8s.aws/instance-gpu-count": "8", "node.kubernetes.io/instance-type": "p5.48xlarge"},
                      True),
    "eks-managed-group": ({"node.kubernetes.io/instance-type": "p4d.24xlarge"}, True),
    "gke": ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "node.kubernetes.io/instance-type": "a3-highgpu-8g"},
            True),
    "aks": ({"kubernetes.azure.com/accelerator": "nvidia", "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5"},
            True),
    "cpu": ({"node.kubernetes.io/instance-type": "m7i.2xlarge", "kubernetes.io/os": "linux"}, False),
}


@pytest.mark.parametrize("platform", sorted(NODES))
def test_the_controller_keeps_off_gpu_nodes(platform: str) -> None:
    """Node affinity keeps the controller off the nodes it may reboot, where `nvidia.com/gpu.present` is
    absent too (EKS, GKE, AKS without the GPU Operator); it tolerates no GPU taint. On main it could
    land on any node."""
    labels, gpu = NODES[platform]
    node = {"metadata": {"name": platform, "labels": labels}}
    for template in controller_pods(docs_of("cronjob.yaml")) + controller_pods(docs_of("serve/serve.yaml")):
        assert node_affinity_matches(template, node) is (not gpu), platform
        for taint in ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                      {"key": "sku", "value": "gpu", "effect": "NoSchedule"}):
            assert not tolerates(template["spec"].get("tolerations"), taint)
    assert set(GPU_NODE_LABELS) <= {e["key"] for e in controller_pods(docs_of("cronjob.yaml"))[0]["spec"]["affinity"][
        "nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]}


def test_only_the_metrics_namespace_reaches_serve() -> None:
    """A NetworkPolicy selects Sweeper's pods and admits only the monitoring namespace, on the http port
    (https://kubernetes.io/docs/concepts/services-networking/network-policies/); serve listens on the
    pod IP, not every interface."""
    docs = docs_of("serve/serve.yaml")
    (np,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    serve = next(d for d in docs if d["kind"] == "Deployment")
    pod_labels = serve["spec"]["template"]["metadata"]["labels"]
    assert np["metadata"]["namespace"] == serve["metadata"]["namespace"]
    assert all(pod_labels.get(k) == v for k, v in np["spec"]["podSelector"]["matchLabels"].items())
    assert np["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": "http"}]
    container = serve["spec"]["template"]["spec"]["containers"][0]
    assert "0.0.0.0" not in container["command"]
    assert any(d["kind"] == "NetworkPolicy" for d in docs_of("cronjob.yaml"))


# -- the webhook credential ----------------------------------------------------------------------------------
def test_the_webhook_url_comes_from_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The URL is a credential (a Slack incoming webhook posts with it alone): the deploy reads it from
    the optional Secret sweeper-webhook into $SWEEPER_WEBHOOK_URL, the ConfigMap leaves it empty, and
    webhook_url_file reads a mounted Secret's key. $SWEEPER_WEBHOOK_URL wins, then the file, then the key."""
    for template in controller_pods(docs_of("cronjob.yaml")):
        env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        assert env["SWEEPER_WEBHOOK_URL"]["valueFrom"]["secretKeyRef"] == {"name": "sweeper-webhook", "key": "url",
                                                                          "optional": True}
    assert deployed_config(ROOT).webhook_url == ""
    secret = tmp_path / "url"
    secret.write_text("https://hooks.example/file\n")
    cfg = Config(webhook_url="https://hooks.example/key", webhook_url_file=str(secret))
    assert cfg.webhook({}) == "https://hooks.example/file"
    assert cfg.webhook({"SWEEPER_WEBHOOK_URL": "https://hooks.example/env"}) == "https://hooks.example/env"
    assert Config(webhook_url="https://hooks.example/key").webhook({}) == "https://hooks.example/key"
    with pytest.raises(ConfigError, match="webhook_url_file"):
        Config(webhook_url_file=str(tmp_path / "absent")).webhook({})


# -- the IAM policy --------------------------------------------------------------------------------------------
def test_the_iam_policy_replaces_only_in_tagged_groups() -> None:
    """SetInstanceHealth and TerminateInstanceInAutoScalingGroup are allowed only on groups tagged
    sweeper.dev/remediate=true (autoscaling:ResourceTag/<key>:
    https://docs.aws.amazon.com/autoscaling/ec2/userguide/tag-security.html); on main, any group."""
    stmts = json.loads((ROOT / "deploy" / "eks" / "iam-policy.json").read_text())["Statement"]
    for stmt in stmts:
        writes = [a for a in stmt["Action"] if not a.split(":")[1].startswith("Describe")]
        if writes:
            assert stmt["Condition"] == {"StringEquals": {"autoscaling:ResourceTag/sweeper.dev/remediate": "true"}}
    assert {a for s in stmts if "Condition" in s for a in s["Action"]} == {
        "autoscaling:SetInstanceHealth", "autoscaling:TerminateInstanceInAutoScalingGroup"}


# -- the admission policies, evaluated with CEL -------------------------------------------------------------
@pytest.fixture(scope="module")
def policies() -> Policies:
    return Policies(docs_of("admission-policy.yaml"))


def review_job(policies: Policies, job: dict[str, Any], namespace: str | None = None, user: str = ACCOUNT) -> str:
    ns = namespace or job["metadata"]["namespace"]
    d = policies.review("CREATE", "batch", "v1", "jobs", ns, job["metadata"]["name"], user, job, None)
    return d.message if d else ""


def test_every_template_job_passes_the_policy(policies: Policies) -> None:
    """What Sweeper itself creates, on every platform and profile, is admitted (else the policy would
    refuse Sweeper's own checks)."""
    cfg = deployed_config(ROOT)
    for platform in ("generic", "gke"):
        ctx = node_ctx(replace(cfg, platform=platform, template_dir=str(ROOT / "job-templates")))
        for t in ("sweeper-check.yaml.j2", "sweeper-light.yaml.j2", "dcgm-diag.yaml.j2", "nccl-allreduce.yaml.j2"):
            assert review_job(policies, render_job(ctx, t, 900, {})) == "", t
        pair_ctx = replace(ctx, partner={**(ctx.node or {}), "name": "ip-10-0-1-3.ec2.internal",
                                         "labels": {"kubernetes.io/hostname": "ip-10-0-1-3"}})
        _, pair_job, _ = render_pair(pair_ctx, "nccl-pair.yaml.j2", 1800, {})
        assert review_job(policies, pair_job) == "", "the pair check"
        rem = Remediator(None, replace(cfg, platform=platform, template_dir=str(ROOT / "job-templates")), None)
        for t, extra in (("reboot.yaml.j2", {}), ("gpu-reset.yaml.j2", {"gpu_ids": "0"})):
            assert review_job(policies, rem._remediation_job("sw-1", ctx.node or {}, t, extra)) == "", t
    check, remediation = shapes(ROOT, cfg)
    # the check mounts the host's /sys and journald's two directories, never its root (sweeper.actions.safety)
    assert {"/sys", "/var/log/journal", "/run/log/journal"} <= check.host_paths and "/" not in check.host_paths
    assert not {p for p in check.host_paths if p.startswith("/run")} - {"/run/log/journal"}
    assert not check.privileged and remediation.privileged


def _attack(job: dict[str, Any], change: Any) -> dict[str, Any]:
    out = copy.deepcopy(job)
    change(out["spec"]["template"]["spec"], out)
    return out


ATTACKS = {
    "a Job in the controller's namespace": (lambda s, j: j["metadata"].update(namespace="sweeper"), "sweeper"),
    "the controller's token mounted": (lambda s, j: s.update(serviceAccountName="sweeper",
                                                             automountServiceAccountToken=True), None),
    "a privileged check": (lambda s, j: s["containers"][0]["securityContext"].update(privileged=True), None),
    "the host's /etc": (lambda s, j: s["volumes"].append({"name": "etc", "hostPath": {"path": "/etc"}}), None),
    "another image": (lambda s, j: s["containers"][0].update(image="docker.io/attacker/miner:1"), None),
    "the host network": (lambda s, j: s.update(hostNetwork=True), None),
    "a capability no template adds": (lambda s, j: s["containers"][0]["securityContext"]["capabilities"].update(
        add=["SYS_ADMIN", "SYS_MODULE"]), None),
    "a pinned node, past the scheduler": (lambda s, j: s.update(nodeName="control-plane-1"), None),
    "not Sweeper's label": (lambda s, j: j["metadata"]["labels"].pop("app.kubernetes.io/managed-by"), None),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_job_not_of_a_template_shape_is_refused(policies: Policies, attack: str) -> None:
    """A ValidatingAdmissionPolicy (GA in Kubernetes 1.30:
    https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/) matched on
    Sweeper's username refuses a Job no template makes; another user's Job is not its business."""
    change, ns = ATTACKS[attack]
    job = render_job(node_ctx(replace(deployed_config(ROOT), template_dir=str(ROOT / "job-templates"))),
                     "sweeper-check.yaml.j2", 900, {})
    bad = _attack(job, change)
    message = review_job(policies, bad, ns)
    assert "ValidatingAdmissionPolicy 'sweeper-jobs' with binding 'sweeper-jobs' denied request" in message, attack
    assert review_job(policies, bad, ns, user="system:serviceaccount:ci:deployer") == ""


def node(labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "labels": labels or {"kubernetes.io/hostname": "n"},
                         "annotations": annotations or {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"taints": taints or [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def review_node(policies: Policies, old: dict[str, Any], change: Any, sub: str = "") -> str:
    new = copy.deepcopy(old)
    change(new)
    d = policies.review("UPDATE", "", "v1", "nodes" + (f"/{sub}" if sub else ""), None, "n", ACCOUNT, new, old)
    return d.message if d else ""


SWEEP_TAINT = {"key": "sweeper.dev/sweep", "value": "sw-1", "effect": "NoSchedule"}


def test_node_writes_are_sweepers_own_and_never_on_the_control_plane(policies: Policies) -> None:
    """RBAC cannot narrow `patch nodes` by label (rules name resources and resourceNames only:
    https://kubernetes.io/docs/reference/access-authn-authz/rbac/#referring-to-resources); the policy
    admits Sweeper's own writes and refuses the rest."""
    ok = [
        lambda n: n["spec"]["taints"].append(SWEEP_TAINT),
        lambda n: n["metadata"]["labels"].update({"sweeper.dev/suspect": "true",
                                                  "nvidia.com/gpu.deploy.device-plugin": "false"}),
        lambda n: n["metadata"]["annotations"].update({"karpenter.sh/do-not-disrupt": "true",
                                                       "sweeper.dev/last-result": "pass"}),
        lambda n: n["spec"].update(unschedulable=True),
    ]
    for change in ok:
        assert review_node(policies, node(), change) == ""
    assert review_node(policies, node(), lambda n: n["status"]["conditions"].append(
        {"type": "GpuSweepHealthy", "status": "False"}), "status") == ""
    held = node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, SWEEP_TAINT])
    assert review_node(policies, held, lambda n: n["spec"]["taints"].remove(SWEEP_TAINT)) == ""
    refused = {
        "another's taint removed": (node(), lambda n: n["spec"].update(taints=[])),
        "a NoExecute taint": (node(), lambda n: n["spec"]["taints"].append(
            {"key": "evict", "value": "all", "effect": "NoExecute"})),
        "a role label": (node(), lambda n: n["metadata"]["labels"].update({"node-role.kubernetes.io/control-plane": ""})),
        "another's annotation": (node(), lambda n: n["metadata"]["annotations"].pop("node.alpha.kubernetes.io/ttl")),
        "Ready flipped": (node(), lambda n: n["status"]["conditions"][0].update(status="False")),
        "the control plane held": (node(labels={"node-role.kubernetes.io/control-plane": ""}),
                                   lambda n: n["spec"]["taints"].append(SWEEP_TAINT)),
    }
    for what, (old, change) in refused.items():
        assert "ValidatingAdmissionPolicy 'sweeper-node-writes'" in review_node(policies, old, change), what


def test_nodeclaims_of_other_nodepools_are_refused() -> None:
    """The NodeClaim policy names the NodePools `remediation` sends to Karpenter; the shipped config
    names none, so every NodeClaim delete by Sweeper's account is refused until one is configured."""
    claim = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
             "metadata": {"name": "gpu-abc", "labels": {"karpenter.sh/nodepool": "gpu"}}}
    other = {**claim, "metadata": {"name": "sys-abc", "labels": {"karpenter.sh/nodepool": "system"}}}

    def review(p: Policies, c: dict[str, Any]) -> str:
        d = p.review("DELETE", "karpenter.sh", "v1", "nodeclaims", None, c["metadata"]["name"], ACCOUNT, None, c)
        return d.message if d else ""
    shipped = Policies(docs_of("admission-policy.yaml"))
    assert "sweeper-nodeclaims" in review(shipped, claim)
    cfg = replace(deployed_config(ROOT), remediation={"default": "manual", "by_pool": {"gpu": "karpenter"},
                                                       "by_profile": {}})
    configured = Policies([d for d in yaml.safe_load_all(render_policies(ROOT, cfg)) if d])
    assert review(configured, claim) == ""
    assert "sweeper-nodeclaims" in review(configured, other)
