"""GPUs the device plugin holds back are a symptom, not a cause (issue 21, point 2).

NVIDIA's device plugin marks a GPU unhealthy on any XID but the six application errors it skips
(13, 31, 43, 45, 68, 109; DP_DISABLE_HEALTHCHECKS adds more): github.com/NVIDIA/k8s-device-plugin,
internal/rm/health.go, getDisabledHealthCheckXids. It never takes the mark back: its ListAndWatch
sets the device Unhealthy with "FIXME: there is no way to recover from the Unhealthy state"
(internal/plugin/server.go), so only a new plugin process sees the GPU healthy again. Before, the
sweep turned "allocatable 7 of 8" into one cause, `gpu.allocatable`, a reboot, and a second one
within 7 days into a replacement, whatever the XID behind it: two contained XID 94s days apart
(an error the application restarts from, by NVIDIA's XID catalogue) deleted a NodeClaim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sweeper.config import home
from sweeper.history import History
from sweeper.policy import decide, load_policy
from sweeper.xid import lookup
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

GPU = "nvidia.com/gpu"
SHIPPED = load_policy(home() / "policies" / "default.yaml")
# Remediation through Karpenter, reboots run: a wrong verdict here would reboot or replace for real.
CFG = replace(TEST_CONFIG, remediation={"default": "manual", "by_pool": {"gpu": "karpenter"}, "by_profile": {}},
              remediate_reboots=True, replacement_wait=1800, light_playbook="", check_timeout=1800)


def fleet(faults: dict[str, Any], **group: Any) -> dict[str, Any]:
    spec = fleet_spec(nodes=2, faults=faults)
    spec["node_groups"][0].update({"labels": {"karpenter.sh/nodepool": "gpu"}, **group})
    return spec


def allocatable(sim: Sim, node: str) -> str:
    return str(sim.core.read_node(node).status.allocatable[GPU])


def plugin_uid(sim: Sim, node: str, namespace: str, selector: str) -> str:
    [pod] = sim.core.list_namespaced_pod(namespace, label_selector=selector,
                                         field_selector=f"spec.nodeName={node}").items
    return str(pod.metadata.uid)


def no_reboot_no_replacement(sim: Sim, history: History) -> None:
    assert sim.cluster.replacements == 0 and sim.cluster.boots == {}, "never rebooted, never replaced"
    assert {c["status"]["nodeName"] for c in sim.kube.list_nodeclaims()} == {"gpu-00", "gpu-01"}
    acts = {a["action"] for a in history.db.query("select action from actions where node = 'gpu-01'")}
    assert not {a for a in acts if a.startswith("remediate")}, acts


def test_two_contained_xid_94s_on_different_gpus_days_apart_replace_nothing(make_sim, history: History) -> None:
    """The issue's reproduction, over four sweep cycles: XID 94 on GPU 1, then two days later on
    GPU 5. Each time the plugin holds the GPU back, Sweeper reads the XID itself (contained, the
    application's to restart), restarts the plugin, sees allocatable whole again, and hands the
    node back. Before: a reboot, then a NodeClaim deleted."""
    assert lookup(94).action in ("ignore", "restart_app")
    sim: Sim = make_sim(fleet({"gpu-01": {"xids": [{"code": 94, "gpu": 1, "at": "1h"},
                                                   {"code": 94, "gpu": 5, "at": "2d"}]}},
                              device_plugin_pod=True))
    clock, selector = sim.cluster.clock, "app.kubernetes.io/name=nvidia-device-plugin"
    verdicts: list[str] = []
    restarts = 0
    for day in range(4):
        clock.advance(2 * 3600 if day == 0 else 86400)
        if day in (0, 2):  # the day of each XID 94
            sim.wait_for(lambda: allocatable(sim, "gpu-01") == "7", what="the plugin to hold a GPU back")
        before = plugin_uid(sim, "gpu-01", "kube-system", selector)
        report = run_sweep(sim, history, replace(CFG, interval=86400 if day else 3600))
        outcome = {o.node: o for o in report.outcomes}.get("gpu-01")
        if outcome is None:
            continue
        verdicts.append(outcome.verdict)
        assert outcome.action == "released", outcome
        restarted = plugin_uid(sim, "gpu-01", "kube-system", selector) != before
        restarts += restarted
        assert restarted == (day in (0, 2)), (day, outcome)
        assert allocatable(sim, "gpu-01") == "8"
    assert restarts == 2 and set(verdicts) <= {"pass", "warn"}, verdicts
    no_reboot_no_replacement(sim, history)
    notes = [r["message"] for r in history.db.query(
        "select message from checks where node = 'gpu-01' and name = 'gpu.allocatable' order by id")]
    assert len(notes) == 2 and all("restarted: allocatable 8 of 8 nvidia.com/gpu again" in m for m in notes), notes
    assert f"XID 94 ({lookup(94).meaning}, restart_app) on GPU 1" in notes[0]
    assert "on GPU 5" in notes[1]


def test_an_application_xid_restarts_the_gpu_operators_plugin_and_the_node_passes(make_sim,
                                                                                   history: History) -> None:
    """On a GPU Operator node the plugin is the operator's DaemonSet pod (app=nvidia-device-plugin-daemonset,
    namespace gpu-operator): deleted, the operator starts a new one, allocatable is whole, and the
    node's later sweeps pass without a reboot."""
    sim: Sim = make_sim(fleet({"gpu-01": {"xids": [{"code": 94, "gpu": 3, "at": "1h"}]}}, operands=True))
    clock, selector = sim.cluster.clock, "app=nvidia-device-plugin-daemonset"
    clock.advance(2 * 3600)
    sim.wait_for(lambda: allocatable(sim, "gpu-01") == "7", what="the plugin to hold GPU 3 back")
    before = plugin_uid(sim, "gpu-01", "gpu-operator", selector)
    first = {o.node: o for o in run_sweep(sim, history, CFG).outcomes}["gpu-01"]
    assert (first.verdict, first.action) in {("warn", "released"), ("pass", "released")}, first
    assert plugin_uid(sim, "gpu-01", "gpu-operator", selector) != before
    assert allocatable(sim, "gpu-01") == "8"
    for _ in range(2):  # later cycles: nothing held back, nothing restarted, handed back each time
        clock.advance(86400)
        uid = plugin_uid(sim, "gpu-01", "gpu-operator", selector)
        later = {o.node: o for o in run_sweep(sim, history, CFG).outcomes}["gpu-01"]
        assert later.action == "released" and later.verdict in ("pass", "warn"), later
        assert plugin_uid(sim, "gpu-01", "gpu-operator", selector) == uid
    no_reboot_no_replacement(sim, history)


