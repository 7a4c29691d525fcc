"""The docs stay true: every command and option (click's command tree), action (the action
registry), job template variable (Jinja2's meta.find_undeclared_variables over each template)
and config key (sweeper/config.py's declaration) is named in README.md or docs/*.md; every
relative link and anchor of README.md and docs/*.md resolves; docs/configuration.md is the
generated one; the README stays one screen; and the worked examples of docs/playbooks.md lint
and run against the simulated cluster."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import click
import yaml
from click.testing import CliRunner
from jinja2 import Environment, meta

from sweeper.actions import load_all
from sweeper.cli import main
from sweeper.config import Config
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(cmd: click.Command, path: tuple[str, ...]) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), cmd
    if isinstance(cmd, click.Group):  # list_commands/get_command: `check` is built when asked for
        ctx = click.Context(cmd)
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name))


def undocumented(text: str) -> list[str]:
    """What a user can type or set that no doc names, one line each."""

    def named(word: str) -> bool:
        return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", text) is not None

    missing = []
    for path, cmd in _commands(main, ("sweeper",)):
        if not named(path):
            missing.append(f"command `{path}`")
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                longest = max(param.opts, key=len)
                if not named(longest):
                    missing.append(f"option `{path} {longest}`")
    for action in sorted(load_all()):
        if not named(f"`{action}`"):
            missing.append(f"action `{action}`")
    env = Environment()
    for template in sorted((ROOT / "job-templates").glob("*.j2")):
        for var in sorted(meta.find_undeclared_variables(env.parse(template.read_text()))):
            if not named(f"`{var}`"):
                missing.append(f"template variable `{var}` (job-templates/{template.name})")
    for f in dataclasses.fields(Config):
        if f.name != "extra" and not named(f"`{f.name}`"):
            missing.append(f"config key `{f.name}`")
    return missing


def test_every_command_option_action_template_variable_and_config_key_is_documented() -> None:
    missing = undocumented("\n".join(p.read_text() for p in DOCS))
    assert not missing, ("undocumented (name each in README.md or docs/*.md):\n  " + "\n  ".join(missing))


def test_the_surface_check_names_exactly_what_is_missing() -> None:
    """The check above must be able to fail, and say precisely why."""
    text = "\n".join(p.read_text() for p in DOCS)
    before = undocumented(text)
    missing = undocumented(text.replace("`pair_rdzv_timeout`", "").replace("--offline", "").replace("`hand_back`", ""))
    assert [m for m in missing if m not in before] == [
        "option `sweeper nodes --offline`", "option `sweeper report --offline`", "action `hand_back`",
        "template variable `pair_rdzv_timeout` (job-templates/nccl-pair.yaml.j2)"]


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            base, n = slug(m.group(1)), 0
            name = base
            while name in out:
                n += 1
                name = f"{base}-{n}"
            out.add(name)
    return out


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    """Every relative link (and #anchor) of these pages that leads nowhere, as `page: target`."""
    bad = []
    for page in pages:
        text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())  # code blocks hold no links
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            rel = dest.relative_to(root).as_posix() if dest.is_relative_to(root) else str(dest)
            if not dest.exists():
                bad.append(f"{page.relative_to(root)}: {target} (no file {rel})")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(root)}: {target} (no heading #{anchor} in {rel})")
    return bad


def test_every_doc_link_and_anchor_resolves() -> None:
    bad = broken_links(DOCS)
    assert not bad, "broken links:\n  " + "\n  ".join(bad)


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    page = ROOT / "docs" / "cli.md"
    other = tmp_path / "page.md"
    other.write_text("# Page\n\n[a](cli.md) [b](nowhere.md) [c](#page) [d](#gone) [e](https://x.org/#y)\n"
                     "```\n[f](in-code.md)\n```\n")
    assert anchors(page) and slug("`sweeper serve` and its schedules") == "sweeper-serve-and-its-schedules"
    assert slug("Running on EKS / AKS / GKE") == "running-on-eks--aks--gke"
    bad = [b.split(": ", 1)[1] for b in broken_links([other], tmp_path)]
    assert bad == ["cli.md (no file cli.md)", "nowhere.md (no file nowhere.md)", "#gone (no heading #gone in page.md)"]


def test_the_configuration_reference_is_generated_and_names_every_key() -> None:
    """docs/configuration.md is `python -m sweeper.configdoc`'s output, byte for byte, and has a
    row with words for every key of the config, every field of its nested values and every
    profile key."""
    from sweeper import configdoc
    from sweeper.profiles import Profile

    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == configdoc.render(), \
        "docs/configuration.md is stale: python -m sweeper.configdoc > /tmp/c && mv /tmp/c docs/configuration.md"
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|.*\| ([^|]*\S[^|]*) \|$", doc, re.M))
    keys = {f.name for cls in (Config, Profile) for f in dataclasses.fields(cls) if f.name not in ("extra", "source")}
    for model in configdoc._nested_models().values():
        keys |= set(model.model_fields)
    assert not keys - set(rows), f"keys without a row in docs/configuration.md: {sorted(keys - set(rows))}"


def test_the_readme_is_one_screen_and_names_each_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for page in ("cli", "configuration", "playbooks", "checks-and-policies", "deploy", "simulator", "benchmarks",
                 "testing", "report", "security"):
        assert f"](docs/{page}.md)" in readme, page
    status = readme[readme.index("## Status"):]
    # the status says plainly what ran on real hardware, and each record it names is in the tree
    assert "never on a real cluster" in status and "no sweep has run on a real cluster" in status
    named = re.findall(r"`(tests/data/[^`*]+)`", status)
    assert named and all((ROOT / p).exists() for p in named), named


def test_one_name_for_the_full_sweep_and_one_for_the_light_check() -> None:
    """'light sweep' (the old name of sweep-light.yaml's play) collided with 'light check'
    (light-busy.yaml): the first is the full sweep now, in the docs and the playbook."""
    for page in [*DOCS, ROOT / "playbooks" / "sweep-light.yaml", ROOT / "playbooks" / "light-busy.yaml"]:
        assert "light sweep" not in page.read_text().lower(), page
    assert yaml.safe_load((ROOT / "playbooks" / "sweep-light.yaml").read_text())["name"] == "full sweep"
    assert yaml.safe_load((ROOT / "playbooks" / "light-busy.yaml").read_text())["name"].startswith("light check")


def example(name: str) -> str:
    """A playbook of docs/playbooks.md, the fenced block after `<!-- example: NAME -->`."""
    doc = (ROOT / "docs" / "playbooks.md").read_text()
    m = re.search(r"<!-- example: " + re.escape(name) + r" -->\s*```yaml\n(.*?)```", doc, re.S)
    assert m, f"no example {name} in docs/playbooks.md"
    return m.group(1)


def test_the_worked_dcgm_gate_lints_and_runs_by_name(make_sim, tmp_path: Path) -> None:
    """The DCGM level-1 gate of docs/playbooks.md, run by name from `playbook_dir` as the doc
    says: a healthy node passes, a node whose row remapping failed (DCGM_FR_ROW_REMAP_FAILURE
    in the software test, which level 1 runs) fails the assert, and both are untainted."""
    books = tmp_path / "playbooks"
    books.mkdir()
    (books / "dcgm-gate.yaml").write_text(example("dcgm-gate.yaml"))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"playbook_dir": str(books), "poll_interval": 0.02}))
    runner = CliRunner()
    res = runner.invoke(main, ["lint", str(books / "dcgm-gate.yaml")])
    assert res.exit_code == 0 and "0 problem(s)" in res.stderr, res.output
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"remap_failure": [4]}})
    out = {}
    for node in ("gpu-00", "gpu-01"):
        res = runner.invoke(main, ["run", "dcgm-gate.yaml", "--node", node, "--config", str(config),
                                   "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db")])
        out[node] = res
        assert not sim.core.read_node(node).spec.taints, "the always section untainted it"
    assert out["gpu-00"].exit_code == 0, out["gpu-00"].output
    assert "DCGM level 1 passed on" in out["gpu-00"].stderr
    assert out["gpu-01"].exit_code == 1, out["gpu-01"].output
    assert "DCGM level 1 failed on gpu-01" in out["gpu-01"].stderr and "GPU 4" in out["gpu-01"].stderr


