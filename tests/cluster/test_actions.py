"""Node actions through `sweeper run`, against the simulated cluster."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from kubernetes import client

from sweeper.actions.docs import markdown
from sweeper.cli import main
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parent.parent.parent


def run(sim: Sim, tmp_path: Path, text: str, *extra: str) -> tuple[int, dict]:
    pb = tmp_path / "play.yaml"
    pb.write_text(text)
    res = CliRunner().invoke(main, ["run", str(pb), "--kubeconfig", str(sim.kubeconfig), "--state",
                                    str(tmp_path / "h.db"), "--json", *extra])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


NODE_PLAY = """
name: node actions
tasks:
  - taint: {key: example.com/maint, value: "yes", effect: NoSchedule}
  - name: again is no change
    taint: {key: example.com/maint, value: "yes"}
  - cordon: {}
  - label: {set: {team: gpu-infra, "sweeper.dev/status": checked}}
  - annotate: {set: {note: "{{ node.labels['kubernetes.io/hostname'] }}"}}
  - event: {reason: SweeperTest, message: "hello from {{ run_id }}", type: Warning}
  - record: {name: probe.latency, value: 4.5, unit: ms}
  - verify_idle: {}
"""


def test_node_actions(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=1)
    code, out = run(sim, tmp_path, NODE_PLAY, "--node", "gpu-00", "--no-hand-back")
    assert code == 0, out
    statuses = [t["status"] for t in out["tasks"]]
    assert statuses == ["changed", "ok", "changed", "changed", "changed", "changed", "changed", "ok"]
    node = sim.core.read_node("gpu-00")
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [("example.com/maint", "yes", "NoSchedule")]
    assert node.spec.unschedulable is True
    assert node.metadata.labels["team"] == "gpu-infra"
    assert node.metadata.annotations["note"] == "gpu-00"
    events = sim.core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-00").items
    assert [(e.reason, e.type) for e in events] == [("SweeperTest", "Warning")]
    undo = """
name: undo
tasks:
  - untaint: {key: example.com/maint}
  - uncordon: {}
  - label: {remove: [team]}
"""
    code, out = run(sim, tmp_path, undo, "--node", "gpu-00")
    assert code == 0 and [t["status"] for t in out["tasks"]] == ["changed", "changed", "changed"]
    node = sim.core.read_node("gpu-00")
    assert not node.spec.taints and not node.spec.unschedulable and "team" not in node.metadata.labels


def test_uncordon_leaves_a_human_cordon_alone(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=1)
    sim.core.patch_node("gpu-00", {"spec": {"unschedulable": True}})
    code, out = run(sim, tmp_path, "name: u\ntasks:\n  - uncordon: {}\n", "--node", "gpu-00")
    assert code == 0 and out["tasks"][0]["status"] == "ok"
    assert sim.core.read_node("gpu-00").spec.unschedulable is True


def test_verify_idle_fails_on_a_busy_node(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=1, workloads=[{"node": "gpu-00", "gpus": 8, "duration": None}])
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="training pod")
    code, out = run(sim, tmp_path, "name: v\ntasks:\n  - verify_idle: {}\n", "--node", "gpu-00")
    assert code == 1 and "GPU pod(s) on the node" in out["tasks"][0]["msg"]


def _pod(name: str, labels: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, namespace="training", labels=labels),
                        spec=client.V1PodSpec(node_name="gpu-00", containers=[
                            client.V1Container(name="c", image="i", command=["sleep", "inf"])]))


def test_drain_honours_pod_disruption_budgets_and_deadlines(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=1)
    for i in range(2):
        sim.core.create_namespaced_pod("training", _pod(f"web-{i}", {"app": "web"}))
    sim.core.create_namespaced_pod("training", _pod("loner", {"app": "solo"}))
    ds = _pod("agent", {"app": "agent"})
    ds.metadata.owner_references = [client.V1OwnerReference(api_version="apps/v1", kind="DaemonSet", name="agent",
                                                            uid="u1")]
    sim.core.create_namespaced_pod("training", ds)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "web", "namespace": "training"},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}
    client.PolicyV1Api(sim.api_client).create_namespaced_pod_disruption_budget("training", pdb)
    sim.wait_for(lambda: all(p.status.phase == "Running" for p in sim.core.list_namespaced_pod("training").items),
                 what="pods running")
    # `sweeper run` keeps the wall clock (its process could be far from the simulator), so the drain's
    # deadline and rounds are real seconds: short ones, the same story (the budget holds to the end).
    code, out = run(sim, tmp_path, "name: d\ntasks:\n  - drain: {timeout: 6s, delay: 1s}\n    register: d\n",
                    "--node", "gpu-00")
    assert code == 1
    msg = out["tasks"][0]["msg"]
    assert "deadline" in msg and "training/web-0" in msg
    left = sorted(p.metadata.name for p in sim.core.list_namespaced_pod("training").items)
    assert left == ["agent", "web-0", "web-1"], "the PDB held, the DaemonSet pod stayed, the rest went"
    # Relax the budget: the drain finishes.
    client.PolicyV1Api(sim.api_client).delete_namespaced_pod_disruption_budget("web", "training")
    code, out = run(sim, tmp_path, "name: d\ntasks:\n  - drain: {timeout: 30s, delay: 1s}\n", "--node", "gpu-00")
    assert code == 0, out
    assert [p.metadata.name for p in sim.core.list_namespaced_pod("training").items] == ["agent"]


def test_hostile_label_values_never_run_as_templates(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=1)
    sim.core.patch_node("gpu-00", {"metadata": {"labels": {"team": "x"},
                                                "annotations": {"evil": "{{ lookup('pipe','id') }}{% for i in range(99999999) %}{% endfor %}"}}})
    play = """
name: hostile
tasks:
  - set_fact: {copied: "{{ node.annotations.evil }}"}
  - annotate: {set: {copy: "{{ copied }}"}}
  - assert:
      that: copied.startswith('{{')
"""
    code, out = run(sim, tmp_path, play, "--node", "gpu-00")
    assert code == 0, out
    assert sim.core.read_node("gpu-00").metadata.annotations["copy"].startswith("{{ lookup('pipe','id') }}")


def test_pure_playbook_runs_without_a_node(tmp_path: Path) -> None:
    pb = tmp_path / "p.yaml"
    pb.write_text("name: p\ntasks:\n  - debug: {msg: '{{ greeting }} {{ n + 1 }}'}\n    register: r\n"
                  "  - assert: {that: r.msg == 'hi 3'}\n")
    res = CliRunner().invoke(main, ["run", str(pb), "-e", "greeting=hi", "-e", "n=2"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["run", str(pb), "-e", "greeting=hi", "-e", "n=5"])
    assert res.exit_code == 1
    res = CliRunner().invoke(main, ["run", str(pb)])
    assert res.exit_code == 2 and "undefined" in res.stderr
    node_pb = tmp_path / "n.yaml"
    node_pb.write_text("name: n\ntasks:\n  - cordon: {}\n")
    res = CliRunner().invoke(main, ["run", str(node_pb)])
    assert res.exit_code == 2 and "needs a target node" in res.stderr


def test_actions_doc_is_generated_from_the_registry() -> None:
    assert (ROOT / "docs" / "actions.md").read_text() == markdown(), \
        "docs/actions.md is stale: python -m sweeper.actions.docs > docs/actions.md"
