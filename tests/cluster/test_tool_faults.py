"""Faults of the tool are never faults of the node: a check that cannot run (an image that cannot be
pulled, a pod refused by admission, a RuntimeClass that does not exist, a missing ConfigMap, a
program missing from the image) ends `error` with the cause in words, hands the node back, and
leaves the node's history without a failure; the same fault on many nodes stops the run (exit 5)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import yaml
from click.testing import CliRunner
from kubernetes import client

from sweeper.cli import main
from sweeper.config import home
from sweeper.history import History
from sweeper.policy import HOLDING
from sweeper.sweep import ATTEMPT_VERDICTS, Sweep
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

BAD_IMAGE = "ghcr.io/sweeper-dev/sweeper:0.1.0-typo@sha256:" + "c" * 64  # pinned, as every image is
CFG = replace(TEST_CONFIG, check_timeout=1800)  # 3 s of real time: room for a loaded machine


def taints(sim: Sim, node: str) -> list[str]:
    return [t.key for t in sim.core.read_node(node).spec.taints or []]


def assert_tool_error(sim: Sim, history: History, report, node: str, *words: str) -> dict:
    """The node's sweep ended `error` by a fault of the check, it was handed back, and its history
    holds no failure: nothing for a ladder, a relapse, a failure rate, the breaker or max_attempts."""
    o = next(o for o in report.outcomes if o.node == node)
    assert (o.verdict, o.action) == ("error", "released"), o
    for w in words:
        assert w in "; ".join(o.reasons), (w, o.reasons)
    assert taints(sim, node) == []
    assert history.failures_since(0, HOLDING) == {}
    assert history.sweeps(node, 0, 1e12) == [], "an error is not a conclusive sweep for the policy's history"
    checks = list(history.db.query("select name, status, code from checks where node = ?", [node]))
    assert checks and all(c["status"] != "fail" for c in checks), checks
    assert report.tool_errors.get(node)
    return checks[0]


def test_an_unpullable_image_ends_error_not_a_hung_check(make_sim, history: History) -> None:
    """The kubelet sets status.startTime when it accepts the pod, before pulling its image, so a pod
    whose image cannot be pulled is "started" but its container never runs; it waits with
    ErrImagePull, then ImagePullBackOff. https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff
    Before, such a check ran into its deadline and the node was quarantined as a hung check."""
    sim: Sim = make_sim(fleet_spec(nodes=2, registry={"missing": [BAD_IMAGE]}))
    report = run_sweep(sim, history, replace(CFG, check_image=BAD_IMAGE))
    for node in ("gpu-00", "gpu-01"):
        # The detail is ErrImagePull's answer from the registry, or ImagePullBackOff's, as last seen.
        check = assert_tool_error(sim, history, report, node, f'the check image "{BAD_IMAGE}" cannot be pulled',
                                  "a fault of the check, not of the node", "ImagePull")
        assert (check["name"], check["code"]) == ("check.tool", "ErrImagePull")
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []
    # The same nodes are not held back by max_attempts: a fault of the tool is not the node's.
    sw = Sweep(sim.kube, replace(CFG, max_attempts=1), history, clock=sim.cluster.clock)
    assert history.failures_since(0, ATTEMPT_VERDICTS) == {"gpu-00": 1, "gpu-01": 1}
    assert sw.gates().attempts == {}


def test_the_simulated_kubelet_pulls_like_the_real_one(make_sim) -> None:
    """startTime is set when the kubelet accepts the pod, while its container still waits; a failed
    pull is ErrImagePull, then ImagePullBackOff until the next try; a reference that does not parse
    is InvalidImageName. https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting"""
    # Real-time speed, so that the 10 s back-off outlasts the test's steps.
    sim: Sim = make_sim(fleet_spec(nodes=1, registry={"missing": ["example.com/none:1"]}, speed=1))
    sim.cluster.stop()  # step the kubelet by hand, to see each state
    for name, image in (("p", "example.com/none:1"), ("q", "Example/UPPER:1")):
        sim.core.create_namespaced_pod("default", {
            "metadata": {"name": name}, "spec": {"nodeName": "gpu-00", "restartPolicy": "Never",
                                                 "containers": [{"name": "c", "image": image}]}})

    def state(name: str) -> tuple[str, str, bool]:
        pod = sim.core.read_namespaced_pod(name, "default")
        waiting = pod.status.container_statuses[0].state.waiting
        return pod.status.phase, waiting.reason, pod.status.start_time is not None

    sim.cluster.step()
    assert state("p") == ("Pending", "ErrImagePull", True)
    assert "example.com/none:1: not found" in sim.core.read_namespaced_pod("p", "default").status \
        .container_statuses[0].state.waiting.message
    assert state("q") == ("Pending", "InvalidImageName", True)
    sim.cluster.step()
    assert state("p") == ("Pending", "ImagePullBackOff", True)
    sim.cluster.missing_images.clear()
    sim.cluster._pulls.clear()  # the back-off is over: the next try finds the image
    sim.cluster.step()
    assert sim.core.read_namespaced_pod("p", "default").status.phase == "Running"


def test_pod_security_admission_refusal_ends_error_with_the_apiserver_words(make_sim, history: History) -> None:
    """A namespace labelled pod-security.kubernetes.io/enforce=baseline refuses a privileged pod at
    creation with a 403; a Job's controller records it as a FailedCreate Event and no pod exists.
    https://kubernetes.io/docs/concepts/security/pod-security-admission/"""
    sim: Sim = make_sim(nodes=2)
    sim.core.patch_namespace("sweeper-checks", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}})
    report = run_sweep(sim, history, CFG)
    words = 'violates PodSecurity "baseline:latest": hostPath volumes (volumes "host-sys", "host-journal"'
    for node in ("gpu-00", "gpu-01"):
        check = assert_tool_error(sim, history, report, node, "refused at creation", words)
        assert check["code"] == "FailedCreate"
    events = [e for e in sim.core.list_namespaced_event("sweeper-checks").items if e.reason == "FailedCreate"]
    assert events and all(e.involved_object.kind == "Job" and "is forbidden: " + words in e.message for e in events)
    assert sim.core.list_namespaced_pod("sweeper-checks").items == [], "the refused pods never existed"


