"""What the CLI does with input a new user gets wrong: a history path, a file a config names, a node
name, a fact, a policy name, an output option, a duration or a number that is off. Bad input is exit 2
with one line that says what was wrong and what is accepted (docs/cli.md, exit codes); the cluster is
the simulated one over HTTP."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from sweeper.cli import main
from tests.conftest import Sim
from tests.test_cli import weeks_of_history, write_config


def err(res: object) -> str:
    return " ".join(res.stderr.split())  # type: ignore[attr-defined]


def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose API server refuses every connection (port 9, discard, nothing listening)."""
    kc = tmp_path / "away.kubeconfig"
    kc.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "away",
                                  "clusters": [{"name": "away", "cluster": {"server": "http://127.0.0.1:9"}}],
                                  "users": [{"name": "away", "user": {}}],
                                  "contexts": [{"name": "away", "context": {"cluster": "away", "user": "away"}}]}))
    return kc


# -- 1. nodes and a history that is not there --------------------------------------------
def test_nodes_with_a_history_path_that_is_not_there_is_exit_2_as_history_and_report(make_sim, tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """`nodes --state /tmp/typo.db` showed every node as never swept, exit 0; `history` and `report`
    with the same path say there is no history there, exit 2. So does `nodes` now, and creates nothing."""
    sim: Sim = make_sim(nodes=2)
    typo = tmp_path / "typo.db"
    runner = CliRunner(env={"SWEEPER_STATE": None})
    for args in (["nodes"], ["nodes", "--offline"], ["history", "gpu-00"], ["report", "--offline"]):
        res = runner.invoke(main, [*args, "--kubeconfig", str(sim.kubeconfig), "--state", str(typo)])
        assert res.exit_code == 2 and f"no history at {typo}" in err(res), (args, res.output)
    res = CliRunner(env={"SWEEPER_STATE": str(typo)}).invoke(main, ["nodes", "--kubeconfig", str(sim.kubeconfig)])
    assert res.exit_code == 2 and f"no history at {typo}" in err(res), res.output
    assert not typo.exists()
    # a first run: no --state, no file named for the context yet, so the cluster's own history is read
    # (here, for no `sweeper serve`, the nodes' labels), and it says where from
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(main, ["nodes", "--kubeconfig", str(sim.kubeconfig)])
    assert res.exit_code == 0 and "no history at state/sim.db" in err(res), res.output
    assert not (tmp_path / "state").exists()


def test_nodes_says_which_history_it_read_and_a_node_never_swept_has_no_rule(make_sim, tmp_path: Path) -> None:
    """The help says `nodes` says which source it read: it did only for the cluster's history. A node
    never swept showed RULE `findings` (its verdict is "", not `pass`): `-`, as its verdict."""
    from sweeper.history import History

    sim: Sim = make_sim(nodes=2)
    state = tmp_path / "h.db"
    History(state).close()
    res = CliRunner().invoke(main, ["nodes", "--kubeconfig", str(sim.kubeconfig), "--state", str(state)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"2 GPU nodes (from the history at {state} and the cluster)", lines
    rows = [line.split() for line in lines if line.startswith("gpu-")]
    assert [r[:6] for r in rows] == [["gpu-00", "p5.48xlarge", "never", "-", "-", "now"],
                                     ["gpu-01", "p5.48xlarge", "never", "-", "-", "now"]], lines
    assert "findings" not in res.stdout
    doc = json.loads(CliRunner().invoke(main, ["nodes", "--offline", "--state", str(state), "--json"]).stdout)
    assert doc == {"nodes": [], "source": f"the history at {state} alone"}


# -- 2. lint and the files a config names ----------------------------------------------------
def test_lint_finds_every_file_a_config_names_where_the_sweep_looks(tmp_path: Path) -> None:
    """`playbook: sweep-ligth.yaml` linted as 0 problems while `plan` and `sweep` exit 2 on it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my-sweep.yaml").write_text(yaml.safe_dump({"name": "m", "tasks": [{"name": "t", "debug": {"msg": "x"}}]}))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"playbook": "my-sweep.yaml", "playbook_dir": str(mine), "light_playbook": "",
                                    "policy": "default.yaml", "reboot_template": "reboot.yaml.j2"}))
    res = CliRunner().invoke(main, ["lint", "--config", str(good), "-o", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["problems"] == [], res.output
    bad = tmp_path / "c.yaml"
    bad.write_text("playbook: sweep-ligth.yaml\n"
                   "light_playbook: light-bussy.yaml\n"
                   "policy: defualt.yaml\n"
                   "gpu_reset_template: gpu-rest.yaml.j2\n"
                   "schedules:\n"
                   "  - {name: deep, cron: '0 3 * * 6', playbook: quarantine-dep.yaml}\n"
                   f"profile_dir: {tmp_path / 'no-profiles'}\n")
    res = CliRunner().invoke(main, ["lint", "--config", str(bad)])
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stdout.splitlines() if ": error: " in line]
    assert [e.split(": error: ")[0] for e in errors] == [f"{bad}:{n}" for n in (1, 2, 3, 4, 6, 7)], errors
    assert "playbook: no playbook 'sweep-ligth.yaml'" in errors[0] and "did you mean sweep-light.yaml" in errors[0]
    assert "light_playbook: no playbook 'light-bussy.yaml'" in errors[1] and "light-busy.yaml" in errors[1]
    assert "policy: no policy 'defualt.yaml'" in errors[2] and "did you mean default.yaml" in errors[2]
    assert "gpu_reset_template: job template 'gpu-rest.yaml.j2'" in errors[3] and "gpu-reset.yaml.j2" in errors[3]
    assert "schedules[0].playbook: no playbook 'quarantine-dep.yaml'" in errors[4]
    assert f"profile_dir: no folder {tmp_path / 'no-profiles'}" in errors[5]
    doc = json.loads(CliRunner().invoke(main, ["lint", "--config", str(bad), "--json"]).stdout)
    assert doc["problems"][:6] == errors, "--json is -o json"


def test_lint_of_a_path_that_is_not_there_is_bad_input(tmp_path: Path) -> None:
    for args in (["lint", str(tmp_path / "nonexistent-dir")], ["lint", "--config", str(tmp_path / "none.yaml")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and "no such file or directory" in err(res), res.output


# -- 3. ingest and a node nobody knows --------------------------------------------------------
def test_ingest_under_a_node_neither_the_cluster_nor_the_history_knows_is_exit_2(make_sim, tmp_path: Path) -> None:
    """`ingest gpu-p5-4` (for gpu-p5-04) recorded under a phantom node. The cluster is asked when the
    history does not know the name; without a cluster, the history alone decides, and says so."""
    sim: Sim = make_sim(nodes=2)
    log = tmp_path / "k.log"
    log.write_text("[ 12.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    state = tmp_path / "h.db"
    runner = CliRunner()
    near = runner.invoke(main, ["ingest", "gpu-0", str(log), "--format", "kernel-log", "--kubeconfig",
                                str(sim.kubeconfig), "--state", str(state)])
    assert near.exit_code == 2 and "no node 'gpu-0': neither the cluster nor the history at" in err(near), near.output
    assert re.search(r"did you mean gpu-0[01], gpu-0[01]\?", err(near)), err(near)
    assert err(near).endswith("(--new-node records it anyway)")
    assert not state.exists(), "nothing recorded, no history file made"
    res = runner.invoke(main, ["ingest", "gpu-01", str(log), "--format", "kernel-log", "--kubeconfig",
                               str(sim.kubeconfig), "--state", str(state)])
    assert res.exit_code == 0, res.output  # the cluster has it
    away = str(unreachable_kubeconfig(tmp_path))
    res = runner.invoke(main, ["ingest", "gpu-01", str(log), "--format", "kernel-log", "--kubeconfig", away,
                               "--state", str(state)])
    assert res.exit_code == 0, res.output  # gone from the cluster (or no cluster): the history knows it
    res = runner.invoke(main, ["ingest", "gpu-1", str(log), "--format", "kernel-log", "--kubeconfig", away,
                               "--state", str(state)])
    assert res.exit_code == 2 and "the cluster could not be asked" in err(res) and "has never seen it" in err(res)
    assert "did you mean gpu-01?" in err(res), res.output
    res = runner.invoke(main, ["ingest", "gpu-1", str(log), "--format", "kernel-log", "--kubeconfig", away,
                               "--state", str(state), "--new-node"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["history", "gpu-1", "--state", str(state), "--json"])
    assert [s["kind"] for s in json.loads(res.stdout)["sweeps"]] == ["ingest"]
    res = runner.invoke(main, ["ingest", "gpu-2", str(log), "--format", "kernel-log", "--no-record"])
    assert res.exit_code == 0, "parsing alone asks nobody"


# -- 5, 6, 7. a policy's name, report's -o, durations and numbers ----------------------------
def test_backtest_takes_a_policy_by_its_name_in_policies(tmp_path: Path) -> None:
    state = weeks_of_history(tmp_path)
    by_name = CliRunner().invoke(main, ["backtest", "--state", state, "--policy", "default", "--since", "100000d",
                                        "--json"])
    assert by_name.exit_code == 0, by_name.output
    by_file = CliRunner().invoke(main, ["backtest", "--state", state, "--policy", "default.yaml", "--since",
                                        "100000d", "--json"])
    assert {**json.loads(by_name.stdout), "since": 0} == {**json.loads(by_file.stdout), "since": 0}
    res = CliRunner().invoke(main, ["backtest", "--state", state, "--policy", "strict"])
    assert res.exit_code == 2 and "cannot read policy" in err(res)
    assert "strict.yaml" not in CliRunner().invoke(main, ["backtest", "--help"]).stdout, "a policy that is shipped"


def test_report_refuses_an_output_format_name_as_its_file(tmp_path: Path, monkeypatch) -> None:
    """`report -o json` wrote the HTML to a file named `json`: every other command's -o is a format."""
    state = weeks_of_history(tmp_path)
    monkeypatch.chdir(tmp_path)
    for fmt in ("json", "yaml", "wide", "table"):
        res = CliRunner().invoke(main, ["report", "--offline", "--state", state, "-o", fmt])
        assert res.exit_code == 2 and f"give -o ./{fmt}" in err(res), res.output
        assert not (tmp_path / fmt).exists()
    res = CliRunner().invoke(main, ["report", "--offline", "--state", state, "-o", "./json"])
    assert res.exit_code == 0 and (tmp_path / "json").read_text().startswith("<!doctype html>"), res.output


def test_a_since_of_a_bare_number_is_seconds_and_says_so(tmp_path: Path) -> None:
    """`history NODE --since 7` printed `no history` with exit 0: sweeper.clock.parse_duration reads
    a number alone as seconds (as the config's durations), so the output names the window it read."""
    state = weeks_of_history(tmp_path)
    res = CliRunner().invoke(main, ["history", "gpu-p5-01", "--state", state, "--since", "7"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "no history for node gpu-p5-01 in the last 7s (--since 7: a number alone is seconds)"
    res = CliRunner().invoke(main, ["history", "gpu-p5-01", "--state", state, "--since", "2d"])
    assert res.stdout.strip() == "no history for node gpu-p5-01 in the last 2d"


def test_max_nodes_on_the_command_line_is_checked_as_the_config_key(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2)
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"), "--config",
            str(write_config(tmp_path))]
    res = CliRunner().invoke(main, ["sweep", *base, "--max-nodes", "-1"])
    assert res.exit_code == 2 and err(res) == "error: --max-nodes: -1 is too small; allowed: integer >= 0", res.output
    assert not (tmp_path / "h.db").exists()
    # 9: with no slot in the budget, a node is not queued behind "N slot(s) free now"
    res = CliRunner().invoke(main, ["plan", *base[:4], "--config", str(write_config(tmp_path, max_nodes=0)), "--json"])
    assert res.exit_code == 0, res.output
    details = {n["detail"] for n in json.loads(res.stdout)["nodes"] if n["reason"] == "over-budget"}
    assert details == {"queued: no slot free now; taken as one frees, within run_deadline"}, res.stdout


def test_a_play_that_rescued_a_failure_says_which(make_sim, tmp_path: Path) -> None:
    """`sweeper run` of the full sweep on a busy node: the GPU pod stops the check (verify_idle
    fails), the block's rescue hands the node back, and the play succeeds, as an Ansible play whose
    failure was rescued does. Its last line said only `ok`, which read as a check that ran and
    passed; it names the rescued failure."""
    from kubernetes import client

    sim = make_sim(nodes=1)
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="train", namespace="default"),
                       spec=client.V1PodSpec(node_name="gpu-00", containers=[client.V1Container(
                           name="c", image="i", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}))]))
    sim.core.create_namespaced_pod("default", pod)
    res = CliRunner().invoke(main, ["run", "sweep-light.yaml", "--node", "gpu-00", "--kubeconfig", str(sim.kubeconfig),
                                    "--state", str(tmp_path / "h.db")])
    assert res.exit_code == 0, res.output
    last = [ln for ln in res.output.splitlines() if ln.startswith("play ")][-1]
    assert last.startswith("play 'full sweep': ok (1 failure(s) rescued; the first: no GPU pod on it"), last
