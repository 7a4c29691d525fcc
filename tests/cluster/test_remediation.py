"""Remediation and what people see, against the simulated cluster (Karpenter NodeClaims,
reboots, GPU resets) and moto (Auto Scaling): providers, dry-run, caps, events, labels,
the GpuSweepHealthy condition, metrics, the webhook."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from moto import mock_aws

from sweeper.fleet import NodeView
from sweeper.history import History
from sweeper.metrics import Metrics
from sweeper.remedy import Remediator, resettable
from sweeper.sweep import Sweep
from tests.conftest import (
    KARPENTER,
    TEST_CONFIG,
    Sim,
    fake_aws_credentials,
    fleet_spec,
    pool_fleet,
    run_sweep,
)


def claims(sim: Sim) -> dict[str, str]:
    return {c["status"]["nodeName"]: c["metadata"]["name"] for c in sim.kube.list_nodeclaims()}


def node_names(sim: Sim) -> set[str]:
    return {n.metadata.name for n in sim.core.list_node().items}


def test_replace_through_karpenter(make_sim, history: History) -> None:
    sim: Sim = make_sim(pool_fleet(3, {"gpu-01": {"remap_failure": [4]}}))
    assert set(claims(sim)) == {"gpu-00", "gpu-01", "gpu-02"}
    report = run_sweep(sim, history, KARPENTER)
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "replace", "gpu-02": "pass"}
    assert "gpu-01" not in claims(sim), "its NodeClaim is deleted"
    assert "gpu-01" not in node_names(sim), "and Karpenter took the node away"
    acts = [(a["action"], a["detail"]) for a in history.db.query("select * from actions where node = 'gpu-01'")]
    assert ("remediate-karpenter", acts[[a for a, _ in acts].index("remediate-karpenter")][1]) in acts
    assert any(a == "replaced" for a, _ in acts), "the old node's history is closed as replaced"
    sim.cluster.clock.advance(900)
    sim.wait_for(lambda: len(node_names(sim)) == 3, what="the replacement to join")
    new = node_names(sim) - {"gpu-00", "gpu-02"}
    assert len(new) == 1 and new.pop() in claims(sim), "a new node with its own NodeClaim"
    reasons = [e.reason for e in sim.core.list_namespaced_event(
        "default", field_selector="involvedObject.name=gpu-01").items]
    assert {"SweepStarted", "SweepReplace", "SweepRemediation"} <= set(reasons)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake_aws_credentials(monkeypatch)
    # moto loads its catalogue of public AMIs into every mock unless MOTO_EC2_LOAD_DEFAULT_AMIS is
    # "false" (moto/settings.py, ec2_load_default_amis): seconds of JSON per test. The group needs one
    # image, so the test registers its own.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.register_image(Name="gpu-node", RootDeviceName="/dev/xvda")["ImageId"]
        asg = boto3.client("autoscaling", region_name="us-east-1")
        asg.create_launch_configuration(LaunchConfigurationName="gpu", ImageId=ami, InstanceType="p5.48xlarge")
        asg.create_auto_scaling_group(AutoScalingGroupName="gpu-asg", LaunchConfigurationName="gpu", MinSize=3,
                                      MaxSize=3, DesiredCapacity=3, AvailabilityZones=["us-east-1a"])
        yield asg


def asg_instances(asg: Any) -> dict[str, dict[str, Any]]:
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-asg"])["AutoScalingGroups"][0]
    return {i["InstanceId"]: i for i in group["Instances"]}


def bind_instances(sim: Sim, asg: Any) -> list[str]:
    """Give the simulated nodes the instance ids moto made (their providerIDs)."""
    ids = sorted(asg_instances(asg))
    for node, iid in zip(("gpu-00", "gpu-01", "gpu-02"), ids, strict=True):
        sim.kube.patch_node(node, [{"op": "replace", "path": "/spec/providerID", "value": f"aws:///us-east-1a/{iid}"}])
    return ids


def test_replace_through_an_auto_scaling_group(make_sim, history: History, aws: Any) -> None:
    sim: Sim = make_sim(nodes=3, faults={"gpu-02": {"remap_failure": [1]}})
    ids = bind_instances(sim, aws)
    cfg = replace(TEST_CONFIG, remediation={"default": "asg", "by_pool": {}, "by_profile": {}})
    report = run_sweep(sim, history, cfg)
    assert {o.node: o.verdict for o in report.outcomes}["gpu-02"] == "replace"
    health = {iid: i["HealthStatus"] for iid, i in asg_instances(aws).items()}
    assert health[ids[2]].lower() == "unhealthy" and health[ids[0]].lower() == "healthy"
    detail = next(history.db.query("select detail from actions where action = 'remediate-asg'"))["detail"]
    assert ids[2] in detail and "gpu-asg" in detail


def test_asg_terminate_keeps_the_desired_capacity(make_sim, history: History, aws: Any) -> None:
    sim: Sim = make_sim(nodes=3, faults={"gpu-00": {"remap_failure": [1]}})
    ids = bind_instances(sim, aws)
    cfg = replace(TEST_CONFIG, remediation={"default": "asg", "by_pool": {}, "by_profile": {}}, asg_action="terminate")
    run_sweep(sim, history, cfg)
    group = aws.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu-asg"])["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 3 and ids[0] not in asg_instances(aws)


def test_a_dry_run_touches_neither_karpenter_nor_the_group(make_sim, history: History, aws: Any) -> None:
    sim: Sim = make_sim(pool_fleet(3, {}))
    ids = bind_instances(sim, aws)
    view = NodeView.from_obj(sim.kube.get_node("gpu-01"))
    before = sim.cluster.store.requests[:]
    rem = Remediator(sim.kube, replace(KARPENTER), sim.cluster.clock, dry_run=True)
    out = rem.remediate("sw-x", view, "p5.48xlarge", "replace", {}, {})
    assert out is not None and out.action == "would-delete-nodeclaim" and out.dry_run
    asg_cfg = replace(TEST_CONFIG, remediation={"default": "asg", "by_pool": {}, "by_profile": {}})
    out = Remediator(sim.kube, asg_cfg, sim.cluster.clock, dry_run=True).remediate("sw-x", view, "p5", "replace", {}, {})
    assert out is not None and out.action == "would-set-unhealthy"
    writes = [r for r in sim.cluster.store.requests[len(before):] if r[0] != "GET"]
    assert writes == [] and set(claims(sim)) == {"gpu-00", "gpu-01", "gpu-02"}
    assert {i["HealthStatus"].lower() for i in asg_instances(aws).values()} == {"healthy"}
    assert sorted(asg_instances(aws)) == ids


def test_the_cap_and_the_breaker_stop_a_mass_replacement(make_sim, history: History) -> None:
    faults = {f"gpu-0{i}": {"remap_failure": [0]} for i in range(5)}
    sim: Sim = make_sim(pool_fleet(6, faults))
    cfg = replace(KARPENTER, max_replacements_per_hour=2, breaker_failures=3, breaker_percent=0)
    report = run_sweep(sim, history, cfg)
    verdicts = sorted(o.verdict for o in report.outcomes)
    assert verdicts.count("replace") == 2 and verdicts.count("quarantine") == 3, report.outcomes
    assert len([n for n in claims(sim) if "-r" not in n]) == 6 - 2, "only two NodeClaims deleted"
    held = [n.metadata.name for n in sim.core.list_node().items
            if any(t.key == cfg.taint_key for t in n.spec.taints or [])]
    assert len(held) == 3, "the others are held for a person"
    for n in held:  # a person releases them (a false positive, say), the nodes would be taken again...
        sim.kube.patch_node(n, [{"op": "replace", "path": "/spec/taints", "value": []}])
    again = run_sweep(sim, history, replace(cfg, interval=0))
    assert again.outcomes == [] and any(d.reason == "breaker-open" for d in again.plan.skip), \
        "...but the breaker opened on five failures within the hour"
    assert sim.cluster.replacements == 2


def test_verdicts_reach_labels_annotation_condition_and_events(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"missing_gpus": 1}})
    cfg = replace(TEST_CONFIG, node_condition=True)
    run_sweep(sim, history, cfg)

    def cond(node: str) -> Any:
        return next(c for c in sim.core.read_node(node).status.conditions if c.type == "GpuSweepHealthy")

    assert (cond("gpu-00").status, cond("gpu-01").status) == ("True", "False")
    assert cond("gpu-01").reason == "SweepReboot" and "GPUs visible" in cond("gpu-01").message
    meta = sim.core.read_node("gpu-01").metadata
    assert meta.labels["sweeper.dev/status"] == "reboot"
    last = json.loads(meta.annotations["sweeper.dev/last-result"])
    assert last["verdict"] == "reboot" and len(meta.annotations["sweeper.dev/last-result"]) <= 4096
    first = cond("gpu-00").last_transition_time
    sim.cluster.clock.advance(7200)
    run_sweep(sim, history, replace(cfg, interval=0))
    assert cond("gpu-00").last_transition_time == first, "unchanged status, unchanged transition time"
    uid = sim.core.read_node("gpu-01").metadata.uid
    events = sim.core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-01").items
    assert {e.reason for e in events} >= {"SweepStarted", "SweepReboot"}
    assert {e.involved_object.uid for e in events} == {uid} and all(e.type for e in events)
    assert cond("gpu-00").last_heartbeat_time != first


def test_metrics_carry_the_verdicts(make_sim, history: History) -> None:
    sim: Sim = make_sim(pool_fleet(3, {"gpu-01": {"remap_failure": [2]}}))
    sw = Sweep(sim.kube, KARPENTER, history, clock=sim.cluster.clock)
    report = sw.run()
    m = Metrics()
    sw.observe(m, report)
    text = m.exposition().decode()
    assert 'sweeper_node_verdict{node="gpu-01",verdict="replace"} 1.0' in text
    assert 'sweeper_node_verdict{node="gpu-00",verdict="pass"} 1.0' in text
    assert 'sweeper_replacements_total{provider="karpenter"} 1.0' in text
    assert 'sweeper_node_checks_failed{node="gpu-01"} 1.0' in text
    assert "sweeper_breaker_open 0.0" in text and "sweeper_run_duration_seconds" in text


class Catch(BaseHTTPRequestHandler):
    """A webhook and a Pushgateway in one: records every request, fails the first N."""

    got: list[tuple[str, str, bytes]] = []
    fail_first = 0

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Catch.got.append((self.command, self.path, body))
        code = 500 if Catch.fail_first > 0 else 200
        Catch.fail_first -= 1
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = _any  # noqa: N815


@pytest.fixture
def catcher() -> Any:
    Catch.got, Catch.fail_first = [], 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Catch)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", Catch
    srv.shutdown()


def test_webhook_on_holds_with_retries(make_sim, history: History, catcher: Any) -> None:
    url, got = catcher
    got.fail_first = 1
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"remap_failure": [3]}})
    run_sweep(sim, history, replace(TEST_CONFIG, webhook_url=url + "/hook"))
    posts = [b for m, p, b in got.got if p == "/hook"]
    assert len(posts) == 2, "one failure, then delivered"
    doc = json.loads(posts[-1])
    assert "gpu-01 replace" in doc["text"] and doc["blocks"][0]["type"] == "header"
    note = next(history.db.query("select detail from actions where action = 'notify'"))["detail"]
    assert note == "delivered on attempt 2"


def test_sweep_pushes_to_a_pushgateway(make_sim, tmp_path, catcher: Any) -> None:
    from click.testing import CliRunner

    from sweeper.cli import main

    url, got = catcher
    sim: Sim = make_sim(nodes=2)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"pushgateway_url: {url}\nmax_percent: 100\npoll_interval: 0.05\n")
    res = CliRunner().invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--config", str(cfg),
                                    "--state", str(tmp_path / "h.db"), "--json"])
    assert res.exit_code == 0, res.output
    pushes = [(m, p, b) for m, p, b in got.got if p.startswith("/metrics/job/sweeper")]
    assert len(pushes) == 1 and pushes[0][0] == "PUT"
    assert b"sweeper_node_last_sweep_timestamp_seconds" in pushes[0][2]


def test_a_reboot_then_a_recheck_when_the_node_is_back(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=1, faults={"gpu-00": {"xids": [{"code": 79, "gpu": 2}]}})
    # Without the gate (gate_taint ""), the node is re-checked with the fleet's playbook; with it, it is
    # soaked first (tests/cluster/test_gate.py).
    cfg = replace(TEST_CONFIG, remediate_reboots=True, gate_taint="")
    # The node is down for 300 simulated seconds (half a real second at this speed), which a busy
    # machine could let pass before the next sweep looks. So simulated time stops the moment the
    # reboot Job is created, and from then on moves only when the test steps it.
    clock = sim.cluster.clock

    def freeze_at_the_reboot_job(stage: str, method: str, path: str) -> None:
        if method != "POST" or not path.endswith("/jobs"):
            return
        if stage == "before":
            clock.freeze()  # no simulated time passes while a Job is being created...
            return
        with sim.cluster.store.lock:
            containers = [c["name"] for j in sim.cluster.store.iter("jobs")
                          for c in j["spec"]["template"]["spec"]["containers"]]
        if "reboot" not in containers:  # job-templates/reboot.yaml.j2 names its container so
            clock.thaw()  # ...and it runs on after a check Job, but not after the reboot Job

    sim.server.hooks.append(freeze_at_the_reboot_job)
    first = run_sweep(sim, history, cfg)
    sim.server.hooks.clear()
    assert {o.node: o.verdict for o in first.outcomes}["gpu-00"] == "reboot"
    remedy = next(d for e, d in first.events if e == "remedy")  # the Job is followed until it starts
    assert remedy["action"] == "reboot-started" and "the reboot began (its container ran)" in remedy["detail"]
    ann = sim.core.read_node("gpu-00").metadata.annotations
    assert ann["sweeper.dev/remediation"] == "reboot" and ann["sweeper.dev/recheck"] == "true"
    old_boot = ann["sweeper.dev/boot-id"]
    assert clock.now() == clock.now(), "simulated time stopped at the reboot Job"

    def rebooted() -> bool:
        if sim.core.read_node("gpu-00").status.node_info.boot_id != old_boot:
            return True
        clock.advance(5)  # the reboot Job runs to its end in steps far shorter than the downtime
        return False

    sim.wait_for(rebooted, what="the reboot")
    assert not NodeView.from_obj(sim.kube.get_node("gpu-00")).ready
    early = run_sweep(sim, history, cfg)
    assert early.outcomes == [] and any(d.node.name == "gpu-00" and "Ready" in d.detail for d in early.plan.skip)
    clock.advance(600)
    sim.wait_for(lambda: NodeView.from_obj(sim.kube.get_node("gpu-00")).ready, what="Ready again")
    clock.thaw()
    again = run_sweep(sim, history, cfg)
    assert [(d.node.name, d.reason) for d in again.plan.take] == [("gpu-00", "recheck")]
    plan = next(d for e, d in again.events if e == "plan")  # the progress line says it is a re-check
    assert plan["take"] == ["gpu-00"] and plan["recheck"] == ["gpu-00"]
    assert {o.node: (o.verdict, o.action) for o in again.outcomes} == {"gpu-00": ("pass", "released")}
    node = sim.core.read_node("gpu-00")
    assert not node.spec.taints and "sweeper.dev/remediation" not in (node.metadata.annotations or {})


def test_a_pending_remap_is_reset_not_rebooted(make_sim, history: History) -> None:
    assert resettable(["row_remap|REMAP_PENDING"]) and not resettable(["row_remap|REMAP_PENDING", "xid|79"])
    sim: Sim = make_sim(nodes=2, faults={"gpu-00": {"remap_pending": [5]}})
    cfg = replace(TEST_CONFIG, remediate_reboots=True)
    run_sweep(sim, history, cfg)
    ann = sim.core.read_node("gpu-00").metadata.annotations
    assert ann["sweeper.dev/remediation"] == "gpu-reset"
    detail = next(history.db.query("select detail from actions where action = 'remediate-gpu-reset'"))["detail"]
    assert "GPU(s) 5 reset" in detail
    again = run_sweep(sim, history, cfg)
    assert {o.node: (o.verdict, o.action) for o in again.outcomes} == {"gpu-00": ("pass", "released")}


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Nothing anywhere in boto3's credential chain
    (https://boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html): no AWS_* variables,
    no shared files, and the instance metadata service switched off so the test never waits for it."""
    import os

    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_a_missing_aws_credential_stops_the_sweep_before_it_takes_a_node(make_sim, tmp_path: Any,
                                                                         no_aws_credentials: None) -> None:
    """`remediation` names asg and boto3 finds no credentials: exit 3 with one line naming what is
    missing, before the lock or any node is touched; not a node held later for a failed replacement."""
    from click.testing import CliRunner

    from sweeper.cli import main

    sim: Sim = make_sim(nodes=3, faults={"gpu-01": {"remap_failure": [1]}})
    cfg = tmp_path / "config.yaml"
    cfg.write_text("max_nodes: 3\nmax_percent: 100\nremediation: {default: manual, by_pool: {gpu: asg}}\n")
    before = len(sim.cluster.store.requests)
    res = CliRunner().invoke(main, ["sweep", "--config", str(cfg), "--kubeconfig", str(sim.kubeconfig),
                                    "--state", str(tmp_path / "h.db")])
    assert res.exit_code == 3, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "asg" in line and "no AWS credentials" in line and "IRSA" in line and "Pod Identity" in line
    assert "autoscaling:SetInstanceHealth" in line
    assert [r for r in sim.cluster.store.requests[before:] if r[0] != "GET"] == [], "nothing written, no lock taken"
    taints = [t for n in sim.core.list_node().items for t in n.spec.taints or []]
    assert taints == []