def test_the_ecc_gate_runs_from_the_authors_folder(make_sim, tmp_path: Path) -> None:
    """docs/playbooks.md's ECC gate and fleet file, as written: the playbook lints, runs by name
    from --playbook-dir against the simulated fleet, and the shipped node-command template's
    `nvidia-smi -q -d ECC` passes the clean node (handed back) and fails the node with a
    double-bit ECC error (volatile uncorrectable: quarantine by the default policy, still held)."""
    from sweeper.history import History

    mine = tmp_path / "my-checks"
    mine.mkdir()
    (mine / "ecc-gate.yaml").write_text(example("ecc-gate.yaml"))
    runner = CliRunner()
    res = runner.invoke(main, ["lint", str(mine / "ecc-gate.yaml")])
    assert res.exit_code == 0 and "0 problem(s)" in res.stderr, res.output
    sim: Sim = make_sim(yaml.safe_load(example("ecc-fleet.yaml")))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"poll_interval": 0.02}))
    for node in ("gpu-00", "gpu-01"):
        res = runner.invoke(main, ["run", "ecc-gate.yaml", "--playbook-dir", str(mine), "--node", node,
                                   "--config", str(config), "--kubeconfig", str(sim.kubeconfig),
                                   "--state", str(tmp_path / "h.db")])
        assert res.exit_code == 0, res.output
    h = History(tmp_path / "h.db")
    try:
        good, bad = (h.node_history(n)["sweeps"][0] for n in ("gpu-00", "gpu-01"))
    finally:
        h.close()
    assert good["verdict"] == "pass" and not sim.core.read_node("gpu-00").spec.taints, good
    assert bad["verdict"] == "quarantine" and sim.core.read_node("gpu-01").spec.taints, bad
    assert any("2 volatile uncorrectable ECC errors" in r for r in bad["reasons"]), bad