def test_an_unknown_runtime_class_ends_error_and_a_known_one_runs(make_sim, history: History,
                                                                  tmp_path: Path) -> None:
    """The RuntimeClass admission controller refuses a pod naming a RuntimeClass that does not
    exist: `pod rejected: RuntimeClass "x" not found` (plugin/pkg/admission/runtimeclass/admission.go,
    https://kubernetes.io/docs/concepts/containers/runtime-class/). A cluster without the GPU
    Operator has no `nvidia` RuntimeClass, which `runtime_class: auto` names on a named generic
    platform (`platform: auto` would find none and name none: tests/cluster/test_platform_auto.py)."""
    sim: Sim = make_sim(nodes=1, runtime_classes=[])
    cfg = replace(CFG, interval=0, platform="generic")
    report = run_sweep(sim, history, cfg)
    check = assert_tool_error(sim, history, report, "gpu-00", 'pod rejected: RuntimeClass "nvidia" not found')
    assert check["code"] == "FailedCreate"
    client.NodeV1Api(sim.api_client).create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    again = run_sweep(sim, history, cfg)
    assert [(o.node, o.verdict, o.action) for o in again.outcomes] == [("gpu-00", "pass", "released")]


def test_a_missing_configmap_and_a_missing_program_are_faults_of_the_check(make_sim, history: History,
                                                                           tmp_path: Path) -> None:
    """A container whose env names a ConfigMap that does not exist waits with CreateContainerConfigError
    (`configmap "x" not found`); a shell whose program is not in the image exits 127."""
    busybox = "busybox:1.36@sha256:" + "d" * 64  # pinned, and in allowed_images: an author's own image
    sim: Sim = make_sim(fleet_spec(nodes=2, registry={"lacking": {busybox: ["sweeper"]}}))
    out = tmp_path / "job-templates"
    shutil.copytree(home() / "job-templates", out)
    path = out / "sweeper-check.yaml.j2"
    text = path.read_text()
    path.write_text(text.replace("""          env:
""", """          env:
            - name: EXTRA
              valueFrom:
                configMapKeyRef: {name: sweeper-extra, key: flags}
"""))
    shell = out / "shell-check.yaml.j2"
    shell.write_text(text.replace('command: ["sweeper", "check"]', 'command: ["sh", "-c", "sweeper check --json"]')
                     .replace("image: {{ image | tojson }}", f'image: "{busybox}"'))
    cfg = replace(CFG, template_dir=str(out), allowed_images=(busybox,))
    report = run_sweep(sim, history, replace(cfg, max_nodes=1, run_deadline=1))  # gpu-00 alone
    check = assert_tool_error(sim, history, report, "gpu-00", "CreateContainerConfigError",
                              'configmap "sweeper-extra" not found')
    assert check["code"] == "CreateContainerConfigError"
    (tmp_path / "pb").mkdir()
    playbook = yaml.safe_load((home() / "playbooks" / "sweep-light.yaml").read_text())
    playbook["tasks"][0]["block"][2]["run_job"]["template"] = "shell-check.yaml.j2"
    (tmp_path / "pb" / "shell.yaml").write_text(yaml.safe_dump(playbook))
    report = run_sweep(sim, history, replace(cfg, playbook_dir=str(tmp_path / "pb"), playbook="shell.yaml",
                                             light_playbook=""))
    check = assert_tool_error(sim, history, report, "gpu-01", "command not found", "sh: 1: sweeper: not found")
    assert check["code"] == "exit 127"


