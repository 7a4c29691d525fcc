"""Deployable manifests and rendered check Jobs are valid Kubernetes objects."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.config import Config, load_config
from sweeper.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
K8S = "1.31"


def test_cronjob_manifest_validates_and_its_config_loads(tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "cronjob.yaml").read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                     "Role", "RoleBinding", "PersistentVolumeClaim", "ConfigMap", "CronJob"]
    for d in docs:
        kubernetes_validate.validate(d, K8S, strict=True)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(cm["data"]["config.yaml"])
    cfg = load_config(cfg_file)
    assert cfg.max_nodes == 4 and cfg.check_timeout == 900
    cron = next(d for d in docs if d["kind"] == "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


@pytest.mark.parametrize("template", sorted(p.name for p in (ROOT / "job-templates").glob("*.j2")))
def test_job_templates_render_valid_jobs(template: str) -> None:
    ctx = ActionContext(config=Config(), node={
        "name": "ip-10-0-1-2.ec2.internal", "gpus": 8,
        "labels": {"kubernetes.io/hostname": "ip-10-0-1-2", "evil": "{{ 7*7 }}: [x]"},
        "annotations": {}, "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()}, run_id="sw-1")
    job = render_job(ctx, template, 900, {})
    kubernetes_validate.validate(job, K8S, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert "nodeName" not in pod, "check Jobs go through the scheduler"
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["values"] == ["ip-10-0-1-2"]
    assert {"key": Config().taint_key, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    limits = pod["containers"][0]["resources"]["limits"]
    if template == "sweeper-light.yaml.j2":
        assert "nvidia.com/gpu" not in limits, "the light check on a busy node takes no GPU"
    else:
        assert limits["nvidia.com/gpu"] == "8", "a check takes all of the node's GPUs"
    assert job["spec"]["activeDeadlineSeconds"] == 900
