"""The attacks of issue 22 on a Job's shape, each refused: a playbook's `vars` cannot move a Job
(namespace, affinity, tolerations, image, privilege), an author's template cannot reach the host
beyond the paths the checks read, a template name cannot leave its folder, and nothing a refused
file holds is echoed back. The rules are sweeper.actions.safety's, shared by the runtime and lint.

Facts: hostPath volumes and their risk (a runtime socket reached through one is the node):
https://kubernetes.io/docs/concepts/storage/volumes/#hostpath; recursive read-only mounts
(`recursiveReadOnly: Enabled` needs `readOnly: true` and no mount propagation; beta in 1.31):
https://kubernetes.io/docs/concepts/storage/volumes/#read-only-mounts; node affinity and
tolerations: https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/ and
https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/; image digests:
https://kubernetes.io/docs/concepts/containers/images/#image-names"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.actions.pair import render_pair
from sweeper.config import Config, load_config
from sweeper.errors import ConfigError, PlaybookError
from sweeper.lint import lint_paths
from sweeper.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.name for p in (ROOT / "job-templates").glob("*.j2"))
REMEDIATION = {"reboot.yaml.j2", "gpu-reset.yaml.j2"}
OUTSIDE = "docker.io/library/alpine@sha256:" + "a" * 64
CONTROL_PLANE = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}]}}}
# Where container runtimes listen (containerd, CRI-O, Docker, k3s's containerd): none may be
# reachable from a check pod. https://kubernetes.io/docs/setup/production-environment/container-runtimes/
SOCKETS = ("/run/containerd/containerd.sock", "/var/run/containerd/containerd.sock", "/run/crio/crio.sock",
           "/var/run/crio/crio.sock", "/var/run/docker.sock", "/run/docker.sock", "/var/run/cri-dockerd.sock",
           "/run/k3s/containerd/containerd.sock", "/var/lib/kubelet/pod-resources/kubelet.sock")


def node(name: str = "gpu-1") -> dict[str, Any]:
    return {"name": name, "gpus": 8, "labels": {"kubernetes.io/hostname": name}, "annotations": {},
            "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()}


def ctx(cfg: Config | None = None) -> ActionContext:
    return ActionContext(config=cfg or Config(), node=node(), partner=node("gpu-2"), run_id="sw-1")


def author(tmp_path: Path, name: str, text: str) -> Config:
    (tmp_path / name).write_text(text)
    return Config(template_dir=str(tmp_path))


def shipped_with(template: str, old: str, new: str, tmp_path: Path) -> Config:
    """An author's copy of a shipped template with one change."""
    text = (ROOT / "job-templates" / template).read_text()
    assert old in text, (template, old)
    return author(tmp_path, "mine.yaml.j2", text.replace(old, new, 1))


# -- a playbook's vars cannot replace what keeps a Job safe -------------------------------------
@pytest.mark.parametrize(("key", "value"), [
    ("namespace", "kube-system"),
    ("affinity", CONTROL_PLANE),
    ("tolerations", [{"operator": "Exists"}]),
    ("image", OUTSIDE),
    ("dcgm_image", OUTSIDE),
    ("nccl_image", OUTSIDE),
    ("reboot_image", OUTSIDE),
    ("node", {"name": "control-plane-1", "gpus": 0}),
    ("labels", {}),
    ("taint_key", "node-role.kubernetes.io/control-plane"),
])
def test_vars_cannot_replace_sweepers_values(key: str, value: Any) -> None:
    template = "dcgm-diag.yaml.j2" if key == "dcgm_image" else "sweeper-check.yaml.j2"
    with pytest.raises(PlaybookError, match=f"vars may not set {key}"):
        render_job(ctx(), template, 900, {key: value})


def test_vars_cannot_make_the_reboot_job_run_another_image() -> None:
    """The issue's `vars: {reboot_image: ...}`: the reboot Job is privileged with hostPID, so its image
    is the config's, and the remediation's own render is refused a var that names another."""
    with pytest.raises(PlaybookError, match="vars may not set reboot_image"):
        render_job(ctx(), "reboot.yaml.j2", 600, {"reboot_image": OUTSIDE}, remediation=True)
    job = render_job(ctx(), "reboot.yaml.j2", 600, {}, remediation=True)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == Config().reboot_image


@pytest.mark.parametrize("key", ["namespace", "pair_affinity", "tolerations", "pair_image", "mpi_image", "partner"])
def test_pair_vars_cannot_replace_sweepers_values(key: str) -> None:
    with pytest.raises(PlaybookError, match=f"vars may not set {key}"):
        render_pair(ctx(), "nccl-pair.yaml.j2", 900, {key: "x"})