def test_a_hung_check_is_a_running_container_that_never_finishes(make_sim, history: History) -> None:
    """The distinction the deadline rests on: the hung check's container ran (a node fault), the
    unpullable one never did (the tool's)."""
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-01": {"hung_check": True}}))
    report = run_sweep(sim, history, replace(CFG, check_timeout=1800))  # 3 s of real time: ample to start it
    hung = next(o for o in report.outcomes if o.node == "gpu-01")
    assert (hung.verdict, hung.action) == ("quarantine", "held")
    assert report.tool_errors == {}


def test_ten_nodes_with_the_same_tool_error_stop_the_run_with_exit_5(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=12, registry={"missing": [BAD_IMAGE]}))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"max_nodes": 10, "max_percent": 100, "poll_interval": 0.02, "check_timeout": 1800,
                                   "interval": "1s", "check_image": BAD_IMAGE, "light_playbook": ""}))
    state = tmp_path / "h.db"
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(state), "--config", str(cfg)]
    runner = CliRunner()
    res = runner.invoke(main, ["sweep", *base, "--json"])
    assert res.exit_code == 5, res.output
    report = json.loads(res.stdout)
    # The first plan takes 10; a slot freed before the third error may be refilled (the rolling
    # queue), never after it: at most tool_error_limit - 1 more nodes.
    verdicts = [n["verdict"] for n in report["nodes"]]
    assert set(verdicts) == {"error"} and 10 <= len(verdicts) <= 12, verdicts
    assert all(n["action"] == "released" for n in report["nodes"])
    assert len(set(report["tool_errors"].values())) == 1 and len(report["tool_errors"]) == len(verdicts)
    assert res.stderr.count("run stopped") == 1, res.stderr
    assert f"the same fault of the check ended {len(verdicts)} nodes" in res.stderr
    assert f'ErrImagePull: the check image "{BAD_IMAGE}" cannot be pulled' in res.stderr
    for n in sim.core.list_node().items:
        assert not [t for t in n.spec.taints or [] if t.key == "sweeper.dev/sweep"], n.metadata.name
    events = [e for e in sim.core.list_namespaced_event("sweeper").items if e.reason == "SweepStoppedToolErrors"]
    assert len(events) == 1 and events[0].involved_object.kind == "Lease"
    h = History(state)
    assert h.failures_since(0, HOLDING) == {}
    h.close()
    # The next run tries one node first; the same fault stops it again.
    res = runner.invoke(main, ["sweep", *base, "--json"])
    assert res.exit_code == 5, res.output
    report = json.loads(res.stdout)
    assert [n["action"] for n in report["nodes"]].count("released") == 1
    assert all(n["action"] == "skipped" for n in report["nodes"] if n["action"] != "released")
    assert "this run's first node ended with one too" in res.stderr
    # The image is fixed: the first node passes, and the rest are swept.
    sim.cluster.missing_images.clear()
    res = runner.invoke(main, ["sweep", *base, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert [n["verdict"] for n in report["nodes"]] == ["pass"] * 12, "the probe, then every other due node"
