"""The config, profile and fleet files: one declaration drives the loader, the file:line messages,
`sweeper lint --config` and docs/configuration.md."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.config import Config, load_config
from sweeper.errors import ConfigError
from sweeper.profiles import load_profile, load_profiles
from sweeper.schema import ConfigProblems
from sweeper.sim.fleet import load_fleet

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# Each value the old loader accepted or misreported; the line of the key, and the range allowed.
BAD = [
    ('max_nodes: "4"', "max_nodes: '4' is a string; allowed: integer >= 0"),
    ("max_nodes: abc", "max_nodes: abc is a string; allowed: integer >= 0"),
    ("max_nodes: true", "max_nodes: true is a boolean; allowed: integer >= 0"),
    ("check_timeout: -5m", "check_timeout: -5m is too small; allowed: duration > 0s"),
    ("min_node_age: -1h", "min_node_age: -1h is too small; allowed: duration >= 0s"),
    ("interval: 0s", "interval: 0s is too small; allowed: duration > 0s"),
    ("lock_ttl: 0", "lock_ttl: 0 is too small; allowed: duration >= 1s"),
    ("max_percent: 250", "max_percent: 250 is too large; allowed: number >= 0 and <= 100"),
    ("poll_interval: soon", "poll_interval: soon is not a duration; allowed: duration > 0s"),
    ("poll_interval: .nan", "poll_interval: .nan is not a finite number; allowed: duration > 0s"),
    ("asg_action: kill", "asg_action: kill is not one of the choices; allowed: one of set-unhealthy, terminate"),
    ("max_nodez: 3", "max_nodez: unknown key (did you mean max_nodes?)"),
]


@pytest.mark.parametrize("line,expected", BAD, ids=[b[0].split(":")[0] + "=" + b[0].split(": ")[1] for b in BAD])
def test_a_bad_value_is_refused_naming_file_line_key_and_what_is_allowed(tmp_path: Path, line: str,
                                                                         expected: str) -> None:
    path = write(tmp_path, f"# a comment\nnamespace: sweeper\n{line}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value).startswith(f"{path}:3: {expected}"), str(exc.value)


def test_nested_keys_are_located_on_their_own_line(tmp_path: Path) -> None:
    path = write(tmp_path, "remediation:\n  default: manual\n  by_pool:\n    gpu: karpentr\n"
                           "schedules:\n  - {name: a, cron: '* * * * *'}\n  - name: b\n    crom: '* * * * *'\n")
    with pytest.raises(ConfigProblems) as exc:
        load_config(path)
    assert exc.value.problems == [
        f"{path}:4: remediation.by_pool.gpu: karpentr is not one of the choices; "
        "allowed: 'karpenter', 'asg' or 'manual'",
        f"{path}:7: schedules[1].cron: missing; allowed: a value (the key is required)",
        f"{path}:8: schedules[1].crom: unknown key (did you mean cron?); allowed: keys cron, dcgm_level, interval, max_nodes, name, playbook"]


def test_durations_stay_human_and_lists_become_tuples(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "check_timeout: 5m\nmin_node_age: 0\ninterval: 1d\npoll_interval: 0.5\n"
                                      "lock_ttl: 300\ngpu_resources: [nvidia.com/gpu]\n"
                                      "schedules: [{name: n, cron: '0 * * * *', interval: 6h}]\n"))
    assert (cfg.check_timeout, cfg.min_node_age, cfg.interval, cfg.poll_interval, cfg.lock_ttl) == \
        (300.0, 0.0, 86400.0, 0.5, 300.0)
    assert cfg.gpu_resources == ("nvidia.com/gpu",)
    assert cfg.schedules == ({"name": "n", "cron": "0 * * * *", "interval": 21600.0},)


def test_every_default_written_out_loads_back_as_the_defaults(tmp_path: Path) -> None:
    """The declaration and the loader agree: a file that spells out each default is Config()."""
    defaults = Config()
    raw = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(Config) if f.name != "extra"}
    raw = {k: list(v) if isinstance(v, tuple) else v for k, v in raw.items()}
    assert load_config(write(tmp_path, yaml.safe_dump(raw))) == dataclasses.replace(
        defaults, remediation={"default": "manual", "by_pool": {}, "by_profile": {}})


def test_lint_config_lists_every_problem_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'max_nodes: "4"\nmax_percent: 250\ncheck_timeout: -5m\n')
    res = CliRunner().invoke(main, ["lint", "--config", str(path), str(ROOT / "profiles" / "default.yaml")])
    assert res.exit_code == 1, res.output
    assert res.stdout.splitlines() == [
        f"{path}:1: max_nodes: '4' is a string; allowed: integer >= 0",
        f"{path}:2: max_percent: 250 is too large; allowed: number >= 0 and <= 100",
        f"{path}:3: check_timeout: -5m is too small; allowed: duration > 0s"]


def test_shipped_profiles_load_and_a_bad_one_names_its_line(tmp_path: Path) -> None:
    assert "p5.48xlarge" in load_profiles(ROOT / "profiles")
    path = write(tmp_path, "gpus: 8\nnic: efa\nnics: -1\nnic_affinity: FAR\npcie_gen: '5'\n", "p.yaml")
    with pytest.raises(ConfigProblems) as exc:
        load_profile(path)
    assert exc.value.problems == [
        f"{path}:3: nics: -1 is too small; allowed: integer >= 0 or empty",
        f"{path}:4: nic_affinity: FAR is not one of the choices; allowed: one of '', PIX, PXB, PHB, NODE, SYS",
        f"{path}:5: pcie_gen: '5' is a string; allowed: integer >= 1 and <= 7 or empty"]
    with pytest.raises(ConfigProblems, match=rf"^{re.escape(str(path))}:1: gpus: missing"):
        load_profile(write(tmp_path, "nic: efa\n", "p.yaml"))


def test_fleet_file_problems_name_their_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: f\nnode_groups:\n  - {name_prefix: n-, count: 2}\nfaults:\n  n-01:\n"
                           "    missing_gpus: -1\n    xids: [{gpu: 1}]\n  n-07: {}\narrivals: {per_hour: x}\n",
                 "fleet.yaml")
    with pytest.raises(ConfigProblems) as exc:
        load_fleet(path)
    assert exc.value.problems == [
        f"{path}:6: faults.n-01.missing_gpus: -1 is too small; allowed: greater than or equal to 0",
        f"{path}:7: faults.n-01.xids[0].code: missing; allowed: a value (the key is required)",
        f"{path}:9: arrivals.per_hour: x is a string; allowed: a valid number"]
    path.write_text("node_groups:\n  - {name_prefix: n-, count: 2}\nfaults:\n  n-07: {hung_check: true}\n")
    with pytest.raises(ConfigProblems, match=rf"^{re.escape(str(path))}:4: faults.n-07: the fleet has no such node"):
        load_fleet(path)


def test_a_playbook_name_stays_inside_its_folder(tmp_path: Path) -> None:
    """`playbook`, `gate_playbook`, `soak_playbook`, `light_playbook`, a schedule's and a ladder rung's
    playbook are names in `playbook_dir` or the shipped playbooks/, as a job template's are: an absolute
    path, a `..` or a symlink out is refused (exit 2), so a config cannot load the controller's other files
    (its service-account token, a mounted Secret) as a playbook. A ConfigMap volume's own links (each key
    a link into `..data/`) stay inside the folder and are read."""
    outside = tmp_path / "token"
    outside.write_text("eyJhbGciOi.secret\n")
    books = tmp_path / "books"
    (books / "..2026_11_26").mkdir(parents=True)
    (books / "..2026_11_26" / "mine.yaml").write_text("name: mine\ntasks:\n- debug: {msg: hi}\n")
    (books / "..data").symlink_to("..2026_11_26")
    (books / "mine.yaml").symlink_to("..data/mine.yaml")
    (books / "out.yaml").symlink_to(outside)
    cfg = Config(playbook_dir=str(books))
    assert cfg.playbook_file("mine.yaml") == books / "mine.yaml"
    assert cfg.playbook_file("sweep-light.yaml").name == "sweep-light.yaml", "the shipped ones after"
    for name in (str(outside), "../token", "x/../../token", "~/token", "out.yaml"):
        with pytest.raises(ConfigError, match="not a playbook name|leaves its folder"):
            cfg.playbook_file(name)
    config = tmp_path / "c.yaml"
    config.write_text(f"playbook_dir: {books}\ndepth_ladder:\n- {{name: a, playbook: ../token, duration: 60}}\n")
    res = CliRunner().invoke(main, ["lint", "--config", str(config)])
    assert res.exit_code == 1 and "depth_ladder: 'a': playbook '../token': not a playbook name" in res.output
