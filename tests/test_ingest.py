"""`sweeper ingest` and `sweeper profiles`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History

FIX = Path(__file__).parent / "parsers" / "fixtures"


@pytest.mark.parametrize("fixture,found,status", [
    ("dcgm-4x-l2-pcie-fail.json", "dcgm", "fail"), ("dcgm-4x-l2-pass.json", "dcgm", "pass"),
    ("nccl-allreduce-h100.txt", "nccl", "pass"), ("dmesg-xid79.txt", "kernel-log", "fail"),
])
def test_ingest_detects_parses_and_records(tmp_path: Path, fixture: str, found: str, status: str) -> None:
    state = tmp_path / "h.db"
    res = CliRunner().invoke(main, ["ingest", "gpu-9", str(FIX / fixture), "--state", str(state), "--json"])
    assert res.exit_code == (0 if status == "pass" else 1), res.output
    assert json.loads(res.stdout)["status"] == status
    h = History(state)
    sweep = h.node_history("gpu-9")["sweeps"][0]
    assert (sweep["playbook"], sweep["verdict"], sweep["kind"]) == (f"ingest:{found}", status, "ingest")
    assert h.last_swept() == {}, "an ingested result is not a sweep"
    h.close()


def test_ingest_bad_input(tmp_path: Path) -> None:
    garbage = tmp_path / "g.txt"
    garbage.write_text("nothing a parser knows\n")
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--no-record"])
    assert res.exit_code == 2 and "cannot tell the format" in res.stderr
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--format", "dcgm", "--no-record", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["status"] == "error"
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--format", "nvidia-smi"])
    assert res.exit_code == 2


def test_profiles_and_which_node_gets_which(make_sim) -> None:
    sim = make_sim(node_groups=[{"name_prefix": "p5-", "count": 1, "instance_type": "p5.48xlarge"},
                                {"name_prefix": "b2-", "count": 1, "instance_type": "p6-b200.48xlarge"}])
    res = CliRunner().invoke(main, ["profiles", "--nodes", "--kubeconfig", str(sim.kubeconfig), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {p["profile"] for p in doc["profiles"]} >= {"p5.48xlarge", "default"}
    assert {n["node"]: n["profile"] for n in doc["nodes"]} == {"p5-00": "p5.48xlarge", "b2-00": "default"}