# -- what an author's template renders is held to Sweeper's own values ---------------------------
@pytest.mark.parametrize(("old", "new", "why"), [
    ("namespace: {{ namespace | tojson }}", "namespace: kube-system", "namespace must be Sweeper's"),
    ("affinity: {{ affinity | tojson }}", f"affinity: {yaml.safe_dump(CONTROL_PLANE, default_flow_style=True).strip()}",
     "node affinity"),
    ("tolerations: {{ tolerations | tojson }}",
     'tolerations: [{"key": "sweeper.dev/sweep", "operator": "Exists"}, {"operator": "Exists"}]', "not Sweeper's"),
    ("tolerations: {{ tolerations | tojson }}",
     "tolerations: {{ (tolerations + [{'key': 'node-role.kubernetes.io/control-plane', 'operator': 'Exists'}]) "
     "| tojson }}", "not Sweeper's"),
    ("image: {{ image | tojson }}", f"image: {OUTSIDE}", "not one of the config's images"),
    ("image: {{ image | tojson }}", "image: evil.example/x:latest", "not pinned by digest"),
    ("path: /sys", "path: /", "not one the checks read"),
    ("path: /sys", "path: /run/containerd", "container runtime"),
    ("path: /sys", "path: /var/run", "container runtime"),
    ("path: /sys", "path: /sys/../run", "container runtime"),
    ("path: /sys", "path: /var/lib/containerd", "container runtime"),
    ("path: /run/log/journal", "path: /run/log", "container runtime"),
    ("path: /run/log/journal", "path: /run/log/journal/../../containerd", "container runtime"),
    ("path: /run/log/journal", "path: /run/systemd/journal", "container runtime"),
    ("path: /var/log/journal", "path: /var/log", "not one the checks read"),
    ('path: /var/log/journal\n            type: ""', "path: /var/log/journal\n            type: DirectoryOrCreate",
     "creates what is missing"),
    ("              mountPropagation: None\n", "              mountPropagation: HostToContainer\n",
     "must not propagate"),
    ("              recursiveReadOnly: Enabled\n", "", "recursiveReadOnly: Enabled"),
    ("              recursiveReadOnly: Enabled\n", "              recursiveReadOnly: IfPossible\n",
     "recursiveReadOnly: Enabled"),
    ("              readOnly: true\n", "", "readOnly: true"),
    ("add: [\"SYSLOG\"]", "add: [\"SYSLOG\", \"SYS_CHROOT\"]", "not ones a check needs"),
    ("add: [\"SYSLOG\"]", "add: [\"SYSLOG\", \"SYS_ADMIN\"]", "remount"),
    ("allowPrivilegeEscalation: false", "privileged: true", "only the shipped remediation templates"),
    ("automountServiceAccountToken: false", "automountServiceAccountToken: true", "automountServiceAccountToken"),
    ("      restartPolicy: Never", "      restartPolicy: Never\n      hostPID: true", "hostPID"),
    ("      restartPolicy: Never", "      restartPolicy: Never\n      hostNetwork: true", "hostNetwork"),
    ("      restartPolicy: Never", "      restartPolicy: Never\n      nodeName: control-plane-1", "nodeName"),
    ("      restartPolicy: Never", "      restartPolicy: Never\n      serviceAccountName: sweeper",
     "serviceAccountName"),
    ("          hostPath:\n            path: /sys\n            type: Directory",
     "          persistentVolumeClaim: {claimName: data}", "volumes are not allowed"),
    ("seccompProfile: {type: RuntimeDefault}", "seccompProfile: {type: Unconfined}", "Unconfined"),
    ('drop: ["ALL"]', 'drop: ["NET_RAW"]', "drop must hold ALL"),
    ("  backoffLimit: 0", "  backoffLimit: 0\n  parallelism: 500", "parallelism and completions"),
    ("      restartPolicy: Never", "      restartPolicy: Never\n      priorityClassName: system-node-critical",
     "priorityClassName"),
    ("runtimeClassName: {{ runtime_class | tojson }}", "runtimeClassName: unconfined-runc", "runtimeClassName"),
    ("    metadata:\n      labels: {{ labels | tojson }}",
     "    metadata:\n      annotations: {container.apparmor.security.beta.kubernetes.io/check: unconfined}\n"
     "      labels: {{ labels | tojson }}", "apparmor"),
    ("          env:\n", "          ports: [{containerPort: 2375, hostPort: 2375}]\n          env:\n", "hostPort"),
    ("          env:\n", "          envFrom: [{secretRef: {name: sweeper-webhook}}]\n          env:\n", "Secret"),
])
def test_an_authors_check_template_is_held_to_the_rules(tmp_path: Path, old: str, new: str, why: str) -> None:
    cfg = shipped_with("sweeper-check.yaml.j2", old, new, tmp_path)
    with pytest.raises(PlaybookError, match="unsafe Job") as err:
        render_job(ctx(cfg), "mine.yaml.j2", 900, {})
    assert why in str(err.value)