def test_a_critical_xid_holds_the_node_for_the_xid_and_leaves_the_plugin_alone(make_sim,
                                                                                history: History) -> None:
    """XID 79 (fallen off the bus): Sweeper's own reading is the cause; the plugin's mark is its
    symptom, recorded as such, and the ladder counts xid|79 only."""
    sim: Sim = make_sim(fleet({"gpu-01": {"xids": [{"code": 79, "gpu": 2}]}}, device_plugin_pod=True))
    before = plugin_uid(sim, "gpu-01", "kube-system", "app.kubernetes.io/name=nvidia-device-plugin")
    o = {o.node: o for o in run_sweep(sim, history, replace(CFG, remediate_reboots=False)).outcomes}["gpu-01"]
    assert (o.verdict, o.action) == ("reboot", "held") and o.reasons[0].startswith("xid (GPU 2): XID 79"), o
    assert plugin_uid(sim, "gpu-01", "kube-system", "app.kubernetes.io/name=nvidia-device-plugin") == before
    row = next(history.db.query("select causes from node_sweeps where node = 'gpu-01'"))
    assert row["causes"] == '["xid|79"]'
    [check] = history.db.query("select status, message from checks where name = 'gpu.allocatable'")
    assert check["status"] == "warn" and "a symptom of Sweeper's own findings (xid 79 on GPU 2)" in check["message"]


def test_the_plugins_mark_alone_never_climbs_a_ladder_or_relapses() -> None:
    """A node held for the plugin's mark a day ago, handed back, and held for it again: before, the
    second reboot for gpu.allocatable within 7 days replaced the node, and the relapse rule too."""
    now = 10 * 86400.0
    mark = {"checks": [{"name": "gpu.allocatable", "status": "fail", "code": "GPU_UNHEALTHY",
                        "message": "1 nvidia.com/gpu unhealthy per the device plugin: allocatable 7 of 8"}]}

    class Past:
        def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
            return [{"started": now - 2 * 86400, "verdict": "reboot", "causes": ["gpu.allocatable|GPU_UNHEALTHY"]},
                    {"started": now - 86400, "verdict": "pass", "causes": []}]

        def series(self, *a: Any) -> list[Any]:
            return []

        def peer_values(self, *a: Any) -> dict[str, float]:
            return {}

        def pair_results(self, *a: Any) -> list[Any]:
            return []

    v = decide([mark], policy=SHIPPED, node="gpu-01", now=now, past=Past())
    assert v.causes == () and not {"second-reboot-same-cause", "fails-again-after-passing"} & set(v.rules), v
    assert v.verdict == "quarantine", v


def test_a_busy_nodes_plugin_is_left_alone_and_the_node_marked_suspect(make_sim, history: History) -> None:
    """A light check reads a busy node: Sweeper does not hold it, so it never restarts the plugin
    under a running job; the node is marked a suspect and swept (and the plugin restarted) once idle."""
    sim: Sim = make_sim(fleet({"gpu-01": {"xids": [{"code": 94, "gpu": 1}]}}, device_plugin_pod=True)
                        | {"workloads": [{"node": "gpu-01", "gpus": 4, "duration": None}]})
    selector = "app.kubernetes.io/name=nvidia-device-plugin"
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="the workload")
    before = plugin_uid(sim, "gpu-01", "kube-system", selector)
    report = run_sweep(sim, history, replace(CFG, light_playbook="light-busy.yaml"))
    light = {o.node: o for o in report.outcomes}["gpu-01"]
    assert light.action == "light" and light.verdict == "quarantine", light
    assert "restarted only on a node Sweeper holds" in "; ".join(light.reasons)
    assert plugin_uid(sim, "gpu-01", "kube-system", selector) == before
    assert sim.core.read_node("gpu-01").metadata.labels.get("sweeper.dev/suspect") == "true"
    assert allocatable(sim, "gpu-01") == "7"