def test_serve_checks_the_aws_credential_at_start_up(no_aws_credentials: None) -> None:
    from sweeper.aws import AwsError
    from sweeper.serve import Server

    cfg = replace(TEST_CONFIG, remediation={"default": "asg", "by_pool": {}, "by_profile": {}},
                  schedules=({"name": "light", "cron": "*/30 * * * *"},))
    with pytest.raises(AwsError, match="no AWS credentials"):
        Server(cfg, kube=None, history=None, port=0)


def test_an_irsa_role_is_a_credential_without_a_call(no_aws_credentials: None, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Any) -> None:
    """IRSA puts a web identity token file and a role ARN in the pod's environment
    (https://docs.aws.amazon.com/eks/latest/userguide/iam-roles-for-service-accounts.html); boto3
    exchanges the token when the credentials are first used, so the check at start asks nothing."""
    from sweeper.remedy import preflight

    token = tmp_path / "token"
    token.write_text("eyJ.token.sig")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/sweeper")
    preflight(replace(TEST_CONFIG, remediation={"default": "asg", "by_pool": {}, "by_profile": {}}))
    preflight(TEST_CONFIG)  # manual only: no AWS at all


def operator_fleet(faults: dict[str, Any]) -> dict[str, Any]:
    spec = fleet_spec(nodes=2, faults=faults)
    spec["node_groups"][0]["operands"] = True
    return spec