@pytest.mark.parametrize("path", [*SOCKETS, "/run", "/run/log", "/run/log/journal/x", "/run/systemd/journal/socket",
                                  "/run/systemd/journal/stdout", "/var/run/log/journal"])
def test_under_run_only_the_journal_directory_itself_may_be_mounted(tmp_path: Path, path: str) -> None:
    """The check reads journald's volatile files in /run/log/journal; journald's own sockets are in
    /run/systemd/journal (https://www.freedesktop.org/software/systemd/man/latest/systemd-journald.service.html,
    FILES), and the runtimes' in /run/containerd, /run/crio and /var/run. Exactly that one directory is
    allowed under /run: nothing above, beside or below it (/var/run is a link to /run on the host, but
    the rule reads the path as written, and refuses it)."""
    cfg = shipped_with("sweeper-check.yaml.j2", "path: /run/log/journal", f"path: {path}", tmp_path)
    with pytest.raises(PlaybookError, match="container runtime"):
        render_job(ctx(cfg), "mine.yaml.j2", 900, {})


def test_the_check_mounts_the_journal_directories_read_only_and_creates_nothing() -> None:
    """The journal's two directories, each read-only all the way down and propagating no mount; their
    hostPath type is the unchecked one, since `Directory` fails the pod where a host keeps no such
    directory and the *OrCreate types make the kubelet create it
    (https://kubernetes.io/docs/concepts/storage/volumes/#hostpath-volume-types)."""
    (job,) = _rendered("sweeper-check.yaml.j2", "eks")
    pod = job["spec"]["template"]["spec"]
    vols = {v["hostPath"]["path"]: v for v in pod["volumes"] if "hostPath" in v}
    assert {p: v["hostPath"].get("type") for p, v in vols.items()} == {
        "/sys": "Directory", "/var/log/journal": "", "/run/log/journal": ""}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    for path, where in (("/var/log/journal", "/host/var/log/journal"), ("/run/log/journal", "/host/run/log/journal")):
        m = mounts[vols[path]["name"]]
        assert (m["mountPath"], m["readOnly"], m["recursiveReadOnly"], m["mountPropagation"]) == (
            where, True, "Enabled", "None")
    assert "--host-root" in pod["containers"][0]["args"] and "/host" in pod["containers"][0]["args"]


def test_a_misshapen_job_is_refused_not_crashed_on(tmp_path: Path) -> None:
    cfg = shipped_with("sweeper-check.yaml.j2", "        - name: host-sys\n          hostPath:",
                       "        - just-a-string\n        - name: host-sys\n          hostPath:", tmp_path)
    with pytest.raises(PlaybookError, match="not shaped like Kubernetes objects"):
        render_job(ctx(cfg), "mine.yaml.j2", 900, {})


def test_an_allowed_image_is_accepted_and_only_by_digest(tmp_path: Path) -> None:
    cfg = shipped_with("sweeper-check.yaml.j2", "image: {{ image | tojson }}", f"image: {OUTSIDE}", tmp_path)
    job = render_job(ctx(replace(cfg, allowed_images=(OUTSIDE,))), "mine.yaml.j2", 900, {})
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == OUTSIDE


def test_a_socket_mount_in_a_pair_template_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "job-templates" / "nccl-pair.yaml.j2").read_text()
    text = text.replace("        - name: dshm\n          emptyDir:",
                        "        - name: sock\n          hostPath: {path: /run/containerd/containerd.sock}\n"
                        "        - name: dshm\n          emptyDir:", 1)
    (tmp_path / "pair.yaml.j2").write_text(text)
    with pytest.raises(PlaybookError, match="container runtime"):
        render_pair(ctx(Config(template_dir=str(tmp_path))), "pair.yaml.j2", 900, {})


def test_the_pair_service_stays_inside_the_cluster(tmp_path: Path) -> None:
    cfg = shipped_with("nccl-pair.yaml.j2", "  clusterIP: None", "  clusterIP: None\n  externalIPs: [203.0.113.7]",
                       tmp_path)
    with pytest.raises(PlaybookError, match="ClusterIP Service"):
        render_pair(ctx(cfg), "mine.yaml.j2", 900, {})


