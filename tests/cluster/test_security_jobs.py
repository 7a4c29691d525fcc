"""Issue 22's Job attacks through `sweeper run` against the simulated cluster: each playbook is
refused with an error that names its file:line, and nothing is created in the cluster. The rules
themselves are tested one by one in tests/test_security_jobs.py; here, that a refused render
never reaches the API server, in any namespace.

https://kubernetes.io/docs/concepts/storage/volumes/#hostpath (a host path is the node's own files),
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/ (node affinity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parent.parent.parent
OUTSIDE = "docker.io/library/alpine@sha256:" + "a" * 64
NAMESPACES = ("sweeper", "kube-system", "default")


def run_play(sim: Sim, tmp_path: Path, task: str, config: str = "") -> Any:
    book = tmp_path / "attack.yaml"
    book.write_text("name: attack\ntasks:\n  - name: the attack\n" + task)
    args = ["run", str(book), "--node", "gpu-00", "--kubeconfig", str(sim.kubeconfig), "--state",
            str(tmp_path / "h.db")]
    if config:
        (tmp_path / "config.yaml").write_text(config)
        args += ["--config", str(tmp_path / "config.yaml")]
    return CliRunner().invoke(main, args)


def nothing_created(sim: Sim) -> None:
    for ns in NAMESPACES:
        assert not sim.batch.list_namespaced_job(ns).items, ns
        assert not [p for p in sim.core.list_namespaced_pod(ns).items
                    if (p.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "sweeper"], ns


@pytest.mark.parametrize(("vars_", "key"), [
    ('{namespace: kube-system}', "namespace"),
    ('{affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: '
     '[{matchExpressions: [{key: node-role.kubernetes.io/control-plane, operator: Exists}]}]}}}}', "affinity"),
    ('{tolerations: [{operator: Exists}]}', "tolerations"),
    (f'{{image: "{OUTSIDE}"}}', "image"),
    (f'{{reboot_image: "{OUTSIDE}"}}', "reboot_image"),
])
def test_a_playbooks_vars_cannot_move_a_job(make_sim: Any, tmp_path: Path, vars_: str, key: str) -> None:
    sim: Sim = make_sim(nodes=1)
    res = run_play(sim, tmp_path, f"    run_job: {{template: sweeper-check.yaml.j2, vars: {vars_}}}\n")
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / 'attack.yaml'}:3" in res.output and f"vars may not set {key}" in res.output, res.output
    nothing_created(sim)


@pytest.mark.parametrize("template", ["/etc/passwd", "../../x", "../../../etc/shadow.j2"])
def test_a_template_name_outside_the_folders_creates_nothing(make_sim: Any, tmp_path: Path, template: str) -> None:
    sim: Sim = make_sim(nodes=1)
    res = run_play(sim, tmp_path, f"    run_job: {{template: \"{template}\"}}\n")
    assert res.exit_code == 2 and "job template" in res.output, res.output
    assert "root:x:0:0" not in res.output
    nothing_created(sim)


def test_a_symlink_out_of_the_authors_folder_creates_nothing(make_sim: Any, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=1)
    folder = tmp_path / "templates"
    folder.mkdir()
    (tmp_path / "elsewhere.yaml.j2").write_text((ROOT / "job-templates" / "sweeper-check.yaml.j2").read_text())
    (folder / "check.yaml.j2").symlink_to(tmp_path / "elsewhere.yaml.j2")
    res = run_play(sim, tmp_path, "    run_job: {template: check.yaml.j2}\n", f"template_dir: {folder}\n")
    assert res.exit_code == 2 and "leaves its folder" in res.output, res.output
    nothing_created(sim)


@pytest.mark.parametrize(("old", "new", "why"), [
    ("path: /sys", "path: /", "not one the checks read"),
    ("path: /sys", "path: /run/containerd/containerd.sock", "container runtime"),
    ("namespace: {{ namespace | tojson }}", "namespace: kube-system", "namespace must be Sweeper's"),
    ("image: {{ image | tojson }}", f"image: {OUTSIDE}", "not one of the config's images"),
    ("      restartPolicy: Never", "      restartPolicy: Never\n      hostPID: true", "hostPID"),
])
def test_an_authors_unsafe_template_creates_nothing(make_sim: Any, tmp_path: Path, old: str, new: str,
                                                    why: str) -> None:
    sim: Sim = make_sim(nodes=1)
    folder = tmp_path / "templates"
    folder.mkdir()
    text = (ROOT / "job-templates" / "sweeper-check.yaml.j2").read_text()
    assert old in text
    (folder / "mine.yaml.j2").write_text(text.replace(old, new, 1))
    res = run_play(sim, tmp_path, "    run_job: {template: mine.yaml.j2}\n", f"template_dir: {folder}\n")
    assert res.exit_code == 2 and "unsafe Job" in res.output and why in res.output, res.output
    assert f"{tmp_path / 'attack.yaml'}:3" in res.output
    nothing_created(sim)


def test_the_shipped_check_still_runs(make_sim: Any, tmp_path: Path) -> None:
    """The same path with Sweeper's own template: the Job runs on the simulated kubelet and passes."""
    sim: Sim = make_sim(nodes=1)
    res = run_play(sim, tmp_path, "    run_job: {template: sweeper-check.yaml.j2}\n")
    assert res.exit_code == 0, res.output