def deploy_labels(sim: Sim, node: str) -> dict[str, str]:
    labels = sim.core.read_node(node).metadata.labels or {}
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")}


def test_a_gpu_reset_pauses_the_gpu_operators_operands_and_restores_them(make_sim, history: History) -> None:
    """`nvidia-smi --gpu-reset` refuses a GPU another process holds, and the GPU Operator's device
    plugin, GFD, DCGM and dcgm-exporter hold them all (https://docs.nvidia.com/deploy/nvidia-smi/,
    -r). The operator removes an operand from a node whose nvidia.com/gpu.deploy.<operand> label is
    "false", as NVIDIA's MIG manager does around a reconfiguration
    (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html)."""
    sim: Sim = make_sim(operator_fleet({"gpu-00": {"remap_pending": [5]}}))
    # Older GPU Operator releases set no deploy label: the operand runs all the same.
    sim.kube.patch_node("gpu-00", [{"op": "remove", "path": "/metadata/labels/nvidia.com~1gpu.deploy.gpu-feature-discovery"}])
    before = deploy_labels(sim, "gpu-00")
    assert set(before.values()) == {"true"} and len(before) == 3
    sim.wait_for(lambda: len(sim.cluster.operand_pods("gpu-00")) == 4, what="the four operands")
    cfg = replace(TEST_CONFIG, remediate_reboots=True)
    run_sweep(sim, history, cfg)
    ann = sim.core.read_node("gpu-00").metadata.annotations
    # The simulated nvidia-smi resets only GPUs no operand holds: the reset taking is the proof.
    assert ann["sweeper.dev/remediation"] == "gpu-reset", "the reset took: no reboot"
    detail = next(history.db.query("select detail from actions where action = 'remediate-gpu-reset'"))["detail"]
    assert "GPU(s) 5 reset" in detail and "after pausing dcgm, dcgm-exporter, device-plugin, gpu-feature-discovery" \
        in detail
    assert deploy_labels(sim, "gpu-00") == before, "and their labels put back as they were"
    sim.wait_for(lambda: len(sim.cluster.operand_pods("gpu-00")) == 4, what="the operands back on the node")
    assert sim.cluster.specs["gpu-00"].faults.remap_pending == []


