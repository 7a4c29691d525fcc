"""Deployable manifests and rendered check Jobs are valid Kubernetes objects."""

import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.admission import render_policies
from sweeper.config import PLATFORM_RUNTIME_CLASS, Config, load_config
from sweeper.errors import ConfigError
from sweeper.manifests import IMAGE_KEYS, OVERLAYS, Overlay, images, overlay_files
from sweeper.profiles import load_profile
from tests.k8s_schema import validate as k8s_validate

ROOT = Path(__file__).resolve().parent.parent
K8S = "1.31"


def docs_of(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def test_cronjob_manifest_validates_and_its_config_loads(tmp_path: Path) -> None:
    docs = docs_of("cronjob.yaml")
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace"] * 3 + ["ServiceAccount"] * 2 + ["ClusterRole", "ClusterRoleBinding"] \
        + ["Role", "RoleBinding"] * 4 + ["ConfigMap", "PersistentVolumeClaim", "CronJob", "Deployment",
                                         "NetworkPolicy"] + ["ConfigMap"] * 4
    for d in docs:
        k8s_validate(d, K8S, strict=True)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(cm["data"]["config.yaml"])
    cfg = load_config(cfg_file)
    assert cfg.max_nodes == 4 and cfg.check_timeout == 900 and cfg.playbook_dir == "/etc/sweeper/playbooks"
    cron = next(d for d in docs if d["kind"] == "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["startingDeadlineSeconds"] > 0
    assert cron["spec"]["suspend"] is False
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and "privileged" not in c["securityContext"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    mounted = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert mounted == {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}


@pytest.mark.parametrize("name", ["cronjob.yaml", "serve/serve.yaml", "rbac-evictions.yaml",
                                  "rbac-karpenter.yaml", "device-plugin/gpu-operator.yaml", "device-plugin/kube-system.yaml",
                                  "device-plugin/nvidia-device-plugin.yaml", "claims/dra-plugin.yaml", "eks/storageclass-gp3.yaml",
                                  "admission-policy.yaml"])
def test_every_manifest_validates(name: str) -> None:
    docs = docs_of(name)
    assert docs
    for d in docs:
        k8s_validate(d, K8S, strict=True)


def test_the_job_namespaces_admit_the_check_jobs() -> None:
    """The node check mounts host paths and reboot / GPU reset are privileged: only the `privileged`
    Pod Security level admits them, so their namespaces say so, or a cluster whose default is
    baseline or restricted would refuse every check pod; the controller's own namespace is
    `restricted` (tests/test_security_deploy.py)
    (https://kubernetes.io/docs/concepts/security/pod-security-standards/,
    https://kubernetes.io/docs/concepts/security/pod-security-admission/)."""
    for name in ("cronjob.yaml", "serve/serve.yaml"):
        levels = {d["metadata"]["name"]: d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
                  for d in docs_of(name) if d["kind"] == "Namespace"}
        assert levels == {"sweeper": "restricted", "sweeper-checks": "privileged",
                          "sweeper-remediation": "privileged"}


def test_the_controller_is_never_disrupted_and_runs_beside_system_pods() -> None:
    """Karpenter leaves a node alone while a pod on it carries karpenter.sh/do-not-disrupt
    (https://karpenter.sh/docs/concepts/disruption/#pod-level-controls); AKS system pools carry
    CriticalAddonsOnly=true:NoSchedule (https://learn.microsoft.com/azure/aks/use-system-pools)."""
    for name in ("cronjob.yaml", "serve/serve.yaml"):
        for _, template in controller_pods_of(docs_of(name)):
            assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
            assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in template["spec"]["tolerations"]


def test_the_tolerations_storage_class_and_node_selector_are_options() -> None:
    from sweeper.manifests import options, render

    mode, opts = options(["serve", "--platform", "aks", "--toleration", "sku=gpu:NoSchedule",
                          "--toleration", "dedicated", "--node-selector", "agentpool=system"])
    assert mode == "serve" and opts.storage_class == "managed-csi"
    docs = [d for d in yaml.safe_load_all(render(ROOT, mode, opts)) if d]
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "managed-csi"
    dep = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert dep["tolerations"] == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
                                  {"key": "dedicated", "operator": "Exists"}]
    assert dep["nodeSelector"] == {"agentpool": "system"}
    for d in docs:
        k8s_validate(d, K8S, strict=True)
    assert options(["--platform", "gke"])[1].storage_class == "standard-rwo"
    assert options(["--platform", "gke", "--storage-class", "premium-rwo"])[1].storage_class == "premium-rwo"
    with pytest.raises(ConfigError):
        options(["--toleration", "a=b:Sometimes"])


def test_platform_sets_the_configs_platform_too(tmp_path: Path) -> None:
    """`--platform eks` writes `platform: eks` into the sweeper-config ConfigMap, not only the storage
    class; without it the shipped `platform: auto` stays, and the claim names no storage class (the
    cluster's default). `--image` is the controller's image and the checks' (check_image) alike."""
    from sweeper.manifests import options, render

    def docs_of_argv(argv: list[str]) -> list[dict]:
        return [d for d in yaml.safe_load_all(render(ROOT, *options(argv))) if d]

    def config_of(argv: list[str]) -> Config:
        cm = next(d for d in docs_of_argv(argv) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sweeper-config")
        path = tmp_path / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        return load_config(path)

    assert config_of(["--platform", "eks"]).platform == "eks"
    assert config_of(["serve", "--platform", "gke"]).platform == "gke"
    assert config_of([]).platform == "auto" and options([])[1].storage_class == ""
    pvc = next(d for d in docs_of_argv([]) if d["kind"] == "PersistentVolumeClaim")
    assert "storageClassName" not in pvc["spec"]
    mine = "registry.example.com/sweeper:0.1.0@sha256:" + "ab" * 32
    assert config_of(["--image", mine]).check_image == mine
    cron = next(d for d in docs_of_argv(["--image", mine]) if d["kind"] == "CronJob")
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] == mine
    with pytest.raises(ConfigError):  # unpinned: the config's check_image refuses a tag alone
        config_of(["--image", "registry.example.com/sweeper:0.1.0"])


def test_the_history_claim_names_a_storage_class() -> None:
    """EKS clusters since 1.30 have no default StorageClass, so a claim without one stays Pending
    (https://docs.aws.amazon.com/eks/latest/userguide/ebs-csi.html); the eks overlay names the EBS CSI
    driver's gp3, and makes it (deploy/eks/storageclass-gp3.yaml). The base names none."""
    pvc = next(d for d in docs_of("cronjob.yaml") if d["kind"] == "PersistentVolumeClaim")
    assert "storageClassName" not in pvc["spec"]
    sc = docs_of("eks/storageclass-gp3.yaml")[0]
    assert sc["metadata"]["name"] == "gp3" and sc["provisioner"] == "ebs.csi.aws.com"
    assert "storageclass-gp3.yaml" in yaml.safe_load((ROOT / "deploy" / "eks" / "kustomization.yaml").read_text())[
        "resources"]


def test_serve_and_the_cronjob_never_write_one_history() -> None:
    """The serve Deployment: one replica, Recreate (the old pod stops before the new one starts:
    https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#recreate-deployment), its own
    claim. Each manifest carries the other controller switched off, so applying one over the other
    leaves exactly one sweeping."""
    serve, cron = docs_of("serve/serve.yaml"), docs_of("cronjob.yaml")

    def claim(docs: list[dict], kind: str) -> str:
        (_, template), = [(d, t) for d, t in controller_pods_of(docs) if d["kind"] == kind]
        (vol,) = [v for v in template["spec"]["volumes"] if "persistentVolumeClaim" in v]
        return str(vol["persistentVolumeClaim"]["claimName"])

    dep = next(d for d in serve if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["sweeper", "serve"]
    assert next(d for d in serve if d["kind"] == "CronJob")["spec"]["suspend"] is True
    assert next(d for d in cron if d["kind"] == "Deployment")["spec"]["replicas"] == 0
    assert claim(serve, "Deployment") != claim(cron, "CronJob")
    assert claim(serve, "Deployment") in {d["metadata"]["name"] for d in serve if d["kind"] == "PersistentVolumeClaim"}
    cm = next(d for d in serve if d["kind"] == "ConfigMap")
    assert yaml.safe_load(cm["data"]["config.yaml"])["schedules"], "serve sweeps on the config's schedules"


def test_the_serve_pod_listens_where_its_probes_and_service_reach_it() -> None:
    """`sweeper serve` listens on 127.0.0.1 unless told; the kubelet's httpGet probes go to the pod's
    IP (https://kubernetes.io/docs/tasks/configure-pod-container/configure-liveness-readiness-startup-probes/#http-probes:
    "host: Host name to connect to, defaults to the pod IP"), as does the Service, so the Deployment's
    command names the pod IP (never 0.0.0.0). Its own option parser reads the manifest's command."""
    from sweeper.cli import main

    for name in ("serve/serve.yaml", "cronjob.yaml"):
        dep = next(d for d in docs_of(name) if d["kind"] == "Deployment")
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"]["httpGet"]["port"] == "http" and "host" not in container["readinessProbe"]["httpGet"]
        command = container["command"]
        serve = main.get_command(None, command[1])  # type: ignore[arg-type]
        ctx = serve.make_context("serve", list(command[2:]))
        assert ctx.params["address"] == "$(POD_IP)" and ctx.params["port"] == 8080, (name, command)
        # the kubelet expands $(POD_IP) from the container's env, here the downward API's pod IP
        # (https://kubernetes.io/docs/tasks/inject-data-application/define-command-argument-container/#use-environment-variables-to-define-arguments)
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def controller_pods_of(docs: list[dict]) -> list[tuple[dict, dict]]:
    return [(d, d["spec"]["jobTemplate"]["spec"]["template"] if d["kind"] == "CronJob" else d["spec"]["template"])
            for d in docs if d["kind"] in ("CronJob", "Deployment")]


def test_the_cronjob_deadline_outlasts_its_longest_playbook(tmp_path: Path) -> None:
    """activeDeadlineSeconds ends the Job, running or not
    (https://kubernetes.io/docs/concepts/workloads/controllers/job/#job-termination-and-cleanup): it is
    derived from the config, so a DCGM level 4 (hours) is not cut off by a deadline made for 15 minutes."""
    from sweeper.manifests import MARGIN, deadline_seconds, playbook_seconds

    cfg = Config(playbook_dir=str(ROOT / "playbooks"))
    assert playbook_seconds(cfg, "sweep-light.yaml") == 900
    assert playbook_seconds(cfg, "quarantine-deep.yaml") == 45 * 60 + 20 * 60
    cron = next(d for d in docs_of("cronjob.yaml") if d["kind"] == "CronJob")
    deadline = cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
    assert deadline >= playbook_seconds(cfg, "sweep-dcgm.yaml") + MARGIN, "the dcgm schedule fits"
    assert playbook_seconds(cfg, "quarantine-deep.yaml", level=4) == 3 * 3600 + 20 * 60
    cfg4 = Config(playbook_dir=str(ROOT / "playbooks"),
                  schedules=({"name": "deep", "cron": "0 3 * * 6", "playbook": "quarantine-deep.yaml", "dcgm_level": 4},))
    assert deadline_seconds(cfg4) > 3 * 3600 + 20 * 60 > deadline
    assert deadline_seconds(cfg4) % 60 == 0


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


# One-node Job templates; the pair templates (a Service and a two-pod Job) have tests/test_pair_templates.py.
CHECK_TEMPLATES = sorted(p.name for p in (ROOT / "job-templates").glob("*.j2") if "pair_affinity" not in p.read_text())


@pytest.mark.parametrize("template", CHECK_TEMPLATES)
def test_job_templates_render_valid_jobs(template: str) -> None:
    ctx = ActionContext(config=Config(), node={
        "name": "ip-10-0-1-2.ec2.internal", "gpus": 8,
        "labels": {"kubernetes.io/hostname": "ip-10-0-1-2", "evil": "{{ 7*7 }}: [x]"},
        "annotations": {}, "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()}, run_id="sw-1")
    job = render_job(ctx, template, 900, {}, remediation=template in PRIVILEGED,
                     bound=template in BOUND)
    k8s_validate(job, K8S, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert {"key": Config().taint_key, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    if template in BOUND:
        # The reset runs while the device plugin is paused (allocatable 0): bound by nodeName, no GPU asked.
        assert pod["nodeName"] == "ip-10-0-1-2.ec2.internal" and "affinity" not in pod
        assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
        return
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
BOUND = {"gpu-reset.yaml.j2"}  # bound to the held node by nodeName (sweeper/actions/safety.py, a bound remediation Job)


@pytest.mark.parametrize("template", CHECK_TEMPLATES)
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
    pod = render_job(ctx, template, 900, {}, remediation=template in PRIVILEGED,
                     bound=template in BOUND)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    host_paths = {v["name"] for v in pod.get("volumes", []) if "hostPath" in v}
    for c in pod["containers"]:
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)
        sc = c.get("securityContext") or {}
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] in host_paths]
        assert all(m.get("readOnly") is True and m.get("recursiveReadOnly") == "Enabled" for m in mounts), \
            "host paths are mounted read-only, submounts included"
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
        assert c["securityContext"]["capabilities"]["add"] == ["SYSLOG"], "only what reading the kernel log needs"


# -- the Kustomize overlays -----------------------------------------------------------------------------------
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl (with Kustomize built in) not on PATH")
OVERLAY_NAMES = [ov.name for ov in OVERLAYS]


def kustomize(path: Path) -> list[dict]:
    """`kubectl kustomize` (https://kubernetes.io/docs/tasks/manage-kubernetes-objects/kustomization/)."""
    proc = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60)  # type: ignore[list-item]
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def rendered_config(docs: list[dict], tmp_path: Path) -> Config:
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sweeper-config")
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    return load_config(path)


def disagreements(docs: list[dict], cfg: Config, overlay: Overlay, listed: dict[str, str]) -> list[str]:
    """What in a rendered overlay contradicts its own config or the images list: the platform, the
    RuntimeClass its check Jobs ask for, the storage class, every image (the controller's, each image key
    of the config, the admission policy's)."""
    out = []
    if cfg.platform != overlay.platform:
        out.append(f"config platform {cfg.platform}, overlay {overlay.platform}")
    job_cfg = replace(cfg, template_dir=str(ROOT / "job-templates"), playbook_dir=str(ROOT / "playbooks"))
    ctx = ActionContext(config=job_cfg, run_id="sw-1", node={
        "name": "ip-10-0-1-2.ec2.internal", "gpus": 8, "labels": {"kubernetes.io/hostname": "ip-10-0-1-2"},
        "annotations": {}, "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()})
    pod = render_job(ctx, "sweeper-check.yaml.j2", 900, {})["spec"]["template"]["spec"]
    if pod.get("runtimeClassName", "") != PLATFORM_RUNTIME_CLASS[overlay.platform]:
        out.append(f"check Jobs ask for RuntimeClass {pod.get('runtimeClassName')!r} on {overlay.platform}")
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    if pvc["spec"].get("storageClassName", "") != overlay.storage_class:
        out.append(f"storage class {pvc['spec'].get('storageClassName')!r}, overlay {overlay.storage_class!r}")
    for key, ref in listed.items():
        if getattr(cfg, key) != ref:
            out.append(f"config {key} {getattr(cfg, key)}, images list {ref}")
    for d in docs:
        if d["kind"] in ("CronJob", "Deployment"):
            spec = d["spec"]["jobTemplate"]["spec"]["template"]["spec"] if d["kind"] == "CronJob" \
                else d["spec"]["template"]["spec"]
            for c in spec["containers"]:
                if c["image"] != listed["check_image"]:
                    out.append(f"{d['kind']} runs {c['image']}, images list {listed['check_image']}")
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "sweeper-jobs")
    allowed = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for key in ("check_image", "nccl_image", "pair_image", "dcgm_image", "reboot_image"):
        if f"'{getattr(cfg, key)}'" not in allowed:
            out.append(f"the admission policy does not admit {key} {getattr(cfg, key)}")
    return out


def test_the_overlays_are_what_the_generator_writes() -> None:
    """deploy/base and deploy/<platform> are generated (python -m sweeper.manifests overlays); only the
    images list and the EKS files listed here are written by hand."""
    files = overlay_files(ROOT)
    for rel, text in files.items():
        assert (ROOT / "deploy" / rel).read_text() == text, f"deploy/{rel} is stale"
    hand = {"base/kustomization.yaml", "eks/iam-policy.json", "eks/storageclass-gp3.yaml"}
    for name in ["base", *OVERLAY_NAMES]:
        on_disk = {str(p.relative_to(ROOT / "deploy")) for p in (ROOT / "deploy" / name).iterdir()}
        assert on_disk <= set(files) | hand, f"deploy/{name} holds files nothing writes: {on_disk - set(files) - hand}"
    assert set(images(ROOT)) == set(IMAGE_KEYS)


@needs_kubectl
@pytest.mark.parametrize("name", OVERLAY_NAMES)
def test_each_overlay_renders_valid_objects_that_agree_with_its_config(name: str, tmp_path: Path) -> None:
    overlay = next(ov for ov in OVERLAYS if ov.name == name)
    docs = kustomize(ROOT / "deploy" / name)
    for d in docs:
        k8s_validate(d, K8S, strict=True)
    cfg = rendered_config(docs, tmp_path)
    assert disagreements(docs, cfg, overlay, images(ROOT)) == []
    assert cfg.remediation["default"] == overlay.remediation
    policies = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy") and d["kind"].endswith("Policy")]
    assert policies == [d for d in yaml.safe_load_all(render_policies(ROOT, cfg)) if d and d["kind"].endswith("Policy")]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    if overlay.remediation == "karpenter":
        assert ("ClusterRole", "sweeper-karpenter") in kinds, "replacing through Karpenter needs its RBAC"
    if overlay.platform == "eks":
        assert ("StorageClass", "gp3") in kinds


@needs_kubectl
def test_a_config_that_disagrees_with_its_manifests_is_caught(tmp_path: Path) -> None:
    """An overlay whose config names another platform, or an images list changed without regenerating
    (as `kustomize edit set image` leaves it), is reported."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    eks = next(ov for ov in OVERLAYS if ov.name == "eks")
    config = tmp_path / "deploy" / "eks" / "config.yaml"
    config.write_text(config.read_text().replace("\nplatform: eks\n", "\nplatform: generic\n"))
    kust = tmp_path / "deploy" / "base" / "kustomization.yaml"
    doc = yaml.safe_load(kust.read_text())
    doc["images"][0]["digest"] = "sha256:" + "1" * 64
    kust.write_text(yaml.safe_dump(doc))
    docs = kustomize(tmp_path / "deploy" / "eks")
    found = disagreements(docs, rendered_config(docs, tmp_path), eks, images(tmp_path))
    assert any(f.startswith("config platform generic") for f in found), found
    assert any("RuntimeClass 'nvidia'" in f for f in found), found
    assert any(f.startswith("config check_image") for f in found), found


@needs_kubectl
@pytest.mark.parametrize("name", ["base", *OVERLAY_NAMES])
def test_each_overlay_applies_with_a_server_dry_run(name: str, sim: Any) -> None:
    """`kubectl apply -k deploy/NAME --dry-run=server`, client-side and server-side apply, against the
    simulated cluster: every object is validated and admitted as a write would be, and nothing is kept
    (dryRun=All: https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run)."""
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig), "HOME": str(sim.kubeconfig.parent)}

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTL, *args], capture_output=True, text=True, env=env, timeout=120)  # type: ignore[list-item]

    if name == "gpu-operator":  # the GPU Operator's namespace, where the device plugin's Role goes
        assert kubectl("create", "namespace", "gpu-operator").returncode == 0
    for extra in ([], ["--server-side"]):
        proc = kubectl("apply", "-k", str(ROOT / "deploy" / name), "--dry-run=server", *extra)
        assert proc.returncode == 0, proc.stderr
        assert "cronjob.batch/sweeper " in proc.stdout and "(server dry run)" in proc.stdout, proc.stdout
    gone = kubectl("-n", "sweeper", "get", "configmap", "sweeper-config")
    assert gone.returncode != 0 and "NotFound" in gone.stderr, "a dry run keeps nothing"
    if name == "eks":
        cm = next(d for d in kustomize(ROOT / "deploy" / "eks") if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"] == "sweeper-config")
        assert re.search(r"(?m)^platform: eks$", cm["data"]["config.yaml"])


def test_set_image_pins_one_entry_and_regenerates_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--set-image NAME=NEWNAME:TAG@DIGEST` writes the entry as `kustomize edit set image` would
    (https://kubectl.docs.kubernetes.io/references/kustomize/cmd/edit/), keeps the list's comments,
    and every generated file follows: the controller, each config, the admission policy."""
    from sweeper.manifests import main

    for d in ("deploy", "playbooks", "job-templates", "profiles", "policies"):
        shutil.copytree(ROOT / d, tmp_path / d)
    mine = "registry.example.com/sweeper:0.1.0@sha256:" + "ab" * 32
    monkeypatch.setenv("SWEEPER_HOME", str(tmp_path))  # the copy is the shipped tree the generator reads
    assert main(["overlays", "--set-image", f"ghcr.io/sweeper-dev/sweeper={mine}"]) == 0
    assert main(["overlays", "--set-image", "ghcr.io/nobody/else=x:1@sha256:" + "0" * 64]) == 2
    kust = (tmp_path / "deploy" / "base" / "kustomization.yaml").read_text()
    assert kust.startswith("# The base of the overlays")
    (entry,) = [e for e in yaml.safe_load(kust)["images"] if e["name"] == "ghcr.io/sweeper-dev/sweeper"]
    assert entry == {"name": "ghcr.io/sweeper-dev/sweeper", "newName": "registry.example.com/sweeper",
                     "newTag": "0.1.0", "digest": "sha256:" + "ab" * 32}
    assert images(tmp_path)["check_image"] == mine
    files = overlay_files(tmp_path)
    assert files == {rel: (tmp_path / "deploy" / rel).read_text() for rel in files}
    for rel in ("cronjob.yaml", "eks/config.yaml", "gpu-operator/config.yaml", "admission-policy.yaml"):
        assert mine in (tmp_path / "deploy" / rel).read_text(), rel
