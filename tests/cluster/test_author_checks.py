"""Checks people write (issue 24, point 5): `run_job` reads every format `sweeper ingest` reads,
a play with no `decide` records the findings' verdict, and the node-command template runs an
author's own tool on the held node."""

from __future__ import annotations

from pathlib import Path

import click

from sweeper.actions import load_all
from sweeper.actions.jobs import _read_other
from sweeper.cli import main
from sweeper.formats import FORMATS
from tests.cluster.test_actions import run
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "parsers" / "fixtures"




def test_run_job_takes_every_format_ingest_reads() -> None:
    """One list of formats, used by `run_job`'s `parser` and by `sweeper ingest --format`."""
    parser = next(a for a in load_all()["run_job"].args if a.name == "parser")
    assert tuple(parser.choices) == FORMATS
    ingest = next(p for p in main.all_commands()["ingest"].params if p.name == "fmt")
    assert isinstance(ingest.type, click.Choice) and tuple(ingest.type.choices) == FORMATS
    assert {"auto", "nvidia-smi", "kernel-log", "ibv-devinfo", "topo", "fi-info", "ping"} <= set(FORMATS)


def test_a_command_output_is_read_as_ingest_reads_it() -> None:
    """nvidia-smi -q output with a double-bit (volatile uncorrectable) ECC count fails the node; a
    command that exited non-zero but whose output reads healthy is an error, never a pass."""
    faulty = (FIXTURES / "nvidia-smi-q-h100-faulty.txt").read_text()
    healthy = (FIXTURES / "nvidia-smi-q-h100-healthy.txt").read_text()
    assert _read_other(faulty, "gpu-00", 0.0, "nvidia-smi", 0, {}).status == "fail"
    assert _read_other(healthy, "gpu-00", 0.0, "nvidia-smi", 0, {"expect_gpus": "2"}).status in ("pass", "warn")
    assert _read_other(healthy, "gpu-00", 0.0, "nvidia-smi", 0, {"expect_gpus": "8"}).status == "fail"  # passed through
    crashed = _read_other(healthy, "gpu-00", 0.0, "nvidia-smi", 2, {})
    assert crashed.status == "error" and "exited 2" in crashed.checks[0].message


# The plays' Job deadlines are an hour of simulated time, 6 s of real time at the fleets' 600x. DCGM
# level 2 runs 150 simulated seconds; at 10m (1 s real) a loaded machine that starved the simulated
# cluster's controllers for 0.75 s between the Job's start and its pod's ended the Job at its
# activeDeadlineSeconds: a hung check (quarantine) and an `error`, not the node's verdict.
AUTO_DCGM = """
name: dcgm read by detection
tasks:
  - run_job: {template: dcgm-diag.yaml.j2, parser: auto, vars: {level: 2}, timeout: 1h}
    register: diag
    ignore_errors: true
  - decide: {results: ["{{ diag }}"]}
"""


def test_parser_auto_detects_the_output(make_sim, tmp_path: Path) -> None:
    """`parser: auto` reads dcgmi's JSON as dcgm: a double-bit ECC error fails the node."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"ecc_dbe": {3: 2}}})
    code, out = run(sim, tmp_path, AUTO_DCGM, "--node", "gpu-00")
    assert code == 0 and out["tasks"][0]["msg"].startswith("pass"), out
    code, out = run(sim, tmp_path, AUTO_DCGM, "--node", "gpu-01")
    assert out["tasks"][0]["msg"].startswith("fail") and "ECC" in out["tasks"][0]["msg"], out
    assert not out["tasks"][1]["msg"].startswith("verdict pass"), out


NO_DECIDE = """
name: dcgm without decide
tasks:
  - run_job: {template: dcgm-diag.yaml.j2, parser: dcgm, vars: {level: 2}, timeout: 1h}
"""


def _last_sweep(tmp_path: Path, node: str) -> dict:
    from sweeper.history import History

    h = History(str(tmp_path / "h.db"))
    try:
        return h.node_history(node)["sweeps"][0]
    finally:
        h.close()


def test_a_play_with_no_decide_records_the_findings_verdict(make_sim, tmp_path: Path) -> None:
    """A double-bit ECC error found by a play without `decide` is the policy's verdict of what the
    check registered, with its reasons, not `error` with no reason; a clean node passes."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"ecc_dbe": {3: 2}}})
    run(sim, tmp_path, NO_DECIDE, "--node", "gpu-01")
    bad = _last_sweep(tmp_path, "gpu-01")
    # A volatile double-bit ECC error: the built-in policy's verdict is reboot (the policy's
    # findings table), recorded with the policy's reasons, not `error` with an empty WHY.
    assert bad["verdict"] == "reboot", bad
    assert bad["reasons"][0].startswith("no decide task") and any("ECC" in r for r in bad["reasons"]), bad
    run(sim, tmp_path, NO_DECIDE, "--node", "gpu-00")
    good = _last_sweep(tmp_path, "gpu-00")
    assert good["verdict"] == "pass", good