def test_a_reset_while_the_operands_run_fails_as_the_real_one_does(make_sim) -> None:
    """The simulator's nvidia-smi refuses a reset while an operand pod runs on the node."""
    sim: Sim = make_sim(operator_fleet({"gpu-00": {"remap_pending": [5]}}))
    code, _out, err = sim.cluster._gpu_reset("gpu-00", ["nvidia-smi", "--gpu-reset", "-i", "5"])
    assert code != 0 and "is currently in use by another process" in err
    assert sim.cluster.specs["gpu-00"].faults.remap_pending == [5]
    sim.kube.patch_node("gpu-00", [{"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.deploy.dcgm-exporter",
                                    "value": "false"}])
    sim.wait_for(lambda: len(sim.cluster.operand_pods("gpu-00")) == 3, what="dcgm-exporter gone")
    code, _out, err = sim.cluster._gpu_reset("gpu-00", ["nvidia-smi", "--gpu-reset", "-i", "5"])
    assert code != 0, "three operands still hold the GPUs"


def test_the_operands_labels_come_back_when_the_reset_fails(make_sim, history: History) -> None:
    """A lost GPU cannot be reset: the node is rebooted instead, and the operands' labels are still
    put back as they were (a person's "false" on one of them stays "false")."""
    sim: Sim = make_sim(operator_fleet({"gpu-00": {"gpu_lost": [2], "remap_pending": [2]}}))
    sim.kube.patch_node("gpu-00", [{"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.deploy.dcgm",
                                    "value": "false"}])
    before = deploy_labels(sim, "gpu-00")
    remediator = Remediator(sim.kube, replace(TEST_CONFIG, remediate_reboots=True), sim.cluster.clock)
    view = NodeView.from_obj(sim.kube.get_node("gpu-00"))
    from sweeper.runner import node_vars
    remedy = remediator.gpu_reset("run-1", view, node_vars(view, TEST_CONFIG), [2])
    assert (remedy.provider, remedy.action) == ("reboot", "reboot-started"), remedy  # the followed reboot began
    assert deploy_labels(sim, "gpu-00") == before and before["nvidia.com/gpu.deploy.dcgm"] == "false"


