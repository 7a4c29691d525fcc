"""The project's own checks run with the tests: layers (import-linter), lint (ruff), types (mypy)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = BIN / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} is not installed; install the test extras: pip install -e '.[test]'")
    return path


def run(*cmd: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_import_layers() -> None:
    run(tool("lint-imports"))


def test_ruff() -> None:
    run(tool("ruff"), "check", "sweeper", "tests", "benchmarks")


def test_mypy() -> None:
    run(tool("mypy"), "sweeper")
