"""The simulated cluster refuses what the shipped deploy/ refuses, as the apiserver would: a sweep
under Sweeper's own token, with the shipped RBAC and admission policies enforced, does everything
it needs and is refused nothing; the same token is refused each attack of docs/security.md with the
apiserver's 403; and a namespace's Pod Security level refuses a pod it forbids."""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sweeper.config import Config
from sweeper.history import History
from sweeper.kube import Kube, RetryPolicy
from sweeper.sim.admission import Policies
from sweeper.sim.rbac import rules_from_manifests
from tests.conftest import TEST_CONFIG, Sim, fleet_spec

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "system:serviceaccount:sweeper:sweeper"


def docs_of(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def as_sweeper(sim: Sim, tmp_path: Path) -> tuple[Kube, client.ApiClient]:
    """Sweeper's service account, its RBAC from deploy/ (the Karpenter document too) and the shipped
    admission policies enforced: a Kube and a raw client that carry its token."""
    token = secrets.token_urlsafe(24)
    rules = rules_from_manifests(docs_of("cronjob.yaml") + docs_of("rbac-karpenter.yaml"), "sweeper", "sweeper")
    sim.server.service_accounts[token] = (ACCOUNT, rules)
    sim.server.admission = Policies(docs_of("admission-policy.yaml"))
    kc = sim.server.write_kubeconfig(tmp_path / "kubeconfig-sweeper", namespace="sweeper")
    kc.write_text(kc.read_text().replace("sim-token", token))
    kube = Kube.from_config(str(kc), clock=sim.cluster.clock)
    kube.retry = RetryPolicy(attempts=8, base=0.5)
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kc), client_configuration=cfg)
    return kube, client.ApiClient(cfg)


def label_namespaces(sim: Sim) -> None:
    """The Pod Security labels deploy/ gives its namespaces."""
    for d in docs_of("cronjob.yaml"):
        if d["kind"] == "Namespace":
            sim.core.patch_namespace(d["metadata"]["name"], {"metadata": {"labels": d["metadata"]["labels"]}})


def test_a_sweep_under_sweepers_token_is_refused_nothing(make_sim, history: History, tmp_path: Path) -> None:
    """Check Jobs, a GPU reset in the remediation namespace, taints, labels, annotations and the node
    condition: every write of a sweep passes RBAC, Pod Security and the admission policies."""
    from sweeper.sweep import Sweep

    sim: Sim = make_sim(fleet_spec(nodes=3, faults={"gpu-01": {"remap_pending": [5]}, "gpu-02": {"missing_gpus": 1}}))
    label_namespaces(sim)
    kube, api = as_sweeper(sim, tmp_path)
    try:
        cfg = replace(TEST_CONFIG, remediate_reboots=True, node_condition=True, light_playbook="")
        report = Sweep(kube, cfg, history, clock=sim.cluster.clock).run()
        verdicts = {o.node: o.verdict for o in report.outcomes}
        assert verdicts["gpu-00"] == "pass" and verdicts["gpu-02"] == "reboot", report.outcomes
        assert sim.core.read_node("gpu-01").metadata.annotations["sweeper.dev/remediation"] == "gpu-reset"
        assert sim.server.denied == [] and sim.server.admission_denied == []
        assert any(p.endswith("/namespaces/sweeper-remediation/jobs") for m, p in sim.cluster.store.requests
                   if m == "POST"), "the remediation Job went to its own namespace"
    finally:
        kube.close()
        api.close()


def check_job(name: str, namespace: str = "sweeper-checks", **pod: Any) -> dict[str, Any]:
    """A Job that looks like Sweeper's, with `pod` over its pod spec."""
    spec = {"restartPolicy": "Never", "automountServiceAccountToken": False,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-00"]}]}]}}},
            "containers": [{"name": "check", "image": Config().check_image, "command": ["sweeper", "check"]}],
            **pod}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "sweeper"}},
            "spec": {"template": {"spec": spec}}}


ROOTED = {"volumes": [{"name": "host", "hostPath": {"path": "/"}}],
          "containers": [{"name": "x", "image": "docker.io/attacker/tool:1", "command": ["sh"],
                          "securityContext": {"privileged": True},
                          "volumeMounts": [{"name": "host", "mountPath": "/host"}]}]}


def refused(call: Any) -> str:
    """The message of the 403 Status the call gets."""
    with pytest.raises(ApiException) as exc:
        call()
    assert exc.value.status == 403, exc.value.body
    return str(json.loads(exc.value.body)["message"])


def test_sweepers_token_is_refused_each_attack(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2)
    label_namespaces(sim)
    kube, api = as_sweeper(sim, tmp_path)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    try:
        # a Job beside the controller, where its token lives: RBAC
        e = refused(lambda: batch.create_namespaced_job("sweeper", check_job("j1", "sweeper")))
        assert 'User "system:serviceaccount:sweeper:sweeper" cannot create resource "jobs"' in e
        # a Job of its templates' shape is admitted; a privileged, host-rooted one of another image is not
        batch.create_namespaced_job("sweeper-checks", check_job("j2"))
        e = refused(lambda: batch.create_namespaced_job("sweeper-checks", check_job("j3", **ROOTED)))
        assert "ValidatingAdmissionPolicy 'sweeper-jobs' with binding 'sweeper-jobs' denied request" in e
        # the controller's own account on a check pod
        e = refused(lambda: batch.create_namespaced_job("sweeper-checks", check_job(
            "j4", serviceAccountName="sweeper", automountServiceAccountToken=True)))
        assert "sweeper-jobs" in e
        # a control-plane node: the admin labels gpu-01 so; Sweeper's taint on it is refused
        sim.core.patch_node("gpu-01", {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}})
        e = refused(lambda: core.patch_node("gpu-01", {"spec": {"taints": [
            {"key": "sweeper.dev/sweep", "value": "sw-x", "effect": "NoSchedule"}]}}))
        assert "Sweeper never writes a control-plane node" in e
        # another's taint removed from a GPU node
        sim.core.patch_node("gpu-00", {"spec": {"taints": [{"key": "maintenance", "value": "x", "effect": "NoSchedule"}]}})
        e = refused(lambda: core.patch_node("gpu-00", {"spec": {"taints": []}}))
        assert "changes no taint but sweeper.dev/sweep" in e
        # Sweeper's own label is admitted
        core.patch_node("gpu-00", {"metadata": {"labels": {"sweeper.dev/suspect": "true"}}})
        assert len(sim.server.admission_denied) == 4
    finally:
        kube.close()
        api.close()


def test_pod_security_refuses_what_the_namespace_level_forbids(make_sim) -> None:
    """A pod created in a namespace is refused by its enforce level with the apiserver's words: the
    controller's `restricted` namespace refuses a host-rooted pod, even the admin's
    (https://kubernetes.io/docs/concepts/security/pod-security-admission/)."""
    sim: Sim = make_sim(nodes=1)
    label_namespaces(sim)
    pod = {"metadata": {"name": "x"}, "spec": ROOTED}
    message = refused(lambda: sim.core.create_namespaced_pod("sweeper", pod))
    assert message.startswith('pods "x" is forbidden: violates PodSecurity "restricted:latest": '
                              'hostPath volumes (volume "host"), privileged (container "x" must not set '
                              'securityContext.privileged=true), '), message
    assert "runAsNonRoot != true" in message and "seccompProfile (pod or container" in message
    # the check namespace is privileged: the same pod is admitted there
    sim.core.create_namespaced_pod("sweeper-checks", pod)
