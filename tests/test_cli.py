"""The CLI in-process (click's CliRunner) against the simulated cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from sweeper.cli import main
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parent.parent


def write_config(tmp_path: Path, **over: object) -> Path:
    cfg = {"max_nodes": 4, "max_percent": 100, "poll_interval": 0.02, "check_timeout": 120, **over}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_command_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, cmd in main.commands.items():
        assert f"sweeper {name}" in readme, f"`sweeper {name}` is not in the README"
        assert cmd.help, f"`sweeper {name}` has no help text"


def test_sweep_then_history_and_plan(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=3, faults={"gpu-01": {"missing_gpus": 2}})
    runner = CliRunner()
    cfg = write_config(tmp_path)
    state = tmp_path / "h.db"
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(state), "--config", str(cfg)]
    res = runner.invoke(main, ["sweep", *base, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    verdicts = {n["node"]: (n["verdict"], n["action"]) for n in report["nodes"]}
    assert verdicts == {"gpu-00": ("pass", "released"), "gpu-01": ("reboot", "held"), "gpu-02": ("pass", "released")}
    res = runner.invoke(main, ["history", "gpu-01", "--state", str(state), "--json"])
    assert res.exit_code == 0, res.output
    h = json.loads(res.stdout)
    assert h["sweeps"][0]["verdict"] == "reboot" and "6 GPUs visible" in h["sweeps"][0]["reasons"][0]
    res = runner.invoke(main, ["history", "gpu-01", "--state", str(state)])
    assert "reboot" in res.stdout and "findings" in res.stdout
    res = runner.invoke(main, ["plan", *base, "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert {n["node"]: n["reason"] for n in plan["nodes"]} == {"gpu-00": "not-due", "gpu-01": "held",
                                                               "gpu-02": "not-due"}


def test_exit_codes(make_sim, tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_nodez: 3\n")
    res = runner.invoke(main, ["sweep", "--config", str(bad), "--state", str(tmp_path / "h.db")])
    assert res.exit_code == 2 and "max_nodez" in res.stderr
    kc = tmp_path / "kc"
    kc.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "x",
                                  "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
                                  "users": [{"name": "x", "user": {}}],
                                  "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    res = runner.invoke(main, ["sweep", "--kubeconfig", str(kc), "--state", str(tmp_path / "h.db"),
                               "--config", str(write_config(tmp_path, api_attempts=1))])
    assert res.exit_code == 3 and "connection failed" in res.stderr
    res = runner.invoke(main, ["history", "gpu-00", "--state", str(tmp_path / "missing.db")])
    assert res.exit_code == 2
    res = runner.invoke(main, ["history", "gpu-00", "--state", str(tmp_path / "h.db"), "--since", "soon"])
    assert res.exit_code == 2 and "--since" in res.stderr


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["demo", "--state", str(tmp_path / "demo.db")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "cycle 5 of 5" in out and "the fleet" in out
    assert re.search(r"gpu-p5-04: reboot -> held", out), "the XID 79 node is held for a reboot"
    assert "gpu-p5-04: reboot: reboot-started" in out and re.search(r"gpu-p5-04: pass -> released", out), \
        "rebooted, checked again, handed back"
    assert "gpu-p5-14: gpu-reset: gpus-reset" in out, "a pending remap is a GPU reset"
    assert "gpu-p5-09: karpenter: nodeclaim-deleted" in out, "the missing GPU survives a reboot: replaced"
    assert re.search(r"gpu-p5-13 .*held .*quarantine", out), "the hung check waits for a person"
    assert "sweeper history" in out and (tmp_path / "report.html").exists()
