"""The build: the package, plus a copy of the shipped playbooks, job templates, profiles and
policies inside it (sweeper/_bundled), so that a wheel, `pip install .` or pipx finds them without
the source tree (sweeper.resources reads them there). The folders stay at the repository's root,
where deploy/, the tests and an editable install read them. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ("playbooks", "job-templates", "profiles", "policies")  # as sweeper.resources.BUNDLED


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the folders where they are
            return
        root = Path(__file__).resolve().parent
        for name in BUNDLED:
            if not (root / name).is_dir():
                raise SystemExit(f"setup.py: {name}/ is missing beside setup.py; the wheel would lack it")
            shutil.copytree(root / name, Path(self.build_lib) / "sweeper" / "_bundled" / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".*", "__pycache__"))


setup(cmdclass={"build_py": BuildWithData})
