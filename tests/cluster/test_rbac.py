"""The CronJob's RBAC is exactly what Sweeper uses, and it works from inside the cluster.

Every API call the commands make against the simulated cluster (a sweep that replaces through
Karpenter, sets the node condition, reconciles a dead run; a pair sweep in both its forms, the
MPI Operator's MPIJob included; an operator's drain) is allowed by
deploy/cronjob.yaml, and every rule there is needed by at least one call. Then the CronJob's
own pod spec runs one sweep against the simulated cluster over TLS, with in-cluster
configuration from a service account token file and the environment, the simulator enforcing
that service account's RBAC."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sweeper.actions import ActionContext, load_all
from sweeper.cli import main
from sweeper.history import History
from sweeper.profiles import load_profile
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.rbac import allowed, attributes, object_name, rule_covers, rules_from_manifests
from sweeper.sim.server import ApiServer
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

ROOT = Path(__file__).resolve().parents[2]
P5 = load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars()


def manifest(name: str = "cronjob.yaml") -> list[dict]:
    """The documents of a file of deploy/, or of every file of a folder of it (device-plugin/: one
    file per namespace the plugin may run in, so that each applies where its namespace exists)."""
    path = ROOT / "deploy" / name
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


# applied only with the feature that needs them
OPTIONAL = ("rbac-karpenter.yaml", "rbac-evictions.yaml", "device-plugin")


def _unused(rules: list, calls: set) -> list:
    return [(ns, rule["resources"], verb) for i, (ns, rule) in enumerate(rules) for verb in rule["verbs"]
            if not any(allowed(rules, *c) == i and rule_covers({**rule, "verbs": [verb]}, *c[:3], c[4])
                       for c in calls)]


def _calls(sim: Sim, start: int, end: int | None = None) -> set:
    """(group, resource, verb, namespace, name) of each request, as RBAC sees it."""
    return {(*a, object_name(p)) for m, p in sim.cluster.store.requests[start:end] if (a := attributes(m, p)) is not None}


def test_the_cluster_role_is_exactly_what_sweeper_uses(make_sim, history: History, tmp_path: Path) -> None:
    # gpu-02: an application XID the device plugin marks unhealthy; Sweeper restarts the plugin
    spec = fleet_spec(nodes=5, faults={"gpu-01": {"remap_failure": [2]}, "gpu-02": {"xids": [{"code": 94, "gpu": 1}]},
                                             "gpu-04": {"remap_pending": [5]}},
                      workloads=[{"node": "gpu-03", "gpus": 8, "duration": None}], mpi_operator=True)
    spec["node_groups"][0].update(labels={"karpenter.sh/nodepool": "gpu"}, device_plugin_pod=True)
    sim: Sim = make_sim(spec)
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="the workload")
    history.run_started("sw-dead", sim.cluster.clock.now() - 7200, "sweep")  # a run that died: reconciled
    sim.core.create_namespaced_service("sweeper-checks", {  # its pair sweep's Service, left behind
        "metadata": {"name": "sweep-pair-gpu-00-dead00", "labels": {
            "app.kubernetes.io/managed-by": "sweeper", "app.kubernetes.io/component": "pair",
            "sweeper.dev/run-id": "sw-dead"}}, "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}})
    sim.kube.create_mpijob("sweeper-checks", {  # and the MPIJob of its pair sweep's MPIJob form
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "pair-mpi-dead00", "labels": {
            "app.kubernetes.io/managed-by": "sweeper", "sweeper.dev/run-id": "sw-dead"}}, "spec": {}})
    start = len(sim.cluster.store.requests)
    cfg = replace(TEST_CONFIG, node_condition=True, light_playbook="", remediate_reboots=True,
                  remediation={"default": "manual", "by_pool": {"gpu": "karpenter"}, "by_profile": {}})
    report = run_sweep(sim, history, cfg)
    assert {o.node: o.verdict for o in report.outcomes}["gpu-01"] == "replace"
    assert {o.node: o.action for o in report.outcomes}["gpu-02"] == "released"
    # a GPU reset, in the remediation namespace, under its own account
    assert sim.core.read_node("gpu-04").metadata.annotations["sweeper.dev/remediation"] == "gpu-reset"
    # a pair sweep between two nodes the run handed back: its headless Service and Indexed Job
    pair = load_all()["run_pair_job"]
    nodes = {n: {"name": n, "gpus": 8, "labels": {"kubernetes.io/hostname": n}, "profile": P5} for n in ("gpu-00", "gpu-02")}
    out = pair.fn(ActionContext(config=cfg, clock=sim.cluster.clock, kube=sim.kube, node=nodes["gpu-00"],
                                partner=nodes["gpu-02"], run_id="sw-pair"), pair.validate({}, "rbac"))
    assert out["status"] == "pass", out
    # the same pair in the MPIJob form, where the MPI Operator is installed
    out = pair.fn(ActionContext(config=cfg, clock=sim.cluster.clock, kube=sim.kube, node=nodes["gpu-00"],
                                partner=nodes["gpu-02"], run_id="sw-pair"),
                  pair.validate({"template": "nccl-pair-mpijob.yaml.j2"}, "rbac"))
    assert out["status"] == "pass", out
    assert {"mpijob": "pair-mpi-dead00", "action": "deleted", "why": "left by run sw-dead"} in report.reconciled
    swept = len(sim.cluster.store.requests)
    # an operator's playbook that drains a node through the Eviction API
    book = tmp_path / "drain.yaml"
    book.write_text("name: drain\ntasks:\n  - drain: {timeout: 10m}\n")
    res = CliRunner().invoke(main, ["run", str(book), "--node", "gpu-03", "--kubeconfig", str(sim.kubeconfig),
                                    "--state", str(tmp_path / "run.db")])
    assert res.exit_code == 0, res.output
    # an operator's pause and resume: the control ConfigMap's first write creates it, the next patches it
    for cmd in (["pause", "--reason", "maintenance"], ["resume"]):
        res = CliRunner().invoke(main, [*cmd, "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "run.db")])
        assert res.exit_code == 0, res.output
    # a check pod refused at creation (Pod Security): its Job's FailedCreate Event is listed, and the
    # run that stops on the repeated tool error says so in an Event on its Lease
    admin = len(sim.cluster.store.requests)  # the cluster admin labels the namespace: not Sweeper's call
    sim.core.patch_namespace("sweeper-checks", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    labelled = len(sim.cluster.store.requests)
    refused = run_sweep(sim, history, replace(cfg, interval=1, tool_error_limit=1))
    assert "refused at creation" in refused.tool_stop, refused.outcomes
    calls = _calls(sim, start, admin) | _calls(sim, labelled)
    base = rules_from_manifests(manifest(), "sweeper", "sweeper")
    optional = {name: rules_from_manifests(manifest(name), "sweeper", "sweeper") for name in OPTIONAL}
    rules = base + [r for name in OPTIONAL for r in optional[name]]
    denied = sorted((c for c in calls if allowed(rules, *c) is None), key=str)
    assert denied == [], f"calls the RBAC does not allow: {denied}"
    # the DRA check's ResourceClaimTemplate is made only on a DRA node (tests/cluster/test_dra_kueue.py)
    unexercised = {("gpu-operator", ("pods",), "delete"), ("nvidia-device-plugin", ("pods",), "delete"),
                   ("sweeper-checks", ("resourceclaimtemplates",), "create")}
    assert [u for u in _unused(rules, calls) if (u[0], tuple(u[1]), u[2]) not in unexercised] == [], \
        "RBAC that no call needs"
    # each optional document is needed by its own feature, and the default manifest lacks it
    feature = {"rbac-karpenter.yaml": _calls(sim, start, swept), "rbac-evictions.yaml": _calls(sim, swept),
               "device-plugin": _calls(sim, start, swept)}
    # The device plugin's document has one Role per namespace the plugin may run in: each grants
    # exactly the delete of pods; this fleet's plugin runs in kube-system.
    assert {(ns, tuple(r["resources"]), tuple(r["verbs"])) for ns, r in optional["device-plugin"]} == {
        (ns, ("pods",), ("delete",)) for ns in ("gpu-operator", "kube-system", "nvidia-device-plugin")}
    for name in OPTIONAL:
        unused = _unused(optional[name], feature[name])
        if name == "device-plugin":
            unused = [u for u in unused if u[0] == "kube-system"]
        assert optional[name] and unused == [], name
        needs = [c for c in feature[name] if allowed(optional[name], *c) is not None]
        assert needs and all(allowed(base, *c) is None for c in needs), f"{name}: the default manifest lacks it"
    # the lock's Lease by its name only: another Lease in the namespace is out of reach
    lease = [c for c in calls if c[1] == "leases" and c[2] in ("get", "update")]
    assert lease and {c[4] for c in lease} == {cfg.lock_name}
    assert allowed(base, "coordination.k8s.io", "leases", "update", "sweeper", "someone-elses") is None
    assert allowed(base, "coordination.k8s.io", "leases", "create", "sweeper") is not None
    assert len(calls) >= 15 and len(rules) >= 10


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make the server's certificate")
def test_the_cronjob_pod_sweeps_from_inside_the_cluster(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    spec = fleet_spec(nodes=3, faults={"gpu-02": {"missing_gpus": 1}})
    spec["namespace"] = "sweeper"
    cluster = SimCluster(parse_fleet(spec))
    server = ApiServer(cluster)
    server.enable_tls(str(cert), str(key))
    docs = manifest()
    token = secrets.token_urlsafe(24)
    server.service_accounts[token] = ("system:serviceaccount:sweeper:sweeper",
                                      rules_from_manifests(docs, "sweeper", "sweeper"))
    server.start()
    try:
        root = tmp_path / "pod"
        cron = next(d for d in docs if d["kind"] == "CronJob")
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "sweeper"
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod["volumes"]}
        maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
        for m in container["volumeMounts"]:  # what the kubelet would mount, under a local root
            target = root / m["mountPath"].lstrip("/")
            source = volumes[m["name"]]
            if "configMap" in source:
                data = maps[source["configMap"]["name"]]["data"]
                if "subPath" in m:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    text = data[m["subPath"]]
                    for path in ("/etc/sweeper", "/var/lib/sweeper"):
                        text = text.replace(f": {path}", f": {root}{path}")
                    # the simulated clock runs 600x: poll in real time accordingly, and allow 100% of 3 nodes
                    target.write_text(text + "poll_interval: 0.05\nmax_percent: 100\n")
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    for name, text in data.items():
                        (target / name).write_text(text)
            else:
                target.mkdir(parents=True, exist_ok=True)
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text(token)
        (sa / "namespace").write_text("sweeper")
        shutil.copy(cert, sa / "ca.crt")
        argv = [a.replace("/etc/sweeper", f"{root}/etc/sweeper").replace("/var/lib/sweeper", f"{root}/var/lib/sweeper")
                for a in container["command"][1:] + container.get("args", [])]
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "SWEEPER_STATE", "SWEEPER_HOME")}
        # plain values; the webhook's optional Secret does not exist here, so the kubelet leaves it unset
        env.update({e["name"]: e["value"].replace("/tmp", str(root / "tmp")) for e in container.get("env", [])
                    if "value" in e})
        assert all(e["valueFrom"]["secretKeyRef"]["optional"] for e in container["env"] if "valueFrom" in e)
        host, port = server.httpd.server_address[:2]
        env.update({"KUBERNETES_SERVICE_HOST": str(host), "KUBERNETES_SERVICE_PORT": str(port),
                    "SWEEPER_SERVICEACCOUNT_DIR": str(sa)})
        assert container["command"][0] == "sweeper"
        proc = subprocess.run([sys.executable, "-m", "sweeper.cli", *argv, "--json"], env=env, capture_output=True,
                              text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads(proc.stdout)
        assert {n["node"]: n["verdict"] for n in report["nodes"]} == {"gpu-00": "pass", "gpu-01": "pass",
                                                                      "gpu-02": "reboot"}
        assert server.denied == [], "the service account's RBAC allowed every call"
        assert cluster.store.requests, "and the calls went to the simulated cluster over TLS"
        h = History(root / "var/lib/sweeper/history.db")
        assert h.counts()["node_sweeps"] == 3
        h.close()
        # and the same token is refused what its RBAC does not grant
        server.service_accounts[token][1].clear()
        proc = subprocess.run([sys.executable, "-m", "sweeper.cli", *argv, "--json"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 3 and "forbidden" in (proc.stdout + proc.stderr).lower()
    finally:
        server.stop()