def test_an_mpijob_in_another_namespace_is_refused(tmp_path: Path) -> None:
    cfg = shipped_with("nccl-pair-mpijob.yaml.j2", "namespace: {{ namespace | tojson }}", "namespace: kube-system",
                       tmp_path)
    with pytest.raises(PlaybookError, match="namespace must be Sweeper's"):
        render_pair(ctx(cfg), "mine.yaml.j2", 900, {})


# -- privilege: the shipped remediation templates, run by the remediation, with the config's image -----
@pytest.mark.parametrize("template", sorted(REMEDIATION))
def test_a_playbook_cannot_run_a_privileged_remediation_template(template: str) -> None:
    with pytest.raises(PlaybookError, match="only the shipped remediation templates"):
        render_job(ctx(), template, 600, {})


def test_an_authors_reboot_template_gets_no_privilege(tmp_path: Path) -> None:
    """A file named like the shipped reboot template, in the author's folder, is the author's."""
    (tmp_path / "reboot.yaml.j2").write_text((ROOT / "job-templates" / "reboot.yaml.j2").read_text())
    with pytest.raises(PlaybookError, match="only the shipped remediation templates"):
        render_job(ctx(Config(template_dir=str(tmp_path))), "reboot.yaml.j2", 600, {}, remediation=True)


def test_the_shipped_reboot_job_runs_only_the_configs_image(tmp_path: Path) -> None:
    """Even the shipped reboot template, given another image by the config's allowed list, is refused:
    a privileged container runs only `reboot_image`."""
    cfg = Config(allowed_images=(OUTSIDE,))
    job = render_job(ctx(cfg), "reboot.yaml.j2", 600, {}, remediation=True)
    assert job["spec"]["template"]["spec"]["hostPID"] is True
    cfg = shipped_with("reboot.yaml.j2", "image: {{ reboot_image | tojson }}", f"image: {OUTSIDE}", tmp_path)
    with pytest.raises(PlaybookError, match="unsafe Job"):
        render_job(ctx(replace(cfg, allowed_images=(OUTSIDE,))), "mine.yaml.j2", 600, {}, remediation=True)


# -- template names stay inside their folder, and a refused file is never echoed -------------------
@pytest.mark.parametrize(("name", "why"), [
    ("/etc/passwd", "absolute path"),
    ("/etc/hostname.j2", "absolute path"),
    ("../../x", "'..'"),
    ("../../../etc/shadow.j2", "'..'"),
    ("sub/../../x.yaml.j2", "'..'"),
    ("~root/x.j2", "absolute path"),
    ("README.md", "ends in .j2"),
])
def test_a_template_name_outside_the_folders_is_refused(name: str, why: str) -> None:
    with pytest.raises(PlaybookError, match="job template") as err:
        render_job(ctx(), name, 900, {})
    assert why in str(err.value)


def test_a_symlink_out_of_the_authors_folder_is_refused_and_not_echoed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("apiVersion: batch/v1\nkind: Job\ntoken: SECRET-MARKER-42\n")
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "x.yaml.j2").symlink_to(secret)
    with pytest.raises(PlaybookError, match="leaves its folder") as err:
        render_job(ctx(Config(template_dir=str(folder))), "x.yaml.j2", 900, {})
    assert "SECRET-MARKER-42" not in str(err.value)


@pytest.mark.parametrize("text", [
    "root:x:0:0:SECRET-MARKER-42:/root:/bin/bash\n  bad: [indent\n",  # not YAML
    "line one\n{{ SECRET-MARKER-42 }\n",  # not Jinja
    "kind: Secret\ndata: {token: SECRET-MARKER-42}\n",  # not a Job
])
def test_a_file_that_is_not_a_job_template_is_not_echoed(tmp_path: Path, text: str) -> None:
    with pytest.raises(PlaybookError) as err:
        render_job(ctx(author(tmp_path, "x.yaml.j2", text)), "x.yaml.j2", 900, {})
    assert "SECRET-MARKER-42" not in str(err.value)


# -- the rendered manifests: host paths one by one, read-only all the way down, no socket --------
def _rendered(template: str, platform: str) -> list[dict[str, Any]]:
    c = ctx(Config(platform=platform))
    if "pair_affinity" in (ROOT / "job-templates" / template).read_text():
        service, job, _ = render_pair(c, template, 900, {})
        return [job] if service is None else [service, job]
    return [render_job(c, template, 900, {}, remediation=template in REMEDIATION,
                       bound=template == "gpu-reset.yaml.j2")]


def _pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    if doc["kind"] == "MPIJob":
        return [r["template"]["spec"] for r in spec["mpiReplicaSpecs"].values()]
    return [spec["template"]["spec"]] if doc["kind"] == "Job" else []