def test_no_gpu_reset_while_fabric_manager_is_down(make_sim, history: History) -> None:
    """On an NVSwitch system a reset GPU must be registered with the fabric again by Fabric Manager
    (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/): with Fabric Manager down,
    a pending remap is not reset alone; the node is rebooted, which restarts Fabric Manager."""
    sim: Sim = make_sim(operator_fleet({"gpu-00": {"remap_pending": [5], "fabric_manager_down": True}}))
    report = run_sweep(sim, history, replace(TEST_CONFIG, remediate_reboots=True))
    reasons = next(o.reasons for o in report.outcomes if o.node == "gpu-00")
    assert any("FABRIC_NOT_READY" in r or "Fabric Manager" in r for r in reasons), reasons
    assert sim.core.read_node("gpu-00").metadata.annotations["sweeper.dev/remediation"] == "reboot"


# -- a GPU reset that can run ----------------------------------------------------------------------

def test_a_paused_device_plugin_leaves_no_gpu_allocatable(make_sim) -> None:
    """When a device plugin's endpoint stops, the kubelet marks every device of its resource
    unhealthy: allocatable drops to 0 while capacity stays (kubernetes/kubernetes,
    pkg/kubelet/cm/devicemanager/manager.go, runEndpoint and markResourceUnhealthy). While the GPU
    Operator's device plugin is paused (nvidia.com/gpu.deploy.device-plugin=false) a pod that
    requests a GPU fits nowhere on the node: the scheduler leaves it Pending, and the kubelet
    refuses one bound by nodeName."""
    from kubernetes import client

    sim: Sim = make_sim(operator_fleet({}))
    sim.kube.patch_node("gpu-00", [{"op": "add", "path": "/metadata/labels/nvidia.com~1gpu.deploy.device-plugin",
                                    "value": "false"}])
    sim.wait_for(lambda: sim.core.read_node("gpu-00").status.allocatable["nvidia.com/gpu"] == "0", what="paused")
    assert sim.core.read_node("gpu-00").status.capacity["nvidia.com/gpu"] == "8"
    assert sim.cluster.plugin_paused("gpu-00")
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="bound"), spec=client.V1PodSpec(
        restart_policy="Never", node_name="gpu-00", containers=[client.V1Container(
            name="c", image="busybox", command=["true"],
            resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}))]))
    sim.core.create_namespaced_pod("default", pod)
    got = sim.wait_for(lambda: (p := sim.core.read_namespaced_pod("bound", "default")).status.phase == "Failed" and p,
                       what="refused")
    assert got.status.reason == "UnexpectedAdmissionError"
    sim.kube.patch_node("gpu-00", [{"op": "replace", "path": "/metadata/labels/nvidia.com~1gpu.deploy.device-plugin",
                                    "value": "true"}])
    sim.wait_for(lambda: sim.core.read_node("gpu-00").status.allocatable["nvidia.com/gpu"] == "8", what="back")