# -- cluster data cannot shape a Job (sweeper.actions.structure) -------------------------------
# A kubelet may write its own Node's annotations and labels (the NodeRestriction admission plugin:
# https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction):
# here the node's annotation carries YAML for the container's command, and an author's template
# writes it bare. Written over HTTP, as a kubelet would write it.
INJECTED = "/tmp\n          command: [sh, -c, evil]"
BROKEN_OUT = '/tmp"\n          command: [sh, -c, evil]\n          terminationMessagePath: "/dev/termination-log'


def bare_annotation(tmp_path: Path, quoted: bool) -> Path:
    folder = tmp_path / "templates"
    folder.mkdir()
    text = (ROOT / "job-templates" / "sweeper-check.yaml.j2").read_text()
    value = "\"{{ node.annotations['example.com/scratch'] }}\"" if quoted else \
        "{{ node.annotations['example.com/scratch'] }}"
    head, sep, tail = text.partition("          env:\n")
    (folder / "mine.yaml.j2").write_text(f"{head}          workingDir: {value}\n{sep}{tail}")
    return folder


def annotate(sim: Sim, node: str, value: str) -> None:
    sim.core.patch_node(node, {"metadata": {"annotations": {"example.com/scratch": value}}})


@pytest.mark.parametrize(("quoted", "value"), [(False, INJECTED), (True, BROKEN_OUT)])
def test_a_nodes_annotation_cannot_give_a_job_its_command(make_sim: Any, tmp_path: Path, quoted: bool,
                                                          value: str) -> None:
    sim: Sim = make_sim(nodes=1)
    annotate(sim, "gpu-00", value)
    folder = bare_annotation(tmp_path, quoted)
    res = run_play(sim, tmp_path, "    run_job: {template: mine.yaml.j2}\n", f"template_dir: {folder}\n")
    assert res.exit_code == 2 and "unsafe Job" in res.output, res.output
    assert "mine.yaml.j2" in res.output and "node['annotations']['example.com/scratch']" in res.output, res.output
    nothing_created(sim)


def test_a_sweep_records_the_refused_job_as_an_error_and_hands_the_node_back(make_sim: Any, tmp_path: Path) -> None:
    """Neither pass nor fail: a refused Job is the tool's fault (the author's template), never the
    node's; the node with a plain annotation is checked as before."""
    from dataclasses import replace

    from sweeper.history import History
    from tests.conftest import TEST_CONFIG, run_sweep

    sim: Sim = make_sim(nodes=2)
    annotate(sim, "gpu-00", "scratch")
    annotate(sim, "gpu-01", INJECTED)
    folder = bare_annotation(tmp_path, quoted=False)
    (folder / "check.yaml").write_text("name: mine\ntasks:\n  - run_job: {template: mine.yaml.j2, timeout: 10m}\n")
    cfg = replace(TEST_CONFIG, template_dir=str(folder), playbook_dir=str(folder), playbook="check.yaml",
                  light_playbook="")
    start = len(sim.cluster.store.requests)
    h = History(tmp_path / "sweep.db")
    try:
        report = run_sweep(sim, h, cfg)
    finally:
        h.close()
    verdicts = {o.node: o.verdict for o in report.outcomes}
    assert verdicts == {"gpu-00": "pass", "gpu-01": "error"}, report.outcomes
    refused = next(o for o in report.outcomes if o.node == "gpu-01")
    assert any("unsafe Job" in r and "node['annotations']['example.com/scratch']" in r for r in refused.reasons), refused
    # no Job of gpu-01's was ever asked for (each is named sweep-<node>-...); gpu-00's ran
    paths = [p for _, p in sim.cluster.store.requests[start:] if "/jobs" in p]
    assert not [p for p in paths if "sweep-gpu-01-" in p] and [p for p in paths if "sweep-gpu-00-" in p], paths
    taints = sim.core.read_node("gpu-01").spec.taints or []
    assert not [t for t in taints if t.key == cfg.taint_key], taints
