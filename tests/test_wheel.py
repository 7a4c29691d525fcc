"""The package as a user installs it (`pip install .`, pipx, a wheel): built from a copy of the
source, installed with its dependencies into a fresh virtual environment outside the repository,
run from an empty directory. It must find its playbooks, templates, profiles and policies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sweeper.resources import BUNDLED

ROOT = Path(__file__).resolve().parent.parent
BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


@pytest.mark.slow
def test_a_wheel_installed_outside_the_repository_lints_and_runs_the_demo(tmp_path: Path) -> None:
    src, dist, venv, work = (tmp_path / d for d in ("src", "dist", "venv", "work"))
    src.mkdir()
    work.mkdir()
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, src / name)
    for name in ("sweeper", *BUNDLED):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "_bundled"))

    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = dist.glob("sweeper-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    for name in BUNDLED:
        shipped = {f"sweeper/_bundled/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / name).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts}
        assert shipped and shipped <= inside, f"the wheel lacks {sorted(shipped - inside)}"

    # A bare environment (no pip of its own to bootstrap: this pip installs into it, `--python`), then the
    # wheel with its dependencies from the index, as `pip install` resolves them for a user.
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile", str(wheel)],
                    tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("SWEEPER_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    where = run([str(python), "-c", "import sweeper.config as c; print(c.__file__); print(c.home())"], work, env)
    module, home = where.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(home) == Path(module).parent / "_bundled", where.stdout

    sweeper = str(venv / "bin" / "sweeper")
    lint = run([sweeper, "lint"], work, env)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 problem(s)" in lint.stdout + lint.stderr

    demo = run([sweeper, "demo", "--state", str(work / "demo.db")], work, env)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "cycle 5 of 5" in demo.stdout and "gpu-p5-04: reboot -> held" in demo.stdout
    assert "gpu-p5-09: karpenter: nodeclaim-deleted" in demo.stdout

    # SWEEPER_HOME still overrides what the package carries.
    mine = tmp_path / "mine"
    for name in BUNDLED:
        shutil.copytree(ROOT / name, mine / name)
    (mine / "playbooks" / "broken.yaml").write_text("name: broken\ntasks:\n  - name: no action here\n")
    linted = run([sweeper, "lint"], work, {**env, "SWEEPER_HOME": str(mine)})
    assert linted.returncode == 1 and "broken.yaml" in linted.stdout + linted.stderr, linted.stdout + linted.stderr