def test_the_reset_job_is_bound_by_node_name_requests_no_gpu_and_turns_persistence_off_first(make_sim) -> None:
    """The shipped reset Job: nodeName (the scheduler has no GPU to give it while the plugin is
    paused), no GPU request, NVIDIA's runtime for nvidia-smi, and `nvidia-smi -pm 0` before
    `nvidia-smi -r`: nvidia-persistenced holds a GPU in persistence mode and the reset refuses it
    (NVIDIA/gpu-operator#118; NVIDIA/NVSentinel#1690, where `-pm 0` then `-r` succeeds)."""
    from sweeper.actions.jobs import render_job
    from sweeper.remedy import Remediator
    from sweeper.runner import node_vars

    sim: Sim = make_sim(nodes=2)
    view = NodeView.from_obj(sim.kube.get_node("gpu-00"))
    r = Remediator(sim.kube, TEST_CONFIG, sim.cluster.clock)
    job = render_job(r._context("run-1", node_vars(view, TEST_CONFIG)), TEST_CONFIG.gpu_reset_template, 600,
                     {"gpu_ids": "2,5"}, remediation=True, bound=True)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == "gpu-00" and "affinity" not in pod
    (c,) = pod["containers"]
    assert not [k for part in c["resources"].values() for k in part if "gpu" in k]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPU_IDS"] == "2,5" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
    script = c["command"][-1]
    assert script.index("-pm 0") < script.index("nvidia-smi -r") < script.index("-pm 1")
    # The simulated nvidia-smi refuses a reset of a GPU still in persistence mode, as the real one does.
    code, _out, err = sim.cluster._gpu_reset("gpu-01", ["nvidia-smi", "-r", "-i", "2"])
    assert code == 255 and "In use by another client" in err
    code, out, _err = sim.cluster._gpu_reset("gpu-01", ["sh", "-c", c["command"][-1]], env)
    assert code == 0 and out.count("was successfully reset.") == 2