def test_every_fleet_file_key_is_documented() -> None:
    """docs/simulator.md has a table row for every key of the fleet file (sweeper/sim/fleet.py):
    the top level, node groups, workloads, arrivals, API faults, the registry and each fault."""
    from sweeper.sim import fleet

    doc = (ROOT / "docs" / "simulator.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M))
    keys = set(fleet.FAULT_KEYS)
    for model in (fleet.FleetFile, fleet._NodeGroup, fleet._Workload, fleet._Arrivals, fleet._ApiFaults,
                  fleet._Registry):
        keys |= set(model.model_fields)
    assert not keys - rows, f"fleet file keys missing from docs/simulator.md: {sorted(keys - rows)}"
    assert "simulator.md" in (ROOT / "README.md").read_text()


def test_the_semantics_table_names_every_golden_playbook() -> None:
    """docs/playbooks.md's semantics table and tests/semantics/golden/ hold the same rules."""
    doc = (ROOT / "docs" / "playbooks.md").read_text()
    table = doc[doc.index("## Semantics"):]
    named = {g for row in table.splitlines() if row.startswith("| `")
             for g in re.findall(r"`([a-z_]+)`", row.rsplit("|", 2)[1])}
    golden = {p.stem for p in (ROOT / "tests" / "semantics" / "golden").glob("*.yaml")
              if not p.stem.endswith(".expect")}
    assert named == golden, f"in the table only: {sorted(named - golden)}; golden only: {sorted(golden - named)}"
