"""Deliberately broken playbooks: each gives its file:line message, exit 2 from `run` and
1 from `lint`, and touches nothing in the cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from tests.conftest import Sim

BROKEN = Path(__file__).parent / "broken"
CASES = sorted(p.name for p in BROKEN.glob("*.yaml"))


def expectations(path: Path) -> list[tuple[int, str]]:
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"# expect: (\d+): (.*)$", line)
        if m:
            out.append((int(m.group(1)) + 0, m.group(2)))
    assert out, f"{path.name} has no '# expect: LINE: message' line"
    return out


@pytest.mark.parametrize("name", CASES)
def test_lint_names_file_and_line(name: str) -> None:
    path = BROKEN / name
    res = CliRunner().invoke(main, ["lint", str(path)])
    assert res.exit_code == 1, res.output
    for line, text in expectations(path):
        assert any(o.startswith(f"{path}:{line}:") and text in o for o in res.stdout.splitlines()), \
            f"expected {path}:{line}: ...{text}... in:\n{res.stdout}"


def test_run_refuses_every_broken_playbook_and_touches_nothing(make_sim) -> None:
    sim: Sim = make_sim(nodes=1)
    runner = CliRunner()
    for name in CASES:
        path = BROKEN / name
        before = len(sim.cluster.store.requests)
        res = runner.invoke(main, ["run", str(path), "--node", "gpu-00", "--kubeconfig", str(sim.kubeconfig),
                                   "--state", str(path.parent / "unused.db")])
        assert res.exit_code == 2, (name, res.output)
        line, text = expectations(path)[0]
        assert f"{path}:{line}" in res.stderr and text in res.stderr, (name, res.stderr)
        writes = [r for r in sim.cluster.store.requests[before:] if r[0] != "GET"]
        assert writes == [], name
    assert not (BROKEN / "unused.db").exists()


def test_shipped_files_lint_clean() -> None:
    res = CliRunner().invoke(main, ["lint"])
    assert res.exit_code == 0, res.output
    assert "0 problem(s)" in res.stderr
