"""The shipped playbooks against the simulated cluster: DCGM and NCCL output from the fault
model, read by the real parsers, decided by the policy, the node handed back by `always`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, run_sweep

TAINT = TEST_CONFIG.taint_key


def test_dcgm_sweep_finds_what_dcgm_finds(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=5, faults={"gpu-01": {"pcie_replay": [1]}, "gpu-02": {"remap_failure": [4]},
                                         "gpu-03": {"nvlink_down": [6]}, "gpu-04": {"dcgm_runtime_error": True}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, playbook="sweep-dcgm.yaml"))
    got = {o.node: (o.verdict, o.action) for o in report.outcomes}
    assert got == {"gpu-00": ("pass", "released"), "gpu-01": ("quarantine", "held"),
                   "gpu-02": ("replace", "held"), "gpu-03": ("reboot", "held"),
                   "gpu-04": ("error", "released")}
    reasons = {o.node: " ".join(o.reasons) for o in report.outcomes}
    assert "PCIe replays" in reasons["gpu-01"] and "NvLink link 3 is currently down" in reasons["gpu-03"]
    assert "already running" in reasons["gpu-04"]
    for node in ("gpu-00", "gpu-04"):
        assert not sim.core.read_node(node).spec.taints
    checks = {r["name"] for r in history.db.query("select distinct name from checks where node = 'gpu-00'")}
    assert {"dcgm.software", "dcgm.pcie", "dcgm.memory", "gpu.count", "xid"} <= checks
    assert sim.batch.list_namespaced_job("sweeper").items == []


def test_deep_quarantine_flags_low_nccl_bandwidth(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"low_bandwidth": 0.8}})
    runner = CliRunner()
    out = {}
    for node in ("gpu-00", "gpu-01"):
        res = runner.invoke(main, ["run", "quarantine-deep.yaml", "--node", node, "--kubeconfig", str(sim.kubeconfig),
                                   "--state", str(tmp_path / "h.db"), "--json", "-e", "dcgm_level=3"])
        assert res.exit_code == 0, res.output
        out[node] = json.loads(res.stdout)
    verdicts = {n: next(t for t in o["tasks"] if t["task"] == "verdict")["msg"] for n, o in out.items()}
    assert verdicts["gpu-00"].startswith("verdict pass")
    assert verdicts["gpu-01"].startswith("verdict quarantine") and "floor 460" in verdicts["gpu-01"]
    assert TAINT in [t.key for t in sim.core.read_node("gpu-01").spec.taints]
    assert not sim.core.read_node("gpu-00").spec.taints
    h = History(tmp_path / "h.db")
    bw = {n: h.node_history(n)["metrics"]["nccl.busbw_largest"][-1][1] for n in ("gpu-00", "gpu-01")}
    assert bw["gpu-00"] > 460 > bw["gpu-01"]
    dcgm_tests = {r["name"] for r in h.db.query("select distinct name from checks where node = 'gpu-00'")}
    assert {"dcgm.diagnostic", "dcgm.targeted_stress", "dcgm.memory_bandwidth"} <= dcgm_tests, "level 3 ran"
    h.close()
