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
                     "Role", "RoleBinding", "PersistentVolumeClaim", "ConfigMap", "CronJob"] + ["ConfigMap"] * 4
    for d in docs:
        kubernetes_validate.validate(d, K8S, strict=True)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(cm["data"]["config.yaml"])
    cfg = load_config(cfg_file)
    assert cfg.max_nodes == 4 and cfg.check_timeout == 900 and cfg.playbook_dir == "/etc/sweeper/playbooks"
    cron = next(d for d in docs if d["kind"] == "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["startingDeadlineSeconds"] > 0
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and "privileged" not in c["securityContext"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    mounted = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert mounted == {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}


def test_the_manifest_is_regenerated_from_the_repository() -> None:
    from sweeper.manifests import render

    assert (ROOT / "deploy" / "cronjob.yaml").read_text() == render(ROOT), \
        "deploy/cronjob.yaml is stale: python -m sweeper.manifests > deploy/cronjob.yaml"
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "cronjob.yaml").read_text()) if d]
    playbooks = next(d for d in docs if d["metadata"]["name"] == "sweeper-playbooks")
    assert set(playbooks["data"]) == {p.name for p in (ROOT / "playbooks").glob("*.yaml")}


def test_the_dockerfile_has_the_basics() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms and all(":" in f.split()[1] and not f.split()[1].endswith(":latest") for f in froms), \
        "base images are pinned to a tag"
    users = [ln for ln in lines if ln.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("0", "root"), "the image runs as a non-root user"
    for d in ("playbooks", "job-templates", "profiles", "policies"):
        assert f"COPY {d} /opt/sweeper/{d}" in lines
    assert "SWEEPER_HOME=/opt/sweeper" in text and 'ENTRYPOINT ["sweeper"]' in lines
    assert any(ln.startswith("RUN pip install --no-cache-dir") for ln in lines)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".venv" in ignored


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
    elif template == "reboot.yaml.j2":
        assert "nvidia.com/gpu" not in limits and pod["hostPID"] is True, "a reboot needs the host, not the GPUs"
    else:
        assert limits["nvidia.com/gpu"] == "8", "a check takes all of the node's GPUs"
    assert job["spec"]["activeDeadlineSeconds"] == 900


PRIVILEGED = {"reboot.yaml.j2", "gpu-reset.yaml.j2"}  # the only Jobs that need the host itself


@pytest.mark.parametrize("template", sorted(p.name for p in (ROOT / "job-templates").glob("*.j2")))
def test_job_templates_take_least_privilege(template: str) -> None:
    """Every Job: no service account token, CPU and memory requests and limits; only reboot and
    GPU reset privileged; the rest drop every capability they do not name, cannot escalate and
    keep the runtime's seccomp profile; host paths are read-only. The light check, beside
    someone else's job, runs as a non-root user with no capability and a read-only root.
    Field meanings: https://kubernetes.io/docs/tasks/configure-pod-container/security-context/
    and https://kubernetes.io/docs/concepts/security/pod-security-standards/ (restricted)."""
    ctx = ActionContext(config=Config(), node={
        "name": "ip-10-0-1-2.ec2.internal", "gpus": 8, "labels": {"kubernetes.io/hostname": "ip-10-0-1-2"},
        "annotations": {}, "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()}, run_id="sw-1")
    pod = render_job(ctx, template, 900, {})["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    host_paths = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
    for c in pod["containers"]:
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)
        sc = c.get("securityContext") or {}
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] in host_paths]
        assert all(m.get("readOnly") is True for m in mounts), "host paths are mounted read-only"
        if template in PRIVILEGED:
            assert sc.get("privileged") is True
            continue
        assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert (sc.get("seccompProfile") or pod["securityContext"]["seccompProfile"]) == {"type": "RuntimeDefault"}
        assert "/dev/kmsg" not in {v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}
    if template == "sweeper-light.yaml.j2":
        (c,) = pod["containers"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and "runAsUser" not in c["securityContext"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert "add" not in c["securityContext"]["capabilities"]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
        assert "--skip-kernel-log" in c["args"], "the XID check says skip, with a reason, instead of failing"
    if template == "sweeper-check.yaml.j2":
        (c,) = pod["containers"]
        assert c["securityContext"]["capabilities"]["add"] == ["SYSLOG", "SYS_CHROOT"], \
            "only what reading the kernel log and running the host's own tools in its root need"