def test_a_reset_that_does_not_say_it_reset_is_not_taken_for_one(make_sim, tmp_path) -> None:
    """An exit status of 0 is no proof: the reset is confirmed from nvidia-smi's own line, "GPU
    <bus id> was successfully reset.", one per GPU (the line NVIDIA/NVSentinel#1690 shows); without
    them the node is rebooted instead."""
    import re
    import shutil

    from sweeper.remedy import Remediator
    from sweeper.runner import node_vars

    sim: Sim = make_sim(nodes=2, faults={"gpu-00": {"remap_pending": [5]}})
    tdir = tmp_path / "templates"
    shutil.copytree(TEST_CONFIG.path("job-templates"), tdir)
    text = (tdir / "gpu-reset.yaml.j2").read_text()
    # A command that exits 0 without nvidia-smi's word that any GPU was reset.
    text = re.sub(r"(?s)          command:.*?(?=          env:)", '          command: ["echo", "All done."]\n', text)
    # An author's copy is never privileged (only the shipped reset is: sweeper.actions.safety).
    text = re.sub(r"(?s)          securityContext:\n.*?(?=\n\S|\n {0,10}\S|\Z)",
                  "          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}", text)
    (tdir / "gpu-reset.yaml.j2").write_text(text)
    (tdir / "reboot.yaml.j2").unlink()  # the reboot it falls back to is the shipped one
    cfg = replace(TEST_CONFIG, remediate_reboots=True, template_dir=str(tdir))
    logs: list[str] = []
    view = NodeView.from_obj(sim.kube.get_node("gpu-00"))
    remedy = Remediator(sim.kube, cfg, sim.cluster.clock, log=logs.append).gpu_reset(
        "run-1", view, node_vars(view, cfg), [5])
    assert remedy.provider == "reboot", remedy
    assert any("unconfirmed" in m for m in logs), logs
