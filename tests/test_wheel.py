"""The package as a user installs it (`pip install .`, pipx, a wheel): built from a copy of the
source, installed into a fresh virtual environment outside the repository, run from an empty
directory. It must find its playbooks, templates, profiles and policies, and run on the dependencies
it declares.

The dependencies are not downloaded and unpacked again (57 distributions, about 20 s of CPU and a
minute of a loaded machine's time each run): the fresh environment sees, through a `.pth` file, a
directory that links only the distributions the wheel's own `Requires-Dist` reaches (followed
transitively, markers evaluated), taken from the suite's environment, each checked against the
wheel's version specifiers, and `pip check` in the fresh environment confirms that every requirement
there is met. A module the package imports but does not declare is missing there as it would be from
a user's `pip install`."""

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


def declared_dependencies(wheel: Path, farm: Path) -> set[str]:
    """Link into `farm` every distribution the wheel requires, transitively (markers evaluated for this
    interpreter and the extras asked for), from this environment; each installed version must satisfy every
    specifier that names it. Returns their normalised names."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    # (requirement, the extras its dependent was asked with: psycopg[binary] brings psycopg-binary)
    todo = [(Requirement(line.split(":", 1)[1].strip()), frozenset[str]()) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]
    seen: set[tuple[str, ...]] = set()
    farm.mkdir()
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            raise AssertionError(f"{req} is declared but not installed in the suite's environment") from None
        assert req.specifier.contains(dist.version, prereleases=True), f"{req}: {dist.version} installed"
        name = canonicalize_name(req.name)
        if (name, *sorted(req.extras)) in seen:
            continue
        seen.add((name, *sorted(req.extras)))
        todo += [(Requirement(r), frozenset(req.extras)) for r in dist.requires or []]
        site = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if (site / top).exists() and not (farm / top).exists():
                (farm / top).symlink_to(site / top)
    return {key[0] for key in seen}


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

    # A bare environment (no pip of its own to bootstrap: this pip installs into it, `--python`) that sees
    # the declared dependencies only (the docstring says why not from the index), then the wheel.
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    deps = declared_dependencies(wheel, tmp_path / "deps")
    assert {"kubernetes", "sqlalchemy", "pydantic", "urllib3"} <= deps, sorted(deps)  # direct and transitive
    [site] = venv.glob("lib/python*/site-packages")
    (site / "sweeper-test-dependencies.pth").write_text(f"{tmp_path / 'deps'}\n")
    installed = run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                     "--no-deps", "--no-index", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    checked = run([sys.executable, "-m", "pip", "--python", str(python), "check"], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    env = {k: v for k, v in os.environ.items() if k not in ("SWEEPER_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
    env["COLUMNS"] = "200"
    where = run([str(python), "-c", "import sweeper.config as c; print(c.__file__); print(c.home())"], work, env)
    module, home = where.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(home) == Path(module).parent / "_bundled", where.stdout

    sweeper = str(venv / "bin" / "sweeper")
    lint = run([sweeper, "lint"], work, env)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 problem(s)" in lint.stdout + lint.stderr

    # Two cycles reach a reboot, a replacement through Karpenter and the report; the whole story (five
    # cycles) is the in-process demo's test (tests/test_cli.py), from the same files.
    demo = run([sweeper, "demo", "--cycles", "2", "--state", str(work / "demo.db")], work, env)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "cycle 2 of 2" in demo.stdout and "gpu-p5-04: reboot -> held" in demo.stdout
    assert "gpu-p5-09: karpenter: nodeclaim-deleted" in demo.stdout
    assert "<svg" in (work / "report.html").read_text(), "the report, from the templates the wheel carries"

    # SWEEPER_HOME still overrides what the package carries.
    mine = tmp_path / "mine"
    for name in BUNDLED:
        shutil.copytree(ROOT / name, mine / name)
    (mine / "playbooks" / "broken.yaml").write_text("name: broken\ntasks:\n  - name: no action here\n")
    linted = run([sweeper, "lint"], work, {**env, "SWEEPER_HOME": str(mine)})
    assert linted.returncode == 1 and "broken.yaml" in linted.stdout + linted.stderr, linted.stdout + linted.stderr
