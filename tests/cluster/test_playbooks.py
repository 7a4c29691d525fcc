"""The shipped playbooks against the simulated cluster: DCGM and NCCL output from the fault
model, read by the real parsers, decided by the policy, the node handed back by `always`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

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
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []


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


def _run(sim: Sim, book: Path, node: str, *extra: str) -> Any:
    return CliRunner().invoke(main, ["run", str(book), "--node", node, "--kubeconfig", str(sim.kubeconfig),
                                     "--state", str(book.parent / "h.db"), *extra])


def _taints(sim: Sim, node: str) -> list[tuple[str, str, str]]:
    return [(t.key, t.value or "", t.effect) for t in sim.core.read_node(node).spec.taints or []]


def test_run_hands_back_its_taint_when_the_play_breaks(make_sim, tmp_path: Path) -> None:
    """A play that takes the node and then hits an undefined variable, with no `always`, exits 2;
    what it tainted and cordoned itself comes off the node. A taint that was there before the
    play (same key and effect, someone else's) is left alone."""
    sim: Sim = make_sim(nodes=2)
    sim.core.patch_node("gpu-01", {"spec": {"taints": [{"key": "ops/hold", "value": "alice", "effect": "NoSchedule"}]}})
    book = tmp_path / "broken.yaml"
    book.write_text("name: broken\ntasks:\n"
                    "  - taint: {key: \"{{ taint_key }}\", value: \"{{ run_id }}\"}\n"
                    "  - taint: {key: ops/hold, value: mine}\n"
                    "  - cordon: {}\n"
                    "  - debug: {msg: \"{{ no_such_variable }}\"}\n")
    for node in ("gpu-00", "gpu-01"):
        res = _run(sim, book, node)
        assert res.exit_code == 2, res.output
        assert "no_such_variable" in res.output and f"handed back {node}" in res.output
        assert not sim.core.read_node(node).spec.unschedulable
    assert _taints(sim, "gpu-00") == []
    assert _taints(sim, "gpu-01") == [("ops/hold", "alice", "NoSchedule")]
    ann = sim.core.read_node("gpu-00").metadata.annotations or {}
    assert f"{TEST_CONFIG.prefix}/cordoned-by" not in ann
    h = History(tmp_path / "h.db")
    sweeps = list(h.db.query("select verdict, reasons from node_sweeps where node = 'gpu-00'"))
    assert sweeps and sweeps[0]["verdict"] == "error" and "no_such_variable" in sweeps[0]["reasons"]
    assert any("removed taint" in a["detail"] for a in h.db.query("select detail from actions where node = 'gpu-00'"))
    h.close()


def test_run_keeps_the_taint_of_a_holding_verdict(make_sim, tmp_path: Path) -> None:
    """A play that ends with a verdict that holds the node (here quarantine) keeps its taint;
    the same play deciding pass gives it back."""
    sim: Sim = make_sim(nodes=2)
    book = tmp_path / "hold.yaml"
    book.write_text("name: hold\ntasks:\n"
                    "  - taint: {key: \"{{ taint_key }}\", value: \"{{ run_id }}\"}\n"
                    "  - set_fact: {verdict: \"{{ outcome }}\"}\n")
    res = _run(sim, book, "gpu-00", "-e", "outcome=quarantine")
    assert res.exit_code == 0, res.output
    assert [k for k, _, _ in _taints(sim, "gpu-00")] == [TAINT]
    res = _run(sim, book, "gpu-01", "-e", "outcome=pass")
    assert res.exit_code == 0, res.output
    assert _taints(sim, "gpu-01") == []


def test_run_hands_back_when_stopped(make_sim, tmp_path: Path) -> None:
    """SIGTERM (here the run's cancel flag, which the CLI's handler sets) stops the play between
    tasks; with no `always` to do it, the run itself takes its taint off."""
    from sweeper.runner import run_playbook

    sim: Sim = make_sim(nodes=1)
    book = tmp_path / "stopped.yaml"
    book.write_text("name: stopped\ntasks:\n"
                    "  - taint: {key: \"{{ taint_key }}\", value: \"{{ run_id }}\"}\n"
                    "  - debug: {msg: never reached}\n")
    seen: list[str] = []
    said: list[str] = []
    result = run_playbook(book, TEST_CONFIG, kube=sim.kube, node_name="gpu-00", clock=sim.cluster.clock,
                          on_task=lambda o: seen.append(o.action), cancelled=lambda: bool(seen), log=said.append)
    assert result.cancelled and seen == ["taint"]
    assert _taints(sim, "gpu-00") == []
    assert any(line.startswith("handed back gpu-00: removed taint " + TAINT) for line in said), said


def test_lint_warns_about_a_node_taken_with_no_hand_back(tmp_path: Path) -> None:
    """A task that taints, cordons or drains with no enclosing `always` that hands the node back
    is a warning at its line (exit 0, or 1 with --strict); inside such a block it is not. The
    shipped playbooks have none."""
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\ntasks:\n"
                    "  - taint: {key: \"{{ taint_key }}\", value: \"{{ run_id }}\"}\n"
                    "  - block:\n"
                    "      - cordon: {}\n"
                    "    always:\n"
                    "      - debug: {msg: not a hand-back}\n")
    guarded = tmp_path / "guarded.yaml"
    guarded.write_text("name: guarded\ntasks:\n"
                       "  - block:\n"
                       "      - block:\n"
                       "          - taint: {key: \"{{ taint_key }}\", value: \"{{ run_id }}\"}\n"
                       "          - drain: {}\n"
                       "    always:\n"
                       "      - hand_back: {}\n")
    runner = CliRunner()
    res = runner.invoke(main, ["lint", str(bare)])
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.stdout.splitlines() if ": warning: " in ln]
    assert [ln.split(": warning: ")[0] for ln in warned] == [f"{bare}:3", f"{bare}:5"]
    assert "taint takes the node" in warned[0] and "cordon takes the node" in warned[1]
    assert runner.invoke(main, ["lint", "--strict", str(bare)]).exit_code == 1
    res = runner.invoke(main, ["lint", "--strict", "--json", str(guarded)])
    assert res.exit_code == 0 and json.loads(res.stdout)["warnings"] == [], res.output
    res = runner.invoke(main, ["lint", "--strict"])
    assert res.exit_code == 0 and "warning" not in res.output, res.output