def test_a_sweep_whose_playbook_has_no_decide_records_the_findings_verdict(make_sim, tmp_path: Path) -> None:
    """The sweep, too: a playbook with no `decide` gives the policy's verdict of its results."""
    from dataclasses import replace

    from sweeper.history import History
    from tests.conftest import TEST_CONFIG, run_sweep

    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"ecc_dbe": {3: 2}}})
    own = tmp_path / "mine"
    own.mkdir()
    (own / "no-decide.yaml").write_text(NO_DECIDE)
    cfg = replace(TEST_CONFIG, playbook_dir=str(own), playbook="no-decide.yaml", light_playbook="")
    h = History(tmp_path / "sweep.db")
    try:
        report = run_sweep(sim, h, cfg)
        verdicts = {o.node: o.verdict for o in report.outcomes}
        assert verdicts == {"gpu-00": "pass", "gpu-01": "reboot"}, report.outcomes
    finally:
        h.close()


ECC_GATE = """
name: ecc gate
tasks:
  - name: ECC counters
    run_job:
      template: node-command.yaml.j2
      vars: {command: [nvidia-smi, -q, -d, ECC]}
      parser: nvidia-smi
      parser_args: {expect_gpus: "{{ node.profile.gpus }}"}
      timeout: 1h
    register: ecc
    ignore_errors: true
  - name: verdict
    decide: {results: ["{{ ecc }}"]}
"""


def test_node_command_runs_nvidia_smi_on_the_held_node(make_sim, tmp_path: Path) -> None:
    """The shipped node-command template runs `nvidia-smi -q -d ECC` with every GPU requested; its
    output is read as nvidia-smi's: a volatile double-bit ECC error fails the node. NVIDIA's runtime
    mounts nvidia-smi into a container given GPUs with the `utility` driver capability
    (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html);
    `-q -d ECC` prints the ECC section of the query (https://docs.nvidia.com/deploy/nvidia-smi/index.html)."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"ecc_dbe": {3: 2}}})
    code, out = run(sim, tmp_path, ECC_GATE, "--node", "gpu-00")
    assert code == 0 and out["tasks"][0]["msg"].startswith("pass"), out
    code, out = run(sim, tmp_path, ECC_GATE, "--node", "gpu-01")
    assert out["tasks"][0]["msg"].startswith("fail") and "ECC" in out["tasks"][0]["msg"], out
    assert out["tasks"][1]["msg"].startswith("verdict quarantine"), out  # the default policy: a critical finding


def test_node_command_takes_only_a_list_of_strings() -> None:
    """A command given as one string is refused when rendered (it would be one program's name);
    a list is the program and its arguments, with no shell, in the least-privilege pod."""
    import pytest

    from sweeper.actions import ActionContext
    from sweeper.actions.jobs import render_job
    from sweeper.config import Config
    from sweeper.errors import PlaybookError
    from sweeper.lint import SAMPLE_NODE

    ctx = ActionContext(config=Config(), node=SAMPLE_NODE, run_id="sw-test-0000")
    with pytest.raises(PlaybookError, match="command_must_be_a_list_of_strings"):
        render_job(ctx, "node-command.yaml.j2", 300, {"command": "nvidia-smi -q"})
    job = render_job(ctx, "node-command.yaml.j2", 300, {"command": ["nvidia-smi", "-q", "-d", "ECC"]})
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["nvidia-smi", "-q", "-d", "ECC"] and "args" not in c
    assert pod["securityContext"]["runAsNonRoot"] is True and not pod.get("volumes")
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == "8"


def test_playbooks_are_found_in_the_authors_folder_first(tmp_path: Path) -> None:
    """`playbook_dir` holds the author's playbooks, looked up first; a name it lacks is a shipped one."""
    from sweeper.config import Config, home

    (tmp_path / "sweep-light.yaml").write_text(NO_DECIDE)
    (tmp_path / "mine.yaml").write_text(NO_DECIDE)
    cfg = Config(playbook_dir=str(tmp_path))
    assert cfg.playbook_file("mine.yaml") == tmp_path / "mine.yaml"
    assert cfg.playbook_file("sweep-light.yaml") == tmp_path / "sweep-light.yaml"
    assert cfg.playbook_file("sweep-dcgm.yaml") == home() / "playbooks" / "sweep-dcgm.yaml"
    assert Config().playbook_file("mine.yaml") == home() / "playbooks" / "mine.yaml"
