"""The CLI in-process (click's CliRunner) against the simulated cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
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
    assert re.search(r"gpu-p5-06: replace -> held\s+\(corrected-ecc-rising", out), \
        "the node whose corrected ECC climbs is replaced on its slope"
    assert "sweeper history" in out and (tmp_path / "report.html").exists()


# -- every escape: its exit code, one line naming the file, nothing changed in the cluster ----------
def cluster_writes(sim: Sim) -> list[tuple[str, str]]:
    return [(m, p) for m, p in sim.cluster.store.requests if m in ("POST", "PUT", "PATCH", "DELETE")]


def one_error_line(res: Any) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    return str(lines[0])


def test_corrupt_history_is_exit_3_naming_the_file_and_touches_nothing(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2)
    state = tmp_path / "h.db"
    state.write_bytes(b"not a database, whatever it once was" * 100)
    runner = CliRunner()
    res = runner.invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--state", str(state),
                               "--config", str(write_config(tmp_path))])
    assert res.exit_code == 3
    assert str(state) in one_error_line(res) and "file is not a database" in res.stderr
    assert cluster_writes(sim) == []
    res = runner.invoke(main, ["history", "gpu-00", "--state", str(state)])
    assert res.exit_code == 3 and str(state) in one_error_line(res)


def test_config_value_of_the_wrong_type_is_exit_2_with_file_line(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2)
    for value, words in (('"4"', "'4' is a string"), ("abc", "abc is a string")):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"max_percent: 100\nmax_nodes: {value}\n")
        res = CliRunner().invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--state",
                                        str(tmp_path / "h.db"), "--config", str(cfg)])
        assert res.exit_code == 2
        assert one_error_line(res) == f"error: {cfg}:2: max_nodes: {words}; allowed: integer >= 0"
    cfg.write_text("check_timeout: -5m\n")  # once tainted a node and released it as "never started"
    res = CliRunner().invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--state",
                                    str(tmp_path / "h.db"), "--config", str(cfg)])
    assert res.exit_code == 2 and f"{cfg}:1: check_timeout: -5m is too small" in one_error_line(res)
    assert cluster_writes(sim) == []


def test_deeply_nested_json_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)  # json.loads recurses once a level
    res = CliRunner().invoke(main, ["ingest", "gpu-00", str(deep), "--format", "dcgm", "--state",
                                    str(tmp_path / "h.db")])
    assert res.exit_code == 2 and str(deep) in one_error_line(res) and "nested too deeply" in res.stderr
    assert not (tmp_path / "h.db").exists(), "nothing recorded"


@pytest.mark.parametrize("expr", ["2.0 ** 100000", "'{:d}'.format('a')"], ids=["OverflowError", "ValueError"])
def test_a_template_raising_is_exit_2_naming_the_playbook(tmp_path: Path, expr: str) -> None:
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "p", "tasks": [{"name": "t", "debug": {"msg": "{{ " + expr + " }}"}}]}))
    res = CliRunner().invoke(main, ["run", str(pb)])
    assert res.exit_code == 2 and str(pb) in one_error_line(res), res.output


def test_text_from_files_is_printed_as_text_never_as_markup(tmp_path: Path) -> None:
    """rich reads `[/bold]` as a closing tag and raises MarkupError; a finding's message is data."""
    from sweeper.result import CheckResult, Result

    message = "[/bold] closed [red]nothing[/red] \\[x]"
    doc = tmp_path / "r.json"
    doc.write_text(Result(node="gpu-00", source="sweeper", started=1e9, finished=1e9,
                          checks=(CheckResult(name="gpu.count", status="fail", message=message),)).to_json())
    state = str(tmp_path / "h.db")
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", "gpu-00", str(doc), "--format", "sweeper", "--state", state],
                        env={"COLUMNS": "250"})
    assert res.exit_code == 1 and message in res.stdout, res.output  # 1: the document holds a failure
    res = runner.invoke(main, ["history", "gpu-00", "--state", state], env={"COLUMNS": "250"})
    assert res.exit_code == 0 and message in res.stdout, res.output


def test_a_bug_is_exit_70_in_one_line_and_debug_shows_the_traceback(tmp_path: Path, monkeypatch) -> None:
    """A failure Sweeper did not foresee is not a finding (1): it says it is a bug, --debug tells where."""
    import sweeper.ingest

    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("unsupported operand")

    monkeypatch.setattr(sweeper.ingest, "ingest_stream", broken)  # a library function of our own, not a client
    log = tmp_path / "k.log"
    log.write_text("kernel: nothing\n")
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", "gpu-00", str(log), "--no-record"])
    assert res.exit_code == 70 and "a bug in Sweeper" in one_error_line(res) and "--debug" in res.stderr
    res = runner.invoke(main, ["--debug", "ingest", "gpu-00", str(log), "--no-record"])
    assert res.exit_code == 70 and "Traceback" in res.stderr and "TypeError: unsupported operand" in res.stderr
