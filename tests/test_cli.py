"""The CLI in-process (click's CliRunner) against the simulated cluster."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parent.parent


def write_config(tmp_path: Path, **over: object) -> Path:
    """check_timeout 1800 simulated seconds, 3 s of real time at the fleets' 600x (as TEST_CONFIG's): at 120,
    a fifth of a second, a loaded machine turned a check into one that "never started before its deadline"."""
    cfg = {"max_nodes": 4, "max_percent": 100, "poll_interval": 0.02, "check_timeout": 1800, **over}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_command_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, cmd in main.all_commands().items():
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


def test_plan_says_a_node_over_the_budget_waits_for_a_slot_of_this_run(make_sim, tmp_path: Path) -> None:
    """A run is a rolling queue: a node over the budget now is taken when a slot frees, so the plan
    no longer says the budget allows only N nodes 'this run'."""
    sim: Sim = make_sim(nodes=3)
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"),
            "--config", str(write_config(tmp_path, max_nodes=1))]
    res = CliRunner().invoke(main, ["plan", *base, "--json"])
    assert res.exit_code == 0, res.output
    over = [n for n in json.loads(res.stdout)["nodes"] if n["reason"] == "over-budget"]
    assert len(over) == 2 and all(n["detail"].startswith("queued: no slot free now (1 went to the nodes taken); "
                                                         "taken as one frees")
                                  and "this run" not in n["detail"] for n in over), over


def test_a_sweep_does_not_count_as_skipped_the_nodes_its_rolling_queue_took_later(make_sim, tmp_path: Path) -> None:
    """One node at a time over three: the first plan skips two over the budget, the run takes them as
    slots free; its summary said `skipped: 2 over-budget` under the three nodes it swept."""
    sim: Sim = make_sim(nodes=3)
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"),
            "--config", str(write_config(tmp_path, max_nodes=1, run_deadline=0))]
    res = CliRunner().invoke(main, ["sweep", *base], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = [line.split()[:3] for line in res.stdout.splitlines() if line.startswith("gpu-")]
    assert sorted(rows) == [[f"gpu-0{i}", "pass", "released"] for i in range(3)], res.stdout
    assert "over-budget" not in res.stdout and "skipped:" not in res.stdout, res.stdout


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


def test_demo_runs_end_to_end(demo: dict[str, Any]) -> None:
    """At 80 columns, as in a pipe: the commands it suggests stay whole on one line, to be copied. (The
    demo runs once in the session, tests/conftest.py; the report's tests read its history.)"""
    out, state = demo["out"], demo["state"]
    assert "cycle 5 of 5" in out and "the fleet" in out
    assert re.search(r"gpu-p5-04: reboot -> held", out), "the XID 79 node is held for a reboot"
    assert "gpu-p5-04: reboot: reboot-started" in out and re.search(r"gpu-p5-04: pass -> released", out), \
        "rebooted, checked again, handed back"
    assert "gpu-p5-14: gpu-reset: gpus-reset" in out, "a pending remap is a GPU reset"
    assert "gpu-p5-09: karpenter: nodeclaim-deleted" in out, "the missing GPU survives a reboot: replaced"
    assert re.search(r"gpu-p5-13 .*held .*quarantine", out), "the hung check waits for a person"
    assert re.search(r"gpu-p5-06: replace -> held\s+\(corrected-ecc-rising", out), \
        "the node whose corrected ECC climbs is replaced on its slope"
    assert f"(sweeper history NODE --state {state})" in out and demo["page"].exists()
    assert f"(sweeper report --state {state} --offline)" in out
    assert "sweeper history gpu-p5-06 --check ecc:" in out
    # the pair sweep: gpu-p5-08's links run at 40%; its first pair fails and blames neither node,
    # each is re-paired with a known-good partner, and gpu-p5-08 alone is held
    assert re.search(r"gpu-p5-08: inconclusive -> held for a re-pair", out)
    assert re.search(r"re-pair of suspect gpu-p5-08 with known-good gpu-p5-\d\d", out)
    assert re.search(r"gpu-p5-08: quarantine -> held\s+\(pair\.nccl: bus bandwidth", out)
    assert "why gpu-p5-08 is held: sweeper history gpu-p5-08 (its pair runs)" in out
    first = re.search(r"gpu-p5-08: inconclusive -> held for a re-pair with a known-good partner\s+"
                      r"\(pair with (gpu-p5-\w+) failed", out)
    pairs = out[out.index("pair sweeps over the fabric"):]
    assert first and re.search(rf"{first.group(1)}: pass -> released", pairs), "its first partner goes back"
    # issue 24, point 7: in a pipe the fleet table is never cut nor wrapped (rich folds a cell to its
    # console's 80 columns), each row whole on one line; a heading keeps its whole title
    assert re.search(r"│ gpu-p5-08 .*│ held .*│ pair\.nccl: bus bandwidth [^\n]* failed again with known-good "
                     r"partner gpu-p5-\d\d +│\n", out), "the held node's reason whole, on its row"
    assert "── sweeper history gpu-p5-06 --check ecc: replaced on its trend, before it failed ──" in out
    # issue 25, point 2: the EKS node monitoring agent's AcceleratedHardwareReady=False is a claim,
    # tested: false on gpu-p5-10 (refuted), true on gpu-p5-04 (confirmed), and the agent's precision
    assert "gpu-p5-10: eks-node-monitoring-agent AcceleratedHardwareReady:NvidiaXID79Error: refuted" in out
    assert "gpu-p5-04: eks-node-monitoring-agent AcceleratedHardwareReady:NvidiaXID79Error: confirmed" in out
    assert "eks-node-monitoring-agent: precision 50% (1 confirmed, 1 refuted, 0 inconclusive)" in out
    # issue 25: the rebooted node is soaked by the gate before hand-back, and Karpenter's replacement of
    # gpu-p5-09 joins with the NodePool's startup taint, which comes off only once it passes its gate
    assert re.search(r"gate: taking [^\n]*gpu-p5-04 \(soak\)", out)
    assert re.search(r"gate: taking [^\n]*gpu-p5-r01 \(gate\)", out)
    assert "gpu-p5-r01: passed its gate (pass); its startup taint is off, handed to work" in out


def test_the_demo_s_fleet_table_prints_a_held_node_s_reason_as_text(make_sim, tmp_path: Path) -> None:
    """The reason annotation is the node's data: `[bold red]` in it was read as rich markup and lost."""
    import io

    from rich.console import Console

    from sweeper.demo import DEMO_CONFIG, fleet_table
    from sweeper.history import History

    sim: Sim = make_sim(nodes=2)
    reason = "xid (GPU 3): XID 79, name=[bold red]python[/bold red] \\[x] [/] fell off the bus"
    sim.core.patch_node("gpu-01", {
        "metadata": {"annotations": {f"{DEMO_CONFIG.prefix}/reason": reason}},
        "spec": {"taints": [{"key": DEMO_CONFIG.taint_key, "value": "sw-1", "effect": "NoSchedule"}]}})
    console = Console(file=io.StringIO(), width=300, color_system=None, highlight=False)
    hist = History(tmp_path / "h.db")
    summary = fleet_table(console, sim.kube, hist, DEMO_CONFIG)
    hist.close()
    assert summary["gpu-01"]["state"] == "held" and summary["gpu-00"]["state"] == "in service"
    held = next(line for line in console.file.getvalue().splitlines() if "gpu-01" in line)
    assert reason[:90] in held, held


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


def test_deeply_nested_json_is_an_error_result_as_any_unreadable_json(tmp_path: Path) -> None:
    """json.loads recurses once a level and raises RecursionError past the interpreter's limit; the
    parser reads that as it reads any JSON it cannot read (an `error` result, exit 1), as it must for
    a check pod's log in a sweep (tests/test_security_data.py)."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    res = CliRunner().invoke(main, ["ingest", "gpu-00", str(deep), "--format", "dcgm", "--new-node", "--state",
                                    str(tmp_path / "h.db")])
    assert res.exit_code == 1 and "gpu-00: dcgm -> error" in res.output and "nested too deep" in res.output


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
    res = runner.invoke(main, ["ingest", "gpu-00", str(doc), "--format", "sweeper", "--new-node", "--state", state],
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


# -- what people see: output formats, text as text, unknown names, help ---------------------------
FIXTURES = Path(__file__).parent / "parsers" / "fixtures"


def test_every_tool_format_ingested_then_history_prints_the_text_as_it_is(tmp_path: Path) -> None:
    """Once a traceback (rich.errors.MarkupError, exit 1): a result's text was read as rich markup."""
    state = str(tmp_path / "h.db")
    runner = CliRunner()
    formats = set()
    for i, path in enumerate(sorted(p for p in FIXTURES.iterdir() if p.is_file())):
        node = f"gpu-{i:02d}"
        res = runner.invoke(main, ["ingest", node, str(path), "--new-node", "--state", state, "--json"])
        if res.exit_code not in (0, 1):
            continue  # a file auto-detection cannot place is not recorded
        doc = json.loads(res.stdout)
        formats.add(doc["source"])
        res = runner.invoke(main, ["history", node, "--state", state])
        assert res.exit_code == 0 and "Traceback" not in res.output, (path.name, res.output)
        for c in [c for c in doc["checks"] if c["status"] in ("fail", "warn", "error")][:30]:
            assert " ".join(c["message"].split()) in " ".join(res.stdout.split()), (path.name, c["message"])
    assert len(formats) >= 6, formats


def test_bracketed_words_from_a_kernel_log_are_kept(tmp_path: Path) -> None:
    """`name=[bold red]python` lost its bracketed words when rich read it as markup."""
    log = tmp_path / "k.log"
    log.write_text("[ 8812.551301] NVRM: Xid (PCI:0000:5d:00): 79, pid=4242, name=[bold red]python[/bold red], "
                   "GPU has fallen off the bus.\n")
    state = str(tmp_path / "h.db")
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", "gpu-00", str(log), "--format", "kernel-log", "--new-node", "--state", state])
    assert res.exit_code == 1 and "name=[bold red]python[/bold red]" in res.stdout, res.output
    for fmt in ([], ["-o", "wide"], ["-o", "yaml"]):
        res = runner.invoke(main, ["history", "gpu-00", "--state", state, *fmt])
        assert res.exit_code == 0 and "name=[bold red]python[/bold red]" in res.stdout, res.output


def weeks_of_history(tmp_path: Path) -> str:
    from sweeper.history import History
    from sweeper.result import CheckResult, Result

    h = History(tmp_path / "h.db")
    t0 = 1_790_000_000.0
    for n in range(3):
        for k in range(2):
            run = f"sw-20260901-07251{k}-4f2a{n}"
            h.run_started(run, t0 + k * 86400, "sweep")
            sid = h.sweep_started(run, f"gpu-p5-{n:02d}", t0 + k * 86400 + n, "sweep-light.yaml", "p5.48xlarge")
            bad = n == 1 and k == 1
            h.result(sid, Result(node=f"gpu-p5-{n:02d}", source="sweeper", started=t0, finished=t0, checks=(
                CheckResult(name="xid", status="fail" if bad else "pass", code="79" if bad else None,
                            message="XID 79 on 0000:53:00 " + "and a long tail of words " * 8 if bad else "ok"),)))
            h.sweep_finished(sid, t0 + k * 86400 + 60, "reboot" if bad else "pass",
                             ["xid (GPU 3): XID 79" if bad else "all checks passed"])
            h.run_finished(run, t0 + k * 86400 + 90, "done", 3, {})
    h.close()
    return str(tmp_path / "h.db")


def test_nodes_says_a_busy_node_with_only_light_checks_is_due(tmp_path: Path) -> None:
    """A light check of a busy node is shown as its last sweep, but only a full sweep makes a node not
    due (the planner's rule); `nodes` said `in 23h` for a busy node never swept in full."""
    from sweeper.history import History

    h = History(tmp_path / "h.db")
    t0 = time.time() - 3600
    h.run_started("sw-1", t0, "sweep")
    for node, kind in (("gpu-busy", "light"), ("gpu-idle", "sweep")):
        sid = h.sweep_started("sw-1", node, t0, "sweep-light.yaml", "p5.48xlarge", kind=kind)
        h.sweep_finished(sid, t0 + 60, "pass", ["all checks passed"])
    h.run_finished("sw-1", t0 + 90, "done", 2, {})
    h.close()
    res = CliRunner().invoke(main, ["nodes", "--offline", "--state", str(tmp_path / "h.db"), "-o", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["node"]: r for r in json.loads(res.stdout)["nodes"]}
    assert rows["gpu-busy"]["verdict"] == "pass" and rows["gpu-busy"]["last_sweep"], rows
    due = {n: datetime.fromisoformat(r["due"].replace("Z", "+00:00")).timestamp() for n, r in rows.items()}
    assert due["gpu-busy"] <= time.time() < due["gpu-idle"], rows
    assert abs(due["gpu-idle"] - (t0 + 86400)) < 2, rows


def test_the_command_list_of_the_help_is_whole_on_80_columns() -> None:
    """`sweeper --help` listed nearly every command as a first sentence cut with '...'."""
    res = CliRunner().invoke(main, ["--help"], terminal_width=80)
    assert res.exit_code == 0, res.output
    listed = res.stdout.split("Commands:", 1)[1].split("Examples:", 1)[0]
    rows = [line.split(None, 1) for line in listed.strip().splitlines()]
    assert [r[0] for r in rows] == main.list_commands(click.Context(main)), listed
    assert all(len(r) == 2 and "..." not in r[1] for r in rows), listed


def test_nodes_names_the_profile_of_a_node_never_swept_from_the_cluster(make_sim, tmp_path: Path) -> None:
    """Before its first sweep a node showed `-` for its profile; the cluster's instance-type label
    says which it gets, as `sweeper profiles --nodes` says."""
    from sweeper.history import History

    sim: Sim = make_sim(nodes=2)
    History(tmp_path / "h.db").close()  # a history with no sweep yet (one that is not there is exit 2)
    res = CliRunner().invoke(main, ["nodes", "--kubeconfig", str(sim.kubeconfig), "--state",
                                    str(tmp_path / "h.db"), "-o", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["nodes"]
    assert [(r["node"], r["profile"], r["last_sweep"]) for r in rows] == [
        ("gpu-00", "p5.48xlarge", None), ("gpu-01", "p5.48xlarge", None)], rows


def test_profiles_name_a_fabric_without_a_rate_without_a_stray_dash() -> None:
    """GCP's a3 profiles give no gVNIC rate: their fabric read `4 x gve-`."""
    res = CliRunner().invoke(main, ["profiles"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.stdout.splitlines() if line.startswith("gcp-a3-highgpu-8g "))
    assert re.search(r"   4 x gve   ", row) and "gve-" not in row, row
    row = next(line for line in res.stdout.splitlines() if line.startswith("p5.48xlarge "))
    assert "32 x efa 100 Gb/s" in row, row


def test_table_commands_take_every_output_format(tmp_path: Path) -> None:
    state = weeks_of_history(tmp_path)
    runner = CliRunner()
    as_json = runner.invoke(main, ["nodes", "--offline", "--state", state, "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.stdout)
    assert runner.invoke(main, ["nodes", "--offline", "--state", state, "--json"]).stdout == as_json.stdout, \
        "--json stays what -o json prints"
    as_yaml = yaml.safe_load(runner.invoke(main, ["nodes", "--offline", "--state", state, "-o", "yaml"]).stdout)
    assert as_yaml == doc
    assert [r["node"] for r in doc["nodes"]] == ["gpu-p5-00", "gpu-p5-01", "gpu-p5-02"]
    assert doc["nodes"][1]["verdict"] == "reboot" and doc["nodes"][1]["last_sweep"] == "2026-09-22T14:13:21Z"

    table = runner.invoke(main, ["nodes", "--offline", "--state", state]).stdout.splitlines()
    assert table[1].split()[:4] == ["NODE", "PROFILE", "LAST", "SWEEP"] and len(table) == 5
    assert re.search(r"^gpu-p5-01\s+p5\.48xlarge\s+\d+d(\d+h)? ago\s+reboot\s+findings\s+now$", table[3]), table
    wide = runner.invoke(main, ["nodes", "--offline", "--state", state, "-o", "wide"]).stdout
    assert "2026-09-22T14:13:21Z" in wide and " ago" not in wide
    bare = runner.invoke(main, ["nodes", "--offline", "--state", state, "--no-headers"]).stdout.splitlines()
    assert [r.split() for r in bare] == [r.split() for r in table[2:]], "no title, no header, the same rows"

    hist = runner.invoke(main, ["history", "gpu-p5-01", "--state", state, "-o", "wide"]).stdout
    assert "sw-20260901-072511-4f2a1" in hist and "2026-09-22T14:13:21Z" in hist
    assert ("and a long tail of words " * 8).strip() in hist, "in a pipe, nothing is shortened"
    doc = json.loads(runner.invoke(main, ["history", "gpu-p5-01", "--state", state, "-o", "json"]).stdout)
    assert doc["sweeps"][0]["started"] == "2026-09-22T14:13:21Z"
    assert doc["metrics"] == {} and doc["sweeps"][0]["run_id"] == "sw-20260901-072511-4f2a1"


def test_history_of_a_node_never_seen_is_exit_2(tmp_path: Path) -> None:
    state = weeks_of_history(tmp_path)
    res = CliRunner().invoke(main, ["history", "no-such-node", "--state", state])
    assert res.exit_code == 2 and "no node 'no-such-node'" in one_error_line(res)
    res = CliRunner().invoke(main, ["history", "gpu-p5-01", "--state", state, "--since", "1d"])
    assert res.exit_code == 0 and "no history for node gpu-p5-01" in res.stdout, "known, only not lately"


def test_release_of_an_unknown_node_is_exit_2_and_changes_nothing(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2)
    res = CliRunner().invoke(main, ["release", "gpu-00", "gpu-p5-99", "--reason", "typo", "--kubeconfig",
                                    str(sim.kubeconfig), "--state", str(tmp_path / "h.db")])
    assert res.exit_code == 2 and "no node named gpu-p5-99" in one_error_line(res)
    assert cluster_writes(sim) == []


def test_plan_and_a_dry_run_leave_nothing_on_disk(make_sim, tmp_path: Path) -> None:
    """`plan` changes nothing; neither does `sweep --dry-run`: not even a state directory."""
    sim: Sim = make_sim(nodes=2)
    state = tmp_path / "state" / "sweeper.db"
    cfg = write_config(tmp_path)
    runner = CliRunner()
    for args in (["plan"], ["sweep", "--dry-run"]):
        res = runner.invoke(main, [*args, "--kubeconfig", str(sim.kubeconfig), "--state", str(state), "--config",
                                   str(cfg), "-o", "json"])
        assert res.exit_code == 0, res.output
        assert not (tmp_path / "state").exists(), args
    assert cluster_writes(sim) == []


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kubeconfig"
    res = CliRunner().invoke(main, ["plan", "--kubeconfig", str(missing), "--state", str(tmp_path / "h.db")])
    assert res.exit_code == 2 and str(missing) in one_error_line(res)
    res = CliRunner().invoke(main, ["plan", "--state", str(tmp_path / "h.db")],
                             env={"HOME": str(tmp_path), "KUBECONFIG": None, "KUBERNETES_SERVICE_HOST": None})
    assert res.exit_code == 2 and str(tmp_path / ".kube" / "config") in one_error_line(res)


def test_a_debug_value_is_printed_whole(tmp_path: Path) -> None:
    value = "start " + "x" * 400 + " end"
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "p", "tasks": [{"name": "show", "debug": {"msg": value}}]}))
    res = CliRunner().invoke(main, ["run", str(pb)])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.stderr.splitlines() if ln.strip().startswith("ok"))
    assert line.endswith(f"show: {value}")


def all_commands() -> list[tuple[list[str], Any]]:
    """Every command and subcommand, `check` (built when asked for) included."""
    import click

    found: list[tuple[list[str], Any]] = []

    def walk(group: click.Group, path: list[str]) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None, name
            if isinstance(cmd, click.Group):
                walk(cmd, [*path, name])
            else:
                found.append(([*path, name], cmd))

    walk(main, [])
    return found


def test_every_command_s_help_has_an_example_that_uses_only_its_own_options() -> None:
    import shlex

    commands = all_commands()
    assert len(commands) >= 20 and ["check"] in [p for p, _ in commands]
    for path, cmd in commands:
        res = CliRunner().invoke(main, [*path, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and "Examples:" in res.stdout, path
        examples = [ln.strip() for ln in res.stdout.split("Examples:", 1)[1].splitlines() if ln.strip()]
        assert examples, path
        options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        for line in examples:
            part = next(p for p in re.split(r"[;|>]", line.split("#")[0]) if "sweeper " in p)
            words = shlex.split(part)
            at = words.index("sweeper")
            assert words[at + 1:at + 1 + len(path)] == path, (path, line)
            used = {w.split("=")[0] for w in words[at + 1 + len(path):] if w.startswith("-") and w != "-"}
            assert used <= options, (path, line, used - options)


def test_the_help_and_the_reading_commands_import_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    """Start-up: click and the command's own needs only. Measured by benchmarks/cli.py; here, which
    modules load (what `python -X importtime` showed as most of the 0.3 s). The history is read with
    the standard library's sqlite3: sqlite_utils (half of what `history NODE` cost) loads only to write."""
    import subprocess
    import sys

    state = weeks_of_history(tmp_path)
    heavy = ("pydantic", "kubernetes", "rich", "sqlite_utils", "apscheduler", "jinja2", "sweeper.checks",
             "prometheus_client")
    probe = ("import sys, runpy\nsys.argv = ['sweeper', *sys.argv[1:]]\ntry:\n"
             "    runpy.run_module('sweeper.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             f"print('LOADED', sorted({{m.split('.')[0] if not m.startswith('sweeper.') else '.'.join(m.split('.')[:2])"
             f" for m in sys.modules}} & set({heavy!r})), file=sys.stderr)\n")
    for argv, allowed in ((["--help"], set()), (["history", "--help"], set()), (["nodes", "--help"], set()),
                          (["plan", "--help"], set()), (["history", "gpu-p5-01", "--state", state], set()),
                          (["nodes", "--offline", "--state", state], set())):
        proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
        loaded = proc.stderr.split("LOADED", 1)[1].strip()
        assert proc.returncode == 0 and set(yaml.safe_load(loaded)) <= allowed, (argv, loaded, proc.stderr[-500:])


def on_a_terminal(argv: list[str], columns: int) -> str:
    """What `sweeper ARGV` shows on a terminal (a pseudo-terminal) of `columns` columns."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", *argv], stdout=follower, stderr=follower,
                            env={**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"})
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.wait(timeout=120) == 0, shown.decode()
    return shown.decode()


def test_at_80_columns_on_a_terminal_run_ids_and_times_stay_whole(tmp_path: Path) -> None:
    """The issue's case: at 80 columns the run id and the date were cut (`sw-20261123-072...`)."""
    state = weeks_of_history(tmp_path)
    text = on_a_terminal(["history", "gpu-p5-01", "--state", state], 80)
    assert "\x1b[" not in text, "NO_COLOR"
    rows = [ln for ln in text.splitlines() if " ago " in ln]
    assert len(rows) == 3 and all(re.match(r"^\d+d(\d+h)? ago +sw-20260901-07251[01]-4f2a1 ", ln) for ln in rows[:2])
    assert rows[2].endswith("…") and all(len(ln) <= 80 for ln in rows), "the long message is shortened, and says so"
    wide = on_a_terminal(["history", "gpu-p5-01", "--state", state, "-o", "wide"], 80)
    rows = [ln for ln in wide.splitlines() if ln.startswith("2026-")]
    assert len(rows) == 3 and all(re.match(r"^2026-\d\d-\d\dT\d\d:\d\d:\d\dZ ", ln) for ln in rows)
    assert ("and a long tail of words " * 8).strip() in wide, "-o wide shortens nothing"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    """`sweeper history NODE | head` once ended in "internal error ... BrokenPipeError", exit 70. A
    reader that has what it wanted and closes the pipe ends the command quietly, as Python's own
    "Note on SIGPIPE" (docs.python.org/3/library/signal.html) shows how."""
    import subprocess
    import sys

    state = str(tmp_path / "h.db")
    log = tmp_path / "kern.log"
    log.write_text("".join(f"[{i}.0] NVRM: Xid (PCI:0000:{i % 8:02x}:00): 79, pid=1, GPU has fallen off the bus.\n"
                           for i in range(1, 200)))
    res = CliRunner().invoke(main, ["ingest", "gpu-00", str(log), "--format", "kernel-log", "--new-node", "--state",
                                    state])
    assert res.exit_code in (0, 1), res.output
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "history", "gpu-00", "--state", state, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err


def test_sweeper_config_in_the_environment_is_the_config(make_sim, tmp_path: Path) -> None:
    """`SWEEPER_CONFIG` stands for `--config`, as `SWEEPER_STATE` stands for `--state`, so `plan`,
    `nodes` and `report` from a shell read the cluster's own config without repeating it."""
    sim: Sim = make_sim(nodes=3)
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db")]
    env = {"SWEEPER_CONFIG": str(write_config(tmp_path, max_nodes=1))}
    res = CliRunner(env=env).invoke(main, ["plan", *base, "--json"])
    assert res.exit_code == 0, res.output
    assert len([n for n in json.loads(res.stdout)["nodes"] if n["reason"] == "over-budget"]) == 2


def test_without_state_each_kubeconfig_context_gets_its_own_history(make_sim, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24, point 4: without --state or SWEEPER_STATE the history is state/<context>.db, so two
    clusters never mix their nodes in one history; `history` and `report` find the same file from the
    same kubeconfig (its current-context, as kubectl reads it:
    https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/)."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"missing_gpus": 2}})
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"SWEEPER_STATE": None})
    cfg = write_config(tmp_path)
    res = runner.invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--config", str(cfg), "-o", "json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "state" / "sim.db").is_file() and not (tmp_path / "state" / "sweeper.db").exists()
    res = runner.invoke(main, ["history", "gpu-01", "--kubeconfig", str(sim.kubeconfig), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["sweeps"][0]["verdict"] == "reboot"
    assert "state/sim.db: named for the kubeconfig context sim" in res.stderr
    # another cluster's kubeconfig (an EKS context name, made a file name) reads a history of its own
    other = yaml.safe_load(sim.kubeconfig.read_text())
    name = "arn:aws:eks:us-west-2:111122223333:cluster/prod"
    other["contexts"][0]["name"] = other["current-context"] = name
    (tmp_path / "prod.kubeconfig").write_text(yaml.safe_dump(other))
    res = runner.invoke(main, ["history", "gpu-01", "--kubeconfig", str(tmp_path / "prod.kubeconfig")])
    # no file of its own: it reads that cluster's (issue 24, point 3; tests/cluster/test_remote_history.py),
    # here the node's labels, for no `sweeper serve` runs there; never the other context's file
    assert res.exit_code == 0 and "no history at state/arn_aws_eks_us-west-2_111122223333_cluster_prod.db" \
        in res.stderr and "labels and annotations" in res.stderr and "state/sim.db" not in res.stderr, res.output
    res = runner.invoke(main, ["history", "gpu-01", "--kubeconfig", str(tmp_path / "prod.kubeconfig"), "--state",
                               "state/arn_aws_eks_us-west-2_111122223333_cluster_prod.db"])
    assert res.exit_code == 2 and "no history at state/arn_aws_eks_us-west-2_111122223333_cluster_prod.db" in res.stderr
    res = runner.invoke(main, ["history", "gpu-01", "--context", "sim", "--kubeconfig",
                               str(tmp_path / "prod.kubeconfig"), "--json"])
    assert res.exit_code == 0, res.output  # --context names the file as it names the cluster
    res = runner.invoke(main, ["report", "--kubeconfig", str(sim.kubeconfig), "--config", str(cfg), "-o", "r.html"])
    assert res.exit_code == 0 and "gpu-01" in (tmp_path / "r.html").read_text(), res.output
    # SWEEPER_STATE and --state still win
    res = CliRunner(env={"SWEEPER_STATE": str(tmp_path / "state" / "sim.db")}).invoke(
        main, ["history", "gpu-01", "--kubeconfig", str(tmp_path / "prod.kubeconfig"), "--json"])
    assert res.exit_code == 0 and "named for" not in res.stderr, res.output


def test_the_plan_line_says_which_taken_nodes_are_re_checks() -> None:
    """Issue 24, point 7: "4 already held, budget 0; taking ..." read as taking nodes beyond the
    budget; the nodes it holds, back from a reboot, are re-checks within it (sweeper.fleet's
    `recheck` decision)."""
    import io

    from sweeper.cli import _printer
    from sweeper.output import Out

    buf = io.StringIO()
    emit = _printer(Out(stream=buf))
    emit("plan", {"run_id": "r1", "gpu_nodes": 16, "held": 4, "budget": 0, "take": ["gpu-p5-04", "gpu-p5-09"],
                  "recheck": ["gpu-p5-04", "gpu-p5-09"]})
    emit("plan", {"run_id": "r2", "gpu_nodes": 16, "held": 1, "budget": 2, "take": ["gpu-p5-01", "gpu-p5-04"],
                  "recheck": ["gpu-p5-04"]})
    emit("plan", {"run_id": "r3", "gpu_nodes": 16, "held": 0, "budget": 2, "take": [], "recheck": []})
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("budget 0; taking gpu-p5-04, gpu-p5-09 (re-checks of nodes it holds)"), lines
    assert lines[1].endswith("taking gpu-p5-01; gpu-p5-04 (a re-check of a node it holds)"), lines
    assert lines[2].endswith("taking none"), lines


def test_metric_trends_leave_out_settings_and_take_the_lowest_thermal_margin(tmp_path: Path) -> None:
    """Issue 24, point 7: a node's trend sums its GPUs' counts, but the PCIe link's generation and width
    (NVML nvmlDeviceGetCurrPcieLinkGeneration/Width) and the enforced power limit are settings: summed
    over 8 GPUs (gen 40, x128, 5600 W) they mean nothing. The thermal margin is degrees left to the
    slowdown (nvmlDeviceGetMarginTemperature), so the node's is its nearest GPU's, not its largest.
    https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html"""
    from sweeper.history import History
    from sweeper.result import Metric, Result

    state = tmp_path / "h.db"
    h = History(state)
    h.run_started("r1", 1e9, "sweep")
    for i, t in enumerate((1e9, 1e9 + 3600)):
        sid = h.sweep_started("r1", "gpu-00", t, "sweep-dcgm.yaml", "p5.48xlarge")
        h.result(sid, Result("gpu-00", "sweeper", t, t, metrics=tuple(
            m for g in range(8) for m in (Metric("pcie.gen", 5, "", g), Metric("pcie.width", 16, "lanes", g),
                                          Metric("gpu.power_limit", 700, "W", g), Metric("gpu.power", 100, "W", g),
                                          Metric("gpu.thermal_margin", 30 - g - i, "C", g),
                                          Metric("ecc.aggregate_corrected", g + i, "count", g)))))
        h.sweep_finished(sid, t + 60, "pass", [])
    h.close()
    res = CliRunner().invoke(main, ["history", "gpu-00", "--state", str(state), "--json"])
    assert res.exit_code == 0, res.output
    series = {k: [v for _, v in pts] for k, pts in json.loads(res.stdout)["metrics"].items()}
    assert series == {"gpu.power": [800, 800], "gpu.thermal_margin": [23, 22],
                      "ecc.aggregate_corrected": [28, 36]}, series
    res = CliRunner().invoke(main, ["history", "gpu-00", "--state", str(state)])
    assert "pcie" not in res.stdout and "power_limit" not in res.stdout and "gpu.thermal_margin" in res.stdout


def test_python_dash_m_sweeper_is_the_sweeper_command() -> None:
    """A check image run with a bare interpreter (`python3 -m sweeper check`, as on a GPU machine
    where the console script was not installed) gets the same command and its name in --help."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "sweeper", "check", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.startswith("Usage: sweeper check")