@pytest.mark.parametrize("platform", ["generic", "eks", "aks", "gke"])
@pytest.mark.parametrize("template", SHIPPED)
def test_no_runtime_socket_is_reachable_from_any_shipped_job(template: str, platform: str) -> None:
    for doc in _rendered(template, platform):
        assert doc["metadata"]["namespace"] == (Config().remediation_namespace if template in REMEDIATION
                                                else Config().check_namespace)
        for pod in _pods(doc):
            paths = {v["name"]: posixpath.normpath(v["hostPath"]["path"]) for v in pod.get("volumes") or []
                     if "hostPath" in v}
            for path in paths.values():
                # the evidence Job alone reads the host's /var/log (DCGM's and the fabric manager's logs), read-only
                assert path in ("/sys", "/var/log/journal", "/run/log/journal", "/home/kubernetes/bin/nvidia") or \
                    (template == "sweeper-evidence.yaml.j2" and path == "/var/log"), path
                reached = [s for s in SOCKETS if s == path or s.startswith(path.rstrip("/") + "/")]
                assert not reached, f"{template}: host path {path} reaches {reached}"
            for c in pod["containers"] + pod.get("initContainers", []):
                assert "@sha256:" in c["image"], c["image"]
                for m in c.get("volumeMounts") or []:
                    if m["name"] in paths:
                        assert m["readOnly"] is True and m["recursiveReadOnly"] == "Enabled", m
                        assert m.get("mountPropagation", "None") == "None", m
                caps = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
                assert "SYS_CHROOT" not in caps


# -- config: images by digest ------------------------------------------------------------------
def test_the_config_refuses_an_image_by_tag(tmp_path: Path) -> None:
    for key in ("check_image", "reboot_image", "dcgm_image"):
        p = tmp_path / "c.yaml"
        p.write_text(f"{key}: ghcr.io/sweeper-dev/sweeper:0.1.0\n")
        with pytest.raises(ConfigError, match="pinned by digest"):
            load_config(p)


def test_every_shipped_default_image_carries_a_digest() -> None:
    cfg = Config()
    for image in cfg.job_images:
        assert image.rsplit("@", 1)[1].startswith("sha256:") and len(image.rsplit(":", 1)[1]) == 64, image


# -- lint applies the same rules --------------------------------------------------------------
def test_lint_refuses_an_unsafe_template_with_the_runtime_rules(tmp_path: Path) -> None:
    cfg = shipped_with("sweeper-check.yaml.j2", "path: /sys", "path: /", tmp_path)
    report = lint_paths([tmp_path / "mine.yaml.j2"], cfg)
    assert any("unsafe Job" in p and "not one the checks read" in p for p in report.problems), report.problems
    report = lint_paths([ROOT / "job-templates"], Config())
    assert not report.problems, report.problems


def test_lint_refuses_a_playbook_that_moves_a_job(tmp_path: Path) -> None:
    book = tmp_path / "play.yaml"
    book.write_text("name: p\ntasks:\n  - run_job: {template: sweeper-check.yaml.j2, vars: {namespace: kube-system}}\n"
                    "  - run_job: {template: /etc/passwd}\n")
    report = lint_paths([book], Config())
    assert any(p.startswith(f"{book}:3:") and "vars may not set namespace" in p for p in report.problems), report.problems
    assert any(p.startswith(f"{book}:4:") and "absolute path" in p for p in report.problems), report.problems


def test_every_variable_sweeper_sets_is_protected() -> None:
    """The list lint checks is the runtime's: every variable render_job and render_pair set."""
    from sweeper.actions.safety import SWEEPER_VARS
    seen: dict[str, Any] = {}
    original = __import__("sweeper.actions.safety", fromlist=["protected"]).protected

    def spy(extra: dict[str, Any], own: dict[str, Any], action: str) -> None:
        seen.update(own)
        original(extra, own, action)

    import sweeper.actions.jobs as jobs
    import sweeper.actions.pair as pair
    try:
        jobs.protected, pair.protected = spy, spy  # type: ignore[assignment]
        render_job(ctx(), "sweeper-check.yaml.j2", 900, {})
        render_pair(ctx(), "nccl-pair.yaml.j2", 900, {})
    finally:
        jobs.protected, pair.protected = original, original  # type: ignore[assignment]
    assert set(seen) <= SWEEPER_VARS, set(seen) - SWEEPER_VARS


def test_lint_names_an_unpublished_image_digest(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"check_image: {Config().check_image}\n")
    report = lint_paths([], Config(), p)
    assert any("check_image" in w and "placeholder" in w for w in report.warnings), report.warnings
